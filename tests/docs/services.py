"""Long-running commands of the docs: how the runner knows one, checks it ready, stops it.

| command | ready when | stopped with | kept |
| --- | --- | --- | --- |
| ``zbk sandbox`` | it printed ``ready:``; each bookie of its ``sandbox.json`` is registered and answers ``/heartbeat``; its auto-recovery process answers ``/heartbeat`` | SIGINT (a Ctrl-C), exit 0, none of its processes left | until its document ends |
| ``zbk bookie`` | registered in its metadata, answering ``/heartbeat`` at the address it registered | SIGTERM, exit 0 | no |
| ``zbk autorecovery`` | answering ``/heartbeat`` on its HTTP port | SIGTERM, exit 0 | no |
| ``prometheus`` | ``/-/ready`` answers 200 | SIGTERM, exit 0 | no |

A command's options are read with zbk's own parser and configuration loader, so that the
check looks where the process itself listens.

While a sandbox runs, the commands after it may name the addresses a sandbox has on its
default ports (bookies ``127.0.0.1:3181``..., their HTTP ``127.0.0.1:4181``..., auto-recovery
``127.0.0.1:5181``): the runner maps them to the ports this one really has.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from helpers.procs import stop_pid
from helpers.wait import wait_until

from docs.markdown import leading_assignments
from zbk import limits
from zbk.cli.sandboxlayout import AUTORECOVERY_PORT_OFFSET, HTTP_PORT_OFFSET

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0  # the sandbox gives each child 30 s after its SIGTERM before SIGKILL
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


@dataclass(frozen=True)
class Service:
    name: str
    pattern: str  # searched in the command line
    ready: Callable[[Started], str]  # raises when not ready in time; returns what it checked
    stop_signal: int = signal.SIGTERM
    keep: bool = False  # kept running for the rest of its document
    leftovers: Callable[[Started], list[int]] | None = None  # processes that must be gone after it


@dataclass
class Started:
    """A long-running command the runner started (its PID is the service's own: exec)."""

    service: Service
    proc: subprocess.Popen[bytes]
    log: Path
    code: str  # the command line as run
    root: Path  # the workspace it runs in
    env: dict[str, str]
    # Text of later commands to replace while it runs (set by its ready check).
    substitutions: dict[str, str] = field(default_factory=dict)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def argv(self) -> list[str]:
        """The command's words after any VAR=value prefixes, ``$VAR``s expanded as the shell
        would from the command's environment."""
        _, rest = leading_assignments(self.code)
        env = {**self.env, "PWD": str(self.root)}
        return shlex.split(_VAR.sub(lambda m: env.get(m[1] or m[2], ""), rest))

    def path(self, p: str) -> Path:
        return (self.root / p).resolve() if not os.path.isabs(p) else Path(p)

    def wait(self, predicate: Callable[[], object], message: str, timeout_s: float = READY_TIMEOUT_S) -> None:
        def check() -> object:
            if not self.alive():
                raise AssertionError(f"exited with {self.proc.returncode} before {message}")
            return predicate()

        wait_until(check, timeout_s=timeout_s, interval_s=0.2, message=message)

    def stop(self) -> int | None:
        """Stop it by PID with its service's signal, SIGKILL if it does not exit in time."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, self.service.stop_signal)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=STOP_TIMEOUT_S)
        return self.proc.returncode

    def stop_cleanly(self) -> str:
        """Stop it; "" when it exited 0 and left nothing behind, else what went wrong (any
        process left behind is stopped by its PID)."""
        rc = self.stop()
        problems = [] if rc == 0 else [f"exited with {rc} on {signal.Signals(self.service.stop_signal).name}"]
        left = self.service.leftovers(self) if self.service.leftovers else []
        for pid in left:
            stop_pid(pid)
        if left:
            problems.append(f"left processes {left} behind")
        return "; ".join(problems)


def zbk_args(st: Started) -> argparse.Namespace:
    """The command's options as ``zbk`` itself parses them."""
    from zbk.cli.main import build_parser

    argv = st.argv()
    if not argv or not argv[0].endswith("zbk"):
        raise AssertionError(f"not a zbk command: {st.code}")
    return build_parser().parse_args(argv[1:])


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as resp:  # noqa: S310 - loopback URLs we built
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError):
        return 0


def answers(url: str) -> Callable[[], bool]:
    """A check that ``url`` answers 200 (GET)."""
    return lambda: http_status(url) == 200


def _registered(metadata: str) -> dict[str, str]:
    """Registered bookies (writable and read-only): id -> HTTP URL."""
    from zbk.metadata.registry import list_bookies
    from zbk.metadata.uri import open_store

    store = open_store(metadata)
    try:
        return {b.bookie_id: b.http_url for ro in (False, True) for b in list_bookies(store, readonly=ro)}
    finally:
        store.close()


def sandbox_ready(st: Started) -> str:
    args = zbk_args(st)
    st.wait(lambda: re.search(r"^ready:", st.output(), re.M), "the sandbox printed ready:")
    data_dir = st.path(args.data_dir)
    layout = json.loads((data_dir / "sandbox.json").read_text())
    base, count, metadata = int(layout["base_port"]), int(layout["bookies"]), str(layout["metadata"])
    ids = {f"127.0.0.1:{base + i}" for i in range(count)}
    registered = _registered(metadata)
    if not ids <= set(registered):
        raise AssertionError(f"bookies {sorted(ids - set(registered))} not registered in {metadata}")
    urls = [f"http://127.0.0.1:{base + HTTP_PORT_OFFSET + i}/heartbeat" for i in range(count)]
    urls.append(f"http://127.0.0.1:{base + AUTORECOVERY_PORT_OFFSET}/heartbeat")
    for url in urls:
        st.wait(answers(url), f"{url} answers 200", timeout_s=30.0)
    default = limits.sandbox_base_port_default
    for offset in (0, HTTP_PORT_OFFSET):
        st.substitutions.update({f"127.0.0.1:{default + offset + i}": f"127.0.0.1:{base + offset + i}"
                                 for i in range(count)})
    st.substitutions[f"127.0.0.1:{default + AUTORECOVERY_PORT_OFFSET}"] = f"127.0.0.1:{base + AUTORECOVERY_PORT_OFFSET}"
    return f"{count} bookies registered in {metadata} and answering /heartbeat, auto-recovery answering"


def sandbox_leftovers(st: Started) -> list[int]:
    """Processes still running whose command line names the sandbox's data dir."""
    data_dir = str(st.path(zbk_args(st).data_dir))
    left: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if data_dir in cmdline:
            left.append(int(proc.name))
    return left


def bookie_ready(st: Started) -> str:
    from zbk.config import BookieConfig, load

    args = zbk_args(st)
    explicit = {"metadata_uri": args.metadata, "data_dir": args.data_dir, "port": args.port,
                "http_port": args.http_port}
    cfg = load(BookieConfig, path=str(st.path(args.config)) if args.config else None, overrides=args.set,
               explicit=explicit).resolved()
    st.wait(lambda: cfg.bookie_id in _registered(cfg.metadata_uri), f"bookie {cfg.bookie_id} registered")
    url = _registered(cfg.metadata_uri)[cfg.bookie_id] + "/heartbeat"
    st.wait(answers(url), f"{url} answers 200", timeout_s=30.0)
    return f"{cfg.bookie_id} registered in {cfg.metadata_uri}, {url} answers"


def autorecovery_ready(st: Started) -> str:
    from zbk.config import AutoRecoveryConfig, load

    args = zbk_args(st)
    cfg = load(AutoRecoveryConfig, path=str(st.path(args.config)) if args.config else None, overrides=args.set,
               explicit={"metadata_uri": args.metadata, "http_port": args.http_port})
    url = f"http://127.0.0.1:{cfg.http_port}/heartbeat"
    st.wait(answers(url), f"{url} answers 200")
    return f"{url} answers"


def prometheus_ready(st: Started) -> str:
    address = "localhost:9090"
    for word in st.argv():
        if word.startswith("--web.listen-address="):
            address = word.split("=", 1)[1]
    url = f"http://{address}/-/ready"
    st.wait(answers(url), f"{url} answers 200")
    return f"{url} answers 200"


_ZBK = r"(?:^|\s|/)zbk\s+(?:-v\s+)?"
SERVICES: tuple[Service, ...] = (
    Service("zbk sandbox", _ZBK + r"sandbox\b(?!.*\s(-h|--help)\b)", sandbox_ready, signal.SIGINT, keep=True,
            leftovers=sandbox_leftovers),
    Service("zbk bookie", _ZBK + r"bookie\b(?!.*\s(-h|--help)\b)", bookie_ready),
    Service("zbk autorecovery", _ZBK + r"autorecovery\b(?!.*\s(-h|--help)\b)", autorecovery_ready),
    Service("prometheus", r"(?:^|\s|/)prometheus\s+--", prometheus_ready),
)
