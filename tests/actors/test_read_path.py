"""The bookie's read path between actors: IndexSyncer (Lookup -> ReadLocations) and
EntryLogger (ReadLocations -> ReadResult), contiguous and sparse, with a damaged record."""

from __future__ import annotations

import os
from pathlib import Path

from zbk.actors.base import ListOutbox
from zbk.actors.entrylogger import EntryLoggerCore
from zbk.actors.indexsyncer import IndexCore
from zbk.actors.messages import Lookup, ReadLocations, ReadResult
from zbk.storage.entrylog import RECORD_HEADER_BYTES, EntryLogWriter, log_name, split_location
from zbk.storage.ledgercache import LedgerCache


def _blob(lid: int, eid: int) -> bytes:
    return f"{lid}:{eid}:".encode() * (50 + eid % 7)


def _setup(tmp_path: Path, held: dict[int, list[int]]) -> tuple[IndexCore, EntryLoggerCore, ListOutbox, dict]:
    logs = EntryLogWriter([str(tmp_path / "ledgers")], 1 << 20, 8192)
    cache = LedgerCache([str(tmp_path / "index")])
    where = {}
    for eid in range(max(max(v) for v in held.values()) + 1):  # ledgers interleaved in the log
        for lid, ids in held.items():
            if eid in ids:
                where[(lid, eid)] = loc = logs.append(lid, eid, _blob(lid, eid))
                cache.put(lid, eid, loc)
    out = ListOutbox()
    index = IndexCore(cache, outbox=out, flush_interval_s=60, persist_marks=lambda _m: None)
    el = EntryLoggerCore(logs, outbox=out)
    return index, el, out, where


def _read(index: IndexCore, el: EntryLoggerCore, out: ListOutbox, lid: int, first: int, count: int,
          sparse: bool = False) -> tuple[ReadLocations, ReadResult]:
    index.on_message(Lookup(ctx=1, ledger_id=lid, first_entry_id=first, count=count, bytes_max=8 << 20,
                            sparse=sparse), 0.0)
    (locs,) = out.take("entrylogger", ReadLocations)
    el.on_message(locs, 0.0)
    (res,) = out.take("server", ReadResult)
    return locs, res


def test_contiguous_and_sparse_range_reads(tmp_path: Path) -> None:
    held = {1: list(range(0, 300)), 2: [e for e in range(300) if e % 3 != 1]}
    index, el, out, _ = _setup(tmp_path, held)
    locs, res = _read(index, el, out, 1, 10, 200)
    assert locs.entry_ids is None and [bytes(b) for b in res.blobs] == [_blob(1, e) for e in range(10, 210)]
    assert not res.error and res.ledger_known
    # Not sparse: the contiguous prefix (ledger 2 lacks entry 1).
    _, res = _read(index, el, out, 2, 0, 50)
    assert [bytes(b) for b in res.blobs] == [_blob(2, 0)] and not res.error
    # Sparse: every held entry of the range, each checked against its own entry id.
    locs, res = _read(index, el, out, 2, 0, 50, sparse=True)
    want = [e for e in range(50) if e % 3 != 1]
    assert locs.entry_ids == want and [bytes(b) for b in res.blobs] == [_blob(2, e) for e in want]
    _, res = _read(index, el, out, 3, 0, 10)
    assert res.blobs == [] and not res.ledger_known and not res.error
    el.logs.close()


def test_a_damaged_record_stops_the_range_there_with_an_error(tmp_path: Path) -> None:
    index, el, out, where = _setup(tmp_path, {1: list(range(100))})
    el.logs.close()  # everything on disk and sealed
    log_id, offset = split_location(where[(1, 40)])
    path = tmp_path / "ledgers" / log_name(log_id)
    with open(path, "r+b") as f:
        f.seek(offset + RECORD_HEADER_BYTES + 5)
        b = f.read(1)
        f.seek(offset + RECORD_HEADER_BYTES + 5)
        f.write(bytes([b[0] ^ 0x01]))
    el.logs = EntryLogWriter([str(tmp_path / "ledgers")], 1 << 20, 8192)
    _, res = _read(index, el, out, 1, 0, 100)
    assert [bytes(b) for b in res.blobs] == [_blob(1, e) for e in range(40)]
    assert str(path) in res.error and f"offset {offset}" in res.error
    _, res = _read(index, el, out, 1, 41, 59)  # the neighbours after it are served
    assert [bytes(b) for b in res.blobs] == [_blob(1, e) for e in range(41, 100)] and not res.error
    el.logs.close()
    assert os.path.exists(path)
