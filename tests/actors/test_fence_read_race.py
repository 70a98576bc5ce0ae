"""A read of a fenced ledger never overtakes an add admitted before the fence.

The bug (found by the randomized fault schedules, seed 1895359050): an add reached a bookie
just before a recoverer's fencing read. The fence record went straight to the journal and
was synced while the add's entry was still on its way through the EntryLogger, so the read
found no entry and answered ENOENTRY; then the add was appended, synced and acknowledged.
The recoverer took the explicit negative, closed the ledger one entry short, and an
acknowledged entry was lost. The Server now holds a read of a fenced ledger until the adds
admitted before it are appended.
"""

from __future__ import annotations

from typing import Any

from zbk.actors.base import ListOutbox
from zbk.actors.messages import AppendBatch, Appended, JournalMeta, Lookup, Synced
from zbk.actors.server import LedgerState, ServerCore
from zbk.wire import messages as w
from zbk.wire.codec import encode
from zbk.wire.ops import AddFlag, ReadFlag

from .test_multi_add import KEY, part

PLAIN = AddFlag(0)


def make() -> tuple[ServerCore, ListOutbox, list[tuple[bytes, Any]]]:
    replies: list[tuple[bytes, Any]] = []
    out = ListOutbox()
    core = ServerCore(ledgers={1: LedgerState(master_key=KEY)}, journal_write_data=True, max_frame_bytes=1 << 20,
                      reply=lambda ident, frames: replies.append((ident, frames)), outbox=out)
    return core, out, replies


def fence_read(core: ServerCore, entry_id: int) -> None:
    core.on_request(b"recoverer", encode(w.ReadRequest(rid=9, ledger_id=1, first_entry_id=entry_id, count=1,
                                                       flags=ReadFlag.FENCE, master_key=KEY)), 0.0)


def sync_fence(core: ServerCore, out: ListOutbox) -> None:
    (meta,) = out.take("journal", JournalMeta)
    core.on_message(Synced([meta.batch_id]), 0.0)


def test_regression_seed_1895359050_a_fence_read_waits_for_an_add_admitted_before_it() -> None:
    core, out, replies = make()
    add = part(1, range(20, 21))
    core.on_request(b"writer", encode(w.AddRequest(rid=1, ledger_id=1, master_key=KEY, flags=PLAIN,
                                                   entries=add.entries)), 0.0)
    (ab,) = out.take("entrylogger", AppendBatch)
    fence_read(core, 20)
    sync_fence(core, out)  # the fence is durable before the add's entry is appended
    assert out.take("index", Lookup) == [], "the read went to the index before the add it follows was appended"
    core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [1]), 0.0)
    (lookup,) = out.take("index", Lookup)
    assert (lookup.ledger_id, lookup.first_entry_id) == (1, 20)
    core.on_message(Synced([ab.batch_id]), 0.0)
    assert [ident for ident, _ in replies] == [b"writer"]  # the add is acknowledged, the read follows the index
    assert core.fenced_reads == {} and core.fenced_waiting == 0


def test_a_fence_read_waits_for_a_multi_add_part_of_its_ledger_and_no_other() -> None:
    core, out, replies = make()
    core.ledgers[2] = LedgerState(master_key=KEY)
    core.on_request(b"writer", encode(w.MultiAddRequest(rid=1, parts=[part(2, range(0, 1)), part(1, range(5, 6))])),
                    0.0)
    (ab,) = out.take("entrylogger", AppendBatch)
    fence_read(core, 5)
    sync_fence(core, out)
    assert out.take("index", Lookup) == [] and core.in_flight == 2
    core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [1, 2]), 0.0)
    assert [lk.ledger_id for lk in out.take("index", Lookup)] == [1]

    # A fenced ledger with nothing in flight is read at once, whatever other ledgers do.
    core.on_request(b"writer", encode(w.AddRequest(rid=2, ledger_id=2, master_key=KEY, flags=PLAIN,
                                                   entries=part(2, range(1, 2)).entries)), 0.0)
    fence_read(core, 5)  # ledger 1 is fenced already: no new fence record
    assert [lk.ledger_id for lk in out.take("index", Lookup)] == [1]


RECOVERY = AddFlag.RECOVERY_ADD


def recovery_add(core: ServerCore, out: ListOutbox, entry_id: int) -> AppendBatch:
    core.on_request(b"repairer", encode(w.AddRequest(rid=100 + entry_id, ledger_id=1, master_key=KEY, flags=RECOVERY,
                                                     entries=part(1, range(entry_id, entry_id + 1)).entries)), 0.0)
    (ab,) = out.take("entrylogger", AppendBatch)
    return ab


def fenced_behind_an_add() -> tuple[ServerCore, ListOutbox, AppendBatch]:
    """Ledger 1 with an add of entry 20 admitted and not yet appended, then fenced by a read
    of entry 20, which waits for it: (core, outbox, the add's AppendBatch)."""
    core, out, _ = make()
    core.on_request(b"writer", encode(w.AddRequest(rid=1, ledger_id=1, master_key=KEY, flags=PLAIN,
                                                   entries=part(1, range(20, 21)).entries)), 0.0)
    (ab,) = out.take("entrylogger", AppendBatch)
    fence_read(core, 20)
    sync_fence(core, out)
    return core, out, ab


def test_a_fence_read_does_not_wait_for_recovery_adds_admitted_after_it() -> None:
    """A stream of recovery adds into a fenced ledger must not starve its reads: a read
    waits only for the adds admitted before it."""
    core, out, before = fenced_behind_an_add()
    after = [recovery_add(core, out, e) for e in (30, 31)]  # admitted after the read arrived
    core.on_message(Appended(before.batch_id, before.ledger_ids, before.entry_ids, [1]), 0.0)
    (lookup,) = out.take("index", Lookup)  # served, though recovery adds are still on their way
    assert lookup.first_entry_id == 20 and core.fenced_waiting == 0
    assert all(ab.batch_id in core.unappended[1] for ab in after)


def test_regression_chaos_seed_267285727_appends_of_other_ledgers_do_not_rescan_waiting_reads() -> None:
    """The bug (a 30-minute chaos run, seed 267285727): every Appended message rescanned every
    waiting fenced read against every add in flight, so a busy bookie with reads waiting
    spent all its Server time there and stopped answering anyone. The waiting reads are
    now kept per ledger, and only an Appended of their own ledger looks at them."""
    core, out, held = fenced_behind_an_add()
    for _ in range(500):
        fence_read(core, 20)  # recoverers retrying: every read waits for the same add
    assert core.fenced_waiting == 501
    looked: list[int] = []
    real = core._start_fenced_reads
    core._start_fenced_reads = lambda lid: (looked.append(lid), real(lid))  # type: ignore[method-assign]
    for k in range(200):  # adds of another ledger come and go
        core.on_request(b"other", encode(w.AddRequest(rid=1000 + k, ledger_id=2, master_key=KEY, flags=PLAIN,
                                                      entries=part(2, range(k, k + 1)).entries)), 0.0)
        (ab,) = out.take("entrylogger", AppendBatch)
        core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [1]), 0.0)
    assert looked == [] and out.take("index", Lookup) == []
    core.on_message(Appended(held.batch_id, held.ledger_ids, held.entry_ids, [1]), 0.0)
    assert looked == [1] and len(out.take("index", Lookup)) == 501 and core.fenced_waiting == 0
    assert core.unappended == {}
