"""Journal: framing, group commit, rotation, replay and the torn-tail rule."""

from __future__ import annotations

import logging
import os
import random
import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from zbk import limits
from zbk.errors import BookieIOError, CorruptDataError
from zbk.storage.disk import FaultyDisk
from zbk.storage.entrylogformat import encode_records
from zbk.storage.journal import (
    BATCH_RECORD_BYTES,
    HEADER_BYTES,
    RECORD_HEADER_BYTES,
    START,
    JournalRecord,
    JournalWriter,
    LogMark,
    RecordType,
    list_segments,
    replay,
    segment_name,
    segment_seed,
)

from .helpers import cut, flip_byte

Rec = tuple[RecordType, int, int, bytes]


def _records(n: int, rng: random.Random | None = None) -> list[Rec]:
    rng = rng or random.Random(7)
    kinds = [RecordType.ADD, RecordType.ADD, RecordType.FENCE, RecordType.MASTER_KEY,
             RecordType.LIMBO, RecordType.EXPLICIT_LAC]
    out: list[Rec] = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        payload = rng.randbytes(rng.randrange(0, 300)) if kind in (RecordType.ADD, RecordType.MASTER_KEY) else b""
        out.append((kind, rng.randrange(1 << 40), i, payload))
    return out


def _write(directory: str, recs: list[Rec], per_batch: int = 5, segment_bytes_max: int = 1 << 20,
           close: bool = True, adds: bool = False) -> tuple[JournalWriter, list[LogMark]]:
    """Write ``recs`` in batches; returns the writer and the mark returned by each sync.
    With ``adds``, each run of ADD records in a batch goes in one ADDS record, as a bookie
    writes an add request's entries."""
    w = JournalWriter(directory, segment_bytes_max)
    marks = []
    for i in range(0, len(recs), per_batch):
        run: list[Rec] = []
        for rec in [*recs[i:i + per_batch], None]:
            if adds and rec is not None and rec[0] == RecordType.ADD:
                run.append(rec)
                continue
            if run:
                w.append_records(encode_records([r[1] for r in run], [r[2] for r in run], [r[3] for r in run]),
                                 len(run))
                run = []
            if rec is not None:
                w.append(*rec)
        marks.append(w.sync())
    if close:
        w.close()
    return w, marks


def _replayed(directory: str, mark: LogMark = START) -> list[tuple[JournalRecord, LogMark]]:
    return list(replay(directory, mark))


def _start_of(rec: JournalRecord, end: LogMark) -> int:
    return end.offset - RECORD_HEADER_BYTES - len(rec.payload)


def test_round_trip_yields_every_record_with_increasing_marks(tmp_path):
    recs = _records(50)
    w, marks = _write(str(tmp_path), recs)
    out = _replayed(str(tmp_path))
    assert [tuple(r) for r, _ in out] == recs
    ends = [m for _, m in out]
    assert ends == sorted(ends) and len(set(ends)) == len(ends)
    assert ends[-1] == marks[-1]  # the mark sync() returned is the mark after the last record


def test_sync_is_one_write_and_one_fsync(tmp_path):
    disk = FaultyDisk()
    w = JournalWriter(str(tmp_path), 1 << 20, disk)
    writes, fsyncs = disk.writes, disk.fsyncs
    for i in range(100):
        assert w.append(RecordType.ADD, 1, i, b"x" * 1024) == (i + 1) * (RECORD_HEADER_BYTES + 1024)
    mark = w.sync()
    assert (disk.writes - writes, disk.fsyncs - fsyncs) == (1, 1)
    assert w.pending_bytes == 0 and mark == w.synced_mark
    assert w.sync() == mark  # nothing pending: no write, no fsync
    assert (disk.writes - writes, disk.fsyncs - fsyncs) == (1, 1)
    w.close()


def test_an_adds_record_replays_as_one_add_per_entry_with_the_mark_after_it(tmp_path):
    rng = random.Random(11)
    ids = [0, 1, 5, 2**62, 7]
    blobs = [rng.randbytes(n) for n in (0, 1, 300, 1024, 17)]
    records = encode_records([42] * len(ids), ids, blobs)
    d = str(tmp_path)
    w = JournalWriter(d, 1 << 20)
    w.append(RecordType.FENCE, 3)
    before = w.pending_bytes
    assert w.append_records(records, len(ids)) == before + RECORD_HEADER_BYTES + len(records) == w.pending_bytes
    w.append(RecordType.FENCE, 4)
    w.sync()
    w.close()
    got = _replayed(d)
    assert [tuple(r) for r, _ in got] == ([(RecordType.FENCE, 3, -1, b"")]
                                          + [(RecordType.ADD, 42, e, b) for e, b in zip(ids, blobs, strict=True)]
                                          + [(RecordType.FENCE, 4, -1, b"")])
    marks = [m for _, m in got]
    assert marks[0] < marks[1] == marks[5] < marks[6]  # the adds share the mark after their record
    assert marks[5].offset - marks[0].offset == RECORD_HEADER_BYTES + len(records)


def test_append_records_refuses_counts_its_bytes_cannot_hold(tmp_path):
    w = JournalWriter(str(tmp_path), 1 << 20)
    records = encode_records([1, 1], [0, 1], [b"a", b"b"])
    for count in (0, -1, 3):
        with pytest.raises(ValueError):
            w.append_records(records, count)
    assert w.pending_bytes == 0
    w.close()


def test_a_batch_larger_than_a_record_is_split_between_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "journal_record_bytes_max", 3000)
    blobs = [bytes([i]) * 1024 for i in range(10)]
    d = str(tmp_path)
    w = JournalWriter(d, 1 << 20)
    w.append_records(encode_records([9] * 10, list(range(10)), blobs), 10)
    w.sync()
    w.close()
    got = _replayed(d)
    assert [(r.type, r.ledger_id, r.entry_id, r.payload) for r, _ in got] == [
        (RecordType.ADD, 9, i, b) for i, b in enumerate(blobs)]
    # Two 1,048-byte entry records fit in 3,000 bytes, three do not: five ADDS records.
    assert [m for _, m in got][::2] == [m for _, m in got][1::2] and len({m for _, m in got}) == 5
    w = JournalWriter(d, 1 << 20)
    for count in (9, 11):
        with pytest.raises(ValueError, match="hold 10 entry records"):
            w.append_records(encode_records([9] * 10, list(range(10)), blobs), count)
    with pytest.raises(ValueError, match="larger than a journal record may be"):  # replay would refuse it
        w.append_records(encode_records([9, 9], [10, 11], [b"x" * 100, b"y" * 3000]), 2)
    assert w.pending_bytes == 0
    w.close()


def _adds_record_written(d: str, records: bytes | bytearray, count: int) -> None:
    w = JournalWriter(d, 1 << 20)
    w.append_records(records, count)
    w.sync()
    w.close()


def test_an_entry_record_that_fails_its_crc_inside_a_sound_adds_record_is_corruption(tmp_path):
    records = encode_records([1, 1, 1], [0, 1, 2], [b"a" * 50, b"b" * 50, b"c" * 50])
    records[74 + 30] ^= 0x01  # the second entry's blob: its own crc fails, the record's is made after
    _adds_record_written(str(tmp_path), records, 3)
    with pytest.raises(CorruptDataError, match="entry log record is corrupt"):
        _replayed(str(tmp_path))


def test_an_adds_record_whose_count_is_wrong_is_corruption(tmp_path):
    _adds_record_written(str(tmp_path), encode_records([1, 1, 1], [0, 1, 2], [b"a", b"b", b"c"]), 2)
    with pytest.raises(CorruptDataError, match="holds 3 entries where it says 2"):
        _replayed(str(tmp_path))


def _as_version_2(path: str) -> None:
    """Rewrite a segment's header to say format version 2, as the previous release wrote."""
    with open(path, "r+b") as f:
        magic, _, sid = struct.unpack("<8sIQ", f.read(20))
        head = struct.pack("<8sIQ", magic, 2, sid)
        f.seek(0)
        f.write(head + struct.pack("<I", crc32c(head)))


def test_version_2_segments_are_still_read_and_hold_no_adds_records(tmp_path):
    d = str(tmp_path / "v2")
    w = JournalWriter(d, 1 << 20)
    for e in range(3):
        w.append(RecordType.ADD, 5, e, b"x" * 10)
    w.sync()
    w.close()
    _as_version_2(os.path.join(d, segment_name(1)))
    assert [(r.type, r.entry_id) for r, _ in _replayed(d)] == [(RecordType.ADD, 0), (RecordType.ADD, 1),
                                                               (RecordType.ADD, 2)]
    bad = str(tmp_path / "adds-in-v2")
    _adds_record_written(bad, encode_records([1], [0], [b"a"]), 1)
    _as_version_2(os.path.join(bad, segment_name(1)))
    with pytest.raises(CorruptDataError, match="ADDS record in a version 2 segment"):
        _replayed(bad)


def test_sync_without_fsync_writes_but_does_not_fsync(tmp_path):
    disk = FaultyDisk()
    w = JournalWriter(str(tmp_path), 1 << 20, disk)
    fsyncs = disk.fsyncs
    w.append(RecordType.FENCE, 9)
    mark = w.sync(fsync=False)
    assert disk.fsyncs == fsyncs and w.synced_mark < mark
    assert w.sync(fsync=True) == mark and disk.fsyncs == fsyncs + 1
    w.close()
    assert [r for r, _ in _replayed(str(tmp_path))] == [JournalRecord(RecordType.FENCE, 9, -1, b"")]


def test_rotation_and_delete_segments_before(tmp_path):
    d = str(tmp_path)
    recs = _records(200)
    w, marks = _write(d, recs, per_batch=10, segment_bytes_max=4096)
    segs = list_segments(d)
    assert len(segs) > 3 and segs == list(range(1, len(segs) + 1))
    for sid in segs[:-1]:  # a segment ends at the first sync boundary past the size limit
        assert os.path.getsize(os.path.join(d, segment_name(sid))) < 4096 + 10 * (RECORD_HEADER_BYTES + 300) + 40
    assert [tuple(r) for r, _ in _replayed(d)] == recs
    # Replay from a mark yields exactly the records after it.
    mid = marks[len(marks) // 2]
    after = _replayed(d, mid)
    assert [tuple(r) for r, _ in after] == recs[(len(marks) // 2 + 1) * 10:]
    # A checkpoint at ``mid`` lets everything before its segment go, never the current one.
    w2 = JournalWriter(d, 4096)
    deleted = w2.delete_segments_before(mid)
    assert deleted == [s for s in segs if s < mid.segment_id]
    assert w2.delete_segments_before(LogMark(10**6, 0)) == [s for s in segs if s >= mid.segment_id]
    assert list_segments(d) == [w2.segment_id]
    w2.close()


def test_writer_after_replay_starts_a_new_segment(tmp_path):
    d = str(tmp_path)
    _write(d, _records(10))
    assert len(_replayed(d)) == 10
    w = JournalWriter(d)
    assert w.segment_id == 2 and w.mark == LogMark(2, HEADER_BYTES)
    w.append(RecordType.FENCE, 3)
    w.close()
    assert [r.ledger_id for r, _ in _replayed(d, LogMark(2, 0))] == [3]
    assert len(_replayed(d)) == 11


@pytest.mark.parametrize("adds", [False, True], ids=["add-records", "adds-records"])
def test_torn_tail_at_random_cut_points_is_truncated(tmp_path, rng, caplog, adds):
    recs = _records(40, rng)
    if adds:  # runs of ADD records, which each batch writes as one ADDS record
        recs = [(RecordType.ADD, *r[1:]) if r[0] == RecordType.FENCE else r for r in recs]
    for trial in range(25):
        d = str(tmp_path / f"t{trial}")
        os.makedirs(d)
        per_batch = rng.choice([1, 3, 8])
        _, marks = _write(d, recs, per_batch=per_batch, adds=adds)
        full = _replayed(d)
        assert (len({m for _, m in full}) < len(full)) == (adds and per_batch > 1)  # ADDs share their ADDS's mark
        path = os.path.join(d, segment_name(1))
        size = os.path.getsize(path)
        last_batch_start = marks[-2].offset if len(marks) > 1 else HEADER_BYTES
        cut_at = rng.randrange(last_batch_start, size)
        original = open(path, "rb").read()
        cut(path, cut_at)
        if rng.random() < 0.3:  # power loss may also leave the file extended with zeros
            with open(path, "ab") as f:
                f.write(bytes(rng.randrange(1, 600)))
        damaged = open(path, "rb").read()
        size_before = len(damaged)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            got = _replayed(d)
        # Every record whose bytes (and all before them) survived; zeros written over a
        # record that ended in zeros leave it intact, so compare bytes, not offsets.
        expected = [(r, m) for r, m in full if damaged[:m.offset] == original[:m.offset]]
        assert got == expected, f"cut at {cut_at}"
        kept = expected[-1][1].offset if expected else HEADER_BYTES
        # Cut back to the last complete record (or just after a complete batch header).
        assert os.path.getsize(path) in (kept, kept + BATCH_RECORD_BYTES)
        truncated = os.path.getsize(path) < size_before
        # Cutting off nothing but zeros is dropping unused preallocation, not a torn write:
        # no warning then. Any other cut is a torn tail and says so.
        only_zeros = not damaged[os.path.getsize(path):].strip(b"\0")
        assert (truncated and not only_zeros) == any(path in m and "torn tail" in m for m in caplog.messages)
        caplog.clear()
        assert _replayed(d) == expected  # a second replay is clean and identical
        assert not caplog.messages


def test_bit_flip_in_the_middle_is_corruption_with_path_and_offset(tmp_path, rng):
    d = str(tmp_path)
    _write(d, _records(60, rng))
    full = _replayed(d)
    victim, end = full[20]
    start = _start_of(victim, end)
    flip_byte(os.path.join(d, segment_name(1)), rng.randrange(start, end.offset))
    with pytest.raises(CorruptDataError) as err:
        _replayed(d)
    assert err.value.path == os.path.join(d, segment_name(1))
    assert err.value.offset == start
    assert os.path.getsize(err.value.path) > end.offset  # nothing was truncated


def test_bit_flip_in_last_record_after_clean_close_is_corruption(tmp_path):
    d = str(tmp_path)
    _write(d, _records(10))
    victim, end = _replayed(d)[-1]
    flip_byte(os.path.join(d, segment_name(1)), end.offset - 1)
    with pytest.raises(CorruptDataError) as err:
        _replayed(d)
    assert err.value.offset == _start_of(victim, end)


def test_bit_flip_in_last_record_after_crash_is_a_torn_tail(tmp_path, caplog):
    d = str(tmp_path)
    _, marks = _write(d, _records(10))
    path = os.path.join(d, segment_name(1))
    cut(path, marks[-1].offset)  # remove the closing batch: the state a crash leaves
    full = _replayed(d)
    victim, end = full[-1]
    flip_byte(path, end.offset - 1)
    with caplog.at_level(logging.WARNING):
        got = _replayed(d)
    assert got == full[:-1]
    assert os.path.getsize(path) == _start_of(victim, end)
    assert any("torn tail" in m and str(_start_of(victim, end)) in m for m in caplog.messages)


def test_corruption_in_a_sealed_segment_is_an_error_even_at_its_end(tmp_path):
    d = str(tmp_path)
    _write(d, _records(100), per_batch=10, segment_bytes_max=2048)
    first = [(r, m) for r, m in _replayed(d) if m.segment_id == 1]
    victim, end = first[-1]
    flip_byte(os.path.join(d, segment_name(1)), end.offset - 1)
    with pytest.raises(CorruptDataError) as err:
        _replayed(d)
    assert (err.value.path, err.value.offset) == (os.path.join(d, segment_name(1)), _start_of(victim, end))


def test_unsynced_batch_damaged_before_a_later_unsynced_batch_is_torn(tmp_path):
    """With fsync off, a later batch does not vouch for an earlier one (power-loss reordering)."""
    d = str(tmp_path)
    w = JournalWriter(d)
    w.append(RecordType.ADD, 1, 0, b"a" * 100)
    durable = w.sync()
    w.append(RecordType.ADD, 1, 1, b"b" * 100)
    w.sync(fsync=False)
    w.append(RecordType.ADD, 1, 2, b"c" * 100)
    w.sync(fsync=False)
    os.close(w._fd)  # crash: no closing batch
    flip_byte(os.path.join(d, segment_name(1)), durable.offset + 40 + 50)
    assert [r.entry_id for r, _ in _replayed(d)] == [0]
    assert os.path.getsize(os.path.join(d, segment_name(1))) == durable.offset + BATCH_RECORD_BYTES


def test_record_of_unknown_type_is_corruption(tmp_path):
    d = str(tmp_path)
    w = JournalWriter(d)
    w.append(RecordType.FENCE, 1)
    w.sync()
    body = struct.pack("<BQq", 99, 1, -1)
    w._buf += struct.pack("<II", len(body), crc32c(body, segment_seed(w.segment_id))) + body
    w.sync()
    w.close()
    with pytest.raises(CorruptDataError, match="unknown type 99"):
        _replayed(d)


def test_interrupted_segment_creation_is_removed(tmp_path, caplog):
    d = str(tmp_path)
    _write(d, _records(5))
    with open(os.path.join(d, segment_name(2)), "wb") as f:
        f.write(b"ZBKJR")
    with caplog.at_level(logging.WARNING):
        assert len(_replayed(d)) == 5
    assert list_segments(d) == [1]
    assert any("interrupted" in m for m in caplog.messages)


def test_missing_segments_are_corruption(tmp_path):
    d = str(tmp_path)
    _write(d, _records(60), per_batch=5, segment_bytes_max=1024)
    segs = list_segments(d)
    os.unlink(os.path.join(d, segment_name(segs[1])))
    with pytest.raises(CorruptDataError, match="missing"):
        _replayed(d)
    with pytest.raises(CorruptDataError, match="missing"):
        _replayed(d, LogMark(segs[1], 100))


def test_enospc_surfaces_and_leaves_synced_records_intact(tmp_path):
    d = str(tmp_path)
    disk = FaultyDisk()
    w = JournalWriter(d, 1 << 20, disk)
    for i in range(10):
        w.append(RecordType.ADD, 5, i, b"p" * 200)
    w.sync()
    disk.write_bytes_left = 700  # the next batch only partly fits
    for i in range(10, 20):
        w.append(RecordType.ADD, 5, i, b"p" * 200)
    with pytest.raises(OSError) as err:
        w.sync()
    assert err.value.errno == 28  # ENOSPC
    disk.write_bytes_left = None  # space is back, but the file may end in a partial batch
    w.append(RecordType.ADD, 5, 20, b"")
    with pytest.raises(BookieIOError):
        w.sync()
    w.close()  # closes the file, writes nothing more
    # Every synced record survives; complete records of the failed batch may too (never
    # acknowledged, harmless); the partial one is cut off as a torn tail.
    got = [r.entry_id for r, _ in _replayed(d)]
    assert got == list(range(len(got))) and 10 <= len(got) < 20


def test_fsync_failure_poisons_the_writer(tmp_path):
    disk = FaultyDisk()
    w = JournalWriter(str(tmp_path), 1 << 20, disk)
    w.append(RecordType.FENCE, 1)
    disk.fail_fsync = True
    with pytest.raises(OSError):
        w.sync()
    disk.fail_fsync = False
    with pytest.raises(BookieIOError):
        w.sync()
    w.close()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([t for t in RecordType if t not in (RecordType.BATCH, RecordType.ADDS)]),
                          st.integers(0, (1 << 63) - 1),
                          st.integers(-1, (1 << 63) - 1), st.binary(max_size=64)), max_size=30))
def test_any_records_round_trip(tmp_path_factory, recs):
    d = str(tmp_path_factory.mktemp("j"))
    w = JournalWriter(d)
    for rec in recs:
        w.append(*rec)
    w.close()
    assert [tuple(r) for r, _ in replay(d)] == recs


# --- preallocation ---------------------------------------------------------------------------


def test_segment_is_preallocated_with_zeros_and_sealed_on_close(tmp_path):
    d = str(tmp_path)
    w = JournalWriter(d, 1 << 20, preallocate_bytes=64 * 1024)
    path = os.path.join(d, segment_name(1))
    assert os.path.getsize(path) == 64 * 1024
    w.append(RecordType.ADD, 1, 0, b"x" * 1000)
    mark = w.sync()
    data = open(path, "rb").read()
    assert len(data) == 64 * 1024 and not data[mark.offset:].strip(b"\0")
    w.close()
    assert os.path.getsize(path) == w.mark.offset  # sealed: ends at the closing batch
    assert [r.entry_id for r, _ in _replayed(d)] == [0]


def test_preallocate_extends_when_half_is_used_and_rotation_seals(tmp_path):
    d = str(tmp_path)
    disk = FaultyDisk()
    w = JournalWriter(d, 20 * 1024, disk, preallocate_bytes=8 * 1024)
    path = os.path.join(d, segment_name(1))
    assert not w.preallocate()  # more than half is still ahead
    for i in range(30):
        w.append(RecordType.ADD, 7, i, b"p" * 1000)
        w.sync()
        before = os.path.getsize(path) if w.segment_id == 1 else None
        extended = w.preallocate()
        if w.segment_id == 1 and before is not None:
            size = os.path.getsize(path)
            assert size >= w.mark.offset  # records never run past what exists...
            # ...and an extension leaves a whole chunk ahead of them
            assert (size == w.mark.offset + 8 * 1024) if extended else size == before
    assert w.segment_id > 1
    # Sealed segments end exactly at their last batch: no zeros for replay to read.
    for sid in list_segments(d)[:-1]:
        seg = open(os.path.join(d, segment_name(sid)), "rb").read()
        assert seg[-8:] != bytes(8)
    w.close()
    assert [r.entry_id for r, _ in _replayed(d)] == list(range(30))


def test_crash_with_preallocated_tail_replays_every_synced_record_quietly(tmp_path, caplog):
    d = str(tmp_path)
    w = JournalWriter(d, 1 << 20, preallocate_bytes=256 * 1024)
    for i in range(20):
        w.append(RecordType.ADD, 3, i, b"e" * 500)
        mark = w.sync()
        w.preallocate()
    os.close(w._fd)  # kill -9: no closing batch, zeros after the last record
    path = os.path.join(d, segment_name(1))
    assert os.path.getsize(path) > mark.offset
    with caplog.at_level(logging.INFO, logger="zbk.storage.journal"):
        got = _replayed(d)
    assert [r.entry_id for r, _ in got] == list(range(20)) and got[-1][1] == mark
    assert os.path.getsize(path) == mark.offset
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("unused preallocation" in r.getMessage() for r in caplog.records)
    w2 = JournalWriter(d, 1 << 20, preallocate_bytes=256 * 1024)  # the next boot's writer
    assert w2.segment_id == 2
    w2.close()


def test_torn_batch_inside_preallocation_is_a_torn_tail(tmp_path, caplog):
    d = str(tmp_path)
    w = JournalWriter(d, 1 << 20, preallocate_bytes=64 * 1024)
    w.append(RecordType.ADD, 3, 0, b"a" * 300)
    durable = w.sync()
    w.append(RecordType.ADD, 3, 1, b"b" * 300)
    w.append(RecordType.ADD, 3, 2, b"c" * 300)
    w.sync(fsync=False)
    os.close(w._fd)
    path = os.path.join(d, segment_name(1))
    # Power loss: only the first 200 bytes of the second batch reached the disk.
    with open(path, "r+b") as f:
        f.seek(durable.offset + 200)
        f.write(bytes(1000))
    with caplog.at_level(logging.WARNING):
        got = _replayed(d)
    assert [r.entry_id for r, _ in got] == [0]
    assert any("torn tail" in m for m in caplog.messages)


@pytest.mark.parametrize("adds", [False, True], ids=["add-record", "adds-record"])
def test_corruption_before_a_later_durable_batch_is_still_an_error_with_preallocation(tmp_path, adds):
    d = str(tmp_path)
    w = JournalWriter(d, 1 << 20, preallocate_bytes=64 * 1024)
    marks = []
    for i in range(5):
        if adds:  # an add request's two entries in one ADDS record
            w.append_records(encode_records([3, 3], [2 * i, 2 * i + 1], [b"z" * 100, b"y" * 50]), 2)
        else:
            w.append(RecordType.ADD, 3, i, b"z" * 100)
        marks.append(w.sync())
    os.close(w._fd)  # a crash: zeros after the last batch
    path = os.path.join(d, segment_name(1))
    assert os.path.getsize(path) > marks[-1].offset
    flip_byte(path, marks[1].offset - 1)  # inside record 1, which later batches vouch for
    with pytest.raises(CorruptDataError) as err:
        _replayed(d)
    assert err.value.offset == marks[0].offset + BATCH_RECORD_BYTES


def test_preallocation_off_writes_no_zeros(tmp_path):
    d = str(tmp_path)
    w = JournalWriter(d, 1 << 20, preallocate_bytes=0)
    w.append(RecordType.FENCE, 1)
    mark = w.sync()
    assert not w.preallocate()
    assert os.path.getsize(os.path.join(d, segment_name(1))) == mark.offset
    w.close()


def test_enospc_while_preallocating_poisons_the_writer_and_loses_nothing_synced(tmp_path):
    d = str(tmp_path)
    disk = FaultyDisk()
    w = JournalWriter(d, 1 << 20, disk, preallocate_bytes=8 * 1024)
    for i in range(4):
        w.append(RecordType.ADD, 9, i, b"q" * 1000)
        w.sync()
    disk.write_bytes_left = 100
    with pytest.raises(OSError) as err:
        w.preallocate()
    assert err.value.errno == 28
    disk.write_bytes_left = None
    w.append(RecordType.ADD, 9, 4, b"q")
    with pytest.raises(BookieIOError):
        w.sync()
    w.close()
    assert [r.entry_id for r, _ in _replayed(d)] == [0, 1, 2, 3]


def test_journal_actor_keeps_zeros_ahead_of_its_commits(tmp_path):
    from zbk.actors.base import ListOutbox
    from zbk.actors.journal import JournalCore
    from zbk.actors.messages import JournalAppend, Synced

    d = str(tmp_path)
    jw = JournalWriter(d, 1 << 20, preallocate_bytes=16 * 1024)
    out = ListOutbox()
    jc = JournalCore(jw, outbox=out, sync_data=True, group_bytes_max=1 << 20, group_wait_s=0.01)
    path = os.path.join(d, segment_name(1))
    for b in range(40):  # 40 KiB of records through a 16 KiB preallocation
        jc.on_message(JournalAppend(b, encode_records([4], [b], [b"x" * 1000]), 1), 0.0)
        jc.commit()
        assert out.take("server", Synced)[0].batch_ids == [b]
        assert os.path.getsize(path) - jw.mark.offset >= 8 * 1024
    jw.close()
    assert [r.entry_id for r, _ in _replayed(d)] == list(range(40))
