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


def test_forks_do_not_run_grpc_fork_handlers_while_etcd_clients_are_busy() -> None:
    """zbk.metadata.etcd turns gRPC's fork handlers off: with them on, every fork() (a bookie
    restarted by a test, a sandbox child) pauses and resets gRPC's threads and descriptors
    under the threads that are using them (gRPC logs "skipping fork() handlers" when it
    notices in time)."""
    script = textwrap.dedent("""
        import os, threading
        os.environ.pop("GRPC_ENABLE_FORK_SUPPORT", None)
        import zbk.metadata.etcd  # noqa: F401 - sets the default before gRPC loads
        import grpc
        from zbk.cli.children import spawn_tied

        channel = grpc.insecure_channel("127.0.0.1:1")
        done = threading.Event()

        def busy() -> None:
            while not done.is_set():
                try:
                    grpc.channel_ready_future(channel).result(timeout=0.01)
                except Exception:
                    pass

        t = threading.Thread(target=busy)
        t.start()
        for _ in range(40):
            spawn_tied(["true"]).wait()
        done.set()
        t.join()
        print("forked 40", flush=True)
    """)
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and "forked 40" in out.stdout, out.stderr
    assert "fork() handlers" not in out.stderr, out.stderr[-2000:]
