"""The clock-fault layer itself (faults.faketime), before any zbk test trusts it: what
libfaketime moves in a Python process and what it leaves alone, that a step reaches a
running process at once, and that etcd (a Go program) is out of its reach. Also the
leader watch of the clock tests (faults.clockcluster), shown to see two leaders."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path

from helpers.etcd import ETCD_BIN
from helpers.procs import free_port, start_process, stop_process

from faults.clockcluster import LeaderWatch
from faults.faketime import SHM_DIR, FakeTime, release

# Reports its clocks, then the time a sleep, a timed wait and a select take (real seconds,
# CLOCK_MONOTONIC_RAW), then the wall clock's offset from the parent's (the parent's real
# wall clock arrives on stdin) after each line the parent sends.
PROBE = r"""
import json, select, sys, threading, time
raw = lambda: time.clock_gettime(time.CLOCK_MONOTONIC_RAW)
out = lambda **kw: print(json.dumps(kw), flush=True)
out(time=time.time(), monotonic=time.monotonic(), boottime=time.clock_gettime(time.CLOCK_BOOTTIME))
took = {}
for name, wait in (("sleep", lambda: time.sleep(0.2)), ("event", lambda: threading.Event().wait(0.2)),
                   ("select", lambda: select.select([], [], [], 0.2))):
    t0 = raw(); wait(); took[name] = raw() - t0
out(took=took)
for line in sys.stdin:
    out(offset=time.time() - float(line))
"""


def test_only_the_wall_clock_moves_and_a_step_reaches_a_running_process(tmp_path: Path) -> None:
    clock = FakeTime(tmp_path / "clock", 600.0)
    mono_before, boot_before = time.monotonic(), time.clock_gettime(time.CLOCK_BOOTTIME)
    proc = subprocess.Popen([sys.executable, "-c", PROBE], env=clock.env(), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdin is not None and proc.stdout is not None

        def line() -> dict[str, object]:
            ready, _, _ = select.select([proc.stdout], [], [], 10)
            assert ready, "the probe went silent"
            out: dict[str, object] = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
            return out

        def offset() -> float:
            proc.stdin.write(f"{time.time()}\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
            return float(line()["offset"])  # type: ignore[arg-type]

        clocks = line()
        assert abs(float(clocks["time"]) - time.time() - 600) < 5, clocks  # type: ignore[arg-type]
        # CLOCK_MONOTONIC and CLOCK_BOOTTIME are the host's own: the child's readings fall
        # between the parent's before and after.
        assert mono_before <= float(clocks["monotonic"]) <= time.monotonic(), clocks  # type: ignore[arg-type]
        assert boot_before <= float(clocks["boottime"]) <= time.clock_gettime(time.CLOCK_BOOTTIME), clocks  # type: ignore[arg-type]
        took = line()["took"]
        assert all(0.19 <= s < 1.5 for s in took.values()), took  # type: ignore[union-attr]
        assert abs(offset() - 600) < 1
        clock.set(-300.0)  # a step back of 15 minutes, while the process runs
        assert abs(offset() + 300) < 1
        clock.jump(+60.0)
        assert abs(offset() + 240) < 1
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        release(proc.pid)
    assert not list(SHM_DIR.glob(f"*faketime_*_{proc.pid}")), "libfaketime's files of the probe are left"


def test_etcd_keeps_the_real_time_under_libfaketime(tmp_path: Path) -> None:
    """Go reads the clock through the vDSO, not libc: libfaketime cannot skew etcd, whose
    leases run on Go's monotonic clock anyway."""
    clock = FakeTime(tmp_path / "clock", -7200.0)
    url = f"http://127.0.0.1:{free_port()}"
    log = tmp_path / "etcd.log"
    before = time.time()
    proc = start_process([ETCD_BIN, "--name", "e", "--data-dir", str(tmp_path / "e.etcd"),
                          "--listen-client-urls", url, "--advertise-client-urls", url,
                          "--listen-peer-urls", f"http://127.0.0.1:{free_port()}",
                          "--initial-cluster-token", uuid.uuid4().hex, "--logger", "zap", "--log-level", "info"],
                         log, env=clock.env())
    try:
        deadline = time.monotonic() + 20
        stamps: list[float] = []
        while not stamps and time.monotonic() < deadline:
            time.sleep(0.1)
            for text in log.read_text(errors="replace").splitlines():
                if text.startswith("{"):
                    stamps.append(datetime.fromisoformat(json.loads(text)["ts"].replace("Z", "+00:00")).timestamp())
        assert stamps, f"etcd logged nothing:\n{log.read_text()[-2000:]}"
        assert before - 5 <= stamps[0] <= time.time() + 5, (before, stamps[0])
    finally:
        stop_process(proc, kill=True)
        release(proc.pid)


class _Node:
    """Stands in for an AutoRecoveryNode: what LeaderWatch reads of one."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.alive = True
        self.leading = False

    def metric(self, name: str) -> float | None:
        assert name == "zbk_auditor_is_leader"
        return 1.0 if self.leading else 0.0


def test_the_leader_watch_sees_a_hand_over_and_an_overlap() -> None:
    a, b = _Node("a"), _Node("b")
    with LeaderWatch([a, b], interval_s=0.01) as watch:  # type: ignore[list-item]
        a.leading = True
        time.sleep(0.2)
        a.leading, b.leading = False, True  # a hand-over
        time.sleep(0.2)
        assert watch.overlaps == []
        a.leading = True  # two leaders
        time.sleep(0.2)
    assert watch.leaders_seen() == ["a", "b", "a"]
    assert watch.overlaps and all(names == ["a", "b"] for _, names in watch.overlaps)
