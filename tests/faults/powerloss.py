"""A FUSE file system that loses, at a "power cut", everything that was not yet durable.

It is mounted over a backing directory and passes every operation through to it, so reads
see the live state. Beside that it keeps, in memory, how to undo every change that is not
durable yet under the page-cache model of LazyFS (the layer Jepsen uses):

* **file data** written since the file's last ``fsync`` or ``fdatasync``: the first time a
  4 KiB block below the file's durable size is changed (by a write or a shrinking
  truncate) its durable contents are saved; the durable size is remembered. An fsync
  forgets both: the file is durable as it stands. Appends beyond the durable size cost
  nothing to track (they are cut off by a truncate at the cut), nor do overwrites of
  zeros (a preallocated journal), which are saved as a length only;
* **names** created, renamed or removed since their directory's last ``fsync`` (which
  reaches the daemon as ``fsyncdir``): the first change of a name since that fsync
  records what the name durably referred to (an inode, or nothing). A file that such a
  record refers to gets a hard link in the *attic*, a directory beside the backing one on
  the same file system, so that it can be brought back after its last name is gone; a
  directory that is removed is moved into the attic instead.

``syncfs`` is not forwarded to FUSE daemons by Linux (only virtiofs receives it), so on
this layer, as on any file system whose syncfs cannot be trusted, it makes nothing
durable. Nothing in the model depends on the backing directory's own durability: the host
does not lose power, only this layer pretends to.

A cut (``PowerLossMount.cut``, powerloss_mount.py) first sends SIGKILL to the processes
it is given, while it holds the lock that every changing operation takes, so that no
operation lands between the kill and the cut. Then it undoes everything volatile: every
file with unsynced data is cut to its durable size and its saved blocks are written back,
then every recorded name is put back to what it durably was. With ``torn``, a random
(seeded) prefix of the last unsynced write of each file is kept: a write torn by the power
loss, as disks and kernels tear one (``torn_prefix``): at a sector boundary, and past the
file's durable size only up to a page boundary, since the size on disk grows by the pages
written back. A write here is one request as the kernel hands it over: a large ``write(2)``
may arrive as several, split at page boundaries. The backing directory then holds exactly
what was durable, and the daemon answers every later operation with EIO (the disk is
gone) until it is unmounted and a new one mounted for the restart. An unmount without a
cut keeps the live state, as a clean shutdown that synced everything.

Not modelled: hole punching and other fallocate modes (EOPNOTSUPP), and rename flags
(mfusepy drops them, so RENAME_NOREPLACE and RENAME_EXCHANGE act as a plain rename);
extended attributes are not offered.

The daemon is this file run as a script (``python powerloss.py --backing B --mount M
--control SOCK``), a separate process driven over a Unix socket with one JSON line per
request; ``PowerLossMount`` starts it, drives it, and stops it by PID. The binding is
mfusepy (ctypes over libfuse 3's high-level, path-based API): pure Python, so no compiler
is needed, and maintained, where pyfuse3 and llfuse say they are no longer developed.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import random
import shutil
import signal
import socket
import stat
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

BLOCK_BYTES = 4096
SECTOR_BYTES = 512  # the unit a disk writes atomically (torn writes keep whole sectors)
_ZEROS = bytes(BLOCK_BYTES)
_O_SYNC_ANY = os.O_SYNC | os.O_DSYNC

log = logging.getLogger("powerloss")


# --- the volatile state ------------------------------------------------------------------


def torn_prefix(offset: int, data: bytes, durable_size: int, rng: random.Random) -> int:
    """How many bytes of the write of ``data`` at ``offset`` a torn cut keeps, in a file
    whose durable size is ``durable_size``: a disk writes a sector (SECTOR_BYTES) whole or
    not at all, so the write is torn at a random sector boundary strictly inside it; and a
    file's size grows as writeback completes page-cache pages (on ext4 and XFS the size on
    disk follows the pages written back), so what lies past the durable size shows only up
    to the last page boundary (BLOCK_BYTES) the kept sectors reach. 0: nothing is kept (the
    write is lost whole, as when it lies within one sector or one growing page)."""
    end = offset + len(data)
    first = (offset // SECTOR_BYTES + 1) * SECTOR_BYTES
    cuts = range(first, end, SECTOR_BYTES)
    if not cuts:
        return 0
    cut = rng.choice(cuts)
    if cut > durable_size:
        cut = max(durable_size, cut // BLOCK_BYTES * BLOCK_BYTES)
    return max(0, cut - offset)


@dataclass
class FileState:
    """What a cut must undo in one file (an inode): present only while it has data that
    was written since its last fsync."""

    durable_size: int
    # Block number -> the block's durable bytes (cut at durable_size), or their length
    # when they were all zeros.
    saved: dict[int, bytes | int] = field(default_factory=dict)
    last_write: tuple[int, bytes] | None = None  # (offset, data) of the newest write
    unsynced_bytes: int = 0  # bytes written since the last fsync (a statistic)


class VolatileState:
    """The undo state of one mount: file data and names that are not durable yet."""

    def __init__(self, attic: str) -> None:
        self.attic = attic
        self.files: dict[int, FileState] = {}
        # Directory inode -> {name: inode the name durably referred to, or None}.
        self.names: dict[int, dict[str, int | None]] = {}
        self.held: dict[int, int] = {}  # inode -> records whose durable target it is
        self.lock = threading.Lock()
        self.dead = False
        self.ops = {"write": 0, "fsync": 0, "fsyncdir": 0, "names": 0}  # operations seen (statistics)

    # -- data --

    def file_for_change(self, ino: int, fd: int) -> FileState:
        st = self.files.get(ino)
        if st is None:  # first change since the last fsync: the size now is the durable one
            st = self.files[ino] = FileState(durable_size=os.fstat(fd).st_size)
        return st

    def save_blocks(self, st: FileState, fd: int, start: int, end: int) -> None:
        """Save the durable bytes of every block in [start, end) below the durable size
        that is not saved yet (must run before those bytes change)."""
        end = min(end, st.durable_size)
        if start >= end:
            return
        for block in range(start // BLOCK_BYTES, (end - 1) // BLOCK_BYTES + 1):
            if block in st.saved:
                continue
            at = block * BLOCK_BYTES
            old = _pread(fd, min(BLOCK_BYTES, st.durable_size - at), at)
            st.saved[block] = len(old) if old == _ZEROS[:len(old)] else old

    def created(self, ino: int, *, regular: bool) -> None:
        """A new inode (create, mkdir, mknod, symlink): nothing of it is durable. Any state
        kept under this number belonged to a dead inode whose number was reused."""
        self.files.pop(ino, None)
        self.names.pop(ino, None)
        if regular:
            self.files[ino] = FileState(durable_size=0)

    def synced(self, ino: int) -> None:
        self.ops["fsync"] += 1
        self.files.pop(ino, None)

    # -- names --

    def before_name_change(self, dir_ino: int, dir_path: str, name: str) -> None:
        """Record what ``name`` in the directory durably refers to, the first time it
        changes since the directory's last fsync (unchanged since then, it is what it is now)."""
        self.ops["names"] += 1
        record = self.names.setdefault(dir_ino, {})
        if name in record:
            return
        try:
            st = os.lstat(os.path.join(dir_path, name))
        except FileNotFoundError:
            record[name] = None
            return
        record[name] = st.st_ino
        self._hold(st.st_ino, os.path.join(dir_path, name), st)

    def _hold(self, ino: int, path: str, st: os.stat_result) -> None:
        n = self.held.get(ino, 0)
        self.held[ino] = n + 1
        if n == 0 and not stat.S_ISDIR(st.st_mode):  # directories are moved to the attic when removed
            os.link(path, self.attic_path(ino), follow_symlinks=False)

    def _release(self, ino: int) -> None:
        n = self.held.pop(ino) - 1
        if n:
            self.held[ino] = n
            return
        with contextlib.suppress(FileNotFoundError):
            if os.path.isdir(self.attic_path(ino)):
                shutil.rmtree(self.attic_path(ino))  # a removed durable directory: now gone for good
            else:
                os.unlink(self.attic_path(ino))

    def dir_synced(self, dir_ino: int) -> None:
        self.ops["fsyncdir"] += 1
        for target in (self.names.pop(dir_ino, None) or {}).values():
            if target is not None:
                self._release(target)

    def attic_path(self, ino: int) -> str:
        return os.path.join(self.attic, str(ino))

    # -- the cut --

    def cut(self, backing: str, *, torn: bool, seed: int) -> dict[str, Any]:
        """Undo everything volatile in ``backing``; the caller holds the lock."""
        where = _inodes(backing, self.attic)
        rng = random.Random(seed)
        lost_bytes = torn_kept = 0
        # In path order, so that a seed tears the same writes again (inode numbers vary).
        for path, ino in sorted((where.get(ino, ""), ino) for ino in self.files):
            st = self.files[ino]
            lost_bytes += st.unsynced_bytes
            if not path or not stat.S_ISREG(os.lstat(path).st_mode):
                continue  # the inode has no name any more (durable or not): nothing to keep
            fd = os.open(path, os.O_WRONLY)
            try:
                os.ftruncate(fd, st.durable_size)
                for block, old in st.saved.items():
                    os.pwrite(fd, _ZEROS[:old] if isinstance(old, int) else old, block * BLOCK_BYTES)
                if torn and st.last_write is not None:
                    keep = torn_prefix(*st.last_write, st.durable_size, rng)
                    if keep > 0:
                        offset, data = st.last_write
                        os.pwrite(fd, data[:keep], offset)
                        torn_kept += keep
            finally:
                os.close(fd)
        names_undone = self._undo_names(backing)
        shutil.rmtree(self.attic)
        os.mkdir(self.attic)
        report = {"files_reverted": len(self.files), "unsynced_bytes_lost": lost_bytes,
                  "torn_bytes_kept": torn_kept, "names_undone": names_undone}
        self.files.clear()
        self.names.clear()
        self.held.clear()
        self.dead = True
        return report

    def _undo_names(self, backing: str) -> int:
        """Put every recorded name back to its durable target. First every name whose
        target differs is emptied (a directory is moved into the attic with all below it),
        then every durable target is put back, files from their attic links and
        directories from wherever they are now. Directory paths are looked up afresh
        after every directory move (such moves are rare)."""
        where = _inodes(backing, self.attic)
        undone = 0
        spare = 0
        for dir_ino, record in sorted(self.names.items()):
            for name, target in sorted(record.items()):
                d = where.get(dir_ino)
                if d is None:
                    continue  # a directory that is not durable itself: it goes with its parent
                path = os.path.join(d, name)
                try:
                    now = os.lstat(path)
                except FileNotFoundError:
                    continue
                if now.st_ino == target:
                    continue
                undone += 1
                if stat.S_ISDIR(now.st_mode):
                    spare += 1
                    os.rename(path, os.path.join(self.attic, f"moved-{spare}"))
                    where = _inodes(backing, self.attic)
                else:
                    os.unlink(path)
        for dir_ino, record in sorted(self.names.items()):
            for name, target in sorted(record.items()):
                d = where.get(dir_ino)
                if d is None or target is None:
                    continue
                path = os.path.join(d, name)
                if os.path.lexists(path):
                    continue  # already right
                undone += 1
                link = self.attic_path(target)
                if os.path.lexists(link) and not os.path.isdir(link):
                    os.link(link, path, follow_symlinks=False)
                    continue
                src = where.get(target)
                if src is None:
                    raise RuntimeError(f"durable directory inode {target} ({path}) was lost")
                os.rename(src, path)
                where = _inodes(backing, self.attic)
        return undone

    def stats(self) -> dict[str, Any]:
        return {"dirty_files": len(self.files),
                "unsynced_bytes": sum(s.unsynced_bytes for s in self.files.values()),
                "saved_blocks": sum(len(s.saved) for s in self.files.values()),
                "dirty_dirs": len(self.names),
                "dirty_names": sum(len(r) for r in self.names.values()),
                "held_inodes": len(self.held), "dead": self.dead, "ops": dict(self.ops)}


def _pread(fd: int, size: int, offset: int) -> bytes:
    """pread, also from a descriptor opened write-only (through /proc/self/fd)."""
    try:
        return os.pread(fd, size, offset)
    except OSError as e:
        if e.errno != errno.EBADF:
            raise
    rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY)
    try:
        return os.pread(rfd, size, offset)
    finally:
        os.close(rfd)


def _inodes(*roots: str) -> dict[int, str]:
    """Inode -> one path of it, for everything below ``roots`` (roots included)."""
    out: dict[int, str] = {}
    for root in roots:
        out.setdefault(os.lstat(root).st_ino, root)
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                p = os.path.join(dirpath, name)
                out.setdefault(os.lstat(p).st_ino, p)
    return out


# --- the FUSE operations -----------------------------------------------------------------


def _operations_class() -> type:
    """The mfusepy Operations subclass (built on demand: only the daemon imports mfusepy)."""
    import mfusepy

    FuseOSError = mfusepy.FuseOSError

    class PowerLossOps(mfusepy.Operations):  # type: ignore[misc]
        use_ns = True

        def __init__(self, backing: str, state: VolatileState) -> None:
            self.root = backing
            self.state = state
            self.fh_ino: dict[int, int] = {}
            self.fh_sync: set[int] = set()  # handles opened O_SYNC / O_DSYNC

        def _full(self, path: str) -> str:
            return os.path.join(self.root, path.lstrip("/"))

        def _alive(self) -> None:
            if self.state.dead:
                raise FuseOSError(errno.EIO)

        def _parent(self, path: str) -> tuple[int, str, str]:
            full = self._full(path)
            parent, name = os.path.split(full)
            return os.lstat(parent).st_ino, parent, name

        def _name_change(self, path: str) -> None:
            dir_ino, parent, name = self._parent(path)
            self.state.before_name_change(dir_ino, parent, name)

        # metadata

        def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
            self._alive()
            st = os.fstat(fh) if fh is not None else os.lstat(self._full(path))
            attrs = {k: getattr(st, k) for k in ("st_mode", "st_ino", "st_nlink", "st_uid", "st_gid", "st_size",
                                                 "st_blocks", "st_rdev")}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)  # use_ns
            return attrs

        def access(self, path: str, amode: int) -> int:
            self._alive()
            if not os.access(self._full(path), amode):
                raise FuseOSError(errno.EACCES)
            return 0

        def chmod(self, path: str, mode: int) -> int:
            self._alive()
            os.chmod(self._full(path), mode)
            return 0

        def chown(self, path: str, uid: int, gid: int) -> int:
            self._alive()
            os.chown(self._full(path), uid, gid, follow_symlinks=False)
            return 0

        def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
            self._alive()
            if times is None:
                os.utime(self._full(path), follow_symlinks=False)
            else:
                os.utime(self._full(path), ns=times, follow_symlinks=False)
            return 0

        def statfs(self, path: str) -> dict[str, int]:
            self._alive()
            sv = os.statvfs(self.root)
            return {k: getattr(sv, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")}

        def readlink(self, path: str) -> str:
            self._alive()
            return os.readlink(self._full(path))

        # directories

        def opendir(self, path: str) -> int:
            self._alive()
            return os.open(self._full(path), os.O_RDONLY | os.O_DIRECTORY)

        def releasedir(self, path: str, fh: int) -> int:
            os.close(fh)
            return 0

        def readdir(self, path: str, fh: int) -> list[str]:
            self._alive()
            return [".", "..", *os.listdir(self._full(path))]

        def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
            with self.state.lock:
                self._alive()
                self.state.dir_synced(os.fstat(fh).st_ino)
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            with self.state.lock:
                self._alive()
                self._name_change(path)
                os.mkdir(self._full(path), mode)
                self.state.created(os.lstat(self._full(path)).st_ino, regular=False)
            return 0

        def rmdir(self, path: str) -> int:
            with self.state.lock:
                self._alive()
                full = self._full(path)
                if os.listdir(full):
                    raise FuseOSError(errno.ENOTEMPTY)
                self._name_change(path)
                ino = os.lstat(full).st_ino
                if ino in self.state.held:  # durably named somewhere: keep it for a cut
                    os.rename(full, self.state.attic_path(ino))
                else:
                    os.rmdir(full)
            return 0

        # names

        def create(self, path: str, mode: int, flags: int) -> int:
            with self.state.lock:
                self._alive()
                full = self._full(path)
                existed = os.path.lexists(full)
                if not existed:
                    self._name_change(path)
                fd = self._open_locked(full, flags | os.O_CREAT, mode)
                if not existed:
                    self.state.created(self.fh_ino[fd], regular=True)
                return fd

        def mknod(self, path: str, mode: int, dev: int) -> int:
            with self.state.lock:
                self._alive()
                self._name_change(path)
                os.mknod(self._full(path), mode, dev)
                self.state.created(os.lstat(self._full(path)).st_ino, regular=stat.S_ISREG(mode))
            return 0

        def symlink(self, target: str, source: str) -> int:
            with self.state.lock:
                self._alive()
                self._name_change(target)
                os.symlink(source, self._full(target))
                self.state.created(os.lstat(self._full(target)).st_ino, regular=False)
            return 0

        def link(self, target: str, source: str) -> int:
            with self.state.lock:
                self._alive()
                self._name_change(target)
                os.link(self._full(source), self._full(target), follow_symlinks=False)
            return 0

        def unlink(self, path: str) -> int:
            with self.state.lock:
                self._alive()
                self._name_change(path)
                os.unlink(self._full(path))
            return 0

        def rename(self, old: str, new: str) -> int:
            with self.state.lock:
                self._alive()
                self._name_change(old)
                self._name_change(new)
                os.rename(self._full(old), self._full(new))
            return 0

        # file data

        def _open_locked(self, full: str, flags: int, mode: int = 0o644) -> int:
            if flags & os.O_TRUNC and os.path.lexists(full):
                fd0 = os.open(full, os.O_RDONLY)
                try:
                    self._before_truncate(os.fstat(fd0).st_ino, fd0, 0)
                finally:
                    os.close(fd0)
            # The kernel gives every write its offset (no O_APPEND below, or pwrite would ignore it).
            # O_DIRECT stays with the kernel: the daemon's own buffers are not aligned, and an
            # O_DIRECT write is volatile until an fsync all the same (the disk's cache), as the
            # model keeps it.
            flags &= ~(os.O_APPEND | getattr(os, "O_DIRECT", 0))
            try:  # readable too, to save blocks before they change (else through /proc, see _pread)
                fd = os.open(full, flags & ~os.O_ACCMODE | os.O_RDWR if flags & os.O_ACCMODE == os.O_WRONLY
                             else flags, mode)
            except PermissionError:
                fd = os.open(full, flags, mode)
            self.fh_ino[fd] = os.fstat(fd).st_ino
            if flags & _O_SYNC_ANY:
                self.fh_sync.add(fd)
            else:
                self.fh_sync.discard(fd)
            return fd

        def open(self, path: str, flags: int) -> int:
            with self.state.lock:
                self._alive()
                return self._open_locked(self._full(path), flags)

        def release(self, path: str, fh: int) -> int:
            self.fh_ino.pop(fh, None)
            self.fh_sync.discard(fh)
            os.close(fh)
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            self._alive()
            return os.pread(fh, size, offset)

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            with self.state.lock:
                self._alive()
                ino = self.fh_ino.get(fh) or os.fstat(fh).st_ino
                if fh in self.fh_sync:  # O_SYNC / O_DSYNC: every write is durable at once
                    n = os.pwrite(fh, data, offset)
                    self.state.synced(ino)
                    return n
                self.state.ops["write"] += 1
                st = self.state.file_for_change(ino, fh)
                self.state.save_blocks(st, fh, offset, offset + len(data))
                n = os.pwrite(fh, data, offset)
                st.last_write = (offset, data[:n])
                st.unsynced_bytes += n
                return n

        def _before_truncate(self, ino: int, fd: int, length: int) -> None:
            """Save what a truncate to ``length`` is about to cut off of the durable bytes."""
            st = self.state.file_for_change(ino, fd)
            self.state.save_blocks(st, fd, length, st.durable_size)

        def truncate(self, path: str, length: int, fh: int | None = None) -> int:
            with self.state.lock:
                self._alive()
                if fh is not None:
                    self._before_truncate(os.fstat(fh).st_ino, fh, length)
                    os.ftruncate(fh, length)
                    return 0
                full = self._full(path)
                fd = os.open(full, os.O_RDONLY)
                try:
                    self._before_truncate(os.fstat(fd).st_ino, fd, length)
                finally:
                    os.close(fd)
                os.truncate(full, length)
            return 0

        def fallocate(self, path: str, mode: int, offset: int, size: int, fh: int) -> int:
            if mode != 0:  # hole punching and friends are not modelled
                raise FuseOSError(errno.EOPNOTSUPP)
            with self.state.lock:
                self._alive()
                self.state.file_for_change(os.fstat(fh).st_ino, fh)  # remembers the durable size
                os.posix_fallocate(fh, offset, size)
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            with self.state.lock:
                self._alive()
                self.state.synced(self.fh_ino.get(fh) or os.fstat(fh).st_ino)
            return 0

    return PowerLossOps


# --- the daemon ----------------------------------------------------------------------------


def _serve_control(sock_path: str, backing: str, state: VolatileState) -> None:
    """Answer one JSON request per line on a Unix socket: ping, stats, cut."""
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(4)

    def handle(conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as f:
            for line in f:
                req = json.loads(line)
                try:
                    reply = _control(req, backing, state)
                except Exception as e:  # noqa: BLE001 - reported to the harness, which fails the test
                    log.exception("control request %s failed", req)
                    reply = {"error": f"{type(e).__name__}: {e}"}
                f.write(json.dumps(reply).encode() + b"\n")
                f.flush()

    while True:
        conn, _ = srv.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def _control(req: dict[str, Any], backing: str, state: VolatileState) -> dict[str, Any]:
    op = req.get("op")
    if op == "ping":
        return {"ok": True}
    with state.lock:
        if op == "stats":
            return state.stats()
        if op == "cut":
            if state.dead:
                raise RuntimeError("already cut")
            for pid in req.get("kill_pids", []):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            report = state.cut(backing, torn=bool(req.get("torn")), seed=int(req.get("seed", 0)))
            log.warning("power cut (torn=%s, seed=%s): %s", req.get("torn"), req.get("seed"), report)
            return report
    raise ValueError(f"unknown control op {op!r}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backing", required=True, help="the directory that holds what is durable")
    p.add_argument("--mount", required=True, help="where to mount the layer")
    p.add_argument("--control", required=True, help="path of the Unix socket for control requests")
    p.add_argument("--attic", help="inodes kept for a cut (default: <backing>.attic, same file system)")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    backing = os.path.abspath(a.backing)
    attic = os.path.abspath(a.attic or backing + ".attic")
    shutil.rmtree(attic, ignore_errors=True)  # what a previous daemon held is garbage now
    os.mkdir(attic)
    if os.lstat(attic).st_dev != os.lstat(backing).st_dev:
        sys.exit(f"the attic {attic} must be on the file system of {backing}")
    state = VolatileState(attic)
    threading.Thread(target=_serve_control, args=(a.control, backing, state), daemon=True,
                     name="control").start()

    # mfusepy loads libfuse 2 when it is installed, unless told otherwise.
    os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")
    import mfusepy

    # hard_remove: without it libfuse renames a file unlinked while open to .fuse_hidden*
    # instead of unlinking it, a rename this layer would record as a change of names.
    # auto_unmount: fusermount3 removes the mount if this process dies without doing so.
    try:
        mfusepy.FUSE(_operations_class()(backing, state), a.mount, foreground=True, nothreads=False,
                     fsname="powerloss", subtype="powerloss", hard_remove=True, auto_unmount=True)
    except RuntimeError as e:
        # libfuse's fuse_main returns 8 when its loop ended by a signal (SIGTERM: our stop).
        if e.args != (8,):
            raise
    log.info("unmounted: %s", state.stats())


if __name__ == "__main__":
    main()
