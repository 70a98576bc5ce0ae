"""Clock faults: processes whose wall clock is off, or jumps, by libfaketime (Debian package
``faketime``; scripts/setup.sh installs it).

A :class:`FakeTime` is one fake wall clock: a ``FAKETIME_TIMESTAMP_FILE`` holding an offset
from the real wall clock in seconds. Every process started with its :meth:`FakeTime.env`
reads that file on each clock read (``FAKETIME_NO_CACHE=1``), so :meth:`FakeTime.set` moves
the clocks of all of them at once, while they run: a step of the host's clock when all the
processes of a host share one file, a skewed machine when one process has its own.

What is faked, tested in ``test_clock_faketime.py``:

* the wall clock only (``time.time()``, ``gettimeofday``, ``CLOCK_REALTIME``).
  ``FAKETIME_DONT_FAKE_MONOTONIC=1`` leaves CLOCK_MONOTONIC, CLOCK_MONOTONIC_RAW and
  CLOCK_BOOTTIME alone, as a real clock step (NTP, ``date -s``) does. Without it,
  libfaketime 0.9.10 moves those clocks too (to the faked wall clock's value), and Python
  hangs in its first timed wait (``threading.Event.wait`` waits in ``sem_clockwait``,
  which that version does not convert);
* Python processes only. Go programs (etcd) read the clock through the vDSO, never through
  libc, so libfaketime does not reach them: etcd under it keeps the real time.

``time.sleep`` needs a shim under libfaketime 0.9.10 (see faketime_site/sitecustomize.py),
which :meth:`FakeTime.env` puts on the path.

Every process that loads libfaketime makes a semaphore and a shared memory object in
/dev/shm named after its PID, and removes them only when it exits cleanly: :func:`release`
removes those of a process the tests stopped (kill -9 included).
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Mapping
from pathlib import Path

SHIM_DIR = Path(__file__).with_name("faketime_site")
SHM_DIR = Path("/dev/shm")
# The MT build serializes libfaketime's own state across threads (every zbk process has many).
_LIBRARY_PATTERNS = ("/usr/lib/*/faketime/libfaketimeMT.so.1", "/usr/lib/faketime/libfaketimeMT.so.1",
                     "/usr/local/lib/faketime/libfaketimeMT.so.1")


def libfaketime() -> str:
    """The path of libfaketimeMT; an AssertionError saying how to get it if it is missing
    (a clock-fault test fails rather than skips silently)."""
    for pattern in _LIBRARY_PATTERNS:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    raise AssertionError("libfaketime is not installed: apt-get install faketime (scripts/setup.sh does)")


def release(pid: int) -> None:
    """Remove what libfaketime made in /dev/shm for process ``pid``, once it has exited."""
    for name in (f"sem.faketime_sem_{pid}", f"faketime_shm_{pid}"):
        with contextlib.suppress(FileNotFoundError):
            (SHM_DIR / name).unlink()


class FakeTime:
    """One fake wall clock, ``offset_s`` seconds from the real one."""

    def __init__(self, path: Path, offset_s: float = 0.0) -> None:
        self.path = path
        self.offset_s = 0.0
        self.set(offset_s)

    def set(self, offset_s: float) -> None:
        """Move every process of this clock to ``offset_s`` from the real wall clock, at once
        (the file is replaced whole, so a reader sees the old or the new offset)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(f"{offset_s:+.3f}\n")
        os.replace(tmp, self.path)
        self.offset_s = offset_s

    def jump(self, by_s: float) -> None:
        """A step of ``by_s`` seconds (forward if positive)."""
        self.set(self.offset_s + by_s)

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """``base`` (default: this process's environment) for a process on this clock."""
        env = dict(os.environ if base is None else base)
        env.pop("FAKETIME", None)  # it would take precedence over the file
        preload = [libfaketime()] + [p for p in env.get("LD_PRELOAD", "").split() if p]
        path = [str(SHIM_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env.update(LD_PRELOAD=" ".join(preload), PYTHONPATH=os.pathsep.join(path),
                   FAKETIME_TIMESTAMP_FILE=str(self.path), FAKETIME_NO_CACHE="1",
                   FAKETIME_DONT_FAKE_MONOTONIC="1")
        return env
