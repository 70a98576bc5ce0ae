"""Entry logs written with O_DIRECT (zbk/storage/entrylog.py, "Direct I/O"): the same bytes
on disk as buffered writes, reads that never see stale cached pages, footers that end the
file, sealing after a crash, and buffered writes where O_DIRECT is refused or per-ledger."""

from __future__ import annotations

import logging
import os
import random

import pytest
from helpers.directio import RefusingDirectDisk, refuse_direct_opens

from zbk.storage.disk import DIRECT_BLOCK_BYTES, O_DIRECT, RealDisk, only_zeros
from zbk.storage.entrylog import EntryLogWriter, list_logs, log_name, read_footer


def _crash(w: EntryLogWriter) -> None:
    """Drop the writer as kill -9 would: no footer, no flush of what is still in memory."""
    for lg in w._open.values():
        w._close_direct(lg)
        os.close(lg.fd)
    w._open.clear()
    w._active.clear()


def _entries(rng: random.Random, n: int) -> list[tuple[int, int, bytes]]:
    """Entries whose sizes end records at every offset of a block: 1 byte to 9 KiB."""
    return [(1 + i % 3, i, rng.randbytes(rng.choice([1, 17, 500, 1024, 4071, 4096, 9000]))) for i in range(n)]


def _append(w: EntryLogWriter, entries: list[tuple[int, int, bytes]], rng: random.Random) -> list[int]:
    """The entries in batches of 1 to 6, some one by one; returns their locations."""
    locations: list[int] = []
    i = 0
    while i < len(entries):
        chunk = entries[i:i + rng.randrange(1, 7)]
        if rng.random() < 0.5:
            locations += w.append_batch([e[0] for e in chunk], [e[1] for e in chunk], [e[2] for e in chunk])[0]
        else:
            locations += [w.append(*e) for e in chunk]
        if rng.random() < 0.1:
            w.flush()
        i += len(chunk)
    return locations


def _read_all(w: EntryLogWriter, entries: list[tuple[int, int, bytes]], locations: list[int]) -> None:
    for (lid, eid, blob), loc in zip(entries, locations, strict=True):
        assert w.read(loc, lid, eid) == blob


def test_direct_writes_put_the_same_bytes_on_disk_as_buffered_ones(ddir):
    entries = _entries(random.Random(7), 400)
    files: dict[bool, dict[str, bytes]] = {}
    locs: dict[bool, list[int]] = {}
    for direct in (False, True):
        d = ddir / ("direct" if direct else "buffered")
        w = EntryLogWriter([str(d)], 256 << 10, 8192, direct_io=direct)
        locs[direct] = _append(w, entries, random.Random(11))  # the same batches and flushes on both sides
        assert all(lg.dfd >= 0 for lg in w._active.values()) is direct
        _read_all(w, entries, locs[direct])
        w.close()
        files[direct] = {name: (d / name).read_bytes() for name in sorted(os.listdir(d)) if name.endswith(".log")}
        w = EntryLogWriter([str(d)], 256 << 10, 8192, direct_io=direct)
        assert w.sealed_on_open == []  # every log ends in its footer's trailer
        _read_all(w, entries, locs[direct])
        w.close()
    assert locs[True] == locs[False]
    assert len(files[True]) > 3  # rotated by size several times
    assert files[True] == files[False]  # no padding left behind a footer


def test_reads_after_each_write_never_see_stale_cached_bytes(ddir):
    """A read caches the block holding the end of the records; the next direct write rewrites
    that block, and the next read must see the new records in it."""
    rng = random.Random(5)
    w = EntryLogWriter([str(ddir)], 64 << 20, 0, direct_io=True)  # every append is written at once
    done: list[tuple[int, bytes, int]] = []
    for i in range(300):
        blob = rng.randbytes(rng.choice([10, 300, 1000, 3000]))
        done.append((i, blob, w.append(1, i, blob)))
        assert w._active[-1].dfd >= 0
        for eid, b, loc in done[-3:]:  # the newest records share the tail block
            assert w.read(loc, 1, eid) == b
    got = w.read_entries(1, [eid for eid, _, _ in done], [loc for _, _, loc in done], 64 << 20)
    assert got.error is None and [bytes(b) for b in got.blobs] == [b for _, b, _ in done]
    w.close()


def test_a_crash_keeps_every_flushed_entry_and_seals_at_the_padding(ddir, caplog):
    rng = random.Random(3)
    entries = _entries(rng, 200)
    w = EntryLogWriter([str(ddir)], 64 << 20, 8192, direct_io=True)
    locations = _append(w, entries[:150], rng)
    w.flush()
    tail = [w.append(*e) for e in entries[150:]]  # partly written, never flushed
    assert tail
    _crash(w)
    path = ddir / log_name(1)
    size = os.path.getsize(path)
    assert size % DIRECT_BLOCK_BYTES == 0  # the last direct write's zeros are there
    with caplog.at_level(logging.INFO, logger="zbk.storage.entrylog"):
        w = EntryLogWriter([str(ddir)], 64 << 20, 8192, direct_io=True)
    assert w.sealed_on_open == [1]
    assert "zero bytes; sealed there" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    _read_all(w, entries[:150], locations)
    w.close()


def test_a_crash_between_the_footer_and_the_cut_of_its_padding_seals_the_log(ddir):
    class NoTruncate(RealDisk):
        def truncate(self, fd, size):
            pass

    rng = random.Random(9)
    entries = _entries(rng, 60)
    w = EntryLogWriter([str(ddir)], 64 << 20, 8192, disk=NoTruncate(), direct_io=True)
    locations = _append(w, entries, rng)
    w.rotate()
    w.flush()  # durable, footer and all, but the zeros after the footer are still there
    _crash(w)
    fd = os.open(ddir / log_name(1), os.O_RDONLY)
    try:
        assert read_footer(fd, 1) is None
    finally:
        os.close(fd)
    w = EntryLogWriter([str(ddir)], 64 << 20, 8192, direct_io=True)
    assert w.sealed_on_open == [1]
    _read_all(w, entries, locations)
    w.close()


def test_logs_per_ledger_are_written_buffered(ddir):
    w = EntryLogWriter([str(ddir)], 64 << 20, 0, per_ledger=True, direct_io=True)
    w.append(1, 0, b"a" * 5000)
    w.append(2, 0, b"b" * 5000)
    assert [lg.dfd for lg in w._active.values()] == [-1, -1]
    w.close()


def test_a_file_system_refusing_o_direct_at_the_open_gets_buffered_writes(tmp_path, monkeypatch, caplog):
    refuse_direct_opens(monkeypatch)
    with caplog.at_level(logging.INFO, logger="zbk.storage.entrylog"):
        w = EntryLogWriter([str(tmp_path)], 64 << 20, 0, direct_io=True)
        loc = w.append(1, 0, b"a" * 100)
    assert w._active[-1].dfd < 0 and "refuses O_DIRECT" in caplog.text
    w.close()
    w = EntryLogWriter([str(tmp_path)], 64 << 20, 0)
    assert w.read(loc, 1, 0) == b"a" * 100
    w.close()


@pytest.mark.skipif(not O_DIRECT, reason="no O_DIRECT on this platform")
def test_a_refused_direct_write_falls_back_to_buffered_and_loses_nothing(ddir, caplog):
    rng = random.Random(4)
    entries = _entries(rng, 80)
    w = EntryLogWriter([str(ddir)], 64 << 20, 4096, disk=RefusingDirectDisk(), direct_io=True)
    locations = [w.append(*entries[0])]
    assert w._active[-1].dfd >= 0  # opened direct; its writes are refused
    with caplog.at_level(logging.INFO, logger="zbk.storage.entrylog"):
        locations += _append(w, entries[1:], rng)
    assert w._active[-1].dfd < 0 and "O_DIRECT writes refused" in caplog.text
    w.close()
    w = EntryLogWriter([str(ddir)], 64 << 20, 4096)
    assert w.sealed_on_open == [] and sorted(list_logs(str(ddir))) == [1]
    _read_all(w, entries, locations)
    w.close()


def test_only_zeros_reads_a_long_tail_a_piece_at_a_time(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" + bytes(3 << 20) + b"y")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert only_zeros(fd, 1, 1 + (3 << 20))
        assert not only_zeros(fd, 1, 2 + (3 << 20))  # the last byte, in the fourth MiB
        assert not only_zeros(fd, 0, 10)
        assert only_zeros(fd, 2 + (3 << 20), 10 << 20)  # past the end of the file: nothing to read
    finally:
        os.close(fd)
