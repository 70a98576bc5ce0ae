"""The bookie's read path between actors: IndexSyncer (Lookup -> ReadLocations) and
EntryLogger (ReadLocations -> ReadResult), contiguous and sparse, with a damaged record; the
EntryLogger serving reads a slice at a time, with appends between the slices."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from zbk.actors.base import ListOutbox
from zbk.actors.entrylogger import EntryLoggerCore
from zbk.actors.indexsyncer import IndexCore
from zbk.actors.messages import (
    AppendBatch,
    Appended,
    LogStats,
    LogStatsRequest,
    Lookup,
    ReadLocations,
    ReadResult,
)
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
          sparse: bool = False, stripe: tuple[int, int] | None = None) -> tuple[ReadLocations, ReadResult]:
    index.on_message(Lookup(ctx=1, ledger_id=lid, first_entry_id=first, count=count, bytes_max=8 << 20,
                            sparse=sparse, stripe=stripe), 0.0)
    (locs,) = out.take("entrylogger", ReadLocations)
    el.on_message(locs, 0.0)
    el.finish_reads()
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
    # A stripe of it: the held entries whose id % 3 is the residue, whatever the range's start.
    for first, residue in ((0, 0), (0, 1), (0, 2), (1, 0), (5, 2), (7, 0)):
        locs, res = _read(index, el, out, 2, first, 50, sparse=True, stripe=(3, residue))
        want = [e for e in range(first, first + 50) if e % 3 == residue and e % 3 != 1]
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


def _locations(cache: LedgerCache, lid: int, entries: range, bytes_max: int = 8 << 20, ctx: int = 1) -> ReadLocations:
    """The ReadLocations the IndexSyncer sends for a read of ``entries``."""
    out = ListOutbox()
    index = IndexCore(cache, outbox=out, flush_interval_s=60, persist_marks=lambda _m: None)
    index.on_message(Lookup(ctx=ctx, ledger_id=lid, first_entry_id=entries[0], count=len(entries),
                            bytes_max=bytes_max), 0.0)
    (locs,) = out.take("entrylogger", ReadLocations)
    return locs


Sliced = tuple[EntryLoggerCore, ListOutbox, LedgerCache]


@pytest.fixture
def sliced(tmp_path: Path) -> Iterator[Sliced]:
    index, el, out, _ = _setup(tmp_path, {1: list(range(300)), 2: list(range(20))})
    el.read_slice_bytes = 4096  # about 25 entries of _blob's sizes
    yield el, out, index.cache
    el.logs.close()


def test_an_append_behind_a_large_read_waits_for_one_slice_not_the_read(sliced: Sliced) -> None:
    el, out, cache = sliced
    el.on_message(_locations(cache, 1, range(300)), 0.0)
    el.serve_read_slice()
    assert not out.take("server", ReadResult) and len(el.reads) == 1
    el.on_message(AppendBatch(7, [3], [0], [b"late"], journal=False), 0.0)
    assert [a.batch_id for a in out.take("server", Appended)] == [7]  # before the read is done
    el.finish_reads()
    (res,) = out.take("server", ReadResult)
    assert [bytes(b) for b in res.blobs] == [_blob(1, e) for e in range(300)] and not res.error


def test_reads_take_turns_so_a_small_one_is_not_held_behind_a_large_one(sliced: Sliced) -> None:
    el, out, cache = sliced
    el.on_message(_locations(cache, 1, range(300), ctx=1), 0.0)
    el.on_message(_locations(cache, 2, range(3), ctx=2), 0.0)
    el.serve_read_slice()
    el.serve_read_slice()
    assert [r.ctx for r in out.take("server", ReadResult)] == [2]
    el.finish_reads()
    assert [r.ctx for r in out.take("server", ReadResult)] == [1]


def test_any_message_but_an_append_finds_every_earlier_read_answered(sliced: Sliced) -> None:
    """The IndexSyncer sends DeleteLogs behind every read location it handed out (the GC's
    proof, zbk/actors/gc.py): a log must not go while a read of it is half served."""
    el, out, cache = sliced
    el.on_message(_locations(cache, 1, range(300)), 0.0)
    el.serve_read_slice()
    el.on_message(LogStatsRequest(5), 0.0)
    assert [type(m) for _, m in out.sent] == [ReadResult, LogStats] and not el.reads
    assert len(out.sent[0][1].blobs) == 300


@pytest.mark.parametrize("seed", range(40))
def test_slices_add_up_to_what_one_read_returns(tmp_path: Path, seed: int) -> None:
    """Whatever the slice and the request's bytes_max, the sliced read answers exactly what
    one read_entries call over all the locations returns: the same entries, stopping at the
    same place, with the same error (some seeds damage a record)."""
    rng = random.Random(seed)
    first = rng.randrange(100)
    logs = EntryLogWriter([str(tmp_path / "ledgers")], 1 << 20, 8192)
    cache = LedgerCache([str(tmp_path / "index")])
    sizes = [rng.choice([10, 300, 1000, 5000, 70_000]) for _ in range(120)]
    where = [logs.append(1, eid, rng.randbytes(size)) for eid, size in enumerate(sizes)]
    for eid, loc in enumerate(where):
        cache.put(1, eid, loc)
    if rng.random() < 0.5:  # sealed and on disk, else partly still in the write buffer
        logs.close()
        if rng.random() < 0.5:
            log_id, offset = split_location(where[first + rng.randrange(4)])
            with open(tmp_path / "ledgers" / log_name(log_id), "r+b") as f:
                f.seek(offset + RECORD_HEADER_BYTES + 3)
                b = f.read(1)
                f.seek(offset + RECORD_HEADER_BYTES + 3)
                f.write(bytes([b[0] ^ 0x01]))
        logs = EntryLogWriter([str(tmp_path / "ledgers")], 1 << 20, 8192)
    out = ListOutbox()
    el = EntryLoggerCore(logs, outbox=out)
    try:
        el.read_slice_bytes = rng.choice([1, 500, 4096, 100_000])
        locs = _locations(cache, 1, range(first, 120), bytes_max=rng.choice([1, 2000, 60_000, 200_000, 8 << 20]))
        want = logs.read_entries(1, locs.ids(), locs.locations, locs.bytes_max)
        el.on_message(locs, 0.0)
        while el.reads:
            el.serve_read_slice()
        (res,) = out.take("server", ReadResult)
        assert [bytes(b) for b in res.blobs] == [bytes(b) for b in want.blobs]
        assert res.error == (str(want.error) if want.error else "")
    finally:
        logs.close()
