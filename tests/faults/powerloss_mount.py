"""The harness side of the power-loss layer: mount it, cut the power, mount it again.

:class:`PowerLossMount` runs the daemon (tests/faults/powerloss.py, run as a script) as a
child process, talks to it over its Unix control socket, and stops it by PID; the mount
is removed on success, failure and Ctrl-C (and, should the test process itself be
killed, by the daemon dying with it and fusermount3's ``auto_unmount``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from helpers.procs import start_process, stop_process, tail

DAEMON = str(Path(__file__).with_name("powerloss.py"))


class PowerLossMount:
    """The layer over ``backing``, mounted at ``mountpoint`` by a daemon process that this
    object starts and stops by PID. Use as a context manager, or call :meth:`unmount` in a
    ``finally``: the mount is removed on success, failure and Ctrl-C alike."""

    def __init__(self, backing: Path, mountpoint: Path, *, log_path: Path | None = None) -> None:
        self.backing = Path(backing)
        self.mountpoint = Path(mountpoint)
        self.control = self.backing.parent / f".{self.backing.name}.control.sock"
        self.log_path = log_path or self.backing.parent / f"{self.backing.name}.powerloss.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PowerLossMount:
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.unmount()

    def mount(self, timeout_s: float = 20.0) -> PowerLossMount:
        assert self.proc is None, "already mounted"
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        if self.control.exists():
            self.control.unlink()
        argv = [sys.executable, DAEMON, "--backing", str(self.backing), "--mount", str(self.mountpoint),
                "--control", str(self.control)]
        self.proc = start_process(argv, self.log_path)
        deadline = time.monotonic() + timeout_s
        try:
            while not (is_mounted(self.mountpoint) and self._ping()):
                if self.proc.poll() is not None:
                    raise AssertionError(f"powerloss daemon exited with {self.proc.returncode}:\n"
                                         f"{tail(self.log_path)}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"powerloss layer not mounted in {timeout_s}s:\n{tail(self.log_path)}")
                time.sleep(0.05)
        except BaseException:
            self.unmount()
            raise
        return self

    def _ping(self) -> bool:
        try:
            return bool(self.request({"op": "ping"}, timeout_s=1.0).get("ok"))
        except OSError:
            return False

    def request(self, req: dict[str, Any], *, timeout_s: float = 60.0) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(str(self.control))
            with s.makefile("rwb") as f:
                f.write(json.dumps(req).encode() + b"\n")
                f.flush()
                reply: dict[str, Any] = json.loads(f.readline())
        if "error" in reply:
            raise AssertionError(f"powerloss daemon: {reply['error']}")
        return reply

    def stats(self) -> dict[str, Any]:
        return self.request({"op": "stats"})

    def cut(self, *, torn: bool = False, seed: int = 0, kill_pids: tuple[int, ...] = ()) -> dict[str, Any]:
        """The power cut: SIGKILL to ``kill_pids``, then everything volatile is dropped (a
        random prefix of each file's last unsynced write kept with ``torn``). The layer
        answers EIO from then on; :meth:`restart` brings it back on what was durable."""
        return self.request({"op": "cut", "torn": torn, "seed": seed, "kill_pids": list(kill_pids)})

    def restart(self) -> PowerLossMount:
        """Unmount and mount again: what processes see afterwards is what was durable."""
        self.unmount()
        return self.mount()

    def unmount(self) -> None:
        """Stop the daemon by its PID (SIGTERM: libfuse unmounts on its way out), then make
        sure nothing stays mounted (fusermount3 -u, then a lazy umount)."""
        if self.proc is not None:
            stop_process(self.proc, timeout_s=10.0)
            self.proc = None
        for cmd in (["fusermount3", "-u", "-q", str(self.mountpoint)], ["umount", "-l", str(self.mountpoint)]):
            if not is_mounted(self.mountpoint):
                break
            subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        if is_mounted(self.mountpoint):
            raise AssertionError(f"{self.mountpoint} is still mounted")


def require_fuse() -> None:
    """Fail (never skip) where the layer cannot run: it needs /dev/fuse, fuse3 and mfusepy."""
    import pytest

    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.fail("the power-loss layer needs /dev/fuse and fuse3 (apt-get install fuse3)")
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:  # OSError: mfusepy found no libfuse
        pytest.fail(f"the power-loss layer needs mfusepy and libfuse3 (scripts/setup.sh): {e}")


def is_mounted(path: Path) -> bool:
    """Whether ``path`` is a mount point, from /proc/self/mountinfo (a stat of a dead
    FUSE mount would fail or hang)."""
    target = os.path.abspath(path)
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            mount_point = line.split()[4].replace("\\040", " ")
            if mount_point == target:
                return True
    return False
