"""The chaos cluster: a 3-member etcd, 5 bookies (some with the journal off) and 2
`zbk autorecovery` processes, all real processes, all stopped by PID: on loopback, or
(``ClusterSettings.hosts``) each on a host of its own (tests/chaos/hosts.py), which the
network, power and clock faults need.

:class:`ChaosCluster` starts them, injects the faults of tests/chaos/faults.py, watches for
processes that exit on their own (an unexpected exit is a finding: it is recorded with the
end of its log and the process is started again so that the run goes on), and heals
everything when the faults stop.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from faults.netcluster import BOOKIE_PORT, ETCD_CLIENT_PORT
from faults.netfaults import Drop
from faults.netns import Network
from helpers.bookie import BookieProcess
from helpers.etcd import ETCD_DEFAULT_TIMING, EtcdCluster
from helpers.procs import free_port, start_process, stop_process, tail

from chaos.faults import CRASH_KINDS, Fault
from chaos.hosts import CLIENT_HOST, HostBookie, HostEtcdCluster, Hosts, ar_host, bookie_host
from zbk.errors import EXIT_BOOT

HTTP_TIMEOUT_S = 3.0


def http(method: str, port: int, path: str, body: dict[str, Any] | None = None,
         timeout_s: float = HTTP_TIMEOUT_S, host: str = "127.0.0.1") -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=data, method=method)
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        raw = resp.read()
    return raw.decode() if path == "/metrics" else json.loads(raw)


UNCLEAN_REPAIRS = 'zbk_replicator_in_place_repairs_total{why="unclean"}'


def metric(text: str, name: str) -> float:
    """A sample's value in Prometheus text; ``name`` may carry its labels as printed."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def boot_waited_for_metadata(log: Path) -> bool:
    """The bookie's last error is a boot that could not reach the metadata store: the exit
    (EXIT_BOOT) docs/operations.md tells the supervisor to restart, which a run that cuts
    bookies off etcd, or kills its members, causes on purpose."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return False
    errors = [ln for ln in lines if " ERROR " in ln or " CRITICAL " in ln]
    return bool(errors) and "boot failed: MetadataUnavailableError" in errors[-1]


def why_exited(log: Path) -> str:
    """The first error lines of a log (the cause), then its last lines."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return f"(no log at {log})"
    errors = [ln for ln in lines if " ERROR " in ln or " CRITICAL " in ln or ln.startswith("Traceback")][:3]
    return " | ".join(errors + ["..."] + lines[-4:])


class AutoRecoveryProc:
    """One `zbk autorecovery` process (a new one, on a new HTTP port, after each kill); on
    loopback, or in autorecovery host ``slot`` of ``hosts``."""

    def __init__(self, root: Path, uri: str, name: str, settings: dict[str, object],
                 hosts: Hosts | None = None, slot: int = 0) -> None:
        self.name = name
        self.log = root / f"{name}.log"
        self.hosts = hosts
        self.slot = slot
        self.host = ar_host(slot) if hosts is not None else ""
        self.http_host = hosts.addr(self.host) if hosts is not None else "127.0.0.1"
        self.http_port = hosts.ar_port(self.host) if hosts is not None else free_port()
        self.uri = uri
        self.settings = settings if hosts is None else {**settings, "http_bind_address": self.http_host}
        self.proc: Any = None

    @property
    def candidate_id(self) -> str:
        return f"{self.http_host}:{self.http_port}"

    def start(self) -> AutoRecoveryProc:
        argv = [sys.executable, "-m", "zbk.cli.main", "autorecovery", "--metadata", self.uri,
                "--http-port", str(self.http_port)]
        for k, v in self.settings.items():
            argv += ["--set", f"{k}={v}"]
        if self.hosts is not None:
            self.proc = self.hosts.start(self.host, argv, self.log, clock=True)
        else:
            self.proc = start_process(argv, self.log, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def ready(self) -> bool:
        try:
            return http("GET", self.http_port, "/heartbeat", timeout_s=1.0, host=self.http_host) is not None
        except (OSError, ValueError):
            return False

    def metrics(self) -> str:
        try:
            return str(http("GET", self.http_port, "/metrics", host=self.http_host))
        except (OSError, ValueError):
            return ""


@dataclass
class Findings:
    """What went wrong outside the data checks (each entry a one-line description)."""

    unexpected_exits: list[str] = field(default_factory=list)
    action_errors: list[str] = field(default_factory=list)
    metadata_boot_exits: int = 0  # boots that could not reach etcd: restarted, as a supervisor would
    lock: threading.Lock = field(default_factory=threading.Lock)

    def exit(self, what: str) -> None:
        with self.lock:
            self.unexpected_exits.append(what)

    def action(self, what: str) -> None:
        with self.lock:
            self.action_errors.append(what)


@dataclass(frozen=True)
class ClusterSettings:
    bookies: int = 5
    journal_off: frozenset[int] = frozenset({3, 4})
    # Each process on a host of its own (network namespaces, power-loss layers under the
    # bookies of ``power_loss``, every zbk process on its host's fake clock): tests/chaos/hosts.py.
    hosts: bool = False
    power_loss: frozenset[int] = frozenset({1, 4})  # one journal-on bookie, one journal-off
    autorecovery: int = 2
    registration_ttl_s: int = 3
    bookie: dict[str, object] = field(default_factory=lambda: {
        # A bookie whose journal is off still journals fences and master keys (BP-46).
        "disk_check_interval_ms": 1000, "gc_wait_time_ms": 3_600_000, "flush_interval_ms": 10_000})
    # A lost bookie is re-replicated 4 s after its registration expired: short kills come
    # back before that (BP-46 phase one and limbo repair), longer ones are replaced. The
    # periodic check of every ledger's replicas runs every 30 s instead of weekly, so that
    # replica gaps (a bookie that missed entries it should hold) are found and repaired
    # within the run (docs/chaos.md).
    autorecovery_settings: dict[str, object] = field(default_factory=lambda: {
        "lost_bookie_recovery_delay_s": 4, "open_ledger_rereplication_grace_period_s": 5, "lease_ttl_s": 6,
        "replicator_workers": 2, "auditor_periodic_check_interval_s": 30})


class ChaosCluster:
    def __init__(self, root: Path, settings: ClusterSettings, findings: Findings, log: Any = print) -> None:
        self.root = root
        self.s = settings
        self.findings = findings
        self.log = log
        self.hosts: Hosts | None = None
        self.etcd: EtcdCluster | HostEtcdCluster
        if settings.hosts:
            self.hosts = Hosts(root, etcd_members=3, bookies=settings.bookies, autorecovery=settings.autorecovery,
                               power_loss=settings.power_loss)
            self.etcd = HostEtcdCluster(self.hosts, ETCD_DEFAULT_TIMING)
        else:
            self.etcd = EtcdCluster(root / "etcd", size=3, timing=ETCD_DEFAULT_TIMING)
        self.uri = ""
        self.bookies: list[BookieProcess] = []
        self.autorecovery: list[AutoRecoveryProc] = []
        self.retired: list[AutoRecoveryProc] = []  # killed ones (their logs stay)
        self.ar_started = 0
        # What the fault runner took down on purpose: the supervisor leaves those alone.
        self.down_bookies: set[int] = set()
        self.paused_bookies: set[int] = set()
        self.readonly_bookies: set[int] = set()
        self.down_etcd: set[int] = set()
        # Bookies crashed (killed, power-cut, exited) since they last said they had no ledger
        # in limbo: only these can be in limbo (crash_blocked).
        self.maybe_limbo: set[int] = set()
        self.net_faults: dict[int, list[Drop]] = {}  # bookie -> the drops of its partition
        self.power_cuts: list[dict[str, Any]] = []  # the layers' reports
        self.ar_metrics_of_dead: dict[str, float] = {}
        self._lock = threading.RLock()

    # -- start and stop -------------------------------------------------------------------
    def start(self) -> None:
        if self.hosts is not None:
            self.hosts.create()  # first: this process joins the clients' host before any thread starts
        self.etcd.start()
        self.uri = self.etcd.uri("chaos")
        for i in range(self.s.bookies):
            settings = {**self.s.bookie, "registration_ttl_s": self.s.registration_ttl_s,
                        "journal_write_data": i not in self.s.journal_off}
            if self.hosts is not None:
                self.bookies.append(HostBookie(self.hosts, i, self.uri, settings))
            else:
                self.bookies.append(BookieProcess(self.root, self.uri, name=f"b{i}", settings=settings))
        for b in self.bookies:
            b.start(wait=False)
        for b in self.bookies:
            b.wait_ready(60)
        for _ in range(self.s.autorecovery):
            self.start_autorecovery()
        self.wait_autorecovery(60)

    def start_autorecovery(self) -> AutoRecoveryProc:
        # A new process goes to the autorecovery host that has none running now.
        used = {a.slot for a in self.autorecovery}
        slot = next((k for k in range(self.s.autorecovery) if k not in used), 0)
        ar = AutoRecoveryProc(self.root, self.uri, f"ar{self.ar_started}", self.s.autorecovery_settings,
                              self.hosts, slot)
        self.ar_started += 1
        self.autorecovery.append(ar.start())
        return ar

    def wait_autorecovery(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(a.ready() for a in self.autorecovery) and self.leader() is not None:
                return
            time.sleep(0.2)
        raise AssertionError(f"autorecovery not ready with a leader in {timeout_s}s:\n"
                             + "\n".join(tail(a.log, 10) for a in self.autorecovery))

    def stop(self) -> None:
        """Stop every process by PID (SIGCONT first: a stopped process ignores SIGTERM)."""
        for b in self.bookies:
            if b.proc is not None and b.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(b.proc.pid, signal.SIGCONT)
        for a in self.autorecovery + self.retired:
            if a.proc is not None:
                stop_process(a.proc, timeout_s=10.0)
        for b in self.bookies:
            if b.proc is not None:
                stop_process(b.proc, timeout_s=10.0)
        self.etcd.stop()
        if self.hosts is not None:
            self.hosts.close()

    # -- looking --------------------------------------------------------------------------
    def leader(self) -> str | None:
        for a in self.autorecovery:
            if a.alive():
                try:
                    return http("GET", a.http_port, "/api/v1/autorecovery/who_is_auditor",
                                host=a.http_host)["auditor"]
                except (OSError, ValueError, KeyError):
                    continue
        return None

    def bookie_info(self, i: int) -> dict[str, Any]:
        b = self.bookies[i]
        return dict(http("GET", b.http_port, "/api/v1/bookie/info", host=b.http_host))

    def ar_metric_total(self, name: str) -> float:
        """A counter summed over every autorecovery process of the run (the killed ones as
        last scraped before their kill)."""
        live = sum(metric(a.metrics(), name) for a in self.autorecovery if a.alive())
        return live + self.ar_metrics_of_dead.get(name, 0.0)

    # -- faults ---------------------------------------------------------------------------
    def crash_blocked(self, f: Fault) -> str:
        """Why ``f``, a crash of a journal-off bookie, must not happen now ('' if it may): another
        journal-off bookie is down, or crashed and has not said since that it has no ledger in
        limbo (tests/chaos/faults.py)."""
        if f.kind not in CRASH_KINDS or f.target not in self.s.journal_off:
            return ""
        for j in sorted(self.s.journal_off - {f.target}):
            if j in self.down_bookies:
                return f"journal-off bookie b{j} is down"
            if j not in self.maybe_limbo:
                continue  # not crashed since it last said it had no ledger in limbo
            try:
                limbo = int(self.bookie_info(j).get("limbo_ledgers", 0))
            except (OSError, ValueError) as e:
                return f"journal-off bookie b{j} crashed and has not said since that it has no ledger in limbo ({e})"
            if limbo:
                return f"journal-off bookie b{j} has {limbo} ledgers in limbo"
            self.maybe_limbo.discard(j)
        return ""

    def inject(self, f: Fault) -> None:
        with self._lock:
            if f.kind in ("bookie_power_cut", "clock_jump"):  # these need the fault's param
                getattr(self, f"_start_{f.kind}")(f.target, f)
            else:
                getattr(self, f"_start_{f.kind}")(f.target)

    def end(self, f: Fault) -> None:
        with self._lock:
            getattr(self, f"_end_{f.kind}")(f.target)

    def _start_bookie_kill(self, i: int) -> None:
        self.down_bookies.add(i)
        self.maybe_limbo.add(i)
        self.bookies[i].kill9()

    def _end_bookie_kill(self, i: int) -> None:
        self.bookies[i].start(wait=False)
        self.down_bookies.discard(i)

    def _start_bookie_pause(self, i: int) -> None:
        b = self.bookies[i]
        assert b.proc is not None
        self.paused_bookies.add(i)
        os.kill(b.proc.pid, signal.SIGSTOP)

    def _end_bookie_pause(self, i: int) -> None:
        b = self.bookies[i]
        assert b.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(b.proc.pid, signal.SIGCONT)
        self.paused_bookies.discard(i)

    def _set_state(self, i: int, state: str) -> None:
        deadline = time.monotonic() + 20
        while True:  # a bookie restarted a moment ago may not serve HTTP yet
            try:
                b = self.bookies[i]
                http("PUT", b.http_port, "/api/v1/bookie/state", {"state": state}, host=b.http_host)
                return
            except (OSError, ValueError) as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"b{i}: PUT /api/v1/bookie/state {state} failed for 20 s: {e}") from e
                time.sleep(0.3)

    def _start_bookie_readonly(self, i: int) -> None:
        self.readonly_bookies.add(i)
        self._set_state(i, "readonly")

    def _end_bookie_readonly(self, i: int) -> None:
        self._set_state(i, "writable")
        self.readonly_bookies.discard(i)

    def _start_etcd_kill(self, i: int) -> None:
        self.down_etcd.add(i)
        self.etcd.members[i].kill()

    def _end_etcd_kill(self, i: int) -> None:
        self.etcd.members[i].start()
        self.down_etcd.discard(i)

    def _start_auditor_kill(self, _: int) -> None:
        # Just after another fault there may be no leader for a while: a killed leader's
        # key stays until its lease expires.
        deadline = time.monotonic() + 5.0 + float(self.s.autorecovery_settings.get("lease_ttl_s", 10))  # type: ignore[arg-type]
        while True:
            leader = self.leader()
            victim = next((a for a in self.autorecovery if a.candidate_id == leader), None)
            if victim is not None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if victim is None:
            raise RuntimeError(f"no live autorecovery process leads (leader {leader!r})")
        text = victim.metrics()
        for name in ("zbk_replicator_ledgers_replicated_total", "zbk_replicator_entries_copied_total",
                     "zbk_replicator_limbo_ledgers_repaired_total", UNCLEAN_REPAIRS):
            self.ar_metrics_of_dead[name] = self.ar_metrics_of_dead.get(name, 0.0) + metric(text, name)
        stop_process(victim.proc, kill=True)
        self.autorecovery.remove(victim)
        self.retired.append(victim)

    def _end_auditor_kill(self, _: int) -> None:
        while len(self.autorecovery) < self.s.autorecovery:
            self.start_autorecovery()

    # -- faults of the hosts ----------------------------------------------------------------
    @property
    def net(self) -> Network:
        assert self.hosts is not None, "network faults need ClusterSettings(hosts=True)"
        return self.hosts.net

    def _start_bookie_isolate(self, i: int) -> None:
        self.net_faults[i] = self.net.faults.isolate(bookie_host(i))

    def _start_bookie_zombie(self, i: int) -> None:
        self.net_faults[i] = self.net.faults.zombie(bookie_host(i), [CLIENT_HOST], port=BOOKIE_PORT)

    def _start_bookie_lose_etcd(self, i: int) -> None:
        assert self.hosts is not None
        self.net_faults[i] = self.net.faults.lose_etcd(bookie_host(i), self.hosts.etcd_hosts, port=ETCD_CLIENT_PORT)

    def _lift(self, i: int) -> None:
        self.net.faults.lift(self.net_faults.pop(i, []))

    _end_bookie_isolate = _end_bookie_zombie = _end_bookie_lose_etcd = _lift

    def _start_bookie_power_cut(self, i: int, f: Fault) -> None:
        b = self.bookies[i]
        assert isinstance(b, HostBookie)
        self.down_bookies.add(i)
        self.maybe_limbo.add(i)
        report = b.power_cut(torn=bool(f.param), seed=int(f.at_s * 1000))
        self.power_cuts.append({"bookie": f"b{i}", "at_s": f.at_s, "torn": bool(f.param), **report})

    def _end_bookie_power_cut(self, i: int) -> None:
        b = self.bookies[i]
        assert isinstance(b, HostBookie)
        b.power_on()
        self.down_bookies.discard(i)

    def _clock(self, target: int) -> Any:
        assert self.hosts is not None
        return self.hosts.clocks[self.hosts.clock_hosts[target]]

    def _start_clock_jump(self, target: int, f: Fault) -> None:
        self._clock(target).set(f.param)

    def _end_clock_jump(self, target: int) -> None:
        self._clock(target).set(0.0)

    # -- supervision and healing ----------------------------------------------------------
    def supervise(self) -> None:
        """Restart what exited without being told to, and record it."""
        with self._lock:
            for i, b in enumerate(self.bookies):
                if i in self.down_bookies or b.proc is None or b.proc.poll() is None:
                    continue
                if b.proc.returncode == EXIT_BOOT and boot_waited_for_metadata(b.log):
                    self.findings.metadata_boot_exits += 1
                    self.log(f"   bookie b{i} could not reach etcd to boot (exit {EXIT_BOOT}); restarting it")
                else:
                    self.findings.exit(f"bookie b{i} exited with {b.proc.returncode}: {why_exited(b.log)} ({b.log})")
                    self.log(f"!! bookie b{i} exited with {b.proc.returncode}; restarting it")
                self.maybe_limbo.add(i)
                self.paused_bookies.discard(i)
                b.start(wait=False)
            for a in list(self.autorecovery):
                if not a.alive():
                    self.findings.exit(f"autorecovery {a.name} exited with {a.proc.returncode}: {why_exited(a.log)} ({a.log})")
                    self.log(f"!! autorecovery {a.name} exited with {a.proc.returncode}; starting another")
                    self.autorecovery.remove(a)
                    self.retired.append(a)
                    self.start_autorecovery()
            members: list[Any] = list(self.etcd.members)  # loopback or host members: the same shape
            for i, m in enumerate(members):
                if i not in self.down_etcd and m.proc is not None and m.proc.poll() is not None:
                    self.findings.exit(f"etcd member {i} exited with {m.proc.returncode}")
                    m.start()

    def heal(self, timeout_s: float = 90.0) -> None:
        """Every process up, every bookie writable: the state a run ends in."""
        with self._lock:
            if self.hosts is not None:
                self.net.faults.heal()
                self.net_faults.clear()
                for clock in self.hosts.clocks.values():
                    clock.set(0.0)
            for i in sorted(self.paused_bookies):
                self._end_bookie_pause(i)
            for i in sorted(self.down_bookies):
                b = self.bookies[i]
                if isinstance(b, HostBookie) and b.disk is not None and b.disk.proc is not None \
                        and b.disk.stats().get("dead"):
                    self._end_bookie_power_cut(i)
                else:
                    self._end_bookie_kill(i)
            for i in sorted(self.down_etcd):
                self._end_etcd_kill(i)
            for i in sorted(self.readonly_bookies):
                self._end_bookie_readonly(i)
            self._end_auditor_kill(0)
        for m in self.etcd.members:
            m.wait_healthy(timeout_s)
        for b in self.bookies:
            b.wait_ready(timeout_s)
        self.supervise()
        self.wait_autorecovery(timeout_s)
        for i in range(len(self.bookies)):
            if self.bookie_info(i)["state"] != "writable":
                self._set_state(i, "writable")
