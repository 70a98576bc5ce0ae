"""Real etcd servers for tests: single members and clusters on 127.0.0.1.

Each member has its own data dir and log file under a test tmp dir; ``kill`` and
``start`` again reuse the same ports and data dir (a restart). Timing flags are tightened
by default (heartbeat 50 ms, election 500 ms) so that elections after a kill, and the
minimum lease TTL (1.5 election timeouts), stay short. A cluster that must ride out a
starved host (the chaos run) passes ``timing=ETCD_DEFAULT_TIMING`` (etcd's own 100 ms /
1000 ms): with 500 ms elections, a few hundred milliseconds of CPU steal make followers
call elections, and every request fails until a leader holds again.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from helpers.procs import free_port, start_process, stop_process, tail

ETCD_BIN = shutil.which("etcd") or "/usr/bin/etcd"
START_ATTEMPTS = 3  # new ports after "address already in use" (another test took ours)


FAST_TIMING = (50, 500)  # heartbeat ms, election timeout ms
ETCD_DEFAULT_TIMING = (100, 1000)


class EtcdUnavailable(RuntimeError):
    pass


class EtcdMember:
    def __init__(self, name: str, base_dir: Path, client_port: int, peer_port: int,
                 timing: tuple[int, int] = FAST_TIMING) -> None:
        self.name = name
        self.timing = timing
        self.data_dir = base_dir / f"{name}.etcd"
        self.log_path = base_dir / f"{name}.log"
        self.client_port = client_port
        self.peer_port = peer_port
        self.initial_cluster = ""
        self.cluster_token = ""
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def argv(self) -> list[str]:
        client = f"http://127.0.0.1:{self.client_port}"
        return [
            ETCD_BIN, "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.initial_cluster, "--initial-cluster-token", self.cluster_token,
            "--initial-cluster-state", "new",
            "--heartbeat-interval", str(self.timing[0]), "--election-timeout", str(self.timing[1]),
            "--logger", "zap", "--log-level", "warn",
        ]

    def start(self) -> None:
        """Start (or restart, on the same ports and data dir) without waiting."""
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is running"
        self.proc = start_process(self.argv(), self.log_path)

    def healthy(self) -> bool:
        """etcd's /health: true once this member is up and the cluster has a leader."""
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1) as r:
                return bool(json.loads(r.read()).get("health") == "true")
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_healthy(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if self.proc is not None and self.proc.poll() is not None:
                raise EtcdUnavailable(f"etcd {self.name} exited with {self.proc.returncode}:\n{tail(self.log_path)}")
            if time.monotonic() > deadline:
                raise EtcdUnavailable(f"etcd {self.name} not healthy after {timeout_s} s:\n{tail(self.log_path)}")
            time.sleep(0.05)

    def bind_failed(self) -> bool:
        return "address already in use" in tail(self.log_path, 200)

    def kill(self) -> None:
        """SIGKILL by PID: a crash, not a clean shutdown."""
        if self.proc is not None:
            stop_process(self.proc, kill=True)

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM by PID, then SIGKILL if it lingers."""
        if self.proc is not None:
            stop_process(self.proc, timeout_s=timeout_s)

    def restart(self, *, kill: bool = True) -> None:
        self.kill() if kill else self.stop()
        self.start()


class EtcdCluster:
    """``size`` members forming one cluster; ``uri(scope)`` lists every endpoint."""

    def __init__(self, base_dir: Path, size: int = 1, timing: tuple[int, int] = FAST_TIMING) -> None:
        assert size >= 1
        self.base_dir = base_dir
        self.size = size
        self.timing = timing
        self.members: list[EtcdMember] = []

    @property
    def endpoints(self) -> list[str]:
        return [m.endpoint for m in self.members]

    def uri(self, scope: str) -> str:
        return f"etcd://{','.join(self.endpoints)}/{scope}"

    def member(self, endpoint: str) -> EtcdMember:
        return next(m for m in self.members if m.endpoint == endpoint)

    def start(self) -> EtcdCluster:
        """Start every member and wait until all are healthy; retries on port clashes."""
        for attempt in range(START_ATTEMPTS):
            self._configure(attempt)
            for m in self.members:
                m.start()
            try:
                for m in self.members:
                    m.wait_healthy()
                return self
            except EtcdUnavailable:
                clash = any(m.bind_failed() for m in self.members)
                self.stop()
                if not clash or attempt == START_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _configure(self, attempt: int) -> None:
        token = f"zbk-test-{uuid.uuid4().hex[:8]}"
        directory = self.base_dir / f"try{attempt}"
        directory.mkdir(parents=True, exist_ok=True)
        self.members = [EtcdMember(f"m{i}", directory, free_port(), free_port(), self.timing) for i in range(self.size)]
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.initial_cluster, m.cluster_token = initial, token

    def stop(self) -> None:
        """Stop every member by PID (teardown: runs even if a test failed). SIGTERM goes to
        all first, so that no member waits on its departed peers one after another; a member
        that tries to hand over leadership to peers that are gone is killed after 2 s."""
        for m in self.members:
            if m.proc is not None and m.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(m.proc.pid, signal.SIGTERM)
        for m in self.members:
            m.stop(timeout_s=2.0)
