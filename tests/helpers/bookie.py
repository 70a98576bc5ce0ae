"""Real bookie processes for tests: started with the `zbk bookie` CLI on free loopback ports,
always stopped by PID (SIGTERM for a clean stop, SIGKILL for kill -9 tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from helpers.procs import free_port, start_process, stop_process, tail
from zbk.client.raw import BookieConnection
from zbk.config import BookieConfig, canonical_key
from zbk.errors import ZbkError
from zbk.wire import messages as w
from zbk.wire.curve import CurveClient


def with_defaults(settings: dict[str, object], defaults: dict[str, object]) -> dict[str, object]:
    """``settings`` plus each default whose key ``settings`` does not already give, in any
    spelling (flat or dotted): both would be the same key given twice, a ConfigError."""
    given = {canonical_key(BookieConfig, k) for k in settings}
    return {**{k: v for k, v in defaults.items() if canonical_key(BookieConfig, k) not in given}, **settings}


class BookieProcess:
    def __init__(self, root: Path, metadata_uri: str, *, port: int | None = None, name: str = "bookie",
                 settings: dict[str, object] | None = None, curve: CurveClient | None = None,
                 bookie_id: str | None = None) -> None:
        """``bookie_id``: a stable id (a name) instead of the default 127.0.0.1:<port>."""
        self.root = root
        self.curve = curve  # the CURVE keys readiness checks use, for a bookie that requires them
        self.data_dir = root / name
        self.log = root / f"{name}.log"
        self.metadata_uri = metadata_uri
        self.port = port or free_port()
        self.http_port = free_port()
        # GC is slowed down by default: raw-protocol tests write ledgers that have no metadata,
        # which a GC run would rightly delete. GC tests set gc_wait_time_ms themselves.
        self.settings = with_defaults(settings or {}, {"registration_ttl_s": 2, "disk_check_interval_ms": 1000,
                                                        "gc_wait_time_ms": 3_600_000})
        if bookie_id is not None:
            self.settings["bookie_id"] = bookie_id
        self.proc: subprocess.Popen[bytes] | None = None
        self.extra_argv: list[str] = []  # more `zbk bookie` flags (--readonly)

    @property
    def bookie_id(self) -> str:
        return str(self.settings.get("bookie_id") or self.address)

    @property
    def address(self) -> str:
        """Where its wire port is (its id too, unless it was given a name)."""
        return f"127.0.0.1:{self.port}"

    @property
    def http_host(self) -> str:
        """The address of its HTTP admin API."""
        return "127.0.0.1"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "zbk.cli.main", "bookie", "--metadata", self.metadata_uri,
                "--data-dir", str(self.data_dir), "--port", str(self.port), "--http-port", str(self.http_port)]
        for k, v in self.settings.items():
            argv += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
        return argv + self.extra_argv

    def start(self, *, wait: bool = True, timeout_s: float = 30.0) -> BookieProcess:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = start_process(self.argv(), self.log, env=env)
        if wait:
            self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until the bookie answers on its wire port and is registered: the wire server starts
        before the registration (two metadata writes, or a wait for a lease a killed process
        left), and a client sees only registered bookies (GET is_ready answers 200 then)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"bookie exited with {self.proc.returncode}:\n{tail(self.log)}")
            if self._answers() and self._registered():
                return
            time.sleep(0.1)
        raise AssertionError(f"bookie not ready in {timeout_s}s:\n{tail(self.log)}")

    def _answers(self) -> bool:
        try:
            with BookieConnection(self.bookie_id, timeout_s=0.5, curve=self.curve, address=self.address) as c:
                return c.call(w.BookieInfoRequest(rid=c.next_rid())).status == 0
        except ZbkError:
            return False

    def _registered(self) -> bool:
        url = f"http://{self.http_host}:{self.http_port}/api/v1/bookie/is_ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return bool(r.status == 200)
        except (OSError, ValueError):  # 503 (HTTPError is an OSError), refused, timed out
            return False

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int | None:
        """Clean stop (SIGTERM); returns the exit code."""
        if self.proc is None:
            return None
        stop_process(self.proc, timeout_s=20.0)
        return self.proc.returncode

    def exit_code(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def connect(self, timeout_s: float = 10.0) -> BookieConnection:
        return BookieConnection(self.bookie_id, timeout_s=timeout_s, curve=self.curve, address=self.address)

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log, lines)


def wait_registered(metadata_uri: str, bookie_ids: list[str], timeout_s: float = 30.0) -> None:
    """Until every one of ``bookie_ids`` is registered as writable in the metadata."""
    from zbk.metadata.registry import list_bookies
    from zbk.metadata.uri import open_store

    store = open_store(metadata_uri)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            missing = set(bookie_ids) - {r.bookie_id for r in list_bookies(store)}
            if not missing:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"bookies not registered as writable in {timeout_s}s: {sorted(missing)}")
            time.sleep(0.05)
    finally:
        store.close()


def pause(b: BookieProcess) -> None:
    """SIGSTOP: the bookie hangs (its sockets stay open, nothing answers)."""
    assert b.proc is not None
    os.kill(b.proc.pid, signal.SIGSTOP)


def resume(b: BookieProcess) -> None:
    assert b.proc is not None
    os.kill(b.proc.pid, signal.SIGCONT)
