"""Index backpressure: when new ledgers arrive faster than a checkpoint writes their index
files, dirty index pages would grow without bound (one 16 KiB page per new ledger). The
IndexSyncer then sends IndexPressure(True) and the Server holds new adds, in order, until a
checkpoint brings the dirty pages back under the cache bound; beyond the held bounds it
refuses them with ETOOMANYREQUESTS. Reads and everything else go on meanwhile."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zbk import limits
from zbk.actors.base import ListOutbox
from zbk.actors.indexsyncer import IndexCore
from zbk.actors.messages import (
    AppendBatch,
    Checkpoint,
    IndexPressure,
    IndexPut,
    StartCheckpoint,
)
from zbk.actors.server import LedgerState, ServerCore
from zbk.client.digest import make_digest, master_key
from zbk.storage.index import PAGE_BYTES
from zbk.storage.ledgercache import DELTA_PAGE_BYTES, DELTA_SLOT_BYTES, LedgerCache
from zbk.wire import messages as w
from zbk.wire.codec import decode_response, encode
from zbk.wire.entry import build_entry
from zbk.wire.ops import AddFlag
from zbk.wire.status import Status

DIGEST = make_digest("crc32c", b"")
KEY = master_key(b"k")


def add(lid: int, eid: int, rid: int) -> list[bytes]:
    req = w.AddRequest(rid=rid, ledger_id=lid, master_key=KEY, flags=AddFlag(0),
                       entries=[build_entry(lid, eid, eid - 1, b"x" * 100, DIGEST)])
    return encode(req)


def server() -> tuple[ServerCore, ListOutbox, list[Any]]:
    replies: list[Any] = []
    out = ListOutbox()
    core = ServerCore(ledgers={1: LedgerState(master_key=KEY)}, journal_write_data=True, max_frame_bytes=1 << 20,
                      reply=lambda ident, frames: replies.append(decode_response([bytes(f) for f in frames])),
                      outbox=out)
    return core, out, replies


def test_server_holds_adds_under_pressure_and_replays_them_in_order() -> None:
    core, out, replies = server()
    core.on_message(IndexPressure(True), 0.0)
    for eid in range(3):
        core.on_request(b"peer", add(1, eid, rid=10 + eid), 0.0)
    assert out.take(kind=AppendBatch) == [] and replies == [], "held, neither stored nor answered"
    core.on_request(b"peer", encode(w.ReadLacRequest(rid=99, ledger_id=1)), 0.0)  # other requests go on
    assert [type(r) for r in replies] == [w.ReadLacResponse]
    core.on_message(IndexPressure(False), 0.0)
    batches = out.take(kind=AppendBatch)
    assert [b.entry_ids for b in batches] == [[0], [1], [2]], "replayed in arrival order"
    assert not core.held and core.held_bytes == 0


def test_held_adds_are_bounded_beyond_which_they_are_refused(monkeypatch: Any) -> None:
    monkeypatch.setattr(limits, "server_held_adds_max", 2)
    core, out, replies = server()
    core.on_message(IndexPressure(True), 0.0)
    for eid in range(3):
        core.on_request(b"peer", add(1, eid, rid=eid), 0.0)
    assert [(r.rid, r.status) for r in replies] == [(2, Status.ETOOMANYREQUESTS)]
    core.on_message(IndexPressure(False), 0.0)
    assert [b.entry_ids for b in out.take(kind=AppendBatch)] == [[0], [1]]


def test_index_turns_pressure_on_at_twice_the_bound_and_off_after_a_checkpoint(tmp_path: Path) -> None:
    cache = LedgerCache([str(tmp_path)], bytes_max=4 * PAGE_BYTES)
    out = ListOutbox()
    core = IndexCore(cache, outbox=out, flush_interval_s=3600.0, persist_marks=lambda marks: None)
    lid = 0
    # One new ledger with one entry = a new-page delta of one slot (LedgerCache, "New pages").
    per_ledger = DELTA_PAGE_BYTES + DELTA_SLOT_BYTES
    while not out.take(dest="server", kind=IndexPressure):
        lid += 1
        core.on_message(IndexPut([lid], [0], [lid * 100]), 0.0)
        assert lid <= 2 * cache.bytes_max // per_ledger + 1, "no pressure although dirty bytes passed twice the bound"
    assert cache.dirty_bytes >= 2 * cache.bytes_max
    assert len(out.take(dest="entrylogger", kind=StartCheckpoint)) == 1, "a checkpoint is already on its way"
    core.on_message(IndexPut([lid + 1], [0], [1]), 0.0)  # more puts while the checkpoint runs
    assert out.take(dest="server", kind=IndexPressure) == [], "sent once"
    core.on_message(Checkpoint(core.cp_in_flight or 0, ((0, 0),)), 1.0)
    assert [p.on for p in out.take(dest="server", kind=IndexPressure)] == [False]
    assert cache.dirty_bytes == 0 and core.pressure is False
    cache.close()  # its hundreds of index files: the suite runs in one process
