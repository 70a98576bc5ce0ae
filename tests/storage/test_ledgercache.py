"""Index files and the ledger cache: slots, headers, eviction, corruption, failures."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from zbk.errors import BadRequestError, CorruptDataError
from zbk.storage import index, ledgercache
from zbk.storage.disk import SYNCFS_REPORTS_ERRORS, FaultyDisk, raise_open_files_limit
from zbk.storage.entrylog import make_location
from zbk.storage.index import HEADER_BYTES, PAGE_BYTES, PAGE_ENTRIES, SLOT_BYTES, index_path
from zbk.storage.ledgercache import DELTA_PAGE_BYTES, DELTA_SLOT_BYTES, LedgerCache

from .helpers import flip_byte


def loc(entry_id: int) -> int:
    return make_location(1 + entry_id % 7, 24 + 100 * entry_id)


@pytest.fixture(autouse=True, params=["syncfs", "fsync"])
def sync_mode(request, monkeypatch):
    """Every test runs with both ways a flush is made durable: one syncfs per file system
    (the default where the kernel reports writeback errors through it) and an fsync per file."""
    if request.param == "syncfs" and not SYNCFS_REPORTS_ERRORS:
        pytest.skip("this kernel's syncfs does not report writeback errors (Linux < 5.8)")
    if request.param == "fsync":
        monkeypatch.setattr(ledgercache, "SYNCFS_REPORTS_ERRORS", False)
    return request.param


def test_put_get_flush_reopen(tmp_path):
    d = str(tmp_path)
    c = LedgerCache([d], 1 << 20)
    for e in range(3000):
        c.put(5, e, loc(e))
    c.put(6, 0, loc(0))
    assert all(c.get(5, e) == loc(e) for e in range(3000))
    assert c.get(5, 3000) is None and c.get(7, 0) is None
    assert c.flush() >= 3 * PAGE_BYTES
    c.close()
    c = LedgerCache([d], 1 << 20)
    assert c.ledgers() == [5, 6] and c.exists(5) and not c.exists(7)
    assert all(c.get(5, e) == loc(e) for e in range(3000))
    assert c.get(5, 3000) is None and c.get(5, 10**9) is None
    assert c.last_entry_id(5) == 2999 and c.last_entry_id(6) == 0 and c.last_entry_id(7) == -1
    c.close()


def test_overwrite_keeps_the_latest_location(tmp_path):
    c = LedgerCache([str(tmp_path)], 1 << 20)
    c.put(1, 4, loc(4))
    c.flush()
    c.put(1, 4, loc(5))  # journal replay or compaction moved the entry
    assert c.get(1, 4) == loc(5)
    c.flush()
    c.close()
    assert LedgerCache([str(tmp_path)], 1 << 20).get(1, 4) == loc(5)


def test_entry_ids_and_last_entry_mix_disk_and_memory(tmp_path):
    d = str(tmp_path)
    c = LedgerCache([d], 1 << 20)
    present = [*range(0, 10), *range(PAGE_ENTRIES - 2, PAGE_ENTRIES + 3), 5000]
    for e in present[:-3]:
        c.put(9, e, loc(e))
    c.flush()
    c.close()
    c = LedgerCache([d], 1 << 20)
    for e in present[-3:]:
        c.put(9, e, loc(e))
    assert c.entry_ids(9) == [(0, 9), (PAGE_ENTRIES - 2, PAGE_ENTRIES + 2), (5000, 5000)]
    assert c.last_entry_id(9) == 5000
    assert c.entry_ids(404) == []


def test_headers_persist(tmp_path):
    d = str(tmp_path)
    c = LedgerCache([d], 1 << 20)
    c.set_master_key(1, b"k" * 20)
    assert c.set_fenced(1) and not c.set_fenced(1)
    c.set_limbo(1, True)
    c.set_explicit_lac(1, 41)
    c.flush_header(1)  # durable now, without a full flush
    c.set_master_key(2, b"")
    c.set_limbo(2, True)
    c.set_limbo(2, False)
    c.flush()
    c.close()
    c = LedgerCache([d], 1 << 20)
    assert (c.get_master_key(1), c.is_fenced(1), c.is_limbo(1), c.get_explicit_lac(1)) == (b"k" * 20, True, True, 41)
    assert (c.get_master_key(2), c.is_fenced(2), c.is_limbo(2), c.get_explicit_lac(2)) == (b"", False, False, -1)
    assert c.get_master_key(3) is None and not c.is_fenced(3) and not c.exists(3)
    assert c.get_explicit_lac(3) == -1
    assert c.set_fenced(2, True) and c.is_fenced(2) and c.set_fenced(2, False) and not c.is_fenced(2)
    with pytest.raises(BadRequestError):
        c.set_master_key(1, b"x" * 65)


def test_eviction_under_a_small_budget_reads_correctly(tmp_path, rng):
    d = str(tmp_path)
    c = LedgerCache([d], 4 * PAGE_BYTES)
    entries = {}
    for ledger_id in range(1, 6):
        # Every 7th entry: 146 slots a page, enough to make each new page a whole dirty page
        # (a sparser new page is a delta: see test_new_pages_start_as_deltas...).
        for e in range(0, 6 * PAGE_ENTRIES, 7):
            c.put(ledger_id, e, loc(e + ledger_id))
            entries[(ledger_id, e)] = loc(e + ledger_id)
    # Dirty pages are never dropped: the budget is exceeded and a checkpoint is asked for.
    assert c.needs_flush and c.cached_bytes > 4 * PAGE_BYTES
    assert all(c.get(*k) == v for k, v in entries.items())
    c.flush()
    assert not c.needs_flush and c.cached_bytes <= 4 * PAGE_BYTES
    for ledger_id, e in rng.sample(sorted(entries), 300):
        assert c.get(ledger_id, e) == entries[(ledger_id, e)]
        assert c.get(ledger_id, e + 1) is None
        assert c.cached_bytes <= 4 * PAGE_BYTES


def _with_damaged_slot(d: str, ledger_id: int, entries: int, damaged: int, at: int = 2) -> str:
    """A ledger's index file holding entries 0..entries-1, then byte ``at`` of entry
    ``damaged``'s slot flipped (bit rot); returns the file's path."""
    c = LedgerCache([d], 1 << 20)
    for e in range(entries):
        c.put(ledger_id, e, loc(e))
    c.flush()
    c.close()
    path = index_path(d, ledger_id)
    flip_byte(path, HEADER_BYTES + damaged * SLOT_BYTES + at)
    return path


def test_corrupt_slot_is_detected_with_its_offset(tmp_path):
    d = str(tmp_path)
    path = _with_damaged_slot(d, 3, 100, 42)
    c = LedgerCache([d], 1 << 20)
    assert c.get(3, 41) == loc(41)
    with pytest.raises(CorruptDataError) as err:
        c.get(3, 42)
    assert (err.value.path, err.value.offset) == (path, HEADER_BYTES + 42 * SLOT_BYTES)
    with pytest.raises(CorruptDataError):
        c.entry_ids(3)


def test_slot_written_to_the_wrong_place_is_detected(tmp_path):
    d = str(tmp_path)
    c = LedgerCache([d], 1 << 20)
    c.put(3, 0, loc(0))
    c.flush()
    c.close()
    path = index_path(d, 3)
    with open(path, "r+b") as f:
        f.seek(HEADER_BYTES)
        slot = f.read(SLOT_BYTES)
        f.seek(HEADER_BYTES + SLOT_BYTES)
        f.write(slot)
    with pytest.raises(CorruptDataError):
        LedgerCache([d], 1 << 20).get(3, 1)


def test_corrupt_header_is_detected_and_a_zero_header_reads_fresh(tmp_path):
    d = str(tmp_path)
    c = LedgerCache([d], 1 << 20)
    c.set_fenced(1)
    c.set_fenced(2)
    c.flush()
    c.close()
    flip_byte(index_path(d, 1), 13)
    with open(index_path(d, 2), "r+b") as f:
        f.write(bytes(HEADER_BYTES))  # the creating flush never reached the disk
    c = LedgerCache([d], 1 << 20)
    with pytest.raises(CorruptDataError) as err:
        c.is_fenced(1)
    assert (err.value.path, err.value.offset) == (index_path(d, 1), 0)
    assert not c.is_fenced(2)


def test_header_of_another_ledger_is_corruption(tmp_path):
    d = str(tmp_path)
    c = LedgerCache([d], 1 << 20)
    c.set_fenced(1)
    c.flush()
    c.close()
    os.makedirs(os.path.dirname(index_path(d, 2)), exist_ok=True)
    os.rename(index_path(d, 1), index_path(d, 2))
    with pytest.raises(CorruptDataError, match="ledger 1"):
        LedgerCache([d], 1 << 20).is_fenced(2)


def test_delete_ledger(tmp_path):
    d = str(tmp_path)
    c = LedgerCache([d], 1 << 20)
    c.put(1, 0, loc(0))
    c.put(2, 0, loc(0))
    c.flush()
    c.put(1, 1, loc(1))
    assert c.delete_ledger(1) and not c.delete_ledger(1)
    assert not os.path.exists(index_path(d, 1)) and c.get(1, 0) is None and c.ledgers() == [2]
    c.flush()
    c.close()
    assert LedgerCache([d], 1 << 20).ledgers() == [2]


def test_multiple_index_dirs(tmp_path):
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    c = LedgerCache(dirs, 1 << 20)
    for ledger_id in range(6):
        c.put(ledger_id, 0, loc(ledger_id))
    c.flush()
    c.close()
    assert os.path.exists(index_path(dirs[1], 3)) and os.path.exists(index_path(dirs[0], 4))
    c = LedgerCache(list(reversed(dirs)), 1 << 20)
    assert [c.get(ledger_id, 0) for ledger_id in range(6)] == [loc(i) for i in range(6)]


def test_failed_flush_keeps_pages_dirty_and_can_be_retried(tmp_path):
    d = str(tmp_path)
    disk = FaultyDisk(fail_fsync=True)
    c = LedgerCache([d], 1 << 20, disk)
    c.put(1, 0, loc(0))
    c.set_fenced(1)
    assert c.dirty_bytes > 0  # a new page: a delta of one slot until it is written whole
    _flush_fails_then_succeeds(c, disk)
    c = LedgerCache([d], 1 << 20)
    assert c.get(1, 0) == loc(0) and c.is_fenced(1)


def _flush_fails_then_succeeds(c: LedgerCache, disk: FaultyDisk) -> None:
    """A flush while every (f)sync fails keeps everything dirty; the next one, with syncs
    working again, leaves nothing dirty. Closes ``c``."""
    dirty = c.dirty_bytes
    disk.fail_fsync = True
    with pytest.raises(OSError):
        c.flush()
    assert c.dirty_bytes == dirty
    disk.fail_fsync = False
    c.flush()
    assert c.dirty_bytes == 0
    c.close()


def _written(d: str, disk: FaultyDisk, entries: range) -> LedgerCache:
    """A cache on ``disk`` that put ``entries`` of ledger 1 and flushed them (still open)."""
    c = LedgerCache([d], 1 << 20, disk)
    for e in entries:
        c.put(1, e, loc(e))
    c.flush()
    return c


def test_enospc_during_flush_leaves_earlier_flushes_intact(tmp_path):
    d = str(tmp_path)
    disk = FaultyDisk()
    c = _written(d, disk, range(10))
    disk.write_bytes_left = 100
    for e in range(PAGE_ENTRIES, PAGE_ENTRIES + 10):
        c.put(1, e, loc(e))
    with pytest.raises(OSError) as err:
        c.flush()
    assert err.value.errno == 28
    c.close()
    c = LedgerCache([d], 1 << 20)
    assert [c.get(1, e) for e in range(10)] == [loc(e) for e in range(10)]


def test_page_helpers_round_trip(tmp_path):
    page = index.new_page()
    index.set_slot(page, PAGE_ENTRIES + 5, 12345)
    assert index.slot_location(page, PAGE_ENTRIES + 5, "p") == 12345
    assert index.slot_location(page, PAGE_ENTRIES + 6, "p") is None
    assert index.page_entries(page, 1, "p") == [PAGE_ENTRIES + 5]
    assert index.page_count(HEADER_BYTES) == 0 and index.page_count(HEADER_BYTES + 1) == 1


# -- deltas: puts into pages already wholly in the file --------------------------------------


class CountingDisk(FaultyDisk):
    """Counts the index writes and where they go."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.pwrites: list[tuple[int, int]] = []  # (offset, bytes)

    def pwrite(self, fd, data, offset):
        self.pwrites.append((offset, memoryview(data).nbytes))
        super().pwrite(fd, data, offset)


def _flushed(d, entries_of):
    """Index files with the given entries, flushed, and a fresh cache on them (no page cached)."""
    c = LedgerCache([d], 1 << 20)
    for ledger_id, entry_ids in entries_of.items():
        for e in entry_ids:
            c.put(ledger_id, e, loc(e + ledger_id))
    c.flush()
    c.close()


def test_puts_into_pages_in_the_file_are_deltas_written_in_place(tmp_path, monkeypatch, sync_mode):
    d = str(tmp_path)
    _flushed(d, {1: range(0, 10), 2: [*range(0, 5), PAGE_ENTRIES + 3]})
    sizes = {lid: os.path.getsize(index_path(d, lid)) for lid in (1, 2)}
    disk = CountingDisk()
    c = LedgerCache([d], 1 << 20, disk)
    reads = []
    real_read_page = index.read_page
    monkeypatch.setattr(index, "read_page", lambda *a, **k: reads.append(a[1]) or real_read_page(*a, **k))
    for e in range(10, 13):
        c.put(1, e, loc(e + 1))
    c.put(1, 20, loc(21))  # a second run in the same page
    c.put(2, 5, loc(7))
    c.put(2, PAGE_ENTRIES + 4, loc(PAGE_ENTRIES + 6))  # page 1 of ledger 2, wholly in the file too
    c.put(1, 11, loc(99))  # a slot put twice: the last location wins
    assert reads == [], "a put read a page"
    assert 0 < c.dirty_bytes < PAGE_BYTES and not c.needs_flush
    written = c.flush()
    assert written == 6 * SLOT_BYTES
    assert sorted(disk.pwrites) == [
        (HEADER_BYTES + 5 * SLOT_BYTES, SLOT_BYTES),
        (HEADER_BYTES + 10 * SLOT_BYTES, 3 * SLOT_BYTES),
        (HEADER_BYTES + 20 * SLOT_BYTES, SLOT_BYTES),
        (HEADER_BYTES + (PAGE_ENTRIES + 4) * SLOT_BYTES, SLOT_BYTES)]
    assert (disk.syncfses, disk.fsyncs) == ((1, 0) if sync_mode == "syncfs" else (0, 2))
    assert c.dirty_bytes == 0 and c.cached_bytes == 0
    c.close()
    assert {lid: os.path.getsize(index_path(d, lid)) for lid in (1, 2)} == sizes, "a delta changed a file's size"
    c = LedgerCache([d], 1 << 20)
    want1 = {**{e: loc(e + 1) for e in range(13)}, 11: loc(99), 20: loc(21)}
    assert {e: c.get(1, e) for e in range(PAGE_ENTRIES) if c.get(1, e) is not None} == want1
    assert c.get_range(2, 0, 6) == [loc(e + 2) for e in range(5)] + [loc(7)]
    assert c.get(2, PAGE_ENTRIES + 3) == loc(PAGE_ENTRIES + 5) and c.get(2, PAGE_ENTRIES + 4) == loc(PAGE_ENTRIES + 6)
    assert c.entry_ids(1) == [(0, 12), (20, 20)] and c.last_entry_id(1) == 20


def test_reads_of_a_page_with_a_delta_see_disk_and_delta(tmp_path):
    d = str(tmp_path)
    _flushed(d, {4: range(0, 8)})
    c = LedgerCache([d], 1 << 20)
    for e in range(8, 12):
        c.put(4, e, loc(e + 4))
    c.put(4, 2, loc(50))  # an overwrite of a slot on disk (journal replay, compaction)
    assert c.last_entry_id(4) == 11
    assert c.entry_ids(4) == [(0, 11)]  # a whole-ledger walk does not cache the page
    assert c.dirty_bytes < PAGE_BYTES
    expected = [loc(e + 4) for e in range(12)]
    expected[2] = loc(50)
    assert c.get_range(4, 0, 13) == expected + [None]  # the delta is merged: a dirty page now,
    # equal to the file outside the delta's slots (2..11): a changed range, which the cache
    # could turn back into a delta (counted so in dirty_bytes), written in place
    assert (c.dirty_bytes, c.cached_bytes) == (DELTA_PAGE_BYTES, PAGE_BYTES)
    c.put(4, 12, loc(16))
    assert c.flush() == (12 - 2 + 1) * SLOT_BYTES
    c.close()
    c = LedgerCache([d], 1 << 20)
    assert c.get_range(4, 0, 14) == [*expected, loc(16), None]


def _torn_in_page_1(d: str) -> str:
    """Ledger 3 with entries 0 and PAGE_ENTRIES + 1, its file cut inside page 1 on a 4 KiB
    boundary as a crash during the page's first write leaves it; returns the file's path."""
    _flushed(d, {3: [0, PAGE_ENTRIES + 1]})
    path = index_path(d, 3)
    os.truncate(path, 4096 * ((HEADER_BYTES + PAGE_BYTES + 300 * SLOT_BYTES) // 4096))
    return path


def test_a_torn_last_page_is_never_a_delta(tmp_path):
    """A crash while a page extended the file leaves it ending inside that page (on a 4 KiB
    boundary). Writing single slots past that end would leave a size no crash can leave:
    such a page is loaded and written whole."""
    d = str(tmp_path)
    path = _torn_in_page_1(d)
    c = LedgerCache([d], 1 << 20)
    c.put(3, PAGE_ENTRIES + 600, loc(600))  # past the torn end
    c.put(3, 5, loc(5))  # page 0 is whole: a delta
    assert c.dirty_bytes == PAGE_BYTES + DELTA_PAGE_BYTES + DELTA_SLOT_BYTES  # one page, one delta of one slot
    c.flush()
    c.close()
    assert os.path.getsize(path) == HEADER_BYTES + 2 * PAGE_BYTES
    c = LedgerCache([d], 1 << 20)
    assert c.entry_ids(3) == [(0, 0), (5, 5), (PAGE_ENTRIES + 1, PAGE_ENTRIES + 1),
                              (PAGE_ENTRIES + 600, PAGE_ENTRIES + 600)]


def test_failed_delta_flush_keeps_the_deltas_and_can_be_retried(tmp_path):
    d = str(tmp_path)
    _flushed(d, {1: range(4)})
    disk = FaultyDisk(fail_fsync=True)
    c = LedgerCache([d], 1 << 20, disk)
    c.put(1, 4, loc(5))
    with pytest.raises(OSError):
        c.flush()
    assert c.dirty_bytes > 0 and c.get_range(1, 0, 5) == [loc(e + 1) for e in range(5)]
    c.put(1, 5, loc(6))
    disk.fail_fsync = False
    c.flush()
    c.close()
    assert LedgerCache([d], 1 << 20).get_range(1, 0, 7) == [loc(e + 1) for e in range(6)] + [None]


def test_a_crash_during_a_delta_flush_leaves_every_slot_old_or_new(tmp_path):
    """ENOSPC in the middle of the writes of many deltas (a crash leaves any subset of them,
    a slot being 16-byte aligned inside one sector): every slot on disk is either what the
    last completed flush wrote or its new value; the entries of earlier flushes all read back."""
    d = str(tmp_path)
    ledgers = range(1, 41)
    _flushed(d, {lid: range(0, 3) for lid in ledgers})
    disk = FaultyDisk()
    c = LedgerCache([d], 1 << 20, disk)
    for lid in ledgers:
        c.put(lid, 3, loc(3 + lid))
        c.put(lid, 4, loc(4 + lid))
    disk.write_bytes_left = 19 * 2 * SLOT_BYTES + SLOT_BYTES  # 19 ledgers, then one slot of the 20th
    with pytest.raises(OSError):
        c.flush()
    # "kill -9" here: the cache is abandoned, the page cache keeps what was written
    c = LedgerCache([d], 1 << 20)
    new = 0
    for lid in ledgers:
        assert c.get_range(lid, 0, 3) == [loc(e + lid) for e in range(3)]
        tail = [c.get(lid, 3), c.get(lid, 4)]  # a damaged slot would raise CorruptDataError
        assert tail in ([None, None], [loc(3 + lid), None], [loc(3 + lid), loc(4 + lid)]), (lid, tail)
        new += tail == [loc(3 + lid), loc(4 + lid)]
    assert new == 19


def test_delete_ledger_drops_its_deltas(tmp_path):
    d = str(tmp_path)
    _flushed(d, {1: range(3), 2: range(3)})
    c = LedgerCache([d], 1 << 20)
    c.put(1, 3, loc(4))
    c.put(2, 3, loc(5))
    assert c.delete_ledger(1)
    assert c.dirty_bytes == DELTA_PAGE_BYTES + DELTA_SLOT_BYTES
    assert c.flush() == SLOT_BYTES
    assert not os.path.exists(index_path(d, 1)) and c.get(2, 3) == loc(5)


def test_deltas_count_against_the_budget(tmp_path):
    d = str(tmp_path)
    _flushed(d, {lid: [0] for lid in range(100)})
    c = LedgerCache([d], 100 * (DELTA_PAGE_BYTES + DELTA_SLOT_BYTES))
    for lid in range(99):
        c.put(lid, 1, loc(lid))
    assert not c.needs_flush
    c.put(99, 1, loc(99))
    assert c.needs_flush and c.dirty_bytes == 100 * (DELTA_PAGE_BYTES + DELTA_SLOT_BYTES)
    c.flush()
    assert not c.needs_flush and c.dirty_bytes == 0


# -- changed ranges: cached clean pages in the file write only the slots puts changed -------


def test_a_cached_page_in_the_file_writes_only_its_changed_slots(tmp_path):
    d = str(tmp_path)
    disk = CountingDisk()
    c = _written(d, disk, range(10))
    assert disk.pwrites == [(0, HEADER_BYTES), (HEADER_BYTES, PAGE_BYTES)]  # a new file: header, whole page
    size = os.path.getsize(index_path(d, 1))
    disk.pwrites.clear()
    for e in (10, 11, 12):
        c.put(1, e, loc(e))
    c.put(1, 4, loc(40))  # below the range so far (journal replay, compaction): it grows down
    c.put(1, PAGE_ENTRIES + 1, loc(7))  # page 1 is past the file's end: written whole
    assert c.get_range(1, 0, 14) == [*(loc(e) for e in range(4)), loc(40), *(loc(e) for e in range(5, 13)), None]
    assert c.flush() == 9 * SLOT_BYTES + PAGE_BYTES
    assert sorted(disk.pwrites) == [(HEADER_BYTES + 4 * SLOT_BYTES, 9 * SLOT_BYTES),
                                    (HEADER_BYTES + PAGE_BYTES, PAGE_BYTES)]
    assert os.path.getsize(index_path(d, 1)) == size + PAGE_BYTES
    disk.pwrites.clear()
    c.put(1, 13, loc(13))  # the page is clean and cached again: a range once more
    assert c.flush() == SLOT_BYTES and disk.pwrites == [(HEADER_BYTES + 13 * SLOT_BYTES, SLOT_BYTES)]
    c.close()
    c = LedgerCache([d], 1 << 20)
    want = [loc(e) for e in range(14)]
    want[4] = loc(40)
    assert c.get_range(1, 0, 15) == [*want, None]
    assert c.entry_ids(1) == [(0, 13), (PAGE_ENTRIES + 1, PAGE_ENTRIES + 1)]


def test_a_failed_range_flush_keeps_the_range_and_can_be_retried(tmp_path):
    d = str(tmp_path)
    disk = CountingDisk()
    c = _written(d, disk, range(4))
    disk.fail_fsync = True
    c.put(1, 4, loc(4))
    with pytest.raises(OSError):
        c.flush()
    c.put(1, 6, loc(6))
    disk.fail_fsync = False
    disk.pwrites.clear()
    assert c.flush() == 3 * SLOT_BYTES and disk.pwrites == [(HEADER_BYTES + 4 * SLOT_BYTES, 3 * SLOT_BYTES)]
    c.close()
    assert LedgerCache([d], 1 << 20).get_range(1, 0, 8) == [*(loc(e) for e in range(5)), None, loc(6), None]


def test_pages_read_past_a_torn_end_are_written_whole(tmp_path):
    """A page the cache read from a torn last page is not wholly in the file: writing only
    its changed slots would leave the file ending inside a page."""
    d = str(tmp_path)
    path = _torn_in_page_1(d)
    c = LedgerCache([d], 1 << 20)
    assert c.get(3, PAGE_ENTRIES + 1) == loc(PAGE_ENTRIES + 4)  # cached clean, from the torn page
    c.put(3, PAGE_ENTRIES + 2, loc(9))
    assert c.flush() == PAGE_BYTES
    c.close()
    assert os.path.getsize(path) == HEADER_BYTES + 2 * PAGE_BYTES


def test_new_pages_start_as_deltas_and_are_written_whole(tmp_path):
    """Thousands of new ledgers with an entry or two each hold a delta apiece, not a 16 KiB
    page (bookie RSS and index pressure with many new ledgers); the flush writes each new
    page whole, so files grow by whole pages, and keeps it cached clean."""
    d = str(tmp_path)
    disk = CountingDisk()
    c = LedgerCache([d], 1 << 20, disk)
    n = 1000
    for lid in range(1, n + 1):
        c.put(lid, 0, loc(lid))
        c.put(lid, 1, loc(lid + 1))
    assert c.dirty_bytes == n * (DELTA_PAGE_BYTES + 2 * DELTA_SLOT_BYTES) < n * PAGE_BYTES
    assert not c.needs_flush
    assert c.get(7, 1) == loc(8) and c.get(7, 2) is None  # read before the flush: from the delta
    c.flush()
    assert c.dirty_bytes == 0
    for lid in (1, 500, n):
        assert os.path.getsize(index_path(d, lid)) == HEADER_BYTES + PAGE_BYTES
    disk.pwrites.clear()
    c.put(500, 2, loc(3))  # cached clean after the flush: a changed range, not a page
    assert c.flush() == SLOT_BYTES and disk.pwrites == [(HEADER_BYTES + 2 * SLOT_BYTES, SLOT_BYTES)]
    c.close()
    c = LedgerCache([d], 1 << 20)
    assert [c.get(lid, 0) for lid in (1, 500, n)] == [loc(1), loc(500), loc(n)]
    assert c.get_range(500, 0, 4) == [loc(500), loc(501), loc(3), None]
    assert c.entry_ids(7) == [(0, 1)] and c.last_entry_id(7) == 1


def test_a_dense_new_page_becomes_a_whole_page(tmp_path):
    """Past the slots whose charge passes a page's, a new page is an ordinary dirty page."""
    d = str(tmp_path)
    c = LedgerCache([d], 1 << 20)
    slots_max = PAGE_BYTES // DELTA_SLOT_BYTES
    for e in range(slots_max):
        c.put(1, e, loc(e))
    assert c.dirty_bytes == DELTA_PAGE_BYTES + slots_max * DELTA_SLOT_BYTES
    c.put(1, slots_max, loc(slots_max))
    assert c.dirty_bytes == PAGE_BYTES
    for e in range(slots_max + 1, PAGE_ENTRIES + 3):  # into page 1: a new delta again
        c.put(1, e, loc(e))
    assert c.dirty_bytes == PAGE_BYTES + DELTA_PAGE_BYTES + 3 * DELTA_SLOT_BYTES
    c.flush()
    c.close()
    c = LedgerCache([d], 1 << 20)
    assert c.get_range(1, 0, PAGE_ENTRIES + 4) == [*(loc(e) for e in range(PAGE_ENTRIES + 3)), None]


def test_a_new_page_written_whole_is_not_written_whole_again_over_later_slots(tmp_path):
    """After the flush that wrote a new page whole, the page is in the file: puts to it are
    never again a new page (whose whole-page write of zeros would erase the earlier slots),
    also when the clean copy was evicted."""
    d = str(tmp_path)
    c = LedgerCache([d], PAGE_BYTES)  # room for one page: the clean copies get evicted
    for lid in (1, 2, 3):
        c.put(lid, 0, loc(lid))
    c.flush()
    for lid in (1, 2, 3):
        c.put(lid, 1, loc(10 + lid))
    c.flush()
    c.close()
    c = LedgerCache([d], 1 << 20)
    assert [c.get_range(lid, 0, 3) for lid in (1, 2, 3)] == [[loc(lid), loc(10 + lid), None] for lid in (1, 2, 3)]


def test_a_failed_flush_of_new_pages_is_retried_whole(tmp_path):
    d = str(tmp_path)
    disk = FaultyDisk(fail_fsync=True)
    c = LedgerCache([d], 1 << 20, disk)
    for lid in range(1, 6):
        c.put(lid, 0, loc(lid))
    with pytest.raises(OSError):
        c.flush()
    c.put(3, 1, loc(33))  # more after the failure, before the retry
    disk.fail_fsync = False
    c.flush()
    c.close()
    c = LedgerCache([d], 1 << 20)
    assert [c.get(lid, 0) for lid in range(1, 6)] == [loc(lid) for lid in range(1, 6)]
    assert c.get(3, 1) == loc(33)


def test_deleting_a_ledger_with_a_new_page_delta(tmp_path):
    d = str(tmp_path)
    c = LedgerCache([d], 1 << 20)
    c.put(1, 0, loc(1))
    c.put(2, 0, loc(2))
    assert c.delete_ledger(1)
    assert c.dirty_bytes == DELTA_PAGE_BYTES + DELTA_SLOT_BYTES
    c.flush()
    assert not os.path.exists(index_path(d, 1)) and c.get(2, 0) == loc(2)


def test_a_flush_is_one_syncfs_per_file_system_or_one_fsync_per_file(tmp_path, sync_mode):
    """Two index directories on one file system and, where there is one, a third on another
    (/dev/shm): syncfs mode syncs each file system once per flush, whatever the number of
    ledgers; fsync mode fsyncs each written file. A flush with nothing to write syncs nothing."""
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    shm = None
    if os.path.isdir("/dev/shm") and os.stat("/dev/shm").st_dev != os.stat(tmp_path).st_dev:
        shm = tempfile.mkdtemp(dir="/dev/shm", prefix="zbk-test-")
        dirs.append(shm)
    try:
        disk = FaultyDisk()
        c = LedgerCache(dirs, 1 << 20, disk)
        assert c.sync_mode == sync_mode
        assert LedgerCache(dirs, 1 << 20, disk, syncfs=False).sync_mode == "fsync"
        for ledger_id in range(60):
            c.put(ledger_id, 0, loc(ledger_id))
        c.flush()
        file_systems = len({os.stat(d).st_dev for d in dirs})
        assert (disk.syncfses, disk.fsyncs) == ((file_systems, 0) if sync_mode == "syncfs" else (0, 60))
        c.flush()  # nothing dirty
        assert (disk.syncfses, disk.fsyncs) == ((file_systems, 0) if sync_mode == "syncfs" else (0, 60))
        for ledger_id in range(0, 60, 2):
            c.put(ledger_id, 1, loc(ledger_id + 1))
        c.flush()
        assert (disk.syncfses, disk.fsyncs) == ((2 * file_systems, 0) if sync_mode == "syncfs" else (0, 90))
        c.close()
        c = LedgerCache(dirs, 1 << 20)
        assert [c.get(ledger_id, 0) for ledger_id in range(60)] == [loc(i) for i in range(60)]
        assert [c.get(ledger_id, 1) for ledger_id in range(0, 60, 2)] == [loc(i + 1) for i in range(0, 60, 2)]
        c.close()
    finally:
        if shm is not None:
            shutil.rmtree(shm)


def test_a_failed_syncfs_keeps_every_ledger_dirty(tmp_path, sync_mode):
    """Many ledgers (more than one fsync group, more than the descriptor cache): a failure of
    the flush's sync leaves all of them dirty, and the retry makes all of them durable."""
    d = str(tmp_path)
    disk = FaultyDisk()
    c = LedgerCache([d], 64 << 20, disk, files_open_max=300)
    n = 1500
    for ledger_id in range(n):
        c.put(ledger_id, 0, loc(ledger_id))
    c.flush()
    for ledger_id in range(n):
        c.put(ledger_id, 1, loc(ledger_id + 1))
    _flush_fails_then_succeeds(c, disk)
    c = LedgerCache([d], 1 << 20)
    assert all(c.get(ledger_id, 1) == loc(ledger_id + 1) for ledger_id in range(n))
    c.close()


def _open_fds(under: str) -> int:
    """This process's descriptors open on ``under`` or a file below it. Counted by path, not
    in all: descriptors of earlier tests in the same process may close meanwhile."""
    under, n = os.path.realpath(under), 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed since the listing (the listing's own descriptor, too)
        n += target == under or target.startswith(under + os.sep)
    return n


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_index_descriptors_kept_open_are_bounded(tmp_path):
    """At most ``files_open_max`` index files stay open, the least recently used closed
    first; writes, flushes and reads of ledgers beyond that still land (re-opened), and a
    cache of 3,000 keeps every one of 2,000 ledgers open (a checkpoint of them re-opens
    none) where the descriptor limit allows."""
    d = str(tmp_path / "small")
    c = LedgerCache([d], 64 << 20, files_open_max=25)
    assert c.files_open_max == 25
    for round_ in range(3):
        for ledger_id in range(200):
            c.put(ledger_id, round_, loc(ledger_id + round_))
        c.flush()
        assert _open_fds(d) <= 25 + 1  # + the directory descriptor for syncfs
    assert all(c.get(ledger_id, e) == loc(ledger_id + e) for ledger_id in range(200) for e in range(3))
    c.close()
    assert _open_fds(d) == 0
    c = LedgerCache([d], 64 << 20)
    assert all(c.get(ledger_id, 2) == loc(ledger_id + 2) for ledger_id in range(200))
    c.close()

    if raise_open_files_limit() < 4096:
        return
    d = str(tmp_path / "many")
    c = LedgerCache([d], 64 << 20, files_open_max=3000)
    for ledger_id in range(2000):
        c.put(ledger_id, 0, loc(ledger_id))
    c.flush()
    assert _open_fds(d) >= 2000
    c.close()
    assert _open_fds(d) == 0


def test_raise_open_files_limit_reaches_the_hard_limit():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    got = raise_open_files_limit()
    assert got >= soft
    now_soft, now_hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert now_hard == hard
    assert now_soft in (got, resource.RLIM_INFINITY)
    if hard != resource.RLIM_INFINITY:
        assert now_soft == hard


def test_put_many_is_a_put_each(tmp_path, rng):
    """put_many (the IndexPut path) and a put per entry leave the same cache, through new
    ledgers, new pages, deltas over pages in the file, changed ranges of cached pages, dense
    new pages, a small budget's evictions, and flushes in between; and the same files."""
    caches = [LedgerCache([str(tmp_path / name)], 24 * PAGE_BYTES) for name in ("one", "many")]
    next_eid: dict[int, int] = {}
    for round_ in range(6):
        lids, eids, locs = [], [], []
        for _ in range(rng.randrange(200, 1500)):
            lid = rng.randrange(1, 40) if rng.random() < 0.75 else 7  # ledger 7: dense pages
            eid = next_eid.get(lid, 0) if rng.random() < 0.9 else rng.randrange(0, 3000)
            next_eid[lid] = max(next_eid.get(lid, 0), eid + 1)
            lids.append(lid)
            eids.append(eid)
            locs.append(loc(eid + round_))
        for lid, eid, location in zip(lids, eids, locs, strict=True):
            caches[0].put(lid, eid, location)
        caches[1].put_many(lids, eids, locs)
        one, many = caches
        assert (one.dirty_bytes, one.cached_bytes) == (many.dirty_bytes, many.cached_bytes)
        for lid in range(1, 40):
            assert one.last_entry_id(lid) == many.last_entry_id(lid)
        if round_ % 2:
            assert one.flush() == many.flush()
        if round_ in (2, 4):  # reads merge deltas into pages: the same ones in both
            for lid in range(1, 40, 3):
                assert one.get_range(lid, 0, 3000) == many.get_range(lid, 0, 3000)
    for c in caches:
        c.flush()
        c.close()
    reopened = [LedgerCache([str(tmp_path / name)], 24 * PAGE_BYTES) for name in ("one", "many")]
    for lid in range(1, 40):
        assert reopened[0].entry_ids(lid) == reopened[1].entry_ids(lid)
        assert reopened[0].get_range(lid, 0, 3000) == reopened[1].get_range(lid, 0, 3000)
    for c in reopened:
        c.close()
    with pytest.raises(ValueError):
        LedgerCache([str(tmp_path / "x")]).put_many([1, 2], [0], [loc(0)])


def test_dirty_ranges_become_deltas_when_the_cache_needs_room_instead_of_a_checkpoint(tmp_path):
    """Many ledgers written a few entries at a time: the cache holds 8 pages, all
    those cached clean after a flush; puts make them dirty with changed ranges, and puts to 40 other
    ledgers need room. The ranges turn into deltas (oldest first) rather than filling the
    cache with dirty pages: the budget holds, no flush is asked for, a flush writes only the
    changed slots, and every slot reads back, from the cache and after reopening."""
    d = str(tmp_path)
    disk = CountingDisk()
    c = LedgerCache([d], 8 * PAGE_BYTES, disk)
    for lid in range(48):
        for e in range(4):
            c.put(lid, e, loc(lid + e))
    c.flush()  # 48 new pages written whole; those the cache had room for stay cached
    cached = [lid for lid in range(48) if (lid, 0) in c._clean]
    assert len(cached) >= 4
    for rnd in range(3):
        for lid in cached:  # ranges first: they are the oldest dirty pages
            c.put(lid, 4 + rnd, loc(lid + 4 + rnd))
        assert c.dirty_bytes < c.bytes_max // 4
        for lid in range(48):
            if lid not in cached:
                c.put(lid, 4 + rnd, loc(lid + 4 + rnd))
        assert c.cached_bytes <= c.bytes_max and not c.needs_flush
        assert all(c.get(lid, e) == loc(lid + e) for lid in range(48) for e in range(5 + rnd))
    disk.pwrites.clear()
    written = c.flush()
    assert written < 48 * PAGE_BYTES // 4  # slots in place, no whole pages
    c.close()
    c = LedgerCache([d], 1 << 20)
    assert all(c.get_range(lid, 0, 8) == [*(loc(lid + e) for e in range(7)), None] for lid in range(48))
    c.close()


def test_a_dirty_range_turned_into_a_delta_leaves_a_damaged_slot_damaged(tmp_path):
    """A page read from its file with a damaged slot, then changed around that slot: when the
    cache turns the changed range into a delta, it takes only sound slots, so the flush does
    not write the damaged location back under a fresh check word (it would pass for sound)."""
    d = str(tmp_path)
    _with_damaged_slot(d, 1, 10, 5, at=1)
    c = LedgerCache([d], PAGE_BYTES)  # room for one page
    assert c.get(1, 4) == loc(4)  # page 0 cached clean, damaged slot 5 and all
    c.put(1, 3, loc(30))
    c.put(1, 7, loc(70))  # the changed range spans slot 5
    c.put(2, 0, loc(0))  # needs room: page 0 of ledger 1 becomes a delta
    assert (1, 0) not in c._dirty and c._deltas[(1, 0)] == {3: loc(30), 4: loc(4), 6: loc(6), 7: loc(70)}
    c.flush()
    c.close()
    c = LedgerCache([d], 1 << 20)
    assert [c.get(1, e) for e in (3, 4, 6, 7, 8)] == [loc(30), loc(4), loc(6), loc(70), loc(8)]
    with pytest.raises(CorruptDataError):
        c.get(1, 5)
    c.close()
