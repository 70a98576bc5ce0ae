"""Loopback ports and child processes that are always stopped by PID."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from zbk.cli.children import spawn_tied, stop_child
from zbk.cli.ports import free_port  # noqa: F401  (tests import it from here)


def start_process(argv: list[str], log_path: Path, *, env: dict[str, str] | None = None,
                  cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout and stderr appended to ``log_path``, in its own session
    (so that a Ctrl-C aimed at pytest does not hit it before teardown does).

    The child is tied to the test process: if pytest itself dies (kill -9, a native abort)
    and so never reaches the teardown that stops it by PID, the kernel sends it SIGKILL
    (SIGKILL, not SIGTERM: a child a chaos test has paused with SIGSTOP must die too)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return spawn_tied(argv, death_signal=signal.SIGKILL, stdout=log, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)


def stop_process(proc: subprocess.Popen[bytes], *, timeout_s: float = 5.0, kill: bool = False) -> None:
    """Stop one child by its PID: SIGTERM (or SIGKILL with ``kill``), then SIGKILL if it
    has not exited within ``timeout_s``; always reaps it."""
    stop_child(proc, sig=signal.SIGKILL if kill else signal.SIGTERM, timeout_s=timeout_s)


def stop_pid(pid: int, *, timeout_s: float = 5.0) -> None:
    """Stop a process that is not our child (we cannot reap it): SIGTERM, wait, SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.02)


def tail(path: Path, lines: int = 30) -> str:
    """The last lines of a log file, for failure messages."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no log at {path})"
