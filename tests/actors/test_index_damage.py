"""A damaged index page found while running answers EIO for the reads and the entry list
that need it: the index actor must not crash (which would stop the bookie)."""

from __future__ import annotations

from pathlib import Path

from zbk.actors.base import ListOutbox
from zbk.actors.indexsyncer import IndexCore
from zbk.actors.messages import EntryList, ListEntries, Lookup, ReadLocations
from zbk.storage.ledgercache import LedgerCache

SLOT = 16
HEADER = 128


def test_damaged_slot_is_an_error_result_not_a_crash(tmp_path: Path) -> None:
    d = str(tmp_path / "index")
    cache = LedgerCache([d])
    for lid in (1, 2):
        cache.set_master_key(lid, b"k" * 32)
        for e in range(10):
            cache.put(lid, e, (1 << 40) | (1000 + 100 * e))
    cache.flush()
    idx = next(p for p in Path(d).rglob("*.idx") if p.name == f"{1:016x}.idx")
    raw = bytearray(idx.read_bytes())
    raw[HEADER + 5 * SLOT + 3] ^= 0xFF  # entry 5's slot
    idx.write_bytes(bytes(raw))

    out = ListOutbox()
    core = IndexCore(LedgerCache([d]), outbox=out, flush_interval_s=60, persist_marks=lambda _m: None)
    core.on_message(Lookup(ctx=1, ledger_id=1, first_entry_id=0, count=10, bytes_max=1 << 20), 0.0)
    (res,) = out.take("entrylogger", ReadLocations)
    assert len(res.locations) == 5 and res.error and res.ledger_known, res
    core.on_message(ListEntries(ctx=2, ledger_id=1), 0.0)
    (lst,) = out.take("server", EntryList)
    assert lst.error and lst.ranges == []
    core.on_message(Lookup(ctx=3, ledger_id=2, first_entry_id=0, count=10, bytes_max=1 << 20), 0.0)
    (ok,) = out.take("entrylogger", ReadLocations)
    assert len(ok.locations) == 10 and not ok.error, "the other ledger is unaffected"

    # A striped read (WQ < E) looks up only its stripe's slots: one that skips entry 5 is whole.
    core.on_message(Lookup(ctx=4, ledger_id=1, first_entry_id=0, count=10, bytes_max=1 << 20, sparse=True,
                           stripe=(3, 1)), 0.0)
    (stripe,) = out.take("entrylogger", ReadLocations)
    assert stripe.entry_ids == [1, 4, 7] and not stripe.error, stripe
    core.on_message(Lookup(ctx=5, ledger_id=1, first_entry_id=1, count=9, bytes_max=1 << 20, sparse=True,
                           stripe=(2, 1)), 0.0)
    (damaged,) = out.take("entrylogger", ReadLocations)
    assert damaged.entry_ids == [1, 3] and damaged.error, damaged
