"""O_DIRECT in tests: whether a directory takes it, and file systems that refuse it (the
journal's and the entry logs' fallback to buffered writes)."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os

import pytest

from zbk.storage.disk import O_DIRECT, RealDisk


def direct_io_ok(directory: str) -> bool:
    """Whether ``directory``'s file system takes an aligned O_DIRECT write (the journal's
    "Direct I/O"; tmpfs and some FUSE mounts refuse it)."""
    if not O_DIRECT:
        return False
    path = os.path.join(directory, ".direct-io-probe")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | O_DIRECT, 0o644)
    except OSError:
        return False
    try:
        os.pwrite(fd, mmap.mmap(-1, mmap.PAGESIZE), 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        os.unlink(path)


def refuse_direct_opens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every ``os.open`` with O_DIRECT fail with EINVAL, as a file system that refuses
    it at the open (tmpfs, some FUSE mounts)."""
    real_open = os.open

    def refusing(path, flags, *args):  # type: ignore[no-untyped-def]
        if flags & O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refusing)


class RefusingDirectDisk(RealDisk):
    """A disk whose O_DIRECT writes fail with EINVAL before writing (a file system that opens
    such files but refuses their writes)."""

    def pwrite(self, fd, data, offset):  # type: ignore[no-untyped-def]
        if fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        super().pwrite(fd, data, offset)
