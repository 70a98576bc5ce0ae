"""The chaos run: one function, :func:`run_chaos`, used by the CI test
(tests/chaos/test_chaos.py) and by long runs (bench/chaos.py). docs/chaos.md has the why.

Phases:
1. start a 3-member etcd, 5 bookies (b3 and b4 with ``journal_write_data = false``) and 2
   `zbk autorecovery` processes (tests/chaos/cluster.py);
2. run the writers, tailing readers and recoverer (tests/chaos/workload.py) while the seeded
   fault plan (tests/chaos/faults.py) is injected for ``fault_s`` seconds;
3. heal: every process up, every bookie writable; writers close their ledgers; every
   ledger left open is recovered;
4. wait until the cluster is fully replicated (no marks, no limbo, no replica gaps, every
   ledger closed) — the time this takes after the faults stopped is the figure "time to
   full replication" — then read every ledger back (tests/chaos/checks.py);
5. print the seed, the faults by kind and the figures; every process is stopped by PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from faults.history import HistoryRecorder

from chaos import checks
from chaos.cluster import UNCLEAN_REPAIRS, ChaosCluster, ClusterSettings, Findings
from chaos.faults import HOST_KINDS, KIND_LABELS, LOOPBACK_KINDS, Fault, PlanSettings, make_plan
from chaos.workload import CLIENT, DEFAULT_WRITERS, Workload, WriterSpec
from zbk.client import metrics as client_metrics
from zbk.client.bookkeeper import AsyncBookKeeper
from zbk.errors import ZbkError

PROGRESS_EVERY_S = 15.0
STATUS_POLL_S = 2.0


@dataclass(frozen=True)
class ChaosConfig:
    seed: int
    fault_s: float = 180.0
    settle_s: float = 90.0  # after healing, how long the cluster may take to be fully replicated
    readers: int = 2
    rate_per_writer: float = 250.0  # entries/s
    writers: tuple[WriterSpec, ...] = DEFAULT_WRITERS
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    # The fault kinds of the plan; any of HOST_KINDS puts the cluster on hosts (root needed).
    kinds: tuple[str, ...] = LOOPBACK_KINDS

    def cluster_settings(self) -> ClusterSettings:
        return replace(self.cluster, hosts=True) if set(self.kinds) & set(HOST_KINDS) else self.cluster

    def plan_settings(self) -> PlanSettings:
        c = self.cluster_settings()
        return PlanSettings(fault_s=self.fault_s, kinds=self.kinds, bookies=c.bookies, journal_off=c.journal_off,
                            power_loss=c.power_loss, clocks=c.bookies + c.autorecovery)


@dataclass
class ChaosReport:
    seed: int
    fault_s: float
    plan: list[Fault]
    kinds: tuple[str, ...] = LOOPBACK_KINDS
    injected: dict[str, int] = field(default_factory=dict)
    # Crashes of a journal-off bookie skipped while another was down or had ledgers in limbo
    # (chaos.cluster.ChaosCluster.crash_blocked).
    skipped: dict[str, int] = field(default_factory=dict)
    entries_acked: int = 0
    entries_lost: int = 0
    entries_read: int = 0
    ledgers: int = 0
    ledgers_closed_by_writer: int = 0
    ledgers_recovered: int = 0
    writer_failures: dict[str, int] = field(default_factory=dict)
    tail_entries: int = 0
    tails: int = 0
    tails_to_close: int = 0
    ensemble_changes: int = 0
    power_cuts: list[dict[str, Any]] = field(default_factory=list)  # each layer's report of its cut
    rereplicated_ledgers: float = 0.0
    rereplicated_entries: float = 0.0
    limbo_repaired: float = 0.0
    phase_one_ledgers: int = 0  # ledgers fenced and put in limbo by bookies booting after a crash (BP-46)
    closed_lacking: int = 0  # closed ledgers such a boot found lacking entries (marked "unclean")
    unclean_repaired: float = 0.0
    time_to_full_replication_s: float | None = None
    replication: str = ""
    persistence_problems: list[str] = field(default_factory=list)
    checker: str = ""  # the history checker's verdicts (history.jsonl against final.json; verdicts.txt)
    checker_red: list[str] = field(default_factory=list)  # a red property each, with its first counterexample
    violations: list[str] = field(default_factory=list)
    client_errors: list[str] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    metadata_boot_exits: int = 0  # bookie boots that could not reach etcd (exit 5): restarted
    log_exceptions: list[str] = field(default_factory=list)  # tracebacks in any process's log
    action_errors: list[str] = field(default_factory=list)
    heal_error: str = ""  # the cluster did not come back whole after the faults
    elapsed_s: float = 0.0
    checked: bool = False  # the final checks ran to the end

    def failures(self) -> list[str]:
        """Every broken guarantee; empty for a green run."""
        out = []
        if self.entries_lost:
            out.append(f"{self.entries_lost} acknowledged entries lost")
        if not self.checked:
            out.append("the final checks did not run to the end")
        if self.heal_error:
            out.append(f"the cluster did not heal: {self.heal_error}")
        out += self.persistence_problems + self.checker_red + self.violations + self.client_errors + self.unexpected_exits
        out += self.log_exceptions
        missing = [k for k in self.kinds if not self.injected.get(k)]
        if missing and self.plan:
            out.append(f"fault kinds never injected: {', '.join(missing)}")
        if self.time_to_full_replication_s is None:
            out.append(f"not fully replicated after the settle time: {self.replication}")
        if self.entries_acked == 0:
            out.append("no entry was acknowledged: the run tested nothing")
        return out

    def table(self) -> str:
        t = self.time_to_full_replication_s
        full = f"{t:.1f} s" if t is not None else "NOT REACHED"
        rows = [f"chaos run: seed {self.seed}, {self.fault_s:.0f} s of faults, {self.elapsed_s:.0f} s in all "
                f"(replay: ZBK_CHAOS_SEED={self.seed}, or bench/chaos.py --seed {self.seed})",
                "faults injected by kind:"]
        rows += [f"  {KIND_LABELS[k]:<36}{self.injected.get(k, 0):>9}" for k in self.kinds]
        rows += [f"  {'total':<36}{sum(self.injected.values()):>9}",
                 *([f"  {'skipped: a journal-off crash while':<36}{sum(self.skipped.values()):>9}  "
                    f"({_kinds(self.skipped)}; another journal-off bookie down or in limbo)"] if self.skipped else []),
                 f"{'entries acknowledged':<38}{self.entries_acked:>9,}",
                 f"{'entries lost (must be 0)':<38}{self.entries_lost:>9,}",
                 f"{'entries read back and verified':<38}{self.entries_read:>9,}",
                 f"{'ledgers written':<38}{self.ledgers:>9}  ({self.ledgers_closed_by_writer} closed by their writer)",
                 f"{'ledgers recovered':<38}{self.ledgers_recovered:>9}  (writer fenced or failed: "
                 f"{_kinds(self.writer_failures)})",
                 f"{'tailing reads (entries / tails)':<38}{self.tail_entries:>9,}  ({self.tails} tails, "
                 f"{self.tails_to_close} followed to the close)",
                 f"{'client ensemble changes':<38}{self.ensemble_changes:>9}",
                 *([f"{'bookie boots without etcd (exit 5)':<38}{self.metadata_boot_exits:>9}  (restarted, "
                    "as a supervisor does)"] if self.metadata_boot_exits else []),
                 *([f"{'power cuts: unsynced bytes dropped':<38}"
                    f"{sum(c.get('unsynced_bytes_lost', 0) for c in self.power_cuts):>9,}  "
                    f"({sum(1 for c in self.power_cuts if c.get('torn'))} of {len(self.power_cuts)} torn)"]
                   if self.power_cuts else []),
                 f"{'re-replicated by autorecovery':<38}{self.rereplicated_ledgers:>9.0f}  ledgers, "
                 f"{self.rereplicated_entries:.0f} entries",
                 f"{'limbo (BP-46): put in / repaired':<38}{self.phase_one_ledgers:>9}  / {self.limbo_repaired:.0f} "
                 "ledgers",
                 f"{'closed lacking (BP-46): found / fixed':<38}{self.closed_lacking:>9}  / "
                 f"{self.unclean_repaired:.0f} ledgers (after unclean journal-off boots)",
                 f"{'time to full replication':<38}{full:>9}"
                 "  (after the faults stopped)",
                 f"{'history checker':<38}{self.checker or 'DID NOT RUN':>9}"]
        if t is None:
            rows.append(f"  still: {self.replication}")
        fails = self.failures()
        rows.append("result: " + ("GREEN: every check passed" if not fails else f"RED: {len(fails)} problem(s)"))
        rows += [f"  - {f[:400]}" for f in fails[:30]]
        if self.action_errors:
            rows.append(f"fault actions that failed ({len(self.action_errors)}): {self.action_errors[:5]}")
        return "\n".join(rows)


def _kinds(d: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items())) or "none"


@contextlib.contextmanager
def client_log(path: Path) -> Iterator[None]:
    """The in-process clients' log lines (ensemble changes, retries) go to ``path``, not to
    the terminal; restored afterwards."""
    logger = logging.getLogger("zbk")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s"))
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        handler.close()


def run_chaos(cfg: ChaosConfig, root: Path, log: Callable[[str], None] = print) -> ChaosReport:
    """One chaos run under ``root`` (logs and data stay there). Never raises for a broken
    guarantee: those are in the report's ``failures()``."""
    root.mkdir(parents=True, exist_ok=True)
    with client_log(root / "clients.log"):
        return _run(cfg, root, log)


def _run(cfg: ChaosConfig, root: Path, log: Callable[[str], None]) -> ChaosReport:
    t_start = time.monotonic()
    plan = make_plan(cfg.seed, cfg.plan_settings())
    report = ChaosReport(cfg.seed, cfg.fault_s, plan, cfg.kinds, dict.fromkeys(cfg.kinds, 0))
    log(f"chaos: seed {cfg.seed}, {cfg.fault_s:.0f} s of faults, "
        f"{len(plan)} planned; logs and data in {root}")
    (root / "plan.txt").write_text("\n".join(f.describe() for f in plan) + "\n")
    findings = Findings()
    cluster = ChaosCluster(root, cfg.cluster_settings(), findings, log)
    workload: Workload | None = None
    history = HistoryRecorder(root / "history.jsonl")
    changes_before = client_metrics.ENSEMBLE_CHANGES._value.get()
    try:
        cluster.start()
        log(f"chaos: cluster up in {time.monotonic() - t_start:.1f} s: {cluster.uri}")
        # The workload's own notes (failed recoveries and tails, client restarts) go to
        # clients.log beside the client library's lines (client_log routes "zbk.*" there).
        workload = Workload(cluster.uri, cfg.seed, writers=cfg.writers, readers=cfg.readers,
                            rate_per_writer=cfg.rate_per_writer, log=logging.getLogger("zbk.chaos.workload").info,
                            history=history)
        workload.start()
        _inject(cluster, workload, plan, cfg.fault_s, report, log)
        t_faults_end = time.monotonic()
        log("chaos: faults over; healing")
        try:
            cluster.heal()
        except Exception as e:  # noqa: BLE001 - a failure of the run, reported; the checks still run
            report.heal_error = f"{type(e).__name__}: {e}"
            log(f"chaos: the cluster did not heal: {report.heal_error}")
        workload.finish(120.0)
        history.close()
        log(f"chaos: healed, writers done in {time.monotonic() - t_faults_end:.1f} s")
        asyncio.run(_settle_and_check(cfg, cluster, workload, report, t_faults_end, log))
    finally:
        if workload is not None:
            workload.finish(10.0)
        history.close()
        try:
            _fill_report(report, cluster, workload, findings, changes_before)
            if report.failures():
                dump_stacks(cluster, log)
        finally:
            cluster.stop()
    report.elapsed_s = time.monotonic() - t_start
    (root / "report.json").write_text(json.dumps(asdict(report), default=str, indent=1))
    log(report.table())
    return report


def _inject(cluster: ChaosCluster, workload: Workload, plan: list[Fault], fault_s: float, report: ChaosReport,
            log: Callable[[str], None]) -> None:
    events = sorted([(f.at_s, 1, i, f) for i, f in enumerate(plan)] + [(f.end_s, 0, i, f) for i, f in enumerate(plan)],
                    key=lambda e: (e[0], e[1], e[2]))
    t0 = time.monotonic()
    started: set[int] = set()
    next_progress = PROGRESS_EVERY_S
    while True:
        now = time.monotonic() - t0
        while events and events[0][0] <= now:
            _, is_start, i, f = events.pop(0)
            if not is_start and i not in started:
                continue
            try:
                if is_start:
                    why = cluster.crash_blocked(f)
                    if why:
                        report.skipped[f.kind] = report.skipped.get(f.kind, 0) + 1
                        log(f"  {now:6.1f}s  - {f.describe()} skipped: {why}")
                        continue
                    cluster.inject(f)
                    started.add(i)
                    report.injected[f.kind] += 1
                    log(f"  {now:6.1f}s  + {f.describe()}")
                else:
                    cluster.end(f)
            except Exception as e:  # noqa: BLE001 - a fault that could not be applied is reported, not fatal
                cluster.findings.action(f"{f.describe()} ({'start' if is_start else 'end'}): {type(e).__name__}: {e}")
        if now >= fault_s and not events:
            return
        cluster.supervise()
        if now >= next_progress:
            next_progress += PROGRESS_EVERY_S
            log(f"  {now:6.1f}s  acked {workload.entries_acked:,} entries in {len(workload.ledgers)} ledgers, "
                f"{sum(report.injected.values())} faults, {len(workload.violations)} violations")
        wait = min(1.0, (events[0][0] if events else fault_s) - now)
        time.sleep(max(0.01, wait))


async def _settle_and_check(cfg: ChaosConfig, cluster: ChaosCluster, workload: Workload, report: ChaosReport,
                            t_faults_end: float, log: Callable[[str], None]) -> None:
    bk = AsyncBookKeeper(cluster.uri, config=CLIENT)
    await bk.start()
    try:
        deadline = time.monotonic() + cfg.settle_s
        left = await checks.recover_all(bk, deadline, log)
        if left:
            log(f"chaos: {len(left)} ledgers could not be recovered: {left[:10]}")
        for lid in await checks.patient(bk.list_ledgers):
            rec = workload.ledgers.get(lid)
            if rec is not None and rec.failed and not rec.recovered:
                rec.recovered = True

        def infos() -> dict[str, dict[str, Any]]:
            out: dict[str, dict[str, Any]] = {}
            for i, b in enumerate(cluster.bookies):
                try:
                    out[b.bookie_id] = cluster.bookie_info(i)
                except (OSError, ValueError):
                    out[b.bookie_id] = {}
            return out

        status = await checks.replication_status(bk, infos, gaps_when_clear=True)
        said = ""
        while not status.ok and time.monotonic() < deadline:
            if status.describe() != said:  # what is still pending, whenever it changes
                said = status.describe()
                log(f"  {time.monotonic() - t_faults_end:5.1f}s after the faults: {said}")
            await asyncio.sleep(STATUS_POLL_S)
            status = await checks.replication_status(bk, infos, gaps_when_clear=True)
        if status.ok:
            report.time_to_full_replication_s = time.monotonic() - t_faults_end
        else:  # the report names everything still missing, replica gaps included
            status = await checks.replication_status(bk, infos)
        report.replication = status.describe()
        log(f"chaos: replication: {report.replication}")
        for line in status.details:
            log(f"  {line}")
        result = await checks.persistence(bk, cfg.seed, workload.ledgers)
        report.entries_lost = result.lost
        report.entries_read = result.entries_read
        report.persistence_problems = result.problems
        verdicts = await checks.judge_history(bk, cluster.root / "history.jsonl", cluster.root / "final.json")
        (cluster.root / "verdicts.txt").write_text(verdicts.table(limit=None) + "\n")
        report.checker = ", ".join(f"{name} {'green' if v.ok else 'RED'}" for name, v in verdicts.verdicts.items())
        report.checker_red = [f"history checker: {name} RED ({len(v.counterexamples)}): "
                              f"{v.counterexamples[0].describe()}" for name, v in verdicts.verdicts.items() if not v.ok]
        report.checked = True
    except ZbkError as e:
        report.client_errors.append(f"final checks failed: {type(e).__name__}: {e}")
    finally:
        await bk.close()


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning)\b(: .*)?$")
_CONTEXT_LINE = re.compile(r"^Exception in thread |.* (ERROR|CRITICAL) ")


def log_exceptions(root: Path) -> list[str]:
    """One line per traceback in the bookies', autorecovery processes' and clients' logs:
    zbk logs one only for a crash (an actor, a thread, a callback), so each is a finding.
    Tracebacks of threads dying together interleave; each is paired with the nearest
    context line before it ("Exception in thread ...", an ERROR line) and the next
    exception line after it."""
    out = []
    for path in sorted(root.glob("*.log")):
        lines = path.read_text(errors="replace").splitlines()
        used: set[int] = set()
        for i, line in enumerate(lines):
            if not line.startswith("Traceback (most recent call last)"):
                continue
            context = next((ln for ln in reversed(lines[max(0, i - 10):i]) if _CONTEXT_LINE.match(ln)), "")
            j = next((j for j in range(i + 1, min(len(lines), i + 300))
                      if j not in used and _EXCEPTION_LINE.match(lines[j])), None)
            if j is not None:
                used.add(j)
            exc = lines[j] if j is not None else "?"
            out.append(f"traceback in {path.name}: {context[:120]} -> {exc[:160]}")
    return out


def dump_stacks(cluster: ChaosCluster, log: Callable[[str], None]) -> None:
    """Every live bookie's and autorecovery process's Python stacks (py-spy) into
    ``<name>.stacks.txt`` beside its log: a run that is not green may have a process that
    lives but no longer answers, and its threads say where it waits."""
    spy = Path(sys.executable).with_name("py-spy")
    if not spy.exists():
        log(f"chaos: no stacks dumped ({spy} is not installed)")
        return
    procs = [(f"b{i}", b.proc) for i, b in enumerate(cluster.bookies)] + \
        [(a.name, a.proc) for a in cluster.autorecovery]
    dumped = 0
    for name, proc in procs:
        if proc is None or proc.poll() is not None:
            continue
        dumped += 1
        out = cluster.root / f"{name}.stacks.txt"
        try:
            done = subprocess.run([str(spy), "dump", "--pid", str(proc.pid)], capture_output=True, timeout=30)
            out.write_bytes(done.stdout + done.stderr)
        except (OSError, subprocess.TimeoutExpired) as e:
            out.write_text(f"py-spy dump failed: {e}\n")
    log(f"chaos: stacks of {dumped} live processes dumped to {cluster.root}/*.stacks.txt")


def _boot_total(logs: list[str], field: str) -> int:
    """A figure of the bookies' "boot: ... field=N" lines, summed over every boot."""
    return sum(int(n) for text in logs for n in re.findall(rf"{field}=(\d+)", text))


def _fill_report(report: ChaosReport, cluster: ChaosCluster, workload: Workload | None, findings: Findings,
                 changes_before: float) -> None:
    if workload is not None:
        recs = workload.ledgers.values()
        st = workload.stats
        report.entries_acked = workload.entries_acked
        report.ledgers = len(workload.ledgers)
        report.ledgers_closed_by_writer = sum(1 for r in recs if not r.failed)
        report.ledgers_recovered = sum(1 for r in recs if r.failed and r.recovered)
        report.writer_failures = dict(st.writer_failures)
        report.tail_entries = st.entries_seen
        report.tails = st.tails_started
        report.tails_to_close = st.tails_to_close
        report.violations = list(workload.violations)
        report.client_errors += list(workload.client_errors)
    report.ensemble_changes = int(client_metrics.ENSEMBLE_CHANGES._value.get() - changes_before)
    report.power_cuts = list(cluster.power_cuts)
    report.rereplicated_ledgers = cluster.ar_metric_total("zbk_replicator_ledgers_replicated_total")
    report.rereplicated_entries = cluster.ar_metric_total("zbk_replicator_entries_copied_total")
    report.limbo_repaired = cluster.ar_metric_total("zbk_replicator_limbo_ledgers_repaired_total")
    boot_logs = [b.log.read_text(errors="replace") for b in cluster.bookies if b.log.exists()]
    report.phase_one_ledgers = _boot_total(boot_logs, "phase_one_ledgers")
    report.closed_lacking = _boot_total(boot_logs, "closed_ledgers_lacking")
    report.unclean_repaired = cluster.ar_metric_total(UNCLEAN_REPAIRS)
    report.unexpected_exits = list(findings.unexpected_exits)
    report.metadata_boot_exits = findings.metadata_boot_exits
    report.log_exceptions = log_exceptions(cluster.root)
    report.action_errors = list(findings.action_errors)
