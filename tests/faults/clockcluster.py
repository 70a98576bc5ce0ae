"""A zbk cluster on loopback whose processes may each run on a fake clock (faults.faketime):
bookies, `zbk autorecovery` processes and :mod:`faults.clockclient` sessions. Every
process is started by this module and stopped by PID (:meth:`ClockCluster.stop_all` at
teardown, even when a test fails).

:class:`LeaderWatch` samples each autorecovery process's own belief that it leads
(``zbk_auditor_is_leader`` on its HTTP port, which never touches the metadata store) and
records when each one led, on the test's monotonic clock.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from helpers.etcd import ETCD_BIN, FAST_TIMING
from helpers.procs import free_port, start_process, stop_process, tail

from faults.faketime import FakeTime, release

REPO = Path(__file__).resolve().parents[2]
CLIENT_SCRIPT = Path(__file__).with_name("clockclient.py")
# Short registration leases (yet not so short that a starved machine loses them), GC out of the way.
BOOKIE_SETTINGS: dict[str, object] = {"registration_ttl_s": 4, "disk_check_interval_ms": 1000,
                                      "gc_wait_time_ms": 3_600_000}


def base_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests")])
    return env


class Node:
    """One zbk process, on the real clock or on ``clock``."""

    def __init__(self, root: Path, name: str, argv: list[str], clock: FakeTime | None) -> None:
        self.name = name
        self.argv = argv
        self.clock = clock
        self.log = root / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.pids: list[int] = []  # every process started, for release() of its libfaketime files

    def env(self) -> dict[str, str]:
        return base_env() if self.clock is None else self.clock.env(base_env())

    def start(self) -> Node:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is running"
        self.proc = start_process(self.argv, self.log, env=self.env(), cwd=REPO)
        self.pids.append(self.proc.pid)
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, *, kill: bool = False) -> int | None:
        if self.proc is None:
            return None
        stop_process(self.proc, timeout_s=20.0, kill=kill)
        release(self.proc.pid)
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def http(self, port: int, path: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return str(resp.read().decode())


class EtcdNode(Node):
    """A one-member etcd (libfaketime does not reach it: a Go program reads the clock
    without libc; test_clock_faketime.py shows it)."""

    def __init__(self, root: Path, name: str, clock: FakeTime | None) -> None:
        self.client_port, peer_port = free_port(), free_port()
        client, peer = f"http://127.0.0.1:{self.client_port}", f"http://127.0.0.1:{peer_port}"
        argv = [ETCD_BIN, "--name", name, "--data-dir", str(root / f"{name}.etcd"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"{name}={peer}", "--initial-cluster-token", uuid.uuid4().hex,
                "--heartbeat-interval", str(FAST_TIMING[0]), "--election-timeout", str(FAST_TIMING[1]),
                "--logger", "zap", "--log-level", "warn"]
        super().__init__(root, name, argv, clock)

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if json.loads(self.http(self.client_port, "/health")).get("health") == "true":
                    return
            except (OSError, ValueError):
                pass
            if not self.alive or time.monotonic() > deadline:
                raise AssertionError(f"etcd not healthy:\n{tail(self.log, 20)}")
            time.sleep(0.1)


class BookieNode(Node):
    def __init__(self, root: Path, uri: str, name: str, clock: FakeTime | None, settings: dict[str, object]) -> None:
        self.port, self.http_port = free_port(), free_port()
        argv = [sys.executable, "-m", "zbk.cli.main", "bookie", "--metadata", uri, "--data-dir", str(root / name),
                "--port", str(self.port), "--http-port", str(self.http_port)]
        for k, v in {**BOOKIE_SETTINGS, **settings}.items():
            argv += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
        super().__init__(root, name, argv, clock)
        self.data_dir = root / name

    @property
    def bookie_id(self) -> str:
        return f"127.0.0.1:{self.port}"


class AutoRecoveryNode(Node):
    def __init__(self, root: Path, uri: str, name: str, clock: FakeTime | None, settings: dict[str, object]) -> None:
        self.http_port = free_port()
        argv = [sys.executable, "-m", "zbk.cli.main", "autorecovery", "--metadata", uri,
                "--http-port", str(self.http_port)]
        for k, v in settings.items():
            argv += ["--set", f"{k}={v}"]
        super().__init__(root, name, argv, clock)

    @property
    def candidate_id(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def metric(self, name: str) -> float | None:
        """A gauge or counter of this process (None if it does not answer)."""
        try:
            text = self.http(self.http_port, "/metrics")
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None


class ClientSession:
    """A :mod:`faults.clockclient` session: one command a line, one JSON answer a line."""

    def __init__(self, root: Path, uri: str, name: str, clock: FakeTime | None) -> None:
        self.log = root / f"{name}.log"
        env = base_env() if clock is None else clock.env(base_env())
        log = open(self.log, "ab")  # noqa: SIM115 - owned by the child, closed after the start
        try:
            self.proc = subprocess.Popen([sys.executable, str(CLIENT_SCRIPT), "session", "--metadata", uri],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                                         cwd=REPO, start_new_session=True)
        finally:
            log.close()
        ready = self._read(60.0)
        assert ready.get("event") == "ready", ready

    def _read(self, timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            state = f"exited {self.proc.poll()}" if self.proc.poll() is not None else f"silent for {timeout_s} s"
            raise AssertionError(f"clock client {state}:\n{tail(self.log, 40)}")
        out: dict[str, Any] = json.loads(line)
        return out

    def call(self, line: str, timeout_s: float = 120.0) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()
        out = self._read(timeout_s)
        if "error" in out:
            raise AssertionError(f"clock client: {line!r} failed: {out['error']}\n{out.get('trace', '')}")
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b"exit\n")
                self.proc.stdin.flush()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                pass
        stop_process(self.proc, kill=True)  # type: ignore[arg-type]
        release(self.proc.pid)


class ClockCluster:
    """Processes of one cluster; ``uri`` is the embedded store's, or set by :meth:`etcd`."""

    def __init__(self, root: Path, uri: str = "") -> None:
        self.root = root
        self.uri = uri
        self.nodes: list[Node] = []
        self.sessions: list[ClientSession] = []

    def etcd(self, name: str, clock: FakeTime | None = None) -> EtcdNode:
        """A one-member etcd; the cluster's metadata URI becomes a fresh scope on it."""
        node = EtcdNode(self.root, name, clock)
        self.nodes.append(node)
        node.start()
        node.wait_healthy()
        self.uri = f"etcd://{node.endpoint}/clock{uuid.uuid4().hex[:8]}"
        return node

    def bookie(self, name: str, clock: FakeTime | None = None, **settings: object) -> BookieNode:
        node = BookieNode(self.root, self.uri, name, clock, settings)
        self.nodes.append(node)
        node.start()
        return node

    def autorecovery(self, name: str, clock: FakeTime | None = None, **settings: object) -> AutoRecoveryNode:
        node = AutoRecoveryNode(self.root, self.uri, name, clock, settings)
        self.nodes.append(node)
        node.start()
        return node

    def session(self, name: str, clock: FakeTime | None = None) -> ClientSession:
        s = ClientSession(self.root, self.uri, name, clock)
        self.sessions.append(s)
        return s

    def wait_http(self, nodes: list[AutoRecoveryNode], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        for n in nodes:
            while n.metric("zbk_auditor_is_leader") is None:
                if not n.alive or time.monotonic() > deadline:
                    raise AssertionError(f"{n.name} not serving:\n{tail(n.log, 30)}")
                time.sleep(0.1)

    def logs(self) -> str:
        return "\n".join(f"--- {n.name}\n{tail(n.log, 15)}" for n in self.nodes)

    def stop_all(self) -> None:
        for s in self.sessions:
            s.close()
        for n in reversed(self.nodes):  # etcd last
            if n.alive:
                n.stop(kill=True)
            for pid in n.pids:  # those that exited by themselves too
                release(pid)


class LeaderWatch:
    """Samples ``zbk_auditor_is_leader`` of every autorecovery process every ``interval_s``.

    A span of leadership starts at the first sample that finds a process leading and ends at
    its last such sample before one that finds it not leading (or not answering: dead). A
    sample that finds two leaders asks them again at once: a hand-over between two reads of
    one round (the old leader stops leading before its key is deleted, and only then can
    another be elected) is not an overlap; two that still both lead are."""

    def __init__(self, nodes: list[AutoRecoveryNode], interval_s: float = 0.1) -> None:
        self.nodes = nodes
        self.interval_s = interval_s
        self.spans: dict[str, list[list[float]]] = {n.name: [] for n in nodes}  # name -> [start, end] led
        self.overlaps: list[tuple[float, list[str]]] = []
        self.samples = 0
        self._open: set[str] = set()  # names whose last span is still open
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-watch", daemon=True)

    def __enter__(self) -> LeaderWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _leaders(self, nodes: list[AutoRecoveryNode]) -> list[str]:
        return [n.name for n in nodes if n.alive and n.metric("zbk_auditor_is_leader") == 1.0]

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            leaders = self._leaders(self.nodes)
            if len(leaders) > 1:
                leaders = self._leaders([n for n in self.nodes if n.name in leaders])
                if len(leaders) > 1:
                    self.overlaps.append((now, leaders))
            self.samples += 1
            for name in leaders:
                if name in self._open:
                    self.spans[name][-1][1] = now
                else:
                    self.spans[name].append([now, now])
            self._open = set(leaders)

    def leaders_seen(self) -> list[str]:
        """Who led, in the order they started leading (a name once per span)."""
        starts = sorted((span[0], name) for name, spans in self.spans.items() for span in spans)
        return [name for _, name in starts]
