"""`zbk sandbox` as a user runs it: a real sandbox process with real bookie and
auto-recovery children on free loopback ports. Every process is stopped by PID at the end,
even when a test fails (the sandbox by SIGTERM, then any child still alive, found by its
command line)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.procs import free_port, stop_pid, stop_process, tail
from helpers.wait import wait_until

import zbk
from zbk.cli.sandbox import pick_free_base_port
from zbk.metadata.registry import list_bookies
from zbk.metadata.uri import open_store
from zbk.recovery.underreplication import UnderReplicationRegistry

PW = b"sandbox"
ENTRIES = 300
# A kill -9'd bookie's registration lingers until its lease expires; keep that short.
FAST_LEASES = ["--set", "registration_ttl_s=2"]

pytestmark = pytest.mark.timeout(120)


def payload(i: int) -> bytes:
    return f"entry-{i:06d}-".encode() * 40


def bookie_pids(data_dir: Path) -> dict[str, int]:
    """Live bookie processes of this sandbox, by name, found by their command line (what
    `pgrep -f <data dir>/bookie-` would find), independent of what the sandbox reports."""
    found: dict[str, int] = {}
    marker = f"{data_dir}/bookie-"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:  # exited while we looked
            continue
        for arg in argv:
            if arg.startswith(marker):
                found[os.path.basename(arg)] = int(entry)
    return found


def autorecovery_pids(data_dir: Path) -> list[int]:
    """Live `zbk autorecovery` processes working on this sandbox's metadata, found by their
    command line."""
    found = []
    meta = f"sqlite:///{data_dir}/meta.db"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "autorecovery" in argv and meta in argv:
            found.append(int(entry))
    return found


def http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


def is_leader_metric(http: str) -> float | None:
    """zbk_auditor_is_leader of the process serving ``http``; None while nothing answers."""
    try:
        text = http_get(f"{http}/metrics")
    except OSError:  # a restarted process not listening yet
        return None
    for line in text.splitlines():
        if line.startswith("zbk_auditor_is_leader "):
            return float(line.split()[1])
    return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class SandboxProcess:
    """One `zbk sandbox --json --no-status` process; its stdout is one JSON event per line."""

    def __init__(self, data_dir: Path, run_dir: Path, *args: str) -> None:
        self.data_dir = data_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.out_path, self.err_path = run_dir / "sandbox.out", run_dir / "sandbox.err"
        argv = [sys.executable, "-m", "zbk.cli.main", "sandbox", "--data-dir", str(data_dir), "--json",
                "--no-status", *args]
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            # Its own session, like a background job: only the signals we send reach it.
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         start_new_session=True)

    def events(self) -> list[dict[str, Any]]:
        lines = self.out_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def logs(self) -> str:
        return f"stdout:\n{tail(self.out_path)}\nstderr:\n{tail(self.err_path)}"

    def wait_event(self, kind: str, timeout_s: float = 30.0, **match: Any) -> dict[str, Any]:
        """The first event of ``kind`` whose fields include ``match``."""
        def find() -> dict[str, Any]:  # empty (falsy) until the event is there
            if self.proc.poll() is not None:
                raise AssertionError(f"sandbox exited with {self.proc.returncode}:\n{self.logs()}")
            return next((e for e in self.events()
                         if e["event"] == kind and all(e.get(k) == v for k, v in match.items())), {})

        return wait_until(find, timeout_s=timeout_s, interval_s=0.05, message=f"sandbox event {kind!r}")

    def interrupt(self, timeout_s: float = 45.0) -> int:
        """Ctrl-C: SIGINT to the sandbox alone; returns its exit code."""
        os.kill(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout_s)

    def kill_everything(self) -> None:
        stop_process(self.proc, timeout_s=40.0)
        for pid in [*bookie_pids(self.data_dir).values(), *autorecovery_pids(self.data_dir)]:
            stop_pid(pid)


@pytest.fixture
def sandboxes(tmp_path: Path) -> Iterator[list[SandboxProcess]]:
    started: list[SandboxProcess] = []
    try:
        yield started
    finally:
        for sb in started:
            sb.kill_everything()


def start(sandboxes: list[SandboxProcess], data_dir: Path, *args: str) -> SandboxProcess:
    sb = SandboxProcess(data_dir, data_dir.parent / f"run-{len(sandboxes)}", *args)
    sandboxes.append(sb)
    return sb


def wait_registered(uri: str, ids: set[str], timeout_s: float = 30.0) -> None:
    store = open_store(uri)
    try:
        wait_until(lambda: {b.bookie_id for b in list_bookies(store)} == ids, timeout_s=timeout_s,
                   interval_s=0.1, message=f"bookies {sorted(ids)} registered")
    finally:
        store.close()


def read_back(uri: str, ledger_id: int) -> list[bytes]:
    with zbk.BookKeeper(uri) as bk:
        rh = bk.open_ledger(ledger_id, password=PW)
        assert rh.is_closed
        return [e.payload for e in rh.read(0, rh.last_add_confirmed)]


def under_replicated(uri: str) -> int:
    store = open_store(uri)
    try:
        return UnderReplicationRegistry(store, "test").count()
    finally:
        store.close()


def test_sandbox_runs_restarts_stops_cleanly_and_comes_back(sandboxes: list[SandboxProcess], tmp_path: Path) -> None:
    data = tmp_path / "cluster"
    sb = start(sandboxes, data, "--bookies", "3", "--base-port", "0", *FAST_LEASES)
    cluster = sb.wait_event("cluster")
    uri, ids = cluster["metadata"], {b["id"] for b in cluster["bookies"]}
    assert uri == f"sqlite:///{data}/meta.db" and len(ids) == 3
    assert all(b["id"] == f"127.0.0.1:{b['port']}" and b["http_port"] == b["port"] + 1000 for b in cluster["bookies"])
    ar = cluster["autorecovery"]
    base = cluster["base_port"]
    assert ar["http_port"] == base + 2000 and ar["id"] == f"127.0.0.1:{base + 2000}"
    assert ar["metrics"] == f"http://127.0.0.1:{base + 2000}/metrics"
    assert ar["pid"] is None, "auto-recovery starts only once the bookies have registered"
    wait_registered(uri, ids)
    started = sb.wait_event("started", process="autorecovery")
    ready = sb.wait_event("ready")
    assert ready["auditor"] == ar["id"], "the sandbox's auto-recovery process is the auditor"
    reported = {b["name"]: b["pid"] for b in cluster["bookies"]}
    assert bookie_pids(data) == reported, "the bookies the sandbox reports are the ones running"
    assert autorecovery_pids(data) == [started["pid"]]
    assert json.loads(http_get(f"{ar['http']}/api/v1/autorecovery/who_is_auditor")) == {"auditor": ar["id"]}
    assert is_leader_metric(ar["http"]) == 1.0

    # A second sandbox on the same data dir is refused, and disturbs nothing.
    second = subprocess.run([sys.executable, "-m", "zbk.cli.main", "sandbox", "--data-dir", str(data)],
                            capture_output=True, text=True, timeout=30)
    assert second.returncode == 1 and "another zbk sandbox" in second.stderr, second.stderr

    with zbk.BookKeeper(uri) as bk:
        lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PW)
        futures = [lh.append_async(payload(i)) for i in range(ENTRIES)]
        assert [f.result(30) for f in futures] == list(range(ENTRIES))
        lh.close()
        ledger_id = lh.ledger_id
    assert read_back(uri, ledger_id) == [payload(i) for i in range(ENTRIES)]

    # A bookie dying under the sandbox is reported and restarted.
    os.kill(reported["bookie-1"], signal.SIGKILL)
    exited = sb.wait_event("exited")
    assert exited["bookie"] == "bookie-1" and exited["code"] == -signal.SIGKILL
    restarted = sb.wait_event("restarted")
    assert restarted["bookie"] == "bookie-1" and restarted["pid"] != reported["bookie-1"]
    wait_until(lambda: bookie_pids(data).get("bookie-1") == restarted["pid"], message="bookie-1 running again")
    wait_registered(uri, ids)
    assert read_back(uri, ledger_id) == [payload(i) for i in range(ENTRIES)]

    # So is the auto-recovery process; the new one serves the same HTTP port.
    os.kill(started["pid"], signal.SIGKILL)
    exited = sb.wait_event("exited", process="autorecovery")
    assert exited["code"] == -signal.SIGKILL and exited["pid"] == started["pid"]
    restarted = sb.wait_event("restarted", process="autorecovery")
    assert restarted["pid"] != started["pid"]
    wait_until(lambda: autorecovery_pids(data) == [restarted["pid"]], message="autorecovery running again")
    # The killed process's leadership lasts until its lease expires; then the new one leads.
    wait_until(lambda: is_leader_metric(ar["http"]) == 1.0, timeout_s=30, interval_s=0.2,
               message="the restarted auto-recovery process is the auditor")

    running = bookie_pids(data)
    assert len(running) == 3
    ar_pids = autorecovery_pids(data)
    dirty = [data / name / "index" / "DIRTY" for name in running]
    assert all(p.exists() for p in dirty), "a running bookie holds its dirty marker"
    assert sb.interrupt() == 0, sb.logs()
    assert not [pid for pid in running.values() if alive(pid)], "a bookie outlived the sandbox"
    assert not [pid for pid in ar_pids if alive(pid)], "auto-recovery outlived the sandbox"
    assert bookie_pids(data) == {} and autorecovery_pids(data) == []
    assert not [p for p in dirty if p.exists()], "a bookie did not stop cleanly (dirty marker left)"
    stops = [e for e in sb.events() if e["event"] == "stopped"]
    assert {e["process"]: e["code"] for e in stops} == {"autorecovery": 0, "bookie-0": 0, "bookie-1": 0, "bookie-2": 0}
    assert stops[0]["process"] == "autorecovery", "auto-recovery stops before the bookies it watches"
    assert sb.events()[-1] == {"event": "exit", "code": 0}

    # Same data dir, no port given: the same cluster comes back (same ids, cookies match).
    sb2 = start(sandboxes, data)
    cluster2 = sb2.wait_event("cluster")
    assert {b["id"] for b in cluster2["bookies"]} == ids and cluster2["autorecovery"]["id"] == ar["id"]
    wait_registered(uri, ids)
    assert sb2.wait_event("ready")["auditor"] == ar["id"]
    # Started after the bookies registered, the auditor saw no bookie as lost.
    assert under_replicated(uri) == 0
    assert read_back(uri, ledger_id) == [payload(i) for i in range(ENTRIES)]
    running, ar_pids = bookie_pids(data), autorecovery_pids(data)
    assert len(ar_pids) == 1
    assert sb2.interrupt() == 0, sb2.logs()
    assert not [pid for pid in [*running.values(), *ar_pids] if alive(pid)]
    assert not [n for n in running if (data / n / "index" / "DIRTY").exists()]


def run_sandbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zbk.cli.main", "sandbox", "--no-status", *args],
                          capture_output=True, text=True, timeout=30)


def test_a_busy_port_is_refused_before_anything_starts(tmp_path: Path) -> None:
    base = pick_free_base_port(2)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base + 1001))  # bookie-1's HTTP port
        busy.listen()
        r = run_sandbox("--data-dir", str(tmp_path / "c"), "--bookies", "2", "--base-port", str(base))
    assert r.returncode == 1 and f"port {base + 1001} (bookie-1 HTTP) is in use" in r.stderr, r.stderr
    assert not (tmp_path / "c" / "logs").exists(), "no bookie was started"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base + 2000))  # auto-recovery's HTTP port
        busy.listen()
        r = run_sandbox("--data-dir", str(tmp_path / "d"), "--bookies", "2", "--base-port", str(base))
    assert r.returncode == 1 and f"port {base + 2000} (autorecovery HTTP) is in use" in r.stderr, r.stderr
    assert not (tmp_path / "d" / "logs").exists(), "no bookie was started"


def test_a_data_dir_keeps_its_ports_and_metadata(tmp_path: Path) -> None:
    data = tmp_path / "c"
    data.mkdir()
    port = free_port()
    (data / "sandbox.json").write_text(json.dumps({"bookies": 3, "base_port": port, "metadata": "sqlite:///x/m.db"}))
    r = run_sandbox("--data-dir", str(data), "--base-port", str(port + 10))
    assert r.returncode == 2 and f"created with --base-port {port}" in r.stderr, r.stderr
    r = run_sandbox("--data-dir", str(data), "--metadata", "sqlite:///y/m.db")
    assert r.returncode == 2 and "created with --metadata sqlite:///x/m.db" in r.stderr, r.stderr
    assert not (data / "logs").exists()


def test_exit_codes_are_explained() -> None:
    from zbk.cli.sandbox import describe_exit

    assert describe_exit(0) == "exit 0 (clean stop)"
    assert describe_exit(4) == "exit 4 (cookie mismatch)"
    assert describe_exit(11) == "exit 11 (actor journal crashed)"
    assert describe_exit(-9) == "killed by SIGKILL"
    from zbk.cli.sandbox import describe_autorecovery_exit

    assert describe_autorecovery_exit(0) == "exit 0 (clean stop)"
    assert describe_autorecovery_exit(1) == "exit 1 (lease lost or a worker crashed)"
    assert describe_autorecovery_exit(2) == "exit 2 (bad configuration)"
    assert describe_autorecovery_exit(-15) == "killed by SIGTERM"
