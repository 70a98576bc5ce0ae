"""The power-loss layer itself: what survives a cut, and what does not.

Each test mounts the layer (tests/faults/powerloss.py) over a fresh backing directory,
changes files through the mount, cuts the power and mounts again: what it then reads is
what was durable. The daemon is stopped by PID and the mount removed at teardown, on
failure too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import zbk

from .powerloss import BLOCK_BYTES, SECTOR_BYTES, torn_prefix
from .powerloss_mount import PowerLossMount, is_mounted, require_fuse


@pytest.fixture
def layer(tmp_path: Path) -> Iterator[PowerLossMount]:
    require_fuse()
    fs = PowerLossMount(tmp_path / "disk", tmp_path / "mnt")
    try:
        yield fs.mount()
    finally:
        fs.unmount()
    assert not is_mounted(fs.mountpoint)


def _write(path: Path, data: bytes, *, offset: int | None = None, sync: bool = False, create: bool = True) -> None:
    fd = os.open(path, os.O_WRONLY | (os.O_CREAT if create else 0), 0o644)
    try:
        if offset is None:
            os.write(fd, data)
        else:
            os.pwrite(fd, data, offset)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cut(layer: PowerLossMount, **kw: object) -> dict[str, object]:
    report = layer.cut(**kw)  # type: ignore[arg-type]
    layer.restart()
    return report


def test_a_write_without_fsync_is_gone_after_a_cut(layer):
    m = layer.mountpoint
    _write(m / "f", b"durable", sync=True)
    _fsync_dir(m)
    _write(m / "f", b"VOLATILE", offset=3, create=False)
    _write(m / "f", b"+tail", offset=20, create=False)  # grows the file
    assert (m / "f").read_bytes() == b"durVOLATILE" + bytes(9) + b"+tail", "reads see the live state"
    report = _cut(layer)
    assert (m / "f").read_bytes() == b"durable"
    assert report["unsynced_bytes_lost"] == 13


def test_an_fsynced_write_stays(layer):
    m = layer.mountpoint
    (m / "sub").mkdir()
    _fsync_dir(m)
    _write(m / "sub" / "f", b"a" * 10_000, sync=True)
    _fsync_dir(m / "sub")
    _write(m / "sub" / "f", b"b" * 5_000, offset=2_000, sync=True)
    fd = os.open(m / "sub" / "f", os.O_WRONLY)
    try:
        os.pwrite(fd, b"c" * 100, 0)
        os.fdatasync(fd)  # fdatasync counts as fsync
    finally:
        os.close(fd)
    _cut(layer)
    assert (m / "sub" / "f").read_bytes() == b"c" * 100 + b"a" * 1_900 + b"b" * 5_000 + b"a" * 3_000


def test_a_rename_without_an_fsync_of_its_directory_is_undone(layer):
    m = layer.mountpoint
    _write(m / "old", b"one", sync=True)
    _write(m / "other", b"two", sync=True)
    _fsync_dir(m)
    os.rename(m / "old", m / "new")
    os.replace(m / "other", m / "new2")
    _write(m / "target", b"three", sync=True)
    _fsync_dir(m)  # "target" and the two renames above are durable from here
    os.replace(m / "new", m / "target")  # replaces a durable file: undone, both come back
    assert sorted(os.listdir(m)) == ["new2", "target"]
    _cut(layer)
    assert sorted(os.listdir(m)) == ["new", "new2", "target"]
    assert (m / "new").read_bytes() == b"one" and (m / "new2").read_bytes() == b"two"
    assert (m / "target").read_bytes() == b"three"
    os.rename(m / "new2", m / "back")
    _cut(layer)
    assert sorted(os.listdir(m)) == ["new", "new2", "target"]


def test_a_rename_across_directories_needs_both_fsynced(layer):
    m = layer.mountpoint
    (m / "a").mkdir()
    (m / "b").mkdir()
    _fsync_dir(m)
    _write(m / "a" / "f", b"x", sync=True)
    _fsync_dir(m / "a")
    os.rename(m / "a" / "f", m / "b" / "f")
    _fsync_dir(m / "b")  # the new name is durable, the old one not yet removed: a hard link
    _cut(layer)
    assert (m / "a" / "f").read_bytes() == b"x" and (m / "b" / "f").read_bytes() == b"x"


def test_a_directory_rename_without_fsyncs_is_undone_with_all_below_it(layer):
    m = layer.mountpoint
    (m / "a" / "x").mkdir(parents=True)
    (m / "b").mkdir()
    _write(m / "a" / "x" / "f", b"f", sync=True)
    for d in (m, m / "a", m / "a" / "x"):
        _fsync_dir(d)
    os.rename(m / "a" / "x", m / "b" / "x")  # a durable directory moves...
    _write(m / "b" / "x" / "g", b"g", sync=True)  # ...gets a new file...
    os.rename(m / "b", m / "c")  # ...and its new parent is renamed too
    _cut(layer)
    assert sorted(os.listdir(m)) == ["a", "b"] and os.listdir(m / "b") == []
    assert os.listdir(m / "a" / "x") == ["f"] and (m / "a" / "x" / "f").read_bytes() == b"f"


def test_a_created_file_vanishes_without_an_fsync_of_its_directory(layer):
    m = layer.mountpoint
    _write(m / "f", b"fsynced data, but no directory fsync", sync=True)
    (m / "d").mkdir()
    _write(m / "d" / "g", b"g", sync=True)
    _fsync_dir(m / "d")  # d's own name is still volatile: g goes with it
    _cut(layer)
    assert os.listdir(m) == []


def test_a_created_file_stays_with_its_directory_fsynced_but_its_data_does_not_without_fsync(layer):
    m = layer.mountpoint
    _write(m / "f", b"no fsync of the file")
    _fsync_dir(m)
    _cut(layer)
    assert (m / "f").read_bytes() == b""


def test_an_unlink_without_an_fsync_of_its_directory_is_undone(layer):
    m = layer.mountpoint
    (m / "d").mkdir()
    _fsync_dir(m)
    _write(m / "d" / "f", b"keep me" * 1000, sync=True)
    _fsync_dir(m / "d")
    _write(m / "d" / "f", b"lost", offset=0, create=False)  # unsynced, then unlinked
    os.unlink(m / "d" / "f")
    os.rmdir(m / "d")
    assert os.listdir(m) == []
    _cut(layer)
    assert (m / "d" / "f").read_bytes() == b"keep me" * 1000


def test_an_unlink_with_an_fsync_of_its_directory_is_durable(layer):
    m = layer.mountpoint
    _write(m / "f", b"x", sync=True)
    _fsync_dir(m)
    os.unlink(m / "f")
    _fsync_dir(m)
    assert layer.stats()["held_inodes"] == 0, "the attic let go of the file"
    _cut(layer)
    assert os.listdir(m) == []


def test_a_torn_write_keeps_a_prefix_only(layer):
    m = layer.mountpoint
    _write(m / "f", b"D" * 8192, sync=True)
    _fsync_dir(m)
    _write(m / "f", b"lost entirely", offset=100, create=False)  # not the last write: lost
    # 3,000 bytes inside the durable bytes, within one page: the kernel hands a write that
    # crosses pages to the daemon in pieces, each one write of the layer.
    new = bytes(range(1, 201)) * 15
    _write(m / "f", new, offset=1000, create=False)
    report = _cut(layer, torn=True, seed=7)
    data = (m / "f").read_bytes()
    kept = int(report["torn_bytes_kept"])  # type: ignore[call-overload]
    assert 0 < kept < len(new), report
    assert (1000 + kept) % SECTOR_BYTES == 0  # a disk writes a sector whole or not at all
    assert data[:1000] == b"D" * 1000
    assert data[1000:1000 + kept] == new[:kept]
    assert data[1000 + kept:] == b"D" * (8192 - 1000 - kept)
    # The same seed tears at the same sector.
    _write(m / "f", new, offset=1000, create=False)
    assert _cut(layer, torn=True, seed=7)["torn_bytes_kept"] == kept


def test_a_torn_write_that_grew_a_file_grows_it_by_whole_pages_only(layer):
    """The size on disk follows the page-cache pages written back: a torn write past the
    durable end within one page leaves the file at its durable size, with the sectors of
    the write inside the durable bytes kept or not."""
    m = layer.mountpoint
    _write(m / "g", b"D" * 100, sync=True)
    _fsync_dir(m)
    new = bytes(range(1, 201)) * 15
    _write(m / "g", new, offset=50, create=False)  # 50 bytes over durable ones, 2,950 past the end
    _cut(layer, torn=True, seed=3)
    assert (m / "g").read_bytes() in (b"D" * 100, b"D" * 50 + new[:50])


@pytest.mark.parametrize("seed", range(200))
def test_torn_prefixes_end_on_a_sector_and_grow_a_file_by_pages(seed):
    rng = random.Random(seed)
    offset, length, durable = rng.randrange(20_000), rng.randrange(1, 20_000), rng.randrange(30_000)
    keep = torn_prefix(offset, bytes(length), durable, random.Random(seed))
    end = offset + keep
    assert 0 <= keep < length
    if keep:
        assert end % SECTOR_BYTES == 0 or end == durable  # whole sectors, shown up to the file's size
        assert end <= durable or end % BLOCK_BYTES == 0  # past the durable size: whole pages only


def test_overwrites_of_a_preallocated_file_are_undone_block_by_block(layer):
    """A journal-like file: a big durable file of zeros, overwritten in place and fsynced
    piecewise. Only changed blocks are tracked, the zero ones by their length."""
    m = layer.mountpoint
    size = 4 * 1024 * 1024
    _write(m / "j", bytes(size), sync=True)
    _fsync_dir(m)
    fd = os.open(m / "j", os.O_RDWR)
    try:
        os.pwrite(fd, b"r1" * 3000, 0)
        os.fsync(fd)
        os.pwrite(fd, b"r2" * 3000, 6000)
        stats = layer.stats()
        assert stats["saved_blocks"] == 2 and stats["unsynced_bytes"] == 6000, stats  # bytes 6000-11999
    finally:
        os.close(fd)
    _cut(layer)
    data = (m / "j").read_bytes()
    assert len(data) == size and data[:6000] == b"r1" * 3000 and data[6000:] == bytes(size - 6000)


@pytest.mark.parametrize("seed", range(6))
def test_a_direct_journal_keeps_every_synced_record_through_torn_rewrites(layer, seed):
    """The journal's O_DIRECT writes start at the block holding the end of the last one and
    write its bytes again (zbk/storage/journal.py, "Direct I/O"). A cut that tears such
    writes, made but never fsynced, keeps every record that was fsynced before them."""
    from zbk.storage.journal import START, JournalWriter, RecordType, replay

    rng = random.Random(seed)
    m = layer.mountpoint
    (m / "j").mkdir()
    _fsync_dir(m)
    w = JournalWriter(str(m / "j"), 64 << 20, direct_io=True, preallocate_bytes=64 << 10)
    assert w._dfd >= 0  # the layer takes O_DIRECT: these are direct writes
    synced = rng.randrange(1, 30)
    for i in range(synced):
        w.append(RecordType.ADD, 1, i, rng.randbytes(rng.randrange(1, 6000)))
        w.sync()
        w.preallocate()
    for j in range(rng.randrange(1, 4)):  # written, not fsynced: torn by the cut
        w.append(RecordType.ADD, 1, synced + j, rng.randbytes(rng.randrange(1, 6000)))
        w._write_batch()
    report = _cut(layer, torn=True, seed=seed)
    for fd in (w._dfd, w._fd):  # descriptors of the layer before the cut (closing says ENOTCONN)
        with contextlib.suppress(OSError):
            os.close(fd)
    assert report["files_reverted"] == 1
    got = [r.entry_id for r, _ in replay(str(m / "j"), START)]
    assert got[:synced] == list(range(synced))
    assert got == list(range(len(got)))  # and after them only whole records, in order


def test_a_truncate_without_fsync_is_undone(layer):
    m = layer.mountpoint
    body = os.urandom(3 * BLOCK_BYTES + 10)
    _write(m / "f", body, sync=True)
    _fsync_dir(m)
    os.truncate(m / "f", 5)
    _write(m / "f", b"new", offset=BLOCK_BYTES * 2, create=False)
    _cut(layer)
    assert (m / "f").read_bytes() == body
    with open(m / "f", "wb") as f:  # O_TRUNC
        f.write(b"replaced")
    assert (m / "f").read_bytes() == b"replaced"
    _cut(layer)
    assert (m / "f").read_bytes() == body


def test_syncfs_makes_nothing_durable_on_the_layer(layer):
    """Linux does not forward syncfs to a FUSE daemon: nothing reaches the layer."""
    m = layer.mountpoint
    libc = ctypes.CDLL(None, use_errno=True)
    _write(m / "f", b"x", sync=True)
    _fsync_dir(m)
    _write(m / "f", b"volatile", create=False)
    _write(m / "g", b"volatile")
    fd = os.open(m, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert libc.syncfs(fd) == 0
    finally:
        os.close(fd)
    _cut(layer)
    assert os.listdir(m) == ["f"] and (m / "f").read_bytes() == b"x"


def test_the_layer_answers_eio_after_a_cut_until_it_is_mounted_again(layer):
    m = layer.mountpoint
    _write(m / "f", b"x", sync=True)
    layer.cut()
    with pytest.raises(OSError):
        (m / "f").read_bytes()
    layer.restart()
    assert os.listdir(m) == []  # the file's name was never made durable


# --- the index checkpoint on the layer ---------------------------------------------------------

_INDEX_WRITER = """
import sys, time
from zbk.storage import ledgercache
from zbk.storage.entrylog import make_location
if sys.argv[2] == "trust-syncfs":  # what a bookie did before it knew that FUSE ignores syncfs
    ledgercache.syncfs_untrusted_fs = lambda path: None
cache = ledgercache.LedgerCache([sys.argv[1]])
for lid in range(20):
    for eid in range(50):
        cache.put(lid, eid, make_location(1, 24 + 100 * eid))
cache.flush()
print(cache.sync_mode, flush=True)
time.sleep(600)
"""


def _checkpoint_then_cut(layer: PowerLossMount, mode: str) -> tuple[str, list[tuple[int, int]]]:
    """A child process flushes an index checkpoint to the layer and is killed in a cut;
    returns its sync mode and the (ledger, entry) pairs the checkpoint lost."""
    from zbk.storage.ledgercache import LedgerCache

    index_dir = layer.mountpoint / "index"
    index_dir.mkdir()
    _fsync_dir(layer.mountpoint)
    child = subprocess.Popen([sys.executable, "-c", _INDEX_WRITER, str(index_dir), mode],
                             stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=str(Path(zbk.__file__).parents[1])))
    try:
        assert child.stdout is not None
        sync_mode = child.stdout.readline().decode().strip()
        assert sync_mode, "the index writer died"
        layer.cut(kill_pids=(child.pid,))
    finally:
        child.kill()
        child.wait(10)
    layer.restart()
    lost: list[tuple[int, int]] = []
    try:
        cache = LedgerCache([str(index_dir)])
        lost = [(lid, eid) for lid in range(20) for eid in range(50) if cache.get(lid, eid) is None]
    except Exception:  # noqa: BLE001 - a damaged index is a loss too
        lost = [(-1, -1)]
    return sync_mode, lost


def test_the_layer_is_a_file_system_whose_syncfs_a_bookie_does_not_trust(layer):
    from zbk.storage.disk import syncfs_untrusted_fs

    assert syncfs_untrusted_fs(str(layer.mountpoint)) == "fuse.powerloss"
    assert syncfs_untrusted_fs(str(layer.backing)) is None


def test_an_index_checkpoint_on_the_layer_fsyncs_each_file_and_survives_a_cut(layer):
    mode, lost = _checkpoint_then_cut(layer, "default")
    assert mode == "fsync" and lost == []


def test_an_index_checkpoint_that_trusted_syncfs_on_the_layer_is_lost_in_a_cut(layer):
    """Why the detection exists: the same checkpoint made durable by syncfs is gone."""
    from zbk.storage.disk import SYNCFS_REPORTS_ERRORS

    if not SYNCFS_REPORTS_ERRORS:
        pytest.skip("this kernel's syncfs does not report writeback errors: zbk never uses it")
    mode, lost = _checkpoint_then_cut(layer, "trust-syncfs")
    assert mode == "syncfs" and lost, "a checkpoint made durable by syncfs survived a cut on FUSE"
