"""The journal written with O_DIRECT (zbk/storage/journal.py, "Direct I/O"): the same records
on disk as buffered writes, replay after a crash, recycled segments, preallocation, and
buffered writes where the file system refuses O_DIRECT."""

from __future__ import annotations

import logging
import os
import random

import pytest
from helpers.directio import RefusingDirectDisk, refuse_direct_opens

from zbk.storage.disk import O_DIRECT
from zbk.storage.entrylogformat import encode_records
from zbk.storage.journal import (
    DIRECT_BLOCK_BYTES,
    HEADER_BYTES,
    START,
    JournalWriter,
    RecordType,
    list_free,
    list_segments,
    replay,
    segment_name,
)


def _crash(w: JournalWriter) -> None:
    """Drop the writer as kill -9 would: no closing batch, no seal."""
    w._close_direct()
    os.close(w._fd)
    w._fd = -1


def _records(rng: random.Random, n: int) -> list[tuple[int, int, bytes]]:
    """Records whose sizes cross block boundaries at every offset: 1 byte to 9 KiB."""
    return [(rng.randrange(1, 50), i, rng.randbytes(rng.choice([1, 17, 500, 1024, 4071, 4096, 9000])))
            for i in range(n)]


def _write(w: JournalWriter, recs: list[tuple[int, int, bytes]], rng: random.Random) -> None:
    """The records in group commits of 1 to 6 records, some as one ADDS record."""
    i = 0
    while i < len(recs):
        k = rng.randrange(1, 7)
        chunk = recs[i:i + k]
        if rng.random() < 0.5:
            w.append_records(encode_records([r[0] for r in chunk], [r[1] for r in chunk], [r[2] for r in chunk]),
                             len(chunk))
        else:
            for lid, eid, blob in chunk:
                w.append(RecordType.ADD, lid, eid, blob)
        w.sync()
        if rng.random() < 0.3:
            w.preallocate()
        i += k


def _replayed(directory) -> list[tuple[int, int, bytes]]:
    return [(r.ledger_id, r.entry_id, r.payload) for r, _ in replay(str(directory), START)]


def test_direct_writes_put_the_same_bytes_on_disk_as_buffered_ones(ddir):
    rng = random.Random(7)
    recs = _records(rng, 300)
    files = {}
    for direct in (False, True):
        d = ddir / ("direct" if direct else "buffered")
        w = JournalWriter(str(d), 64 << 20, direct_io=direct, preallocate_bytes=64 << 10)
        assert (w._dfd >= 0) is direct
        _write(w, recs, random.Random(11))  # the same batches on both sides
        end = w._offset
        _crash(w)
        with open(d / segment_name(1), "rb") as f:
            files[direct] = f.read()
        # Past the records: zeros only (padding or preallocation), which replay reads as the end.
        assert not files[direct][end:].strip(b"\0")
        assert _replayed(d) == recs
    assert files[True][:end] == files[False][:end]


def test_a_crash_keeps_every_synced_record_and_a_reopened_journal_goes_on(ddir):
    rng = random.Random(3)
    recs = _records(rng, 120)
    w = JournalWriter(str(ddir), 64 << 20, direct_io=True)
    _write(w, recs[:60], rng)
    w.append(RecordType.ADD, 1, 999, b"never synced")  # in memory only at the crash
    _crash(w)
    assert _replayed(ddir) == recs[:60]
    # The next writer (as after a restart) starts a new segment, also direct.
    w = JournalWriter(str(ddir), 64 << 20, direct_io=True)
    assert w._dfd >= 0 and w.segment_id == 2
    _write(w, recs[60:], rng)
    w.close()
    assert _replayed(ddir) == recs


def _fill_until(w: JournalWriter, segment_id: int, written: list[tuple[int, int, bytes]], sizes: list[int],
                rng: random.Random) -> None:
    """One ADD per sync, each of one of ``sizes``, until the writer is on ``segment_id``."""
    while w.segment_id < segment_id:
        rec = (9, len(written), rng.randbytes(rng.choice(sizes)))
        w.append(RecordType.ADD, *rec)
        w.sync()
        written.append(rec)


def test_recycled_segments_written_direct_never_replay_their_old_records(ddir):
    rng = random.Random(5)
    w = JournalWriter(str(ddir), HEADER_BYTES + 40_000, direct_io=True, reuse_files=2, preallocate_bytes=16 << 10)
    written: list[tuple[int, int, bytes]] = []
    _fill_until(w, 4, written, [100, 3000, 5000], rng)
    # Retire segments 1-3 (as a checkpoint past them would) and write on from free files.
    w.delete_segments_before(w.synced_mark)
    assert list_free(str(ddir)) == [2, 3]
    first_new = len(written)
    _fill_until(w, 6, written, [10, 700, 4096], rng)
    assert list_free(str(ddir)) == []  # segments 5 and 6 were made from them
    last = w.segment_id
    # A short batch into the recycled file: its tail block is padded with zeros, and the old
    # records after that must not replay.
    n = len(written)
    w.append(RecordType.ADD, 9, n, b"x")
    w.sync()
    written.append((9, n, b"x"))
    _crash(w)
    assert w.segment_id == last
    assert list_segments(str(ddir)) == [4, 5, 6]
    got = _replayed(ddir)
    assert got == [r for r in written if r[1] >= got[0][1]]
    assert got[-1] == (9, n, b"x") and got[0][1] <= first_new


def test_preallocation_writes_whole_blocks_past_the_records(ddir):
    w = JournalWriter(str(ddir), 64 << 20, direct_io=True, preallocate_bytes=64 << 10)
    path = ddir / segment_name(1)
    for i in range(40):
        w.append(RecordType.ADD, 1, i, b"e" * 3000)
        w.sync()
        w.preallocate()
        size = os.path.getsize(path)
        assert size % DIRECT_BLOCK_BYTES == 0 and size >= w._offset
    w.close()  # sealed: cut back to the last batch
    assert os.path.getsize(path) == w._offset
    assert [r[1] for r in _replayed(ddir)] == list(range(40))


def test_a_file_system_refusing_o_direct_at_the_open_gets_buffered_writes(tmp_path, monkeypatch, caplog):
    refuse_direct_opens(monkeypatch)
    with caplog.at_level(logging.INFO, logger="zbk.storage.journal"):
        w = JournalWriter(str(tmp_path), 64 << 20, direct_io=True)
    assert w._dfd < 0
    assert "refuses O_DIRECT" in caplog.text
    w.append(RecordType.ADD, 1, 0, b"a" * 100)
    w.sync()
    w.close()
    assert _replayed(tmp_path) == [(1, 0, b"a" * 100)]


@pytest.mark.skipif(not O_DIRECT, reason="no O_DIRECT on this platform")
def test_a_refused_first_direct_write_falls_back_to_buffered_and_loses_nothing(ddir, caplog):
    w = JournalWriter(str(ddir), 64 << 20, disk=RefusingDirectDisk(), direct_io=True)
    assert w._dfd >= 0
    with caplog.at_level(logging.INFO, logger="zbk.storage.journal"):
        for i in range(5):
            w.append(RecordType.ADD, 1, i, b"b" * 1500)
            w.sync()
    assert w._dfd < 0 and "O_DIRECT writes refused" in caplog.text
    w.close()
    assert [r[1] for r in _replayed(ddir)] == list(range(5))
