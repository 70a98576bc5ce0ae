"""Entry logs: written data beyond ``keep_cached_bytes`` is dropped from the page cache
("drop behind"), oldest first, across rotations, and nothing it drops is ever lost."""

from __future__ import annotations

import os

from zbk import limits
from zbk.storage.disk import FaultyDisk
from zbk.storage.entrylog import EntryLogWriter

MIB = 1024 * 1024


def _blob(i: int) -> bytes:
    return i.to_bytes(4, "little") * 256  # 1 KiB, distinct per entry


class _PathDisk(FaultyDisk):
    """Records which file each drop was for (descriptor numbers are reused)."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped: list[tuple[str, int, int]] = []

    def drop_cache(self, fd: int, offset: int, nbytes: int) -> None:
        self.dropped.append((os.readlink(f"/proc/self/fd/{fd}"), offset, nbytes))
        super().drop_cache(fd, offset, nbytes)


def test_drop_behind_keeps_the_newest_bytes_cached_and_loses_nothing(tmp_path):
    d = str(tmp_path)
    disk = _PathDisk()
    keep = 8 * MIB
    w = EntryLogWriter([d], 10 * MIB, 64 * 1024, disk, keep_cached_bytes=keep, writeback_bytes=MIB)
    locs = []
    for i in range(30 * 1024):  # ~30 MiB over three or four logs
        locs.append(w.append(1, i, _blob(i)))
        if i % 4096 == 4095:
            w.flush()  # checkpoints, as the bookie does
    w.flush()
    written = w._bytes_written
    dropped = sum(n for _, _, n in disk.dropped)
    # Everything but the newest keep_cached_bytes (give or take one drop step) was dropped.
    assert written - keep - limits.entry_log_drop_step_bytes_min - 64 * 1024 <= dropped <= written - keep
    # Oldest first and contiguous: the drops tile each log from offset 0 in order, and the
    # next log's drops start only once the previous log was dropped whole.
    order: list[str] = []
    tiled: dict[str, int] = {}
    for path, off, n in disk.dropped:
        if path not in tiled:
            if order:
                assert tiled[order[-1]] == os.path.getsize(order[-1]), "an older log is left behind"
            order.append(path)
            tiled[path] = 0
        assert path == order[-1] and off == tiled[path] and n > 0
        tiled[path] += n
    logs = sorted(w._paths.values())
    assert order == logs[:len(order)] and len(order) >= 3
    # Nothing was lost: every entry reads back, the dropped ones from disk.
    for i, loc in enumerate(locs):
        assert w.read(loc, 1, i) == _blob(i)
    w.close()


def test_no_drops_when_off_or_within_the_budget(tmp_path):
    for keep, expect in ((0, False), (64 * MIB, False), (2 * MIB, True)):
        disk = FaultyDisk()
        w = EntryLogWriter([str(tmp_path / str(keep))], 64 * MIB, 64 * 1024, disk, keep_cached_bytes=keep)
        for i in range(8 * 1024):  # 8 MiB
            w.append(2, i, _blob(i))
        w.flush()
        assert bool(disk.drops) is expect, keep
        w.close()


def test_a_log_removed_by_gc_is_not_dropped_later(tmp_path):
    d = str(tmp_path)
    disk = FaultyDisk()
    w = EntryLogWriter([d], 2 * MIB, 64 * 1024, disk, keep_cached_bytes=16 * MIB)
    for i in range(3 * 1024):  # two sealed logs of 2 MiB and an active one
        w.append(3, i, _blob(i))
    w.flush()
    first = min(w.log_ids())
    assert w.delete_log(first)
    assert all(rng[0] != first for rng in w._cached)
    cached = sum(e - s for _, s, e in w._cached)
    assert w._cached_bytes == cached
    for i in range(3 * 1024, 24 * 1024):  # past the budget: drops start, none for the removed log
        w.append(3, i, _blob(i))
    w.flush()
    assert disk.drops
    w.close()
