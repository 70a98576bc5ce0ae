"""Child processes that die with the process that started them, and are stopped by PID.

A parent that is killed (kill -9, a native abort) runs no ``finally`` and no ``atexit``,
so the bookies, etcd members and autorecovery processes it started would live on as
orphans holding ports and disks. On Linux, ``prctl(PR_SET_PDEATHSIG)`` in the child makes
the kernel send it a signal when its parent goes away.

The kernel ties that signal to the *thread* that forked, not to the process: a child
started from a short-lived thread (a fault scheduler that restarts a bookie, say) would be
signalled when that thread ends. So :func:`spawn_tied` forks from the main thread when
called there, and otherwise hands the fork to one long-lived spawner thread that lives as
long as the process.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from zbk.osthread import PR_SET_PDEATHSIG, PRCTL


def die_with_parent_hook(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks the kernel to send ``sig`` to the child when the forking
    thread ends; None where prctl is unavailable (the child then simply outlives us)."""
    prctl = PRCTL
    if prctl is None:
        return None
    parent, signum = os.getpid(), int(sig)

    def hook() -> None:  # runs in the child between fork and exec: keep it tiny
        prctl(PR_SET_PDEATHSIG, signum)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signum)

    return hook


_Job = tuple[list[str], dict[str, Any], "Future[subprocess.Popen[bytes]]"]
_jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
_spawner: threading.Thread | None = None
_spawner_lock = threading.Lock()


def _spawner_main() -> None:
    while True:
        argv, kwargs, fut = _jobs.get()
        try:
            fut.set_result(subprocess.Popen(argv, **kwargs))  # type: ignore[arg-type]
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            fut.set_exception(e)


def spawn_tied(argv: list[str], *, death_signal: int = signal.SIGTERM, **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **kwargs)`` whose child gets ``death_signal`` when this
    process ends, however it ends. Safe to call from any thread."""
    kwargs["preexec_fn"] = die_with_parent_hook(death_signal)
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(argv, **kwargs)  # type: ignore[no-any-return]
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            # A daemon thread that never returns: it ends only with the process.
            _spawner = threading.Thread(target=_spawner_main, name="zbk-spawner", daemon=True)
            _spawner.start()
    fut: Future[subprocess.Popen[bytes]] = Future()
    _jobs.put((argv, kwargs, fut))
    return fut.result()


def stop_child(proc: subprocess.Popen[Any], *, sig: int = signal.SIGTERM, timeout_s: float = 5.0) -> int | None:
    """Stop one child by its PID: ``sig``, then SIGKILL if it has not exited within
    ``timeout_s``; always reaps it. Returns its exit code (None if it would not die)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
    return proc.returncode
