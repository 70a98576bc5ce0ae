"""The narrow interface between zbk's storage formats and the operating system's disks.

Every byte the storage modules must not lose goes through a :class:`Disk`: ``write`` /
``pwrite`` (all bytes or an ``OSError``), ``fsync`` of a file, ``fsync_dir`` after a name
was created, renamed or removed, ``syncfs`` of a whole file system (the index checkpoint),
``write_file_atomic`` (tmp file, fsync, rename, fsync directory: readers see the old or the
new contents, never a mix), and ``usage`` for the disk checker. Reads go straight to
``os.pread``: a read never needs to survive a crash.

:class:`RealDisk` is the only implementation used by a bookie. :class:`FaultyDisk` is a
test fake that runs out of space after a byte budget (writing the part that fits first,
like a real ``ENOSPC``) or fails ``fsync`` with ``EIO``, so tests can check that a failure
surfaces as an ``OSError`` and leaves already-durable data intact.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # collections.abc.Buffer arrives with Python 3.12
    from typing_extensions import Buffer


# O_DIRECT writes start and end on this boundary, from memory aligned to it: the page size,
# which is also a multiple of every logical block size Linux supports.
DIRECT_BLOCK_BYTES = mmap.PAGESIZE
O_DIRECT: int = getattr(os, "O_DIRECT", 0)


def align_up(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`DIRECT_BLOCK_BYTES`."""
    return -(-n // DIRECT_BLOCK_BYTES) * DIRECT_BLOCK_BYTES


def only_zeros(fd: int, start: int, end: int) -> bool:
    """Whether bytes [start, end) of the file are all zero (unused preallocation, a direct
    write's padding), read a MiB at a time: the tail after a bad record can be most of a
    journal segment or an entry log."""
    while start < end:
        chunk = os.pread(fd, min(end - start, 1 << 20), start)
        if not chunk:  # the file is shorter than it was
            return True
        if chunk.strip(b"\0"):
            return False
        start += len(chunk)
    return True


class DirectWrites:
    """Appends to a file through an ``O_DIRECT`` descriptor, from page-aligned memory it keeps.

    Such a write must start and end on a block boundary, so each one starts at the block
    holding the end of the previous one and carries that block's bytes again (the caller
    keeps them, the *tail*: they are the bytes on disk, so a torn rewrite leaves them as
    they were), and its last block is padded with zeros. Used by the journal and the entry
    logs, whose formats read the zeros as the end of the records.
    """

    def __init__(self, min_bytes: int) -> None:
        self._min = min_bytes
        self._mem: mmap.mmap | None = None

    def write(self, disk: Disk, fd: int, tail: bytes, parts: Sequence[Buffer], offset: int) -> bytes:
        """Write ``parts``, one after another, at file ``offset`` (after ``tail``, the bytes
        from the block boundary below ``offset``); returns the new tail. An ``OSError`` is
        raised as it came: ``EINVAL`` means the file system refused the write before writing
        anything."""
        start = offset - len(tail)
        n = len(tail) + sum(memoryview(p).nbytes for p in parts)
        padded = align_up(n)
        mem = self._mem
        if mem is None or len(mem) < padded:
            mem = self._mem = mmap.mmap(-1, max(padded, self._min))
        view = memoryview(mem)
        try:
            view[:len(tail)] = tail
            at = len(tail)
            for p in parts:
                k = memoryview(p).nbytes
                view[at:at + k] = p
                at += k
            view[n:padded] = bytes(padded - n)
            disk.pwrite(fd, view[:padded], start)
            return bytes(view[n - n % DIRECT_BLOCK_BYTES:n])
        finally:
            view.release()

    def drop(self) -> None:
        """Let the memory go (unmapped once no view of it is left: a failed write's
        traceback may hold one)."""
        self._mem = None


class Disk(Protocol):
    def write(self, fd: int, data: Buffer) -> None:
        """Append all of ``data`` at the file position of ``fd`` (short writes are retried)."""

    def pwrite(self, fd: int, data: Buffer, offset: int) -> None:
        """Write all of ``data`` at ``offset`` without moving the file position."""

    def fsync(self, fd: int) -> None:
        """Make the file's data and metadata durable."""

    def fsync_dir(self, path: str) -> None:
        """Make the names in directory ``path`` durable (after create, rename or unlink)."""

    def syncfs(self, fd: int) -> None:
        """Make everything written to the file system holding ``fd`` durable, names included
        (Linux ``syncfs(2)``); only where :data:`SYNCFS_REPORTS_ERRORS` (see there)."""

    def truncate(self, fd: int, size: int) -> None:
        """Cut the file to ``size`` bytes (not yet durable: follow with :meth:`fsync`)."""

    def write_file_atomic(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data`` durably: the old or the new contents, never a mix."""

    def start_writeback(self, fd: int, offset: int, nbytes: int) -> None:
        """Start writing a range of the file to disk without waiting (a hint, not durability)."""

    def drop_cache(self, fd: int, offset: int, nbytes: int) -> None:
        """Let the page cache drop a range of the file that is on disk (a hint)."""

    def usage(self, path: str) -> tuple[int, int]:
        """``(used_bytes, total_bytes)`` of the file system holding ``path``."""


def _libc_function(name: str, argtypes: list[Any]) -> Callable[..., int] | None:
    """libc's function ``name`` returning an int (errno kept for ctypes.get_errno), or None
    where libc lacks it."""
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_sync_file_range = (_libc_function("sync_file_range", [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint])
                    if sys.platform.startswith("linux") else None)
_SYNC_FILE_RANGE_WRITE = 2


def _load_syncfs() -> Callable[..., int] | None:
    """libc's syncfs where it reports writeback errors (Linux >= 5.8), else None.

    Before 5.8 ``syncfs`` returned 0 even when the kernel had failed to write a page back:
    it could not stand in for fsync, whose error is what makes a flush fail and retry. Since
    5.8 it reports, through the descriptor it is given, every writeback error on the file
    system since that descriptor was opened or last reported one."""
    try:
        major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    except ValueError:
        return None
    if (major, minor) < (5, 8):
        return None
    return _libc_function("syncfs", [ctypes.c_int])


_syncfs = _load_syncfs() if sys.platform.startswith("linux") else None
SYNCFS_REPORTS_ERRORS = _syncfs is not None
"""True where :meth:`RealDisk.syncfs` exists and reports writeback errors (Linux >= 5.8)."""


def mountinfo_fs_type(mountinfo: str, dev: tuple[int, int], path: str) -> str | None:
    """The type of the file system (``ext4``, ``fuse.sshfs``, ...) that holds ``path``, whose
    ``st_dev`` is ``dev`` (major, minor), from the text of a ``/proc/<pid>/mountinfo``: the
    mount of that device, else the mount with the longest mount point above ``path``
    (devices that mountinfo does not name, such as btrfs subvolumes). None when no line
    fits. A line reads ``id parent major:minor root mount-point options [optional
    fields...] - fstype source super-options``."""
    want = f"{dev[0]}:{dev[1]}"
    by_dev: str | None = None
    best: tuple[int, str] | None = None
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        sep = fields.index("-", 6) if "-" in fields[6:] else len(fields)
        if sep + 1 >= len(fields):
            continue
        fstype = fields[sep + 1]
        if fields[2] == want:
            by_dev = fstype  # the last such line: the mount on top
        point = fields[4].replace("\\040", " ")
        if path == point or path.startswith(point.rstrip("/") + "/"):
            if best is None or len(point) >= best[0]:
                best = (len(point), fstype)
    return by_dev if by_dev is not None else (best[1] if best else None)


def syncfs_untrusted_fs(path: str) -> str | None:
    """The type of the file system holding ``path`` when its syncfs cannot be trusted to make
    data durable, else None. FUSE is such a one: Linux forwards syncfs to no FUSE daemon
    but virtiofs's, so there a syncfs returns 0 and writes nothing back (a checkpoint made
    durable by it would be lost in a power cut); such file systems must be synced file by
    file. Unknown (no mountinfo): None."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            fstype = mountinfo_fs_type(f.read(), (os.major(st.st_dev), os.minor(st.st_dev)), real)
    except OSError:
        return None
    return fstype if fstype is not None and fstype.startswith("fuse") else None


def makedirs_durable(path: str, disk: Disk | None = None) -> None:
    """``os.makedirs(path, exist_ok=True)``, then fsync the parent of every directory it
    created, top down: a new directory's name is durable only once its parent is fsynced,
    and a bookie whose journal, ledger or index directory vanishes in a power cut comes back
    without its cookies and its data."""
    created: list[str] = []
    p = os.path.abspath(path)
    while not os.path.isdir(p) and os.path.dirname(p) != p:
        created.append(p)
        p = os.path.dirname(p)
    os.makedirs(path, exist_ok=True)
    for d in reversed(created):
        (disk or REAL_DISK).fsync_dir(os.path.dirname(d))


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open descriptors (``RLIMIT_NOFILE``) to its hard
    limit, as a bookie that keeps thousands of index files open needs (many systems start
    processes at a soft 1,024 under a far higher hard limit); returns the soft limit in
    force afterwards (unchanged where raising it is refused)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if want > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


class RealDisk:
    """The operating system, with the write loops and fsyncs that durability needs."""

    def write(self, fd: int, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def pwrite(self, fd: int, data: Buffer, offset: int) -> None:
        view = memoryview(data).cast("B")
        while view:
            n = os.pwrite(fd, view, offset)
            view = view[n:]
            offset += n

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.fsync(fd)
        finally:
            os.close(fd)

    def syncfs(self, fd: int) -> None:
        """``syncfs(2)``: write back and commit every dirty file and name of the file system
        holding ``fd`` at once, then wait. Raises ``OSError`` on a writeback error reported
        through ``fd`` (keep one descriptor open from before the first write it must cover:
        an error that happened before it was opened is not reported through it)."""
        if _syncfs is None:
            raise OSError(errno.ENOSYS, "syncfs does not report writeback errors on this system")
        if _syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def write_file_atomic(self, path: str, data: bytes) -> None:
        # The tmp name is fixed per target: a leftover from a crash is simply overwritten.
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self.write(fd, data)
            self.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self.fsync_dir(os.path.dirname(os.path.abspath(path)))

    def start_writeback(self, fd: int, offset: int, nbytes: int) -> None:
        """Ask the kernel to start writing ``nbytes`` at ``offset`` to disk now, without
        waiting (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``). A hint, not durability:
        only an fsync makes data durable. A no-op where the call does not exist."""
        if _sync_file_range is not None:
            _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # errors surface at the fsync

    def drop_cache(self, fd: int, offset: int, nbytes: int) -> None:
        """``posix_fadvise(POSIX_FADV_DONTNEED)``: the kernel frees the range's clean pages
        now; dirty pages and pages under writeback stay (the call never loses data). An
        error is ignored: it is a hint, and the file stays intact either way."""
        if hasattr(os, "posix_fadvise"):
            try:
                os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass

    def usage(self, path: str) -> tuple[int, int]:
        st = os.statvfs(path)
        total = st.f_blocks * st.f_frsize
        # Blocks reserved for root are not usable by the bookie: count them as used.
        return total - st.f_bavail * st.f_frsize, total


class FaultyDisk(RealDisk):
    """A :class:`RealDisk` that fails on command (tests only).

    ``write_bytes_left``: bytes that may still be written; the write that crosses the
    budget writes what fits, then raises ``OSError(ENOSPC)`` (``None``: unlimited).
    ``fail_fsync`` / ``fail_fsync_dir``: every (directory) fsync raises ``OSError(EIO)``
    (``fail_fsync``: every syncfs too).
    ``usage_result``: what :meth:`usage` answers instead of the real file system.
    Counters let tests check group commit (one write and one fsync per batch).
    """

    def __init__(self, *, write_bytes_left: int | None = None, fail_fsync: bool = False,
                 fail_fsync_dir: bool = False, usage_result: tuple[int, int] | None = None) -> None:
        self.write_bytes_left = write_bytes_left
        self.fail_fsync = fail_fsync
        self.fail_fsync_dir = fail_fsync_dir
        self.usage_result = usage_result
        self.writes = 0
        self.bytes_written = 0
        self.fsyncs = 0
        self.dir_fsyncs = 0
        self.syncfses = 0
        self.writebacks: list[tuple[int, int, int]] = []  # (fd, offset, bytes) of start_writeback
        self.drops: list[tuple[int, int, int]] = []  # (fd, offset, bytes) of drop_cache

    def _budget(self, data: Buffer) -> memoryview:
        """The part of ``data`` that fits in the budget (all of it when unlimited)."""
        view = memoryview(data).cast("B")
        if self.write_bytes_left is None:
            return view
        return view[: max(0, self.write_bytes_left)]

    def _account(self, wanted: int, written: int) -> None:
        self.writes += 1
        self.bytes_written += written
        if self.write_bytes_left is not None:
            self.write_bytes_left -= written
        if written < wanted:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def write(self, fd: int, data: Buffer) -> None:
        part = self._budget(data)
        super().write(fd, part)
        self._account(memoryview(data).nbytes, part.nbytes)

    def pwrite(self, fd: int, data: Buffer, offset: int) -> None:
        part = self._budget(data)
        super().pwrite(fd, part, offset)
        self._account(memoryview(data).nbytes, part.nbytes)

    def start_writeback(self, fd: int, offset: int, nbytes: int) -> None:
        self.writebacks.append((fd, offset, nbytes))
        super().start_writeback(fd, offset, nbytes)

    def drop_cache(self, fd: int, offset: int, nbytes: int) -> None:
        self.drops.append((fd, offset, nbytes))
        super().drop_cache(fd, offset, nbytes)

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        if self.fail_fsync:
            raise OSError(errno.EIO, "injected fsync failure")
        super().fsync(fd)

    def syncfs(self, fd: int) -> None:
        self.syncfses += 1
        if self.fail_fsync:
            raise OSError(errno.EIO, "injected syncfs failure")
        super().syncfs(fd)

    def fsync_dir(self, path: str) -> None:
        self.dir_fsyncs += 1
        if self.fail_fsync_dir:
            raise OSError(errno.EIO, "injected directory fsync failure")
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def usage(self, path: str) -> tuple[int, int]:
        if self.usage_result is not None:
            return self.usage_result
        return super().usage(path)


REAL_DISK: Disk = RealDisk()
