"""Children started through zbk.cli.children die with their parent, and only then.

The parent here is a real Python process that starts two children (`sleep`), one from its
main thread and one from a short-lived thread that then ends; it is then killed with
SIGKILL, as a native abort or an OOM kill would, so it runs no cleanup of its own."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from helpers.procs import stop_pid, stop_process

PARENT = textwrap.dedent("""
    import signal, subprocess, sys, threading, time
    from zbk.cli.children import spawn_tied

    pids = []
    pids.append(spawn_tied(["sleep", "120"], death_signal=signal.SIGKILL).pid)
    t = threading.Thread(target=lambda: pids.append(spawn_tied(["sleep", "120"]).pid))
    t.start(); t.join()   # the forking thread has ended: its child must live on
    print(" ".join(map(str, pids)), flush=True)
    time.sleep(120)
""")


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
def test_children_outlive_their_forking_thread_but_not_their_parent() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    pids: list[int] = []
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2, pids
        time.sleep(0.5)
        assert all(alive(p) for p in pids), "a child died with the thread that started it"
        os.kill(parent.pid, 9)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in pids), "a child outlived its killed parent"
    finally:
        stop_process(parent, kill=True)
        for pid in pids:
            stop_pid(pid)
