"""Entry logs: append/read, footers, sealing after a crash, rotation (BP-32), failures."""

from __future__ import annotations

import logging
import os
import random

import pytest

from zbk.clock import FakeClock
from zbk.errors import BookieIOError, CorruptDataError
from zbk.storage.disk import FaultyDisk
from zbk.storage.entrylog import (
    HEADER_BYTES,
    RECORD_HEADER_BYTES,
    EntryLogWriter,
    list_logs,
    log_name,
    make_location,
    read_footer,
    scan_file,
    split_location,
)
from zbk.storage.entrylogformat import LAST_ID_FILE, encode_records, read_last_id

from .helpers import cut, flip_byte


def _fill(w: EntryLogWriter, n: int, ledgers: int = 3, size: int = 100,
          rng: random.Random | None = None) -> dict[tuple[int, int], tuple[int, bytes]]:
    """Append ``n`` entries round-robin over ``ledgers``; returns {(ledger, entry): (location, blob)}."""
    rng = rng or random.Random(1)
    out = {}
    for i in range(n):
        ledger_id, entry_id = 10 + i % ledgers, i // ledgers
        blob = rng.randbytes(size)
        out[(ledger_id, entry_id)] = (w.append(ledger_id, entry_id, blob), blob)
    return out


def _check_all(w: EntryLogWriter, entries: dict[tuple[int, int], tuple[int, bytes]]) -> None:
    for (ledger_id, entry_id), (location, blob) in entries.items():
        assert w.read(location, ledger_id, entry_id) == blob


def _usage_of(entries: dict[tuple[int, int], tuple[int, bytes]]) -> dict[int, dict[int, int]]:
    usage: dict[int, dict[int, int]] = {}
    for (ledger_id, _), (location, blob) in entries.items():
        per_log = usage.setdefault(split_location(location)[0], {})
        per_log[ledger_id] = per_log.get(ledger_id, 0) + RECORD_HEADER_BYTES + len(blob)
    return usage


def test_location_packs_log_id_and_offset():
    assert split_location(make_location(3, 12345)) == (3, 12345)
    assert make_location(1, HEADER_BYTES) == (1 << 40) | HEADER_BYTES


def test_append_read_from_buffer_after_flush_and_after_reopen(tmp_path):
    d = str(tmp_path)
    w = EntryLogWriter([d], 1 << 20, 4096)
    entries = _fill(w, 300)
    big = bytes(range(256)) * 40  # larger than one read-ahead: needs a second pread
    entries[(77, 0)] = (w.append(77, 0, big), big)
    entries[(77, 1)] = (w.append(77, 1, b"small"), b"small")  # stays in the buffer
    _check_all(w, entries)  # some still in the write buffer, some in the file
    assert w.flush() > 0
    _check_all(w, entries)
    w.close()
    w2 = EntryLogWriter([d], 1 << 20, 4096)
    assert w2.sealed_on_open == []  # closed cleanly: every log has a footer
    _check_all(w2, entries)
    w2.close()


def test_write_through_when_buffer_is_zero(tmp_path):
    disk = FaultyDisk()
    w = EntryLogWriter([str(tmp_path)], 1 << 20, 0, disk)
    loc = w.append(1, 0, b"abc")
    assert disk.writes == 1 and w.read(loc, 1, 0) == b"abc"
    w.close()


def test_footer_carries_usage_and_reopen_reads_it(tmp_path):
    d = str(tmp_path)
    w = EntryLogWriter([d], 8192, 1024)
    entries = _fill(w, 200)
    w.close()
    expected = _usage_of(entries)
    for log_id, path in list_logs(d).items():
        fd = os.open(path, os.O_RDONLY)
        footer = read_footer(fd, log_id)
        os.close(fd)
        assert footer is not None and footer.usage == expected[log_id]
        assert os.path.getsize(path) <= 8192 + 200  # size rotation keeps logs near the limit
    w2 = EntryLogWriter([d], 8192, 1024)
    assert w2.usage() == expected and w2.log_ids() == sorted(expected)
    w2.close()


def test_crash_without_footer_is_sealed_by_scanning(tmp_path, caplog):
    d = str(tmp_path)
    w = EntryLogWriter([d], 1 << 20, 1024)
    entries = _fill(w, 100)
    w.flush()  # durable, but the log is still active: no footer
    # Crash: a new writer opens the directory while the old one never closed.
    with caplog.at_level(logging.WARNING):
        w2 = EntryLogWriter([d], 1 << 20, 1024)
    assert w2.sealed_on_open == [1] and not caplog.messages  # a clean end: nothing to warn about
    assert w2.usage() == _usage_of(entries)
    _check_all(w2, entries)
    assert sorted((lid, eid) for lid, eid, _, _ in w2.scan(1)) == sorted(entries)
    # The next writer uses a new log, never the sealed one.
    assert split_location(w2.append(1, 0, b"x"))[0] == 2
    w2.close()
    fd = os.open(os.path.join(d, log_name(1)), os.O_RDONLY)
    assert read_footer(fd, 1) is not None  # sealing wrote a footer
    os.close(fd)


def test_torn_tail_is_sealed_at_the_last_complete_record(tmp_path, rng, caplog):
    d = str(tmp_path)
    w = EntryLogWriter([d], 1 << 20, 0)
    entries = _fill(w, 50, rng=rng)
    path = os.path.join(d, log_name(1))
    ordered = sorted(entries.items(), key=lambda kv: kv[1][0])
    (last_key, (last_loc, last_blob)) = ordered[-1]
    tear = split_location(last_loc)[1] + rng.randrange(1, RECORD_HEADER_BYTES + len(last_blob))
    cut(path, tear)
    with caplog.at_level(logging.WARNING):
        w2 = EntryLogWriter([d], 1 << 20, 0)
    assert any(path in m and str(split_location(last_loc)[1]) in m for m in caplog.messages)
    del entries[last_key]
    _check_all(w2, entries)
    assert w2.usage()[1] == _usage_of(entries)[1]
    with pytest.raises(CorruptDataError) as err:
        w2.read(last_loc, *last_key)
    assert err.value.path == path
    assert [(lid, eid) for lid, eid, _, _ in scan_file(path)] == [k for k, _ in ordered[:-1]]
    w2.close()


def test_corrupt_record_is_never_returned(tmp_path, rng):
    d = str(tmp_path)
    w = EntryLogWriter([d], 1 << 20, 4096)
    entries = _fill(w, 100, rng=rng)
    w.close()
    (ledger_id, entry_id), (location, blob) = rng.choice(list(entries.items()))
    offset = split_location(location)[1]
    flip_byte(os.path.join(d, log_name(1)), offset + RECORD_HEADER_BYTES + rng.randrange(len(blob)))
    w2 = EntryLogWriter([d], 1 << 20, 4096)
    with pytest.raises(CorruptDataError) as err:
        w2.read(location, ledger_id, entry_id)
    assert (err.value.path, err.value.offset) == (os.path.join(d, log_name(1)), offset)
    # A sealed log is scanned strictly: the damage is reported, not skipped.
    with pytest.raises(CorruptDataError) as err:
        list(w2.scan(1))
    assert err.value.offset == offset
    w2.close()


def test_location_of_another_entry_or_nowhere_is_corruption(tmp_path):
    w = EntryLogWriter([str(tmp_path)], 1 << 20, 4096)
    loc = w.append(1, 0, b"hello")
    w.flush()
    assert w.read(loc) == b"hello"  # crc checked; ids checked only when given
    with pytest.raises(CorruptDataError, match="holds entry 1:0"):
        w.read(loc, 1, 1)
    with pytest.raises(CorruptDataError, match="holds entry 1:0"):
        w.read(loc, 2, 0)
    with pytest.raises(CorruptDataError):
        w.read(loc + 3, 1, 0)  # not a record boundary
    with pytest.raises(CorruptDataError, match="outside"):
        w.read(loc + 10_000, 1, 0)
    with pytest.raises(CorruptDataError, match="does not exist"):
        w.read(make_location(99, HEADER_BYTES), 1, 0)
    w.close()


def test_unflushed_logs_are_reported_until_flushed_and_delete(tmp_path):
    d = str(tmp_path)
    w = EntryLogWriter([d], 4096, 1024)
    entries = _fill(w, 200)
    logs = w.log_ids()
    assert len(logs) > 2 and w.unflushed_log_ids() == set(logs)
    assert w.least_unflushed_log_id() == logs[0]
    w.flush()
    assert w.unflushed_log_ids() == set(w.active_log_ids()) == {logs[-1]}
    assert w.least_unflushed_log_id() == logs[-1]
    with pytest.raises(AssertionError):
        w.delete_log(logs[-1])
    assert w.delete_log(logs[0]) and not w.delete_log(logs[0])
    assert logs[0] not in w.usage() and not os.path.exists(os.path.join(d, log_name(logs[0])))
    survivors = {k: v for k, v in entries.items() if split_location(v[0])[0] != logs[0]}
    _check_all(w, survivors)
    w.close()


def test_log_ids_are_not_reused_after_the_newest_logs_are_deleted(tmp_path):
    d = str(tmp_path)
    w = EntryLogWriter([d], 1 << 20, 1024)
    w.append(1, 0, b"a")
    w.rotate()
    w.append(1, 1, b"b")
    w.close()
    w = EntryLogWriter([d], 1 << 20, 1024)
    assert w.log_ids() == [1, 2]
    w.delete_log(1)
    w.delete_log(2)
    w.close()
    w = EntryLogWriter([d], 1 << 20, 1024)
    assert split_location(w.append(1, 2, b"c"))[0] == 3
    w.close()


def test_a_batch_whose_write_fails_leaves_the_logs_readable_and_closable(tmp_path):
    """The batch is refused whole (none of its locations handed out); the entries buffered
    before it are still served from memory, and the writer still closes."""
    d = str(tmp_path)
    disk = FaultyDisk()
    w = EntryLogWriter([d], 1 << 20, 2048, disk)
    flushed = _fill(w, 50)
    w.flush()
    buffered = {(98, 0): (w.append(98, 0, b"a" * 100), b"a" * 100)}
    disk.write_bytes_left = 0
    with pytest.raises(OSError) as err:
        w.append_batch([99] * 30, list(range(30)), [bytes([i]) * 100 for i in range(30)])
    assert err.value.errno == 28
    with pytest.raises(BookieIOError):
        w.append_batch([99], [30], [b"x"])
    _check_all(w, flushed)
    _check_all(w, buffered)
    w.close()


@pytest.mark.parametrize("damage", ["flip", "cut"])
def test_a_damaged_log_id_file_is_refused_rather_than_guessed(tmp_path, damage):
    d = str(tmp_path)
    w = EntryLogWriter([d], 1 << 20, 1024)
    w.append(1, 0, b"a")
    w.close()
    path = os.path.join(d, LAST_ID_FILE)
    assert read_last_id(d) == 1
    if damage == "flip":
        flip_byte(path, 9)  # inside the id: the crc32c fails
    else:
        cut(path, 10)
    with pytest.raises(CorruptDataError, match="entry log id file is corrupt"):
        EntryLogWriter([d], 1 << 20, 1024)


def test_per_ledger_logs_rotate_on_write_close(tmp_path):
    w = EntryLogWriter([str(tmp_path)], 1 << 20, 4096, per_ledger=True, open_max=10)
    a = w.append(1, 0, b"a")
    b = w.append(2, 0, b"b")
    assert split_location(a)[0] != split_location(b)[0]
    assert split_location(w.append(1, 1, b"a2"))[0] == split_location(a)[0]
    w.write_close(1)
    assert len(w.active_log_ids()) == 2  # advisory: nothing happens before the next flush
    w.flush()
    assert w.active_log_ids() == [split_location(b)[0]]
    assert split_location(a)[0] not in w.unflushed_log_ids()
    assert w.read(a, 1, 0) == b"a"
    assert w.usage()[split_location(a)[0]] == {1: 2 * RECORD_HEADER_BYTES + 3}
    # A write after the close (recovery adds) opens a new log for the ledger.
    assert split_location(w.append(1, 2, b"a3"))[0] not in (split_location(a)[0], split_location(b)[0])
    w.close()


def test_per_ledger_idle_logs_expire(tmp_path):
    clock = FakeClock()
    w = EntryLogWriter([str(tmp_path)], 1 << 20, 4096, per_ledger=True, expire_after_access_s=60, clock=clock)
    w.append(1, 0, b"a")
    clock.advance(30)
    w.append(2, 0, b"b")
    clock.advance(31)
    assert w.expire_idle() == [1]
    assert len(w.active_log_ids()) == 1
    clock.advance(60)
    assert w.maintain() == [2] and w.active_log_ids() == []  # the owner's tick
    w.append(3, 0, b"c")
    clock.advance(61)
    w.flush()  # flush expires too
    assert w.active_log_ids() == [] and w.unflushed_log_ids() == set()
    w.close()


def test_per_ledger_open_cap_rotates_least_recently_used(tmp_path):
    w = EntryLogWriter([str(tmp_path)], 1 << 20, 4096, per_ledger=True, open_max=3)
    logs = {ledger_id: split_location(w.append(ledger_id, 0, b"x"))[0] for ledger_id in (1, 2, 3)}
    w.append(1, 1, b"x")  # ledger 2 is now the least recently used
    w.append(4, 0, b"x")
    assert sorted(w.active_log_ids()) == sorted([logs[1], logs[3], split_location(w.append(4, 1, b"y"))[0]])
    assert logs[2] in w.unflushed_log_ids()  # sealed, but its fsync waits for the flush
    w.flush()
    assert logs[2] not in w.unflushed_log_ids()
    w.close()


def test_logs_spread_over_directories_and_are_found_again(tmp_path):
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    disk = FaultyDisk(usage_result=(1, 2))
    w = EntryLogWriter(dirs, 2048, 0, disk)
    entries = _fill(w, 100)
    w.close()
    w2 = EntryLogWriter(list(reversed(dirs)), 2048, 0)
    _check_all(w2, entries)
    w2.close()
    os.link(os.path.join(dirs[0], log_name(1)), os.path.join(dirs[1], log_name(1)))
    with pytest.raises(CorruptDataError, match="twice"):
        EntryLogWriter(dirs, 2048, 0)


def test_enospc_fails_writes_but_keeps_reads_and_flushed_data(tmp_path):
    d = str(tmp_path)
    disk = FaultyDisk()
    w = EntryLogWriter([d], 1 << 20, 2048, disk)
    flushed = _fill(w, 50)
    w.flush()
    disk.write_bytes_left = 1000
    pending = {}
    with pytest.raises(OSError) as err:
        for i in range(100):
            blob = bytes([i]) * 100
            pending[(99, i)] = (w.append(99, i, blob), blob)
    assert err.value.errno == 28
    with pytest.raises(BookieIOError):
        w.append(99, 1000, b"x")
    with pytest.raises(BookieIOError):
        w.flush()
    _check_all(w, flushed)
    _check_all(w, pending)  # still served from the write buffer
    w.close()
    # After a restart, everything flushed before the failure is intact.
    w2 = EntryLogWriter([d], 1 << 20, 2048)
    _check_all(w2, flushed)
    w2.close()


def test_interrupted_log_creation_is_removed(tmp_path, caplog):
    d = str(tmp_path)
    with open(os.path.join(d, log_name(5)), "wb") as f:
        f.write(b"ZBK")
    with caplog.at_level(logging.WARNING):
        w = EntryLogWriter([d], 1 << 20, 0)
    assert w.log_ids() == [] and any("interrupted" in m for m in caplog.messages)
    assert split_location(w.append(1, 0, b"x"))[0] == 6
    w.close()


@pytest.mark.parametrize("per_ledger", [False, True])
def test_append_batch_is_append_per_entry_byte_for_byte(tmp_path, rng, per_ledger):
    """The same locations, files, usage and footers as one append() per entry, across
    rotations inside a batch, for one ledger's batches and MULTI_ADD's mixed ones; and the
    records it returns for the journal are the records it logged, in a buffer that later
    appends leave alone."""
    one = EntryLogWriter([str(tmp_path / "one")], size_limit_bytes=8 * 1024, write_buffer_bytes=3000,
                         per_ledger=per_ledger)
    many = EntryLogWriter([str(tmp_path / "many")], size_limit_bytes=8 * 1024, write_buffer_bytes=3000,
                          per_ledger=per_ledger)
    entries: dict[tuple[int, int], tuple[int, bytes]] = {}
    next_eid: dict[int, int] = {}
    handed: list[tuple[bytearray, bytes]] = []
    for _ in range(60):
        n = rng.randrange(1, 40)
        if rng.random() < 0.5:
            lids = [rng.randrange(1, 4)] * n
        else:
            lids = [rng.randrange(1, 6) for _ in range(n)]
        eids = []
        for x in lids:
            eids.append(next_eid.get(x, 0))
            next_eid[x] = eids[-1] + 1
        blobs = [rng.randbytes(rng.randrange(0, 700)) for _ in range(n)]
        want = [one.append(x, e, b) for x, e, b in zip(lids, eids, blobs, strict=True)]
        got, records = many.append_batch(lids, eids, blobs)
        assert got == want
        assert records == encode_records(lids, eids, blobs)
        handed.append((records, bytes(records)))
        entries.update({(x, e): (loc, b) for x, e, loc, b in zip(lids, eids, got, blobs, strict=True)})
        if not per_ledger:
            assert len(many._active[-1].buf) < 3000  # written out once the buffer's size is reached
    assert many.usage() == one.usage()
    assert all(records == copy for records, copy in handed)
    _check_all(many, entries)
    one.flush()
    many.flush()
    assert len(many.log_ids()) > 3  # rotated, also inside batches
    for log_id in many.log_ids():
        a = open(os.path.join(str(tmp_path / "one"), log_name(log_id)), "rb").read()
        b = open(os.path.join(str(tmp_path / "many"), log_name(log_id)), "rb").read()
        assert a == b, log_id
    _check_all(many, entries)
    one.close()
    many.close()


def test_writeback_of_each_few_bytes_is_started_in_order_and_reads_are_unchanged(tmp_path, rng):
    """flush_entry_log_bytes: every time that many bytes of a log were written, writeback of
    exactly the range written since the last start is begun (contiguous, in order, nothing
    twice), so a checkpoint's fsync finds little left; data and reads are unchanged."""
    disk = FaultyDisk()
    w = EntryLogWriter([str(tmp_path)], size_limit_bytes=64 * 1024, write_buffer_bytes=1000, disk=disk,
                       writeback_bytes=8 * 1024)
    entries = _fill(w, 400, size=300, rng=rng)
    assert disk.writebacks
    by_fd: dict[int, list[tuple[int, int]]] = {}
    for fd, offset, n in disk.writebacks:
        by_fd.setdefault(fd, []).append((offset, n))
    for ranges in by_fd.values():
        assert ranges[0][0] == 0 and all(n >= 8 * 1024 for _, n in ranges)
        assert all(a + n == b for (a, n), (b, _) in zip(ranges, ranges[1:], strict=False))  # contiguous
    _check_all(w, entries)
    w.flush()
    _check_all(w, entries)
    off = EntryLogWriter([str(tmp_path / "off")], write_buffer_bytes=1000, disk=(d2 := FaultyDisk()), writeback_bytes=0)
    _fill(off, 400, size=300)
    assert d2.writebacks == []
    w.close()
    off.close()
