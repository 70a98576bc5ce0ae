"""Range reads: EntryLogWriter.read_entries coalesces records into runs (one pread each) and
must answer exactly what reading each entry on its own answers: the same blobs, the same
stop, the same error (file and offset) for a damaged record; and LedgerCache.get_range must
answer what get answers slot by slot."""

from __future__ import annotations

import os
import random

import pytest

from zbk.errors import CorruptDataError
from zbk.storage import entrylog
from zbk.storage.entrylog import RECORD_HEADER_BYTES, EntryLogWriter, log_name, make_location, split_location
from zbk.storage.index import HEADER_BYTES as INDEX_HEADER_BYTES
from zbk.storage.index import PAGE_ENTRIES, SLOT_BYTES
from zbk.storage.ledgercache import LedgerCache

from .helpers import flip_byte

MiB = 1 << 20


def _append(w: EntryLogWriter, ledger_id: int, entry_ids: range | list[int], size: int,
            rng: random.Random) -> dict[int, tuple[int, bytes]]:
    out = {}
    for e in entry_ids:
        blob = rng.randbytes(size)
        out[e] = (w.append(ledger_id, e, blob), blob)
    return out


def _one_by_one(w: EntryLogWriter, ledger_id: int, entry_ids: list[int], locations: list[int],
                bytes_max: int) -> tuple[list[bytes], str | None]:
    """The reference: what the EntryLogger answered before runs (read each entry alone)."""
    blobs: list[bytes] = []
    size = 0
    for eid, loc in zip(entry_ids, locations, strict=True):
        try:
            blob = w.read(loc, ledger_id, eid)
        except CorruptDataError as e:
            return blobs, str(e)
        if blobs and size + len(blob) > bytes_max:
            break
        blobs.append(blob)
        size += len(blob)
    return blobs, None


def _check_same(w: EntryLogWriter, ledger_id: int, entry_ids: list[int], locations: list[int],
                bytes_max: int = 8 * MiB) -> tuple[list[bytes], str | None]:
    batch = w.read_entries(ledger_id, entry_ids, locations, bytes_max)
    got = [bytes(b) for b in batch.blobs]
    want, error = _one_by_one(w, ledger_id, entry_ids, locations, bytes_max)
    assert got == want
    assert (str(batch.error) if batch.error else None) == error
    return got, error


def _log_counting_preads(tmp_path, rng, monkeypatch) -> tuple[EntryLogWriter, dict[int, tuple[int, bytes]], list[int]]:
    """2,000 records of 1 KiB in one flushed log, and the sizes of the preads that follow."""
    w = EntryLogWriter([str(tmp_path)], 64 * MiB, 4096)
    entries = _append(w, 1, range(2000), 1024, rng)
    w.flush()
    preads: list[int] = []
    real = os.pread
    monkeypatch.setattr(entrylog.os, "pread", lambda fd, n, off: preads.append(n) or real(fd, n, off))
    return w, entries, preads


def test_a_run_reads_consecutive_records_with_one_pread(tmp_path, rng, monkeypatch):
    w, entries, preads = _log_counting_preads(tmp_path, rng, monkeypatch)
    ids = list(range(100, 1600))
    got, error = _check_same(w, 1, ids, [entries[e][0] for e in ids])
    assert error is None and got == [entries[e][1] for e in ids]
    preads.clear()
    w.read_entries(1, ids, [entries[e][0] for e in ids], 8 * MiB)
    assert len(preads) == 2 and max(preads) <= MiB + 4096, preads  # 1,500 records of 1,048 bytes: 2 runs
    w.close()


def test_a_run_reads_no_further_than_the_bytes_wanted(tmp_path, rng, monkeypatch):
    """A read served in 256 KiB slices must not pread a whole 1 MiB run per slice and throw
    three quarters of it away."""
    w, entries, preads = _log_counting_preads(tmp_path, rng, monkeypatch)
    ids = list(range(2000))
    locations = [entries[e][0] for e in ids]
    for bytes_max in (256 << 10, 100_000, 5_000, 1):
        preads.clear()
        batch = w.read_entries(1, ids, locations, bytes_max)
        assert [bytes(b) for b in batch.blobs] == [entries[e][1] for e in range(max(1, bytes_max // 1024))]
        assert len(preads) == 1 and preads[0] <= bytes_max + bytes_max // 8 + 2 * 4096, (bytes_max, preads)
        assert all(isinstance(b, memoryview) for b in batch.blobs[:2]) or bytes_max < 4096  # views, not copies
        _check_same(w, 1, ids, locations, bytes_max)
    w.close()


def test_a_damaged_record_inside_a_run_is_an_error_for_that_entry_only(tmp_path, rng):
    d = str(tmp_path)
    w = EntryLogWriter([d], 64 * MiB, 4096)
    entries = _append(w, 1, range(300), 700, rng)
    w.close()
    loc = entries[150][0]
    flip_byte(os.path.join(d, log_name(1)), split_location(loc)[1] + RECORD_HEADER_BYTES + 300)
    w = EntryLogWriter([d], 64 * MiB, 4096)
    ids = list(range(300))
    batch = w.read_entries(1, ids, [entries[e][0] for e in ids], 8 * MiB)
    assert [bytes(b) for b in batch.blobs] == [entries[e][1] for e in range(150)]
    assert isinstance(batch.error, CorruptDataError) and "crc32c" in str(batch.error)
    assert (batch.error.path, batch.error.offset) == (os.path.join(d, log_name(1)), split_location(loc)[1])
    _check_same(w, 1, ids, [entries[e][0] for e in ids])
    # The neighbours after it are served by a read that starts after it.
    after = list(range(151, 300))
    got, error = _check_same(w, 1, after, [entries[e][0] for e in after])
    assert error is None and got == [entries[e][1] for e in after]
    # A damaged record header (its length) is caught too, never read past.
    flip_byte(os.path.join(d, log_name(1)), split_location(entries[200][0])[1] + 1)
    w2 = EntryLogWriter([d], 64 * MiB, 4096)
    got, error = _check_same(w2, 1, after, [entries[e][0] for e in after])
    assert got == [entries[e][1] for e in range(151, 200)] and error is not None
    w.close()
    w2.close()


def test_a_range_across_entry_log_files_and_the_write_buffer(tmp_path, rng):
    d = str(tmp_path)
    w = EntryLogWriter([d], 256 * 1024, 64 * 1024)  # a new log every ~250 records of 1 KiB
    entries = _append(w, 7, range(1200), 1000, rng)
    assert len(w.log_ids()) >= 4
    ids = list(range(1200))
    locs = [entries[e][0] for e in ids]
    # Sealed logs, the active log's written part and its write buffer, in one range.
    got, error = _check_same(w, 7, ids, locs)
    assert error is None and got == [entries[e][1] for e in ids]
    w.flush()
    got, error = _check_same(w, 7, ids, locs)
    assert error is None and got == [entries[e][1] for e in ids]
    w.close()
    w = EntryLogWriter([d], 256 * 1024, 64 * 1024)  # every log sealed, read from files
    got, error = _check_same(w, 7, ids, locs)
    assert error is None and got == [entries[e][1] for e in ids]
    w.close()


def test_entries_out_of_order_interleaved_and_large(tmp_path, rng):
    d = str(tmp_path)
    w = EntryLogWriter([d], 64 * MiB, 4096)
    entries: dict[tuple[int, int], tuple[int, bytes]] = {}
    for e in range(400):  # three ledgers interleaved, some entries larger than a run's guess
        for lid in (1, 2, 3):
            size = rng.choice((10, 500, 3000, 9000, 40_000)) if lid == 2 else rng.randrange(1, 2000)
            blob = rng.randbytes(size)
            entries[(lid, e)] = (w.append(lid, e, blob), blob)
    w.flush()
    for order in ("ascending", "descending", "shuffled", "pairs swapped"):
        ids = list(range(400))
        if order == "descending":
            ids.reverse()
        elif order == "shuffled":
            rng.shuffle(ids)
        elif order == "pairs swapped":
            ids = [e ^ 1 for e in ids]
        for lid in (1, 2):
            got, error = _check_same(w, lid, ids, [entries[(lid, e)][0] for e in ids], bytes_max=64 * MiB)
            assert error is None and got == [entries[(lid, e)][1] for e in ids], (order, lid)
    # The response bound stops before the entry that would pass it (the first is always taken).
    ids = list(range(400))
    got, _ = _check_same(w, 2, ids, [entries[(2, e)][0] for e in ids], bytes_max=100_000)
    assert 1 <= len(got) < 400 and (sum(map(len, got)) <= 100_000 or len(got) == 1)
    w.close()


def test_blobs_of_sparse_runs_do_not_hold_their_run(tmp_path, rng):
    """Dense runs hand out views of the run (no copy); a run that serves little of what it
    read (records of other ledgers in between) hands out copies, so a reply waiting in a
    backlog does not hold much more memory than its entries."""
    d = str(tmp_path)
    w = EntryLogWriter([d], 64 * MiB, 4096)
    dense = _append(w, 1, range(100), 1000, rng)
    sparse = {}
    for e in range(100):
        sparse[e] = (w.append(2, e, rng.randbytes(100)), None)
        w.append(3, e, rng.randbytes(3000))
    w.flush()
    batch = w.read_entries(1, list(range(100)), [dense[e][0] for e in range(100)], 8 * MiB)
    assert all(isinstance(b, memoryview) for b in batch.blobs)
    batch = w.read_entries(2, list(range(100)), [sparse[e][0] for e in range(100)], 8 * MiB)
    assert len(batch.blobs) == 100 and all(isinstance(b, bytes) for b in batch.blobs)
    w.close()


def test_wrong_locations_are_errors_where_they_occur(tmp_path, rng):
    d = str(tmp_path)
    w = EntryLogWriter([d], 64 * MiB, 4096)
    entries = _append(w, 1, range(50), 200, rng)
    w.flush()
    ids = list(range(50))
    good = [entries[e][0] for e in ids]
    for bad in (entries[31][0],  # another entry's record
                good[30] + 3,  # not a record boundary
                good[30] + 10 * MiB,  # past the log's records
                make_location(99, 24),  # no such log
                make_location(1, 0)):  # the log header
        locs = list(good)
        locs[30] = bad
        got, error = _check_same(w, 1, ids, locs)
        assert len(got) == 30 and error is not None, bad
    _, error = _check_same(w, 2, ids, good)  # every record belongs to ledger 1
    assert error is not None and "holds entry 1:0" in error
    w.close()


def test_random_ranges_match_reading_one_by_one(tmp_path, rng):
    d = str(tmp_path)
    w = EntryLogWriter([d], 512 * 1024, 16 * 1024)
    entries: dict[tuple[int, int], tuple[int, bytes]] = {}
    for e in range(600):
        for lid in rng.sample((1, 2, 3), rng.randrange(1, 4)):
            blob = rng.randbytes(rng.choice((0, 1, 100, 1024, 5000, 20_000)))
            entries[(lid, e)] = (w.append(lid, e, blob), blob)
        if rng.random() < 0.01:
            w.flush()
    for _ in range(30):
        lid = rng.choice((1, 2, 3))
        held = sorted(e for (l_, e) in entries if l_ == lid)
        first = rng.randrange(len(held))
        ids = held[first:first + rng.randrange(1, 500)]
        _check_same(w, lid, ids, [entries[(lid, e)][0] for e in ids], bytes_max=rng.choice((8 * MiB, 200_000)))
    w.close()


# --- the index side: get_range ---------------------------------------------------------------


def test_get_range_matches_get_slot_by_slot(tmp_path, rng):
    d = str(tmp_path)
    cache = LedgerCache([d])
    cache.set_master_key(1, b"k")
    present = set(rng.sample(range(3 * PAGE_ENTRIES), 2 * PAGE_ENTRIES)) | set(range(100, 1500))
    for e in present:
        cache.put(1, e, make_location(1 + e % 3, 24 + 1000 * e))
    for flushed in (False, True):
        if flushed:
            cache.flush()
            cache = LedgerCache([d])
        for first, count in ((0, 10), (100, 1400), (1000, 4096), (0, 3 * PAGE_ENTRIES + 5), (5000, 3)):
            assert cache.get_range(1, first, count) == [cache.get(1, e) for e in range(first, first + count)]
    assert cache.get_range(9, 0, 5) == [None] * 5  # an unknown ledger
    cache.close()


def test_get_range_raises_for_a_damaged_slot_like_get(tmp_path):
    d = str(tmp_path)
    cache = LedgerCache([d])
    cache.set_master_key(1, b"k")
    for e in range(2000):
        cache.put(1, e, make_location(1, 24 + 100 * e))
    cache.flush()
    path = cache._ledgers[1].path
    flip_byte(path, INDEX_HEADER_BYTES + 1500 * SLOT_BYTES + 9)  # entry 1500's check
    cache = LedgerCache([d])
    assert cache.get_range(1, 0, 1500) == [make_location(1, 24 + 100 * e) for e in range(1500)]
    with pytest.raises(CorruptDataError) as err:
        cache.get_range(1, 1000, 1000)
    assert err.value.offset == INDEX_HEADER_BYTES + 1500 * SLOT_BYTES
    with pytest.raises(CorruptDataError):
        cache.get(1, 1500)
    cache.close()


def test_get_range_of_a_sparse_ledger_checks_absent_slots_too(tmp_path):
    """A striped ledger's index holds every other slot or so: the absent ones must read
    (0, 0); anything else there is damage, found by get_range as by get."""
    d = str(tmp_path)
    cache = LedgerCache([d])
    cache.set_master_key(1, b"k")
    for e in range(0, 3000, 3):
        cache.put(1, e, make_location(1, 24 + 100 * e))
    cache.flush()
    want = [make_location(1, 24 + 100 * e) if e % 3 == 0 else None for e in range(3000)]
    cache.close()
    cache = LedgerCache([d])
    assert cache.get_range(1, 0, 3000) == want
    path = cache._ledgers[1].path
    cache.close()
    flip_byte(path, INDEX_HEADER_BYTES + 1201 * SLOT_BYTES + 12)  # an absent slot's check word
    cache = LedgerCache([d])
    assert cache.get_range(1, 0, 1201) == want[:1201]
    with pytest.raises(CorruptDataError) as err:
        cache.get_range(1, 1100, 500)
    assert err.value.offset == INDEX_HEADER_BYTES + 1201 * SLOT_BYTES
    with pytest.raises(CorruptDataError):
        cache.get(1, 1201)
    cache.close()
