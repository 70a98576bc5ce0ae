"""`zbk sandbox`: a whole local cluster in one command (ARCHITECTURE.md "Processes").

Everything listens on 127.0.0.1. With ``--base-port P`` (default 3181) and N bookies
(default 3):

* bookie i (0-based) is a real child process ``python -m zbk.cli.main bookie``, wire
  port P+i (so its bookie id is ``127.0.0.1:<P+i>``) and HTTP port P+1000+i
  (``/metrics``, ``/heartbeat``, ``/api/v1/bookie/info``). ``--base-port 0`` picks a free
  range below the kernel's ephemeral ports.
* one auto-recovery process (auditor candidate and replicator workers), a real child
  ``python -m zbk.cli.main autorecovery`` with HTTP port P+2000 (``/metrics``,
  ``/api/v1/autorecovery/...``; its auditor candidate id is ``127.0.0.1:<P+2000>``), a port
  outside the bookie ranges so that adding bookies later cannot collide with it. It starts
  once every bookie has registered (or was given up on): started earlier, on a restart
  with data, its auditor would count the not yet registered bookies as lost and mark
  their ledgers under-replicated.
* metadata is the embedded store ``sqlite:///<data dir>/meta.db`` unless ``--metadata``
  names another (e.g. ``etcd://127.0.0.1:2379/zbk``).
* the data dir (default ``./zbk-sandbox``) holds ``bookie-<i>/`` (journal, ledgers,
  index), ``logs/bookie-<i>.log``, ``logs/autorecovery.log``, ``sandbox.json`` (bookies,
  base port and metadata URI, so that a restart on the same dir brings back the same
  cluster: same ports, same bookie ids, matching cookies) and ``sandbox.lock`` (one
  sandbox per data dir).

While it runs it prints a status line (running bookies, the auto-recovery process and
who is the auditor, registered writable/readonly bookies, the ledger count and the
under-replicated ledger count, read from metadata every 2 s): rewritten in place on a
terminal, a plain line every 10 s (and on every change) otherwise. "ready" is printed
once every bookie has registered and an auditor is elected. A child that exits on its own
is reported and restarted with exponential backoff (1, 2, 4... s), at most 5 times in a
row (a child that then stays up for a minute earns its retries back); a bookie's cookie
mismatch and an auto-recovery configuration error are never retried.

SIGINT, SIGTERM or SIGHUP stop the cluster, by PID: SIGTERM to the auto-recovery process
first (it resigns leadership and releases its ledger locks; stopped bookies must not look
lost to a running auditor), then SIGTERM to every bookie (each then checkpoints and clears
its dirty marker); SIGKILL for any child still running 30 s after its SIGTERM (or at once
on a second Ctrl-C), each exit code reported. Exit code 0 when every started process
stopped cleanly, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zbk.cli.children import spawn_tied
from zbk.cli.sandboxlayout import (
    AUTORECOVERY_PORT_OFFSET,
    DEFAULT_BASE_PORT,
    DEFAULT_DATA_DIR,
    HTTP_PORT_OFFSET,
    BookieSpec,
    ChildSpec,
    Layout,
    check_ports,
    describe_autorecovery_exit,
    describe_exit,
    lock_data_dir,
    pick_free_base_port,
    resolve_layout,
    save_layout,
)
from zbk.cli.sandboxoutput import AR_DOWN, AR_RUNNING, AR_WAITING, Output, Status

if TYPE_CHECKING:
    from zbk.metadata.store import MetadataStore


__all__ = ["Sandbox", "add_parser", "describe_autorecovery_exit", "describe_exit", "pick_free_base_port", "run"]

TICK_S = 0.2  # how quickly a dead child or a signal is noticed
STATUS_INTERVAL_S = 2.0  # metadata is read this often
READY_POLL_S = 0.5  # ... and this often until the cluster is ready
STOP_TIMEOUT_S = 30.0  # a bookie's clean stop joins its actors (10 s each at worst); per stop phase
RESTART_MAX = 5
RESTART_BACKOFF_BASE_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sandbox", help="a whole local cluster: N bookies and auto-recovery on embedded metadata",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bookies", type=int, help="number of bookies (default 3, or as last time on this data dir)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"cluster directory (default ./{DEFAULT_DATA_DIR})")
    p.add_argument("--metadata", help="metadata URI (default sqlite:///<data dir>/meta.db)")
    p.add_argument("--base-port", type=int,
                   help=f"bookie i listens on BASE+i, its HTTP on BASE+{HTTP_PORT_OFFSET}+i, auto-recovery's "
                        f"HTTP on BASE+{AUTORECOVERY_PORT_OFFSET} (default {DEFAULT_BASE_PORT}; 0 picks free ports)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="bookie config override passed to every bookie, this run only (repeatable)")
    p.add_argument("--json", action="store_true",
                   help="first line: the cluster as one JSON object; then one JSON object per event")
    p.add_argument("--no-status", action="store_true", help="no status lines (events are still printed)")
    p.set_defaults(func=run)



# -- child processes ------------------------------------------------------------------------
def bookie_argv(layout: Layout, b: BookieSpec, settings: list[str], verbose: bool) -> list[str]:
    argv = [sys.executable, "-m", "zbk.cli.main", *(["-v"] if verbose else []), "bookie",
            "--metadata", layout.metadata, "--data-dir", b.data_dir, "--port", str(b.port),
            "--http-port", str(b.http_port)]
    for kv in settings:
        argv += ["--set", kv]
    return argv


def autorecovery_argv(layout: Layout, verbose: bool) -> list[str]:
    return [sys.executable, "-m", "zbk.cli.main", *(["-v"] if verbose else []), "autorecovery",
            "--metadata", layout.metadata, "--http-port", str(layout.autorecovery.http_port)]


def spawn(argv: list[str], log_path: str) -> subprocess.Popen[bytes]:
    """Start a child in its own session (process group), so that a Ctrl-C in the terminal
    reaches only the sandbox, which then stops the children itself."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as log:
        # Tied to the sandbox: SIGTERM (a clean stop) if the sandbox is killed before it could
        # stop its children, instead of orphans that hold the ports.
        return spawn_tied(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)



@dataclass
class Supervised:
    """One child process (a bookie or the auto-recovery process) and its restart state."""

    spec: ChildSpec
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0  # restarts in a row; reset once the child stays up STABLE_AFTER_S
    restart_at: float | None = None
    failed: str | None = None  # why we gave up on it

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, now: float) -> None:
        self.proc = spawn(self.argv, self.spec.log)
        self.started_at, self.restart_at = now, None

    def supervise(self, now: float, out: Output) -> None:
        """Notice an unexpected exit and schedule (or give up on) a restart; restart when due."""
        spec = self.spec
        if self.proc is not None:
            code = self.proc.poll()
            if code is None:
                if self.restarts and now - self.started_at > STABLE_AFTER_S:
                    self.restarts = 0
                return
            pid, self.proc = self.proc.pid, None
            why = spec.permanent_failure(code) or (f"{RESTART_MAX} restarts in a row"
                                                   if self.restarts >= RESTART_MAX else None)
            if why is not None:
                self.failed = spec.describe_exit(code)
                out.event("failed", f"{spec.name} (pid {pid}) {self.failed}; not restarting: {why}; "
                          f"see {spec.log}", **spec.event_fields(), pid=pid, code=code)
                return
            delay = min(RESTART_BACKOFF_BASE_S * 2 ** self.restarts, RESTART_BACKOFF_MAX_S)
            self.restart_at = now + delay
            out.event("exited", f"{spec.name} (pid {pid}) {spec.describe_exit(code)}; restarting in {delay:.0f} s "
                      f"({self.restarts + 1}/{RESTART_MAX}); see {spec.log}",
                      **spec.event_fields(), pid=pid, code=code, restart_in_s=delay)
        elif self.restart_at is not None and now >= self.restart_at:
            self.restarts += 1
            self.start(now)
            out.event("restarted", f"{spec.name} restarted (pid {self.pid})", **spec.event_fields(), pid=self.pid)

    def problem(self, now: float) -> str | None:
        if self.failed:
            return f"{self.spec.name} FAILED ({self.failed})"
        if self.restart_at is not None:
            return f"{self.spec.name} down, restart in {max(0.0, self.restart_at - now):.0f} s"
        return None



# -- the sandbox ------------------------------------------------------------------------------
class StopSignals:
    """SIGINT, SIGTERM and SIGHUP (terminal closed) all ask for a clean stop; a second one
    asks to stop waiting and SIGKILL the children."""

    def __init__(self) -> None:
        self.count = 0

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.count += 1


@dataclass
class ClusterView:
    """What metadata says about the cluster, read once per status tick."""

    writable: set[str]
    readonly: set[str]
    ledgers: int
    under_replicated: int
    auditor: str | None


class Sandbox:
    def __init__(self, layout: Layout, store: MetadataStore, out: Output, signals: StopSignals, *,
                 settings: list[str], verbose: bool) -> None:
        self.layout, self.store, self.out, self.signals = layout, store, out, signals
        self.bookies = [Supervised(b, bookie_argv(layout, b, settings, verbose)) for b in layout.bookies]
        # Restarted and stopped like the bookies, but started only once they have registered
        # (see the module docstring), and stopped before them.
        self.autorecovery = Supervised(layout.autorecovery, autorecovery_argv(layout, verbose))
        self.autorecovery_started = False
        self.ready = False

    @property
    def children(self) -> list[Supervised]:
        return [*self.bookies, self.autorecovery]

    def run(self) -> int:
        try:
            now = time.monotonic()
            for c in self.bookies:
                c.start(now)
            self.out.description(self.layout, {c.spec.name: c.pid for c in self.children})
            self._loop()
        finally:
            # Also on an unexpected error: never leave a child behind.
            self.out.end()
            code = self.stop_all()
        return code

    def _loop(self) -> None:
        next_status = 0.0
        while not self.signals.count:
            now = time.monotonic()
            for c in self.children:
                c.supervise(now, self.out)
            if now >= next_status:
                self.out.status(self.status(now), now)
                # Until ready, look more often: starting auto-recovery and saying "ready"
                # should not wait for the slow status cadence.
                next_status = now + (STATUS_INTERVAL_S if self.ready else READY_POLL_S)
            time.sleep(TICK_S)

    def read_cluster(self) -> ClusterView:
        from zbk.metadata.coordination import current_leader
        from zbk.metadata.registry import LedgerStore, list_bookies
        from zbk.recovery.underreplication import UnderReplicationRegistry

        return ClusterView(writable={r.bookie_id for r in list_bookies(self.store)},
                           readonly={r.bookie_id for r in list_bookies(self.store, readonly=True)},
                           ledgers=sum(1 for _ in LedgerStore(self.store).list_ids()),
                           under_replicated=UnderReplicationRegistry(self.store, "zbk-sandbox").count(),
                           auditor=current_leader(self.store))

    def status(self, now: float) -> Status:
        """Read metadata, start auto-recovery or say "ready" when due, and sum it all up."""
        view: ClusterView | None = None
        error = None
        try:
            view = self.read_cluster()
        except Exception as e:  # noqa: BLE001 - a failed status read must not take the cluster down
            error = f"metadata: {e}"
        if view is not None:
            self._advance(view, now)
        ar = self.autorecovery
        st = Status(running=sum(c.alive() for c in self.bookies), bookies=len(self.bookies),
                    autorecovery=(AR_RUNNING if ar.alive() else AR_DOWN if self.autorecovery_started else AR_WAITING),
                    writable=0, readonly=0, ledgers=None,
                    problems=[p for c in self.children if (p := c.problem(now))])
        if view is None:
            st.problems.append(str(error))
            return st
        st.writable, st.readonly, st.ledgers = len(view.writable), len(view.readonly), view.ledgers
        st.under_replicated, st.auditor = view.under_replicated, view.auditor
        return st

    def _advance(self, view: ClusterView, now: float) -> None:
        registered = view.writable | view.readonly
        settled = all(b.bookie_id in registered or c.failed for b, c in zip(self.layout.bookies, self.bookies,
                                                                            strict=True))
        if settled and not self.autorecovery_started:
            ar, spec = self.autorecovery, self.layout.autorecovery
            ar.start(now)
            self.autorecovery_started = True
            self.out.event("started", f"{spec.name} started (pid {ar.pid}): auditor candidate {spec.candidate_id}, "
                           f"metrics {spec.http_url}/metrics", **spec.event_fields(), pid=ar.pid,
                           http=spec.http_url)
        ours = {b.bookie_id for b in self.layout.bookies}
        if not self.ready and ours <= registered and view.auditor is not None:
            self.ready = True
            self.out.event("ready", f"ready: all {len(ours)} bookies registered in {self.layout.metadata}, "
                           f"auditor {view.auditor}", metadata=self.layout.metadata, bookies=sorted(ours),
                           auditor=view.auditor)

    def stop_all(self) -> int:
        """Stop auto-recovery, then the bookies (see the module docstring); report each exit."""
        signals_seen = self.signals.count
        clean = self._stop_group([self.autorecovery], "autorecovery", signals_seen)
        clean &= self._stop_group(self.bookies, f"{len(self.bookies)} bookies", signals_seen)
        self.out.event("exit", f"sandbox stopped: {'every process stopped cleanly' if clean else 'NOT all clean'}",
                       code=0 if clean else 1)
        return 0 if clean else 1

    def _stop_group(self, group: list[Supervised], what: str, signals_seen: int) -> bool:
        """SIGTERM every running child of ``group`` by PID, wait, SIGKILL stragglers; True
        if every child that was started stopped cleanly."""
        running = [c.proc for c in group if c.proc is not None and c.proc.poll() is None]
        if running:
            self.out.event("stopping", f"stopping {what} (SIGTERM)...", group=group[0].spec.kind,
                           processes=len(running))
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while (any(p.poll() is None for p in running) and time.monotonic() < deadline
               and self.signals.count == signals_seen):  # another Ctrl-C: stop waiting
            time.sleep(0.05)
        clean = True
        for c in group:
            clean &= self._reap(c, was_running=c.proc in running)
        return clean

    def _reap(self, c: Supervised, *, was_running: bool) -> bool:
        """Report how one child ended; True if it stopped cleanly (or was never due to start)."""
        spec, proc = c.spec, c.proc
        if proc is None:
            never = c is self.autorecovery and not self.autorecovery_started
            why = ("not started: the bookies had not all registered" if never
                   else c.failed or ("restart pending" if c.restart_at is not None else "not started"))
            self.out.event("stopped", f"  {spec.name} {spec.ident}: was not running ({why})", **spec.event_fields(),
                           pid=None, code=None)
            return never
        killed = proc.poll() is None
        if killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        code = proc.wait()
        note = " after SIGKILL (did not stop in time)" if killed else ""
        if not was_running:
            note = " (it had exited on its own just before the stop)"
        self.out.event("stopped", f"  {spec.name} {spec.ident} pid {proc.pid}: {spec.describe_exit(code)}{note}",
                       **spec.event_fields(), pid=proc.pid, code=code)
        return code == 0 and not killed and was_running


def run(args: argparse.Namespace) -> int:
    from zbk.metadata.uri import open_store

    signals = StopSignals()
    signals.install()  # before any child exists: a Ctrl-C from here on stops them in order
    layout = resolve_layout(args)
    os.makedirs(layout.data_dir, exist_ok=True)
    lock = lock_data_dir(layout.data_dir)
    try:
        check_ports(layout)
        store = open_store(layout.metadata)  # a bad URI or an unreachable etcd fails here, before any child
        try:
            save_layout(layout)  # only a layout that worked binds this data dir
            out = Output(as_json=args.json, show_status=not args.no_status)
            return Sandbox(layout, store, out, signals, settings=args.set, verbose=args.verbose).run()
        finally:
            store.close()
    finally:
        lock.close()
