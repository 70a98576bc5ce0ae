"""Journal recycling (format version 2): retired segments become free files, the next
segments are made from them in place, and their old records never replay."""

from __future__ import annotations

import logging
import os
import struct

from crc32c import crc32c

from zbk.storage.journal import (
    BATCH_MAGIC,
    FREE_SUFFIX,
    HEADER_BYTES,
    RECORD_HEADER_BYTES,
    START,
    JournalWriter,
    LogMark,
    RecordType,
    list_free,
    list_segments,
    replay,
    segment_name,
    segment_seed,
)


def _fill(w: JournalWriter, upto_segment: int, payload: bytes = b"p" * 200) -> int:
    """One ADD per sync until the writer is on ``upto_segment``; returns how many."""
    n = 0
    while w.segment_id < upto_segment:
        w.append(RecordType.ADD, 7, n, payload)
        w.sync()
        n += 1
    return n


def _entries(directory: str, mark: LogMark = START) -> list[tuple[int, int]]:
    return [(r.ledger_id, r.entry_id) for r, _ in replay(directory, mark)]


def _crash(w: JournalWriter) -> None:
    """Drop the writer as kill -9 would: no closing batch, no seal."""
    os.close(w._fd)
    w._fd = -1


def test_retired_segments_are_kept_for_reuse_up_to_the_limit(tmp_path):
    d = str(tmp_path)
    w = JournalWriter(d, 4096, reuse_files=2, preallocate_bytes=0)
    _fill(w, 6)
    assert list_segments(d) == [1, 2, 3, 4, 5, 6]
    assert w.delete_segments_before(w.mark) == [1, 2, 3, 4, 5]
    # The newest two are kept, renamed out of the log; the others are gone.
    assert list_free(d) == [4, 5] and list_segments(d) == [6] and w.free_segments == 2
    assert sorted(os.listdir(d)) == [segment_name(4) + FREE_SUFFIX, segment_name(5) + FREE_SUFFIX,
                                     segment_name(6)]
    w.append(RecordType.FENCE, 3)
    w.sync()
    w.close()
    assert _entries(d) == [(3, -1)]  # free files are not part of the log


def test_next_segments_are_made_from_free_files_in_place(tmp_path):
    d = str(tmp_path)
    w = JournalWriter(d, 4096, reuse_files=2, preallocate_bytes=0)
    _fill(w, 4)
    inode = {s: os.stat(os.path.join(d, segment_name(s))).st_ino for s in (2, 3)}
    mark = w.mark
    w.delete_segments_before(mark)
    assert list_free(d) == [2, 3]
    # The newest free file becomes segment 5, then the other one segment 6.
    written = []
    n = 0
    while w.segment_id < 6:
        w.append(RecordType.ADD, 8, n, b"q" * 300)
        w.sync()
        written.append((8, n))
        n += 1
    assert os.stat(os.path.join(d, segment_name(5))).st_ino == inode[3]
    assert os.stat(os.path.join(d, segment_name(6))).st_ino == inode[2]
    assert list_free(d) == []
    w.append(RecordType.ADD, 8, n, b"q" * 10)
    w.sync()
    written.append((8, n))
    w.close()
    assert _entries(d, mark) == written


def test_old_records_at_a_record_boundary_never_replay(tmp_path, caplog):
    """The new segment's last record ends exactly where an old record of the recycled file
    begins, a record whose CRC is valid for its own segment: only the seed keeps it out."""
    d = str(tmp_path)
    w = JournalWriter(d, 200, reuse_files=1, preallocate_bytes=0)
    # Segments 1 and 2: batches of one ADD with an 8-byte payload (33 bytes: a BATCH
    # record's size), three per segment (24 + 3 * 66 >= 200 rotates).
    eid = 0
    while w.segment_id < 3:
        w.append(RecordType.ADD, 1, eid, b"old-data")
        w.sync()
        eid += 1
        if w.segment_id == 2 and not list_free(d):
            w.delete_segments_before(w.mark)  # segment 1 becomes the free file
    assert eid == 6 and list_free(d) == []
    # Segment 3 was made from segment 1's file: one batch of two such records, then a
    # crash. The records end at 24 + 33 + 66 = 123, where segment 1's second batch has its
    # ADD record.
    w.append(RecordType.ADD, 2, 0, b"new-data")
    w.append(RecordType.ADD, 2, 1, b"new-data")
    w.sync()
    end = w.mark.offset
    _crash(w)
    path = os.path.join(d, segment_name(3))
    data = open(path, "rb").read()
    assert end == HEADER_BYTES + 33 + 2 * 33 and len(data) > end
    length, crc = struct.unpack_from("<II", data, end)
    body = data[end + 8:end + 8 + length]
    assert body[0] == RecordType.ADD and body.endswith(b"old-data")
    assert crc == crc32c(body, segment_seed(1)), "the old record is valid in its own segment"
    with caplog.at_level(logging.WARNING):
        assert [e for lid, e in _entries(d, LogMark(3, 0))] == [0, 1]
    assert os.path.getsize(path) == end  # cut back to the new records
    assert any("recycled segment" in m for m in caplog.messages)


def test_a_checkpoint_mark_and_replay_across_recycled_segments(tmp_path):
    """Marks, rotation and replay behave as with new files over several reuse cycles."""
    d = str(tmp_path)
    w = JournalWriter(d, 3000, reuse_files=3, preallocate_bytes=0)
    expected: list[tuple[int, int]] = []
    mark = w.mark
    for cycle in range(6):
        for eid in range(40):
            w.append(RecordType.ADD, cycle, eid, bytes([cycle]) * (50 + eid))
            w.sync()
            expected.append((cycle, eid))
        assert _entries(d, mark) == expected
        mark = w.mark
        expected = []
        w.delete_segments_before(mark)
        assert len(list_free(d)) <= 3
    w.append(RecordType.ADD, 99, 0, b"last")
    w.sync()
    _crash(w)
    assert _entries(d, mark) == [(99, 0)]


def test_free_files_of_an_earlier_process_are_removed(tmp_path):
    """After a reboot their pages are not cached: a new writer starts a new pool."""
    for reuse in (4, 0):
        d = str(tmp_path / str(reuse))
        w = JournalWriter(d, 4096, reuse_files=4, preallocate_bytes=0)
        _fill(w, 4)
        w.delete_segments_before(w.mark)
        w.close()
        assert list_free(d) == [1, 2, 3]
        w = JournalWriter(d, 4096, reuse_files=reuse, preallocate_bytes=0)
        assert list_free(d) == [] and w.segment_id == 5
        assert os.path.getsize(os.path.join(d, segment_name(5))) == HEADER_BYTES  # a new file
        w.delete_segments_before(w.mark)  # segment 4 is the earlier writer's: removed too
        assert list_free(d) == [] and list_segments(d) == [5]
        w.close()


def test_segments_of_an_earlier_process_are_removed_not_kept(tmp_path):
    d = str(tmp_path)
    w = JournalWriter(d, 4096, reuse_files=4, preallocate_bytes=0)
    _fill(w, 3)
    w.close()
    assert list_segments(d) == [1, 2, 3]
    w = JournalWriter(d, 4096, reuse_files=4, preallocate_bytes=0)  # after replay, at boot
    assert w.delete_segments_before(w.mark) == [1, 2, 3]
    assert list_free(d) == [] and list_segments(d) == [4]
    _fill(w, 6)
    assert w.delete_segments_before(w.mark) == [4, 5]
    assert list_free(d) == [4, 5]
    w.close()


def _v1_segment(path: str, sid: int, records: list[tuple[int, int, bytes]]) -> None:
    """A segment as a version-1 bookie wrote it: plain (unseeded) CRCs."""
    head = struct.pack("<8sIQ", b"ZBKJRNL\x00", 1, sid)
    out = bytearray(head + struct.pack("<I", crc32c(head)))
    batch = struct.pack("<BQq", RecordType.BATCH, sid, HEADER_BYTES) + BATCH_MAGIC
    out += struct.pack("<II", len(batch), crc32c(batch)) + batch
    for lid, eid, payload in records:
        body = struct.pack("<BQq", RecordType.ADD, lid, eid) + payload
        out += struct.pack("<II", len(body), crc32c(body)) + body
    with open(path, "wb") as f:
        f.write(out)


def test_version_1_segments_are_still_read(tmp_path):
    d = str(tmp_path)
    _v1_segment(os.path.join(d, segment_name(1)), 1, [(5, 0, b"a" * 30), (5, 1, b"b" * 40)])
    assert _entries(d) == [(5, 0), (5, 1)]
    w = JournalWriter(d, 4096, reuse_files=2)
    assert w.segment_id == 2
    w.append(RecordType.ADD, 5, 2, b"c")
    w.sync()
    w.close()
    assert _entries(d) == [(5, 0), (5, 1), (5, 2)]
    # Retired by a writer of this version, it is removed rather than reused.
    w = JournalWriter(d, 4096, reuse_files=2)
    assert w.delete_segments_before(LogMark(3, 0)) == [1, 2]
    assert list_free(d) == [] and list_segments(d) == [3]
    w.close()


def test_record_crcs_differ_between_segments():
    seeds = {segment_seed(sid) for sid in range(1, 5000)}
    assert len(seeds) == 4999 and 0 not in seeds
    assert segment_seed(7, version=1) == 0
    assert RECORD_HEADER_BYTES == 25
