"""Real processes for auto-recovery tests: bookies (helpers.bookie) and `zbk autorecovery`
processes, every one stopped by PID at teardown even when the test fails."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.bookie import BookieProcess, wait_registered
from helpers.procs import free_port, start_process, stop_process, tail


class AutoRecoveryProcess:
    def __init__(self, root: Path, metadata_uri: str, name: str, settings: dict[str, object]) -> None:
        self.log = root / f"{name}.log"
        self.http_port = free_port()
        self.metadata_uri = metadata_uri
        self.settings = settings
        self.proc: Any = None

    @property
    def candidate_id(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def start(self, timeout_s: float = 20.0) -> AutoRecoveryProcess:
        argv = [sys.executable, "-m", "zbk.cli.main", "autorecovery", "--metadata", self.metadata_uri,
                "--http-port", str(self.http_port)]
        for k, v in self.settings.items():
            argv += ["--set", f"{k}={v}"]
        self.proc = start_process(argv, self.log, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"autorecovery exited with {self.proc.returncode}:\n{tail(self.log)}")
            try:
                self.get("/heartbeat")
                return self
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"autorecovery not ready in {timeout_s}s:\n{tail(self.log)}")

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.http_port}{path}", data=data, method=method)
        with urllib.request.urlopen(req, timeout=5) as resp:
            raw = resp.read()
        return raw.decode() if path == "/metrics" else json.loads(raw)

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def metric(self, name: str) -> float:
        for line in self.get("/metrics").splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"metric {name} not exported")

    def stop(self, *, kill: bool = False) -> int:
        stop_process(self.proc, timeout_s=20.0, kill=kill)
        return int(self.proc.returncode)


class RecoveryCluster:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = f"sqlite:///{root}/meta.db"
        self.bookies: list[BookieProcess] = []
        self.autorecovery: list[AutoRecoveryProcess] = []

    def start_bookies(self, n: int, settings: dict[str, object] | None = None, *,
                      ids: list[str | None] | None = None) -> list[BookieProcess]:
        """``ids``: the bookies' stable ids (None: the default host:port), one per bookie."""
        ids = ids or [None] * n
        assert len(ids) == n, ids
        new = [BookieProcess(self.root, self.uri, name=f"b{len(self.bookies) + i}", settings=settings,
                             bookie_id=ids[i]) for i in range(n)]
        self.bookies += new
        for b in new:
            b.start(wait=False)
        for b in new:
            b.wait_ready()
        # A bookie answers before its registration lands: wait for it, or a ledger created
        # at once may find too few writable bookies (seen on a loaded machine).
        wait_registered(self.uri, [b.bookie_id for b in new])
        return new

    def by_id(self, bookie_id: str) -> BookieProcess:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)

    def start_autorecovery(self, **settings: object) -> AutoRecoveryProcess:
        ar = AutoRecoveryProcess(self.root, self.uri, f"ar{len(self.autorecovery)}", settings)
        self.autorecovery.append(ar)
        return ar.start()

    def stop_all(self) -> None:
        for ar in self.autorecovery:
            if ar.proc is not None:
                stop_process(ar.proc, kill=True)
        for b in self.bookies:
            if b.proc is not None:
                stop_process(b.proc, kill=True)


@pytest.fixture
def rcluster(tmp_path: Path) -> Iterator[RecoveryCluster]:
    c = RecoveryCluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()
