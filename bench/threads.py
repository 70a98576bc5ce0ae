"""Where the CPU of an add goes, thread by thread: user and system microseconds and context
switches per entry of each thread of bookie-0 and of the client, while one client writes N
ledgers.

For each ``--ledgers`` count (default 1 and 10,000) it starts three bookies (embedded
metadata, journal fsynced), runs `bench/scale.py`'s ledgers workload in a worker process
(E3 WQ3 AQ2, 1 KiB, ``--window`` in total (default 1,000), round-robin over the N ledgers, one run of
``--seconds``, which starts once the bookies are idle after the ledgers' first entries:
their index files are created by a checkpoint), and from 2 s into that run samples
``/proc/PID/task/*/stat`` (CPU) and ``status`` (context switches) of bookie-0 and of the
client for ``--sample-seconds``. Thread
names are those the kernel knows: the bookie's actor threads name themselves
(``zbk-journal``, ``zbk-server``, ...), ZeroMQ's I/O thread is ``ZMQbg/IO/0``.

``--strace SECONDS`` then attaches ``strace -f`` to bookie-0 for that long (after the CPU
sample: strace slows the threads it watches several times over) and prints the system
calls of each thread per entry bookie-0 acknowledged meanwhile. At window 1 an entry is a
request, and the futex calls per request tell how often the actor threads contend for the
GIL. Stops every process it started, by PID.

    .venv/bin/python bench/threads.py --ledgers 1 --ledgers 10000
    .venv/bin/python bench/threads.py --ledgers 1 --window 1 --strace 4
    .venv/bin/python bench/threads.py --rate 600 --seconds 20 --sample-seconds 8

With ``--rate R`` the load is instead one ledger written at R entries/s, open loop, by
bench/openloop.py's writer as in its ladder, and the sample starts once bookie-0 has taken
its first 1.5 s of entries; per entry then means per entry bookie-0 took during the sample.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _procs import Bookie, ZbkCluster, install_signal_handlers, metric_total, stat_times, stop_process  # noqa: E402


def thread_times(pid: int) -> dict[int, tuple[str, float, float, int]]:
    """tid -> (name, user s, system s, context switches) of every thread of ``pid``; the
    switches are the voluntary ones (the thread slept: a wait for a message, the GIL, a
    disk) and the involuntary ones (it was preempted) together."""
    out: dict[int, tuple[str, float, float, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            user, system = stat_times(f"/proc/{pid}/task/{tid}/stat")
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                switches = sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
        except OSError:  # the thread ended meanwhile
            continue
        out[int(tid)] = (name, user, system, switches)
    return out


def measure(n: int, seconds: float, sample_s: float, window: int = 1000, strace_s: float = 0.0,
            settings: dict[str, str] | None = None, rate: int = 0) -> dict[str, Any]:
    here = os.path.dirname(os.path.abspath(__file__))
    with ZbkCluster(3, settings=settings or {}) as zc:
        pids = [b.pid for b in zc.bookies]
        if rate:  # bench/openloop.py's writer: one ledger at a fixed rate, open loop
            argv = [sys.executable, os.path.join(here, "openloop.py"), "--worker", "zbk", "--rate", str(rate),
                    "--seconds", str(seconds), "--warmup", "1", "--size", "1024", "--drain", "10",
                    "--explicit-lac-ms", "10", "--metadata", zc.metadata, "--server-pids", ",".join(map(str, pids))]
        else:
            argv = [sys.executable, os.path.join(here, "scale.py"), "--worker", "multi", "--metadata", zc.metadata,
                    "--pids", ",".join(map(str, pids)), "--counts", str(n), "--window", str(window), "--size", "1024",
                    "--seconds", str(seconds), "--warmup", "1", "--rounds", "1"]
        worker = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            if rate:
                # The writer starts, creates its ledger and warms up for 1 s: sample once
                # bookie-0 has taken that much.
                limit = time.monotonic() + 60
                while _entries_added(zc.bookies[0]) < 1.5 * rate:
                    if worker.poll() is not None or time.monotonic() > limit:
                        raise RuntimeError(f"writer did not start:\n{worker.communicate()[1][-3000:]}")
                    time.sleep(0.05)
            else:
                # The worker creates the ledgers, writes one entry to each, waits for idle
                # bookies, warms up for 1 s, says so on stderr, and runs.
                assert worker.stderr is not None
                for line in worker.stderr:
                    if line.startswith('{"measuring"'):
                        break
                else:
                    raise RuntimeError(f"worker exited {worker.wait()} before its run")
                time.sleep(2)
            watched = {"bookie-0": pids[0], "client": worker.pid}
            before = {k: thread_times(p) for k, p in watched.items()}
            e0 = _entries_added(zc.bookies[0])
            t0 = time.monotonic()
            time.sleep(sample_s)
            elapsed = time.monotonic() - t0
            after = {k: thread_times(p) for k, p in watched.items()}
            added = _entries_added(zc.bookies[0]) - e0
            syscalls = trace_syscalls(zc.bookies[0], strace_s) if strace_s else None
            out, err = worker.communicate(timeout=seconds + 60)
        finally:
            if worker.poll() is None:
                stop_process(worker)  # type: ignore[arg-type]  # a text-mode Popen
        if worker.returncode != 0:
            raise RuntimeError(f"worker exited {worker.returncode}:\n{err[-3000:]}")
        report = json.loads(out.strip().splitlines()[-1])
    run = report if rate else report["runs"][0]
    # Per entry of the sample: what bookie-0 took meanwhile (every entry, at WQ3).
    per_s = added / elapsed if rate else run["entries_per_s"]
    per: dict[str, list[dict[str, Any]]] = {}
    for proc in watched:
        rows: list[dict[str, Any]] = []
        for tid, (name, u1, s1, c1) in sorted(after[proc].items()):
            if tid not in before[proc]:
                continue
            _, u0, s0, c0 = before[proc][tid]
            us, ss = (u1 - u0) / elapsed * 1e6 / per_s, (s1 - s0) / elapsed * 1e6 / per_s
            if us + ss >= 0.05:
                rows.append({"tid": tid, "name": name, "user_us": round(us, 2), "sys_us": round(ss, 2),
                             "switches": round((c1 - c0) / elapsed / per_s, 3)})
        per[proc] = rows
    return {"ledgers": 1 if rate else n, "window": None if rate else window, "rate": rate or None,
            "entries_per_s": round(per_s, 1), "run_seconds": seconds, "sampled_s": round(elapsed, 1),
            "threads": per, "syscalls_per_entry": syscalls}


def _entries_added(bookie: Bookie) -> float:
    return metric_total(bookie.metrics(), "zbk_bookie_entries_added_total")


def trace_syscalls(bookie: Bookie, seconds: float) -> dict[str, dict[str, float]]:
    """``strace -f`` on the bookie for ``seconds``: thread name -> syscall -> calls per entry."""
    names = {tid: t[0] for tid, t in thread_times(bookie.pid).items()}
    with tempfile.NamedTemporaryFile(prefix="zbk-strace-", suffix=".txt", delete=False) as f:
        path = f.name
    try:
        e0 = _entries_added(bookie)
        tracer = subprocess.Popen(["strace", "-f", "-qq", "-o", path, "-p", str(bookie.pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(seconds)
        finally:
            stop_process(tracer, sig=signal.SIGINT)  # strace detaches on SIGINT
        entries = max(1.0, _entries_added(bookie) - e0)
        counts: dict[tuple[int, str], int] = {}
        with open(path) as f:
            for line in f:
                m = _STRACE_LINE.match(line)
                if m:
                    key = (int(m.group(1)), m.group(2))
                    counts[key] = counts.get(key, 0) + 1
    finally:
        os.unlink(path)
    out: dict[str, dict[str, float]] = {}
    for (tid, call), k in sorted(counts.items()):
        per = k / entries
        if per >= 0.05:
            out.setdefault(f"{names.get(tid, '?')} {tid}", {})[call] = round(per, 2)
    return out


# "TID name(" of a call, or "TID <... name resumed>" of one that blocked (counted at its start)
_STRACE_LINE = re.compile(r"^(\d+)\s+([a-z_0-9]+)\(")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ledgers", type=int, action="append", help="ledger counts (repeatable; default 1 and 10000)")
    ap.add_argument("--seconds", type=float, default=45.0, help="length of the worker's run")
    ap.add_argument("--window", type=int, default=1000, help="entries in flight in total (1: one at a time)")
    ap.add_argument("--rate", type=int, default=0,
                    help="instead of a window: one ledger written at this many entries/s, open loop "
                         "(bench/openloop.py's writer); --ledgers is then ignored")
    ap.add_argument("--strace", type=float, default=0.0, metavar="SECONDS",
                    help="after the CPU sample, count bookie-0's system calls per thread for this long")
    ap.add_argument("--sample-seconds", type=float, default=15.0, help="CPU sampled over this much of the run")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="bookie config override")
    a = ap.parse_args()
    if a.sample_seconds + a.strace + 4 > a.seconds:
        ap.error("--sample-seconds (plus --strace) must leave at least 4 s of the run around it")
    if a.strace and shutil.which("strace") is None:
        ap.error("--strace needs strace (apt install strace)")
    install_signal_handlers(max_seconds=900)
    results = []
    for n in ([1] if a.rate else a.ledgers or [1, 10_000]):
        r = measure(n, a.seconds, a.sample_seconds, a.window, a.strace, dict(kv.split("=", 1) for kv in a.set),
                    rate=a.rate)
        r["settings"] = a.set
        results.append(r)
        print(f"{n} ledgers{f' at {a.rate:,}/s offered' if a.rate else ''}: {r['entries_per_s']:,.0f} entries/s; "
              f"us of CPU per entry (user + system), "
              f"context switches per entry:")
        for proc, rows in r["threads"].items():
            total = switches = 0.0
            for row in rows:
                total += row["user_us"] + row["sys_us"]
                switches += row["switches"]
                print(f"  {proc:8} {row['tid']:>8} {row['name']:16} {row['user_us']:6.2f} + {row['sys_us']:5.2f}"
                      f"  {row['switches']:7.3f}")
            print(f"  {proc:8} {'all':>8} {'':16} {total:6.2f}          {switches:7.3f}")
        if r["syscalls_per_entry"]:
            print(f"{n} ledgers: bookie-0's system calls per entry, by thread (under strace):")
            for thread, calls in r["syscalls_per_entry"].items():
                top = sorted(calls.items(), key=lambda kv: -kv[1])
                print(f"  {thread:24} " + "  ".join(f"{c} {v:g}" for c, v in top))
    print(json.dumps({"bench": "threads", "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
