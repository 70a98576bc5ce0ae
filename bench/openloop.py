"""zbk against NATS JetStream at fixed rates (open loop), as users compare logs: latency
percentiles at each offered rate with coordinated omission corrected, the highest rate
that holds, end-to-end latency to a tailing reader, and writers beside catch-up readers.

Starts a 3-bookie zbk (ledgers E3 WQ3 AQ2: an append is confirmed once two bookies have
fsynced it) and a 3-node NATS JetStream (streams R3, file storage, ``sync_interval:
always``) on 127.0.0.1, as bench/peers.py does, and runs these phases (``--phases``):

* ``gen``: the generator against a no-op append, at rising rates: its own ceiling and the
  latency floor it adds (no servers involved).
* ``ladder``: 1 KiB entries at 1k, 2k, 5k entries/s, then steps of 5k, zbk and NATS in
  alternation at each rate, until the first rate a system cannot hold (its ladder stops
  there; the other goes on). A system holds a rate when it completes >= 99 % of the
  appends offered in the measured time (confirmed at most 20 ms after its end) and its p99
  is <= 20 ms. At each rate: p50, p99, p99.9, max (HdrHistogram), the rate achieved, the
  servers' and the client's CPU per entry. With ``--ladder-rounds N`` each system runs each
  rate N times, interleaved with the other system's runs: the rate holds when more than
  half of its rounds hold, and every figure is the median of the rounds' (one stall of a
  shared machine then neither fails a rate nor passes one).
* ``e2e``: at 50 % of NATS's highest held rate (or ``--e2e-rate``), from the intended send
  time to receipt by a tailing reader in another process: zbk's ``tail()`` on the open
  ledger (the writer with explicit LAC on, ``--explicit-lac-ms``), NATS's ordered push
  consumer; ``--e2e-rounds`` (3) runs of each, interleaved, figures the medians of the rounds.
* ``rw`` (zbk only): ``--prefill`` entries written into closed ledgers, then writers at 50 %
  of zbk's highest held rate (or ``--rw-rate``) alone and beside ``--readers`` catch-up
  readers reading those ledgers from their start at full speed: the writers' p99 with and
  without readers, the readers' entries/s, the bookies' storage reads, in ``--rw-rounds``
  rounds (3), the target judged on the medians of the rounds' p99s. So that the readers
  read from the disk, not from the page cache, the bench drops the bookies' entry-log pages
  from the cache every ``--cold-every`` seconds during these runs (posix_fadvise DONTNEED
  on those files only; the bookies' storage-read MB/s shows what came from the disk).
  Each round then runs the writers a third time, beside as many CPU burners as readers,
  which ask for the cores the read load took before the writers started (the readers'
  processes and the bookies, over 2 s) and do nothing else (``--no-rw-floor``: not): the
  floor of the target on this machine, since what the writers lose there any neighbour with
  that appetite costs them, and only the rest is how a bookie's reads share it with adds.

Every run is a fresh client process on a fresh ledger or stream: ``--warmup`` seconds of
the same load, then ``--seconds`` measured, then 0.2 s more load, then up to ``--drain``
seconds waiting for what is in flight. Entry i's latency counts from its intended send time
t0 + i/rate, not from the actual send (coordinated omission corrected); an entry never
confirmed counts with the time the run waited for it. The generator's own lateness (actual
minus intended send) and the latency from the actual send (what a closed-loop bench would
show) are reported beside. CPU figures cover the measured window only; the client's CPU per
entry includes the generator's, whose own share at each rate is the ``gen`` phase's figure. Prints a table per
phase and the targets of the same run; ``--json-out`` writes every figure with the git
revision and the machine's load, ``--plot`` draws latency percentiles against rate. Every
process is stopped by PID on exit, Ctrl-C and SIGTERM.

    .venv/bin/python bench/openloop.py --seconds 10 --json-out openloop.json --plot docs/img/openloop.png
    .venv/bin/python bench/openloop.py --phases ladder --seconds 2 --max-rate 2000     # smoke
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _openloop_stats import (  # noqa: E402
    HOLD_COMPLETED_FRACTION,
    HOLD_P99_MS,
    combine_e2e_rounds,
    highest_held,
    judge,
    ladder_rates,
    run_ladder,
    run_rounds,
)
from _procs import (  # noqa: E402
    FloorServerCluster,
    NatsCluster,
    ZbkCluster,
    cpu_seconds,
    git_rev,
    install_signal_handlers,
    loadavg,
    run_json,
    start_process,
    stop_process,
)

SYSTEMS = ("zbk", "nats")
# Floors, ladder only, beside the targets and not in them. zbk-floor: the same bookies at the
# same rates written without the client library (what any client of these bookies pays).
# server-floor: that writer against single-threaded floor servers (bench/_floor_server.py:
# decode, one write and one fsync per wake-up, answer), what any Python server pays here.
FLOOR = "zbk-floor"
SERVER_FLOOR = "server-floor"
FLOORS = (FLOOR, SERVER_FLOOR)
PHASES = ("gen", "ladder", "e2e", "rw")
GEN_RATES = (1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000)
SCRIPT = os.path.abspath(__file__)


# -- runs ---------------------------------------------------------------------------------------
def writer_argv(system: str, rate: int, args: argparse.Namespace, zbk: ZbkCluster | None,
                nats: NatsCluster | None, *, e2e: bool = False, floor: FloorServerCluster | None = None) -> list[str]:
    argv = [sys.executable, SCRIPT, "--worker", system, "--rate", str(rate), "--seconds", str(args.seconds),
            "--warmup", str(args.warmup), "--size", str(args.size), "--drain", str(args.drain),
            "--explicit-lac-ms", str(args.explicit_lac_ms)]
    if system == "zbk":
        argv += [f"--client-set={kv}" for kv in args.client_set]
        assert zbk is not None
        argv += ["--metadata", zbk.metadata, "--server-pids", ",".join(str(b.pid) for b in zbk.bookies)]
    elif system == FLOOR:
        assert zbk is not None
        argv += ["--servers", ",".join(b.bookie_id for b in zbk.bookies),
                 "--server-pids", ",".join(str(b.pid) for b in zbk.bookies)]
    elif system == SERVER_FLOOR:
        assert floor is not None
        argv += ["--servers", ",".join(floor.addresses), "--server-pids", ",".join(map(str, floor.pids))]
    elif system == "nats":
        assert nats is not None
        argv += ["--servers", ",".join(f"{nd.name}={nd.url}" for nd in nats.nodes),
                 "--server-pids", ",".join(str(nd.pid) for nd in nats.nodes)]
    if e2e:
        argv.append("--e2e")
    if system == "zbk" and args.profile:
        out = f"{args.profile}-client-{rate}{'-e2e' if e2e else ''}-{int(time.time())}.txt"
        argv = [*spy_argv(out), "--", *argv]
    return argv


def spy_argv(out: str) -> list[str]:
    """py-spy sampling only threads that hold the GIL (Python's CPU time, not its waits),
    without pausing the process at each sample (which would slow it down many times)."""
    spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return [spy, "record", "--format", "raw", "--threads", "--gil", "--nonblocking", "--rate", "200", "-o", out]


def measure(system: str, rate: int, args: argparse.Namespace, zbk: ZbkCluster | None, nats: NatsCluster | None,
            *, e2e: bool = False, label: str = "", floor: FloorServerCluster | None = None,
            reclaim: bool = True) -> dict[str, Any]:
    """One writer run at ``rate``, judged; prints a line. After a run on zbk's bookies (with
    ``reclaim``) their GC runs before the next one: each run deletes its ledger, and a ladder
    would otherwise fill the disk (a ladder to 30,000/s, 3 rounds a rate, filled 14 GB)."""
    load_before = loadavg()
    spy = None
    if system == "zbk" and args.profile and zbk is not None:
        # bookie-0 from now to about the end of the measured window (the writer's start-up,
        # about 2 s, included); the profile is written when py-spy's duration is over.
        out = f"{args.profile}-bookie0-{rate}{'-e2e' if e2e else ''}-{int(time.time())}.txt"
        spy = start_process([*spy_argv(out), "--pid", str(zbk.bookies[0].pid),
                             "--duration", str(round(args.warmup + args.seconds + 2))], Path(f"{out}.log"))
    try:
        r = run_json(writer_argv(system, rate, args, zbk, nats, e2e=e2e, floor=floor),
                     timeout_s=args.warmup + args.seconds + args.drain + 180)
    except (RuntimeError, TimeoutError) as err:
        # A run that broke (a worker that died or hung) does not hold its rate; the error is
        # kept in the report, and the other system's ladder goes on.
        print(f"{label or system:>10} {rate:>7,}/s: RUN FAILED: {err}", flush=True)
        if reclaim:
            reclaim_disk(system, zbk)
        time.sleep(args.settle)
        return {"system": system, "rate": rate, "holds": False, "why": "run failed", "error": str(err)[-4000:],
                "load_before": load_before, "load_after": loadavg()}
    finally:
        if spy is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(30)
            stop_process(spy, sig=signal.SIGINT)
    v = judge(r["offered"], r["completed_in_time"], r["p99_ms"])
    r.update(holds=v.holds, why=v.why, load_before=load_before, load_after=loadavg())
    e = r.get("e2e")
    extra = (f"  e2e p50 {e['p50_ms']:.2f} p99 {e['p99_ms']:.2f} p99.9 {e['p999_ms']:.2f} ms "
             f"({e['received']}/{e['expected']})" if e else "")
    late = r.get("late")
    if late and late["bursts"]:
        every = f", every {late['spacing_ms']:.0f} ms (median)" if late["spacing_ms"] is not None else ""
        extra += f"  over {late['over_ms']:.0f} ms: {late['entries']:,} entries in {late['bursts']} burst(s){every}"
    print(f"{label or system:>10} {rate:>7,}/s: {r['achieved_per_s']:>9,.0f}/s  p50 {r['p50_ms']:7.2f}  "
          f"p99 {r['p99_ms']:7.2f}  p99.9 {r['p999_ms']:7.2f}  max {r['max_ms']:8.2f} ms  "
          f"cpu us/entry: servers {fmt_opt(r['server_cpu_us_per_entry'])} client {fmt_opt(r['client_cpu_us_per_entry'])}  "
          f"lag p99 {r['send_lag_p99_ms']:.2f} ms  other {r['other_cores']:.2f} cores  "
          f"{'holds' if v.holds else 'FAILS: ' + v.why}{extra}", flush=True)
    if reclaim:
        r["gc_s"] = reclaim_disk(system, zbk)
    time.sleep(args.settle)
    return r


def reclaim_disk(system: str, zbk: ZbkCluster | None) -> float | None:
    """The bookies' GC run after a run on them (see measure); the seconds it took."""
    if zbk is None or system not in ("zbk", FLOOR):
        return None
    return round(zbk.collect_garbage(), 2)


def fmt_opt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def phase_gen(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The generator alone (a no-op append): rates until it does not hold."""
    runs = []
    for rate in (r for r in GEN_RATES if r <= args.gen_max_rate):
        r = measure("noop", rate, args, None, None, label="no-op")
        runs.append(r)
        if not r["holds"]:
            break
    return runs


@contextlib.contextmanager
def worker_logs(prefix: str) -> Iterator[Path]:
    """A folder for the logs of a phase's worker processes: removed when the phase ends, kept
    (and named on stderr) when it fails, for what the workers said."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    except BaseException:
        print(f"worker logs kept in {path}", file=sys.stderr, flush=True)
        raise
    shutil.rmtree(path, ignore_errors=True)


def phase_rw(args: argparse.Namespace, zbk: ZbkCluster, rate: int) -> dict[str, Any]:
    """Prefill, then per round: the writer alone, then beside the catch-up readers."""
    print(f"prefill: {args.prefill:,} entries of {args.size} B into {args.prefill_ledgers} closed ledgers", flush=True)
    pre = run_json([sys.executable, SCRIPT, "--worker", "zbk-prefill", "--metadata", zbk.metadata,
                    "--entries", str(args.prefill), "--ledger-count", str(args.prefill_ledgers),
                    "--size", str(args.size)], timeout_s=args.prefill / 1000 + 300)
    print(f"prefill: {pre['entries']:,} entries in {pre['seconds']} s", flush=True)
    time.sleep(args.settle)
    ids = pre["ledgers"]
    # Each reader its own ledgers when there are enough, so that no reader finds the pages
    # another one just read in the page cache.
    shares = [ids[k::args.readers] or ids for k in range(args.readers)]
    rounds = []
    with worker_logs("openloop-readers-") as logdir:
        for rnd in range(args.rw_rounds):
            with CacheDropper(zbk, args.cold_every):
                # No GC runs in this phase: it could compact the old ledgers the readers read.
                alone = measure("zbk", rate, args, zbk, None, label="alone", reclaim=False)
            readers = [start_process([sys.executable, SCRIPT, "--worker", "zbk-catchup", "--metadata", zbk.metadata,
                                      "--ledger-ids", ",".join(map(str, shares[k])), "--start", str(k),
                                      "--max-seconds", str(args.max_seconds)],
                                     logdir / f"reader-{rnd}-{k}.log") for k in range(args.readers)]
            try:
                with CacheDropper(zbk, args.cold_every):
                    time.sleep(1.0)  # the readers open their ledgers and start reading
                    appetite = read_appetite(zbk, readers, 2.0)
                    beside = measure("zbk", rate, args, zbk, None, label="+readers", reclaim=False)
            finally:
                for p in readers:
                    stop_process(p, sig=signal.SIGTERM)
            reads = [last_json(logdir / f"reader-{rnd}-{k}.log") for k in range(args.readers)]
            total = sum(x["entries_per_s"] for x in reads)
            cores = appetite["readers_cores"] + appetite["servers_cores"]
            print(f"{'readers':>10}: {args.readers} x {[round(x['entries_per_s']) for x in reads]} entries/s "
                  f"(total {total:,.0f}/s); bookies' storage reads {beside.get('servers_read_mb_per_s')} MB/s "
                  f"(alone {alone.get('servers_read_mb_per_s')}); on their own, before the writers: "
                  f"readers {appetite['readers_cores']:.2f} + bookies {appetite['servers_cores']:.2f} cores", flush=True)
            one = {"alone": alone, "readers": beside, "reader_runs": reads, "readers_entries_per_s": round(total, 1),
                   "read_appetite": appetite}
            if args.rw_floor and cores > 0:
                one.update(burner_case(args, zbk, rate, rnd, cores, logdir))
            rounds.append(one)
    return {"rate": rate, "prefill": pre, "readers": args.readers, "rounds": rounds}


def read_appetite(zbk: ZbkCluster, readers: list[subprocess.Popen[bytes]], secs: float) -> dict[str, float]:
    """Cores the read load takes with the machine to itself: the readers' processes and the
    bookies, over ``secs`` before the writers start (idle bookies take 0.01-0.05)."""
    pids = [b.pid for b in zbk.bookies]
    r0, s0, t0 = [cpu_seconds(p.pid) for p in readers], [cpu_seconds(p) for p in pids], time.monotonic()
    time.sleep(secs)
    r1, s1, t1 = [cpu_seconds(p.pid) for p in readers], [cpu_seconds(p) for p in pids], time.monotonic()
    return {"readers_cores": round((sum(r1) - sum(r0)) / (t1 - t0), 3),
            "servers_cores": round((sum(s1) - sum(s0)) / (t1 - t0), 3)}


def burner_case(args: argparse.Namespace, zbk: ZbkCluster, rate: int, rnd: int, cores: float,
                logdir: Path) -> dict[str, Any]:
    """The writers beside as many processes as there were readers, which ask for the cores
    the read load took with the machine to itself (the readers and the bookies' share) and
    touch neither zbk nor the disk: the floor of the rw target on this machine. What the
    writers lose here, any neighbour with that appetite costs them; only the rest is how
    the bookies' read path shares a bookie with the adds."""
    burners = [start_process([sys.executable, SCRIPT, "--worker", "burn", "--duty", str(cores / args.readers),
                              "--max-seconds", str(args.max_seconds)], logdir / f"burner-{rnd}-{k}.log")
               for k in range(args.readers)]
    try:
        time.sleep(1.0)
        floor = measure("zbk", rate, args, zbk, None, label="+burners", reclaim=False)
    finally:
        for p in burners:
            stop_process(p, sig=signal.SIGTERM)
    took = sum(last_json(logdir / f"burner-{rnd}-{k}.log")["cores"] for k in range(args.readers))
    print(f"{'burners':>10}: {args.readers} x {cores / args.readers:.2f} cores asked, {took:.2f} taken", flush=True)
    return {"burners": floor, "burners_cores": round(took, 3)}


class CacheDropper:
    """While in use, every ``every_s`` seconds: ``posix_fadvise(DONTNEED)`` on the bookies'
    entry logs, so that the catch-up readers read old entries from the disk, as readers of
    data older than the page cache would, and not from the pages they or the prefill brought
    in. Only clean pages go; the journals (which the bookies keep cached on purpose) are
    left alone. ``every_s`` 0: off."""

    def __init__(self, zbk: ZbkCluster, every_s: float) -> None:
        self.zbk, self.every_s = zbk, every_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="cache-dropper", daemon=True)

    def drop(self) -> None:
        for b in self.zbk.bookies:
            for f in (b.data_dir / "ledgers").glob("*.log"):
                try:
                    fd = os.open(f, os.O_RDONLY)
                except OSError:  # deleted meanwhile
                    continue
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)

    def _run(self) -> None:
        while not self.stop.wait(self.every_s):
            self.drop()

    def __enter__(self) -> CacheDropper:
        if self.every_s > 0:
            self.drop()
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(10)


def last_json(path: Path) -> dict[str, Any]:
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"no report in {path}:\n{path.read_text(errors='replace')[-3000:]}")
    return json.loads(lines[-1])  # type: ignore[no-any-return]


# -- reporting ----------------------------------------------------------------------------------
def targets(report: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets that this run measures, each with its figures."""
    out: dict[str, Any] = {}
    lad = report.get("ladder")
    if lad:
        zr = {r["rate"]: r for r in lad["zbk"] if "error" not in r}
        # A rate NATS holds and zbk's ladder never reached (it stopped below) is a miss too.
        held = [r for r in lad["nats"] if r["holds"]]
        worse = [(r["rate"], r["p99_ms"], zr[r["rate"]]["p99_ms"] if r["rate"] in zr else None,
                  r["p999_ms"], zr[r["rate"]]["p999_ms"] if r["rate"] in zr else None)
                 for r in held if r["rate"] not in zr
                 or zr[r["rate"]]["p99_ms"] > r["p99_ms"] or zr[r["rate"]]["p999_ms"] > r["p999_ms"]]
        if held:
            out["zbk p99 and p99.9 <= NATS at every rate NATS holds"] = {
                "met": not worse, "rates": [r["rate"] for r in held],
                "misses (rate, nats p99, zbk p99, nats p99.9, zbk p99.9)": worse}
        hz, hn = lad["highest_held"]["zbk"], lad["highest_held"]["nats"]
        if hz and hn:
            out["zbk highest held >= 2.5 x NATS"] = {"met": hz >= 2.5 * hn, "ratio": round(hz / hn, 2),
                                                     "capped_by_max_rate": lad["capped"]}
    e2e = report.get("e2e")
    if e2e and all("e2e" in e2e["runs"].get(s, {}) for s in SYSTEMS):
        z, n = e2e["runs"]["zbk"]["e2e"]["p99_ms"], e2e["runs"]["nats"]["e2e"]["p99_ms"]
        out["e2e p99: zbk <= NATS"] = {"met": z <= n, "zbk_ms": z, "nats_ms": n}
    rw = report.get("rw")
    if rw:
        good = [rnd for rnd in rw["rounds"] if "error" not in rnd["alone"] and "error" not in rnd["readers"]]
        if good:
            # Medians of three rounds or more: one stall in a run alone (a p99 of 145 ms for a
            # writer whose p99 is 3 ms) would otherwise pass the target. Fewer rounds: every
            # one of them must meet it.
            pairs = [(rnd["alone"]["p99_ms"], rnd["readers"]["p99_ms"]) for rnd in good]
            a = statistics.median(x for x, _ in pairs)
            b = statistics.median(y for _, y in pairs)
            met = b <= 2 * a if len(pairs) >= 3 else all(y <= 2 * x for x, y in pairs)
            t = {"met": met, "alone_ms": a, "readers_ms": b, "ratio": round(b / a, 2) if a else None,
                 "rounds (alone, readers)": pairs}
            floors = [rnd["burners"]["p99_ms"] for rnd in good if "burners" in rnd and "error" not in rnd["burners"]]
            if floors:  # the floor: beside burners that take the readers' cores (not judged)
                f = statistics.median(floors)
                t.update(burners_ms=f, floor_ratio=round(f / a, 2) if a else None)
            out["rw: writers' p99 with readers <= 2 x without (medians of the rounds)"] = t
    return out


def ladder_systems(lad: dict[str, Any]) -> list[str]:
    """The systems a ladder report holds, the floors after the two systems."""
    return [s for s in (*SYSTEMS, *FLOORS) if s in lad]


def row(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['rate']:>8,}  run failed: {r['error'].splitlines()[-1] if r['error'] else '?'}"
    return (f"{r['rate']:>8,} {r['achieved_per_s']:>9,.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
            f"{r['p999_ms']:>7.2f} {r['max_ms']:>8.2f} {fmt_opt(r['server_cpu_us_per_entry']):>7} "
            f"{fmt_opt(r['client_cpu_us_per_entry']):>7} {r['send_lag_p99_ms']:>6.2f} {r['naive_p99_ms']:>7.2f} "
            f"{r['other_cores']:>5.2f}  {'yes' if r['holds'] else 'NO: ' + r['why']}"
            + (f"  (p99 of the rounds: {', '.join(fmt_opt(x, '.2f') for x in r['p99_ms_rounds'])})"
               if "p99_ms_rounds" in r else ""))


HEADER = (f"{'rate/s':>8} {'got/s':>9} {'p50':>7} {'p99':>7} {'p99.9':>7} {'max':>8} {'srv us':>7} "
          f"{'cli us':>7} {'lag99':>6} {'naive99':>7} {'other':>5}  holds")
LEGEND = ("latencies in ms from the intended send time; srv/cli us: CPU microseconds per entry of the servers "
          "and the client; lag99: p99 of the generator's lateness; naive99: p99 from the actual send; "
          "other: cores busy on the machine beside the servers and the client")


def print_report(report: dict[str, Any]) -> None:
    a = report["args"]
    print(f"\n{a['size']} B entries; zbk E3 WQ3 AQ2 vs NATS JetStream R3 file sync=always; {a['seconds']} s per run; "
          f"holds: >= {HOLD_COMPLETED_FRACTION:.0%} completed in time and p99 <= {HOLD_P99_MS:g} ms")
    print(LEGEND)
    if report.get("gen"):
        print("\n== generator against a no-op append ==")
        print(HEADER)
        for r in report["gen"]:
            print(row(r))
        print(f"generator ceiling: {report['gen_ceiling']}")
    lad = report.get("ladder")
    if lad:
        for s in ladder_systems(lad):
            print(f"\n== ladder: {s} (highest held {fmt_opt(lad['highest_held'][s], ',')}) ==")
            print(HEADER)
            for r in lad[s]:
                print(row(r))
    e2e = report.get("e2e")
    if e2e:
        print(f"\n== end to end at {e2e['rate']:,}/s ({e2e['rate_from']}) ==")
        print(f"{'system':>8} {'app p50':>8} {'app p99':>8} {'e2e p50':>8} {'e2e p99':>8} {'p99.9':>8} {'max':>8} "
              f"{'recv':>13} {'reader us':>9}")
        for s, r in e2e["runs"].items():
            if "error" in r:
                print(f"{s:>8} run failed")
                continue
            e = r["e2e"]
            print(f"{s:>8} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {e['p50_ms']:>8.2f} {e['p99_ms']:>8.2f} "
                  f"{e['p999_ms']:>8.2f} {e['max_ms']:>8.2f} {e['received']:>6}/{e['expected']:<6} "
                  f"{fmt_opt(e.get('reader_cpu_us_per_entry')):>9}"
                  + (f"  (e2e p99 of the rounds: {', '.join(fmt_opt(x, '.2f') for x in e['p99_ms_rounds'])})"
                     if "p99_ms_rounds" in e else ""))
    rw = report.get("rw")
    if rw:
        print(f"\n== reads beside writes (zbk) at {rw['rate']:,}/s ({rw['rate_from']}), {rw['readers']} catch-up readers "
              f"over {rw['prefill']['entries']:,} old entries ==")
        print(f"{'round':>5} {'case':>9} {'got/s':>9} {'p50':>7} {'p99':>7} {'p99.9':>7} {'max':>8} "
              f"{'srv us':>7} {'reads/s':>9} {'disk MB/s':>9}")
        for i, rnd in enumerate(rw["rounds"]):
            for case in ("alone", "readers", "burners"):
                if case not in rnd:
                    continue
                r = rnd[case]
                if "error" in r:
                    print(f"{i + 1:>5} {case:>9} run failed")
                    continue
                reads = (f"{rnd['readers_entries_per_s']:>9,.0f}" if case == "readers"
                         else f"{rnd['burners_cores']:>4.2f} cpu" if case == "burners" else f"{'-':>9}")
                print(f"{i + 1:>5} {case:>9} {r['achieved_per_s']:>9,.0f} {r['p50_ms']:>7.2f} {r['p99_ms']:>7.2f} "
                      f"{r['p999_ms']:>7.2f} {r['max_ms']:>8.2f} {fmt_opt(r['server_cpu_us_per_entry']):>7} "
                      f"{reads} {r['servers_read_mb_per_s']:>9}")
    if report.get("targets"):
        print("\n== targets ==")
        for name, t in report["targets"].items():
            figures = {k: v for k, v in t.items() if k != "met"}
            print(f"{'met ' if t['met'] else 'MISSED'} {name}: {figures}")


def plot(report: dict[str, Any], path: str) -> None:
    """Latency percentiles against the offered rate, both systems (log scale), filled
    markers where the rate held; beside it the servers' CPU per entry."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lad = report["ladder"]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    colors = {"zbk": "tab:blue", "nats": "tab:orange", FLOOR: "tab:gray", SERVER_FLOOR: "tab:green"}
    names = {"zbk": "zbk E3 WQ3 AQ2", "nats": "NATS JetStream R3", FLOOR: "zbk floor (no client library)",
             SERVER_FLOOR: "floor servers, no client library"}
    styles = {"p50_ms": ("p50", "-", "o"), "p99_ms": ("p99", "--", "s"), "p999_ms": ("p99.9", "-.", "^"),
              "max_ms": ("max", ":", "D")}
    for s in ladder_systems(lad):
        runs = [r for r in lad[s] if "error" not in r]
        if not runs:
            continue
        rates = [r["rate"] for r in runs]
        for key, (label, ls, marker) in styles.items():
            ys = [r[key] for r in runs]
            ax.plot(rates, ys, linestyle=ls, color=colors[s], label=f"{names[s]} {label}")
            held = [(x, y) for x, y, r in zip(rates, ys, runs, strict=True) if r["holds"]]
            failed = [(x, y) for x, y, r in zip(rates, ys, runs, strict=True) if not r["holds"]]
            if held:
                ax.scatter(*zip(*held, strict=True), marker=marker, color=colors[s], s=22)
            if failed:
                ax.scatter(*zip(*failed, strict=True), marker=marker, facecolors="none", edgecolors=colors[s], s=40)
        cpu = [(r["rate"], r["server_cpu_us_per_entry"]) for r in runs if r["server_cpu_us_per_entry"] is not None]
        if cpu:
            ax2.plot(*zip(*cpu, strict=True), marker="o", color=colors[s], label=f"{names[s]}: servers")
        cli = [(r["rate"], r["client_cpu_us_per_entry"]) for r in runs if r["client_cpu_us_per_entry"] is not None]
        if cli:
            ax2.plot(*zip(*cli, strict=True), marker="o", linestyle="--", color=colors[s], label=f"{names[s]}: client")
    ax.axhline(HOLD_P99_MS, color="tab:red", linewidth=1, label=f"p99 bound {HOLD_P99_MS:g} ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("offered rate, entries/s (log)")
    ax.set_ylabel("latency from intended send, ms (log)")
    ax.set_title("latency at fixed rates (hollow: rate not held)")
    ax.legend(fontsize=7, ncol=2)
    ax2.set_xscale("log")
    ax2.set_xlabel("offered rate, entries/s (log)")
    ax2.set_ylabel("CPU us per entry")
    ax2.set_title("CPU per entry")
    ax2.legend(fontsize=7)
    a = report["args"]
    fig.suptitle(f"{a['size']} B entries, 3 replicas, fsync on, {a['seconds']} s per rate; git {report['git']} "
                 f"(bench/openloop.py)", fontsize=9)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)


# -- main ---------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of {','.join(PHASES)}")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds of each run")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of the same load before each measured window")
    ap.add_argument("--drain", type=float, default=10.0, help="seconds a run waits for its appends in flight")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds of pause between runs")
    ap.add_argument("--size", type=int, default=1024, help="entry bytes (>= 16)")
    ap.add_argument("--max-rate", type=int, default=500_000, help="the ladder's highest rate")
    ap.add_argument("--rates", help="the ladder's rates instead (comma-separated, still stopping at a failure)")
    ap.add_argument("--ladder-rounds", type=int, default=1,
                    help="runs of each system at each ladder rate, interleaved; a rate holds when most of them "
                         "hold, and its figures are the medians of the rounds")
    ap.add_argument("--systems", default=",".join(SYSTEMS),
                    help=f"systems of the ladder and e2e phases; {FLOOR} (ladder only): zbk's bookies written "
                         f"without the client library; {SERVER_FLOOR} (ladder only): that writer against "
                         "single-threaded floor servers (bench/_floor_server.py)")
    ap.add_argument("--profile", metavar="PREFIX", help="profile bookie-0 (PREFIX-bookie0-RATE-TIME.txt) and the "
                    "writer (PREFIX-client-RATE-TIME.txt) of every zbk run with py-spy; raw profiles for "
                    "bench/profile_top.py")
    ap.add_argument("--gen-max-rate", type=int, default=200_000, help="the generator phase's highest rate")
    ap.add_argument("--e2e-rate", type=int, help="rate of the e2e phase (default: half NATS's highest held rate)")
    ap.add_argument("--e2e-rounds", type=int, default=3,
                    help="runs of each system in the e2e phase, interleaved; its figures are the medians of the rounds")
    ap.add_argument("--explicit-lac-ms", type=int, default=10,
                    help="the zbk writers' explicit_lac_interval_ms (0: off); a busy writer sends none")
    ap.add_argument("--rw-rate", type=int, help="writers' rate of the rw phase (default: half zbk's highest held rate)")
    ap.add_argument("--readers", type=int, default=2, help="catch-up readers of the rw phase")
    ap.add_argument("--prefill", type=int, default=200_000, help="old entries the catch-up readers read")
    ap.add_argument("--prefill-ledgers", type=int, default=4)
    ap.add_argument("--rw-rounds", type=int, default=3,
                    help="rounds of the rw phase (the writer alone, then beside the readers); the target is judged "
                         "on the medians of three or more, on every round below that")
    ap.add_argument("--rw-floor", action=argparse.BooleanOptionalAction, default=True,
                    help="in each rw round, the writers also beside CPU burners that take the readers' cores")
    ap.add_argument("--cold-every", type=float, default=1.0,
                    help="seconds between drops of the bookies' entry-log pages from the page cache in the rw "
                         "runs, so that the readers read from the disk (0: never)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="zbk bookie config override")
    ap.add_argument("--client-set", action="append", default=[], metavar="KEY=VALUE",
                    help="a ClientConfig field (an integer) of the zbk writers and tailing readers, "
                         "e.g. add_batches_in_flight_max=0, tail_long_polls=1")
    ap.add_argument("--nats-cpus", choices=["", "spread"], default="",
                    help="spread: each NATS server on one CPU of its own, round-robin (as zbk's --set actor_cpus=spread)")
    ap.add_argument("--json-out", metavar="FILE", help="write every figure here")
    ap.add_argument("--plot", metavar="PNG", help="latency percentiles against rate")
    ap.add_argument("--from-json", metavar="FILE", help="only print (and --plot) a report written by --json-out")
    ap.add_argument("--max-seconds", type=float, default=3600, help="bound on the whole run")
    # worker mode (internal: _openloop_workers.py)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--rate", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--metadata", help=argparse.SUPPRESS)
    ap.add_argument("--servers", help=argparse.SUPPRESS)
    ap.add_argument("--server-pids", default="", help=argparse.SUPPRESS)
    ap.add_argument("--e2e", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--w0", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--w1", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ledger", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--subject", help=argparse.SUPPRESS)
    ap.add_argument("--entries", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ledger-count", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ledger-ids", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--duty", type=float, default=1.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.size < 16:
        ap.error("--size must be at least 16 (the intended send time and the index ride in each entry)")
    if min(args.ladder_rounds, args.e2e_rounds, args.rw_rounds) < 1:
        ap.error("--ladder-rounds, --e2e-rounds and --rw-rounds must be at least 1")
    unknown = set(args.phases.split(",")) - set(PHASES)
    if unknown:
        ap.error(f"unknown phases {sorted(unknown)}")
    if set(args.systems.split(",")) - {*SYSTEMS, *FLOORS}:
        ap.error(f"--systems: of {','.join((*SYSTEMS, *FLOORS))}")
    return args


def main() -> int:
    args = parse_args()
    if args.worker:
        from _openloop_workers import worker_main

        return worker_main(args)
    if args.from_json:
        with open(args.from_json) as f:
            saved = json.load(f)
        saved["targets"] = targets(saved)  # judged by this version of the bench
        print_report(saved)
        if args.plot and saved.get("ladder"):
            plot(saved, args.plot)
            print(f"plot: {args.plot}")
        return 0

    install_signal_handlers(args.max_seconds)
    phases = [p for p in PHASES if p in args.phases.split(",")]
    settings = dict(s.split("=", 1) for s in args.set)
    started = time.time()
    report: dict[str, Any] = {"bench": "openloop", "git": git_rev(), "cpus": os.cpu_count(), "load_start": loadavg(),
                              "args": {k: v for k, v in vars(args).items() if v is not None}, "zbk_settings": settings,
                              "client_settings": dict(s.split("=", 1) for s in args.client_set)}
    if "gen" in phases:
        print("== generator against a no-op append ==", flush=True)
        report["gen"] = phase_gen(args)
        held = [r["rate"] for r in report["gen"] if r["holds"]]
        report["gen_ceiling"] = (f"holds {max(held):,}/s" if held else "holds no rate") + (
            "" if not report["gen"] or not report["gen"][-1]["holds"] else " (the highest rate tried)")
    systems = [s for s in (*SYSTEMS, *FLOORS) if s in args.systems.split(",")]
    need_nats = "nats" in systems and ("ladder" in phases or "e2e" in phases)
    nats = NatsCluster(3, spread_cpus=args.nats_cpus == "spread") if need_nats else None
    zbk = ZbkCluster(3, settings=settings) if set(phases) & {"ladder", "e2e", "rw"} else None
    floor = FloorServerCluster(3) if SERVER_FLOOR in systems and "ladder" in phases else None
    try:
        if floor is not None:
            floor.start()
        if nats is not None:
            nats.start()
        if zbk is not None:
            zbk.start()
            print(f"zbk {[b.bookie_id for b in zbk.bookies]}" + (f"; NATS {nats.urls}" if nats else "")
                  + f"; load {loadavg()}", flush=True)
        if "ladder" in phases:
            print("== ladder ==", flush=True)
            rates = [int(r) for r in args.rates.split(",")] if args.rates else ladder_rates(args.max_rate)
            runs = run_ladder(systems, rates, lambda s, rate: measure(s, rate, args, zbk, nats, floor=floor),
                              args.ladder_rounds)
            shown = (*SYSTEMS, *(s for s in FLOORS if s in systems))
            runs = {s: runs.get(s, []) for s in shown}
            report["ladder"] = {**runs, "rates": rates,
                                "highest_held": {s: highest_held(runs[s]) for s in shown},
                                "capped": [s for s in shown if runs[s] and runs[s][-1]["holds"]]}
        if "e2e" in phases:
            rate, source = args.e2e_rate, "--e2e-rate"
            if rate is None:
                top = (report.get("ladder") or {}).get("highest_held", {}).get("nats")
                rate, source = (top // 2, f"half NATS's highest held {top:,}/s") if top else (None, "")
            if rate is None:
                print("e2e: skipped (no NATS ladder result and no --e2e-rate)", flush=True)
            else:
                print(f"== end to end at {rate:,}/s ==", flush=True)
                e2e_runs = run_rounds([s for s in systems if s not in FLOORS], args.e2e_rounds,
                                      lambda s: measure(s, rate, args, zbk, nats, e2e=True), combine_e2e_rounds)
                report["e2e"] = {"rate": rate, "rate_from": source, "runs": e2e_runs}
        if "rw" in phases:
            assert zbk is not None
            rate, source = args.rw_rate, "--rw-rate"
            if rate is None:
                top = (report.get("ladder") or {}).get("highest_held", {}).get("zbk")
                rate, source = (top // 2, f"half zbk's highest held {top:,}/s") if top else (None, "")
            if rate is None:
                print("rw: skipped (no zbk ladder result and no --rw-rate)", flush=True)
            else:
                print(f"== reads beside writes at {rate:,}/s ==", flush=True)
                report["rw"] = {**phase_rw(args, zbk, rate), "rate_from": source}
    finally:
        if zbk is not None:
            zbk.stop()
        if nats is not None:
            nats.stop()
        if floor is not None:
            floor.stop()
    report["targets"] = targets(report)
    report["load_end"] = loadavg()
    report["wall_s"] = round(time.time() - started, 1)
    print_report(report)
    if args.plot and report.get("ladder"):
        plot(report, args.plot)
        print(f"plot: {args.plot}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"json: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
