"""The longest add stall when a bookie of a ledger's ensemble fails under a writer.

    .venv/bin/python bench/stall.py [--rounds 3] [--heartbeat-ms 500] [--window 200] [--json]

Starts one etcd member, 4 bookies and, in this process, one client writing an E3 WQ2
AQ2 ledger at full speed: ``--window`` appends of ``--entry-size`` bytes always in flight.
After ``--before-s`` seconds one bookie of the ledger's ensemble fails, in one of two ways:

* ``kill``: SIGKILL. Its connections close at once (target: a stall of at most 100 ms);
* ``stop``: SIGSTOP, a stand-in for a network partition: its connections stay open and
  nothing answers (target: at most the client's ``bookie_heartbeat_timeout_ms`` plus 100 ms).

The writer goes on for ``--after-s`` seconds, then closes the ledger. The stall of a round
is the longest time without any add confirmed, over the gaps that end after the fault
(the gap the fault falls in included). Beside it: the longest gap before the fault (the
noise floor of this machine), when the client found the bookie failed and when its
ensemble change was written, the longest add latency after the fault, and whether the
closed ledger's last ensemble has the failed bookie replaced. The add timeout stays at its
default (10 s): a stall near it would mean the failure was found by a timeout. A killed
bookie is started again before the next round, a stopped one continued; which bookie fails
is drawn from the ensemble at the time (``--seed``).

Every process it starts is stopped by PID (also on Ctrl-C); the run is bounded in time
(``--max-seconds``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import os
import random
import signal
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _procs  # noqa: E402

from zbk import eventloop  # noqa: E402
from zbk.client.bookkeeper import AsyncBookKeeper  # noqa: E402
from zbk.config import ClientConfig  # noqa: E402

FAULTS = ("kill", "stop")
KILL_TARGET_S = 0.1


async def one_round(bk: AsyncBookKeeper, cluster: _procs.ZbkCluster, fault: str, rng: random.Random,
                    args: argparse.Namespace) -> dict[str, Any]:
    lh = await bk.create_ledger(3, 2, 2, password=b"bench")
    payload = os.urandom(args.entry_size)
    confirmed: list[float] = []  # when each add was confirmed, in order
    latencies: list[tuple[float, float]] = []  # (confirmed at, latency)
    room = asyncio.Semaphore(args.window)
    stop_at = [float("inf")]

    def done(started: float, fut: asyncio.Future[int]) -> None:
        room.release()
        if not fut.cancelled() and fut.exception() is None:
            now = time.monotonic()
            confirmed.append(now)
            latencies.append((now, now - started))

    async def writer() -> None:
        while time.monotonic() < stop_at[0]:
            await room.acquire()
            lh.append(payload).add_done_callback(functools.partial(done, time.monotonic()))

    task = asyncio.ensure_future(writer())
    await asyncio.sleep(args.before_s)
    victim_id = rng.choice(lh.md.last_ensemble)
    victim = next(b for b in cluster.bookies if b.bookie_id == victim_id)
    t_fault = time.monotonic()
    assert victim.proc is not None
    # os.kill only: reaping or waiting here would block the loop the client runs on.
    os.kill(victim.proc.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    # Looked at every millisecond: when the client found the bookie failed (its transport's
    # record of the first failure) and when the ensemble change was written (new metadata).
    failed_at: dict[str, float] = getattr(bk.ctx.transport, "failed_at", {}) if bk.ctx else {}
    first_md, found, changed = lh.md, math.nan, math.nan
    while time.monotonic() - t_fault < args.after_s:
        t = failed_at.get(victim_id, -math.inf)
        if math.isnan(found) and t >= t_fault:
            found = t
        if math.isnan(changed) and lh.md is not first_md:
            changed = time.monotonic()
        await asyncio.sleep(0.001)
    stop_at[0] = time.monotonic()
    await task
    await lh.close()
    if fault == "stop":
        os.kill(victim.proc.pid, signal.SIGCONT)
    else:
        await asyncio.to_thread(cluster.restart, victim)
        # The client reconnects within ZeroMQ's reconnect interval (0.1-0.2 s); an add sent
        # to the bookie before that fails at once (its connection was lost) and would make
        # the next round's ledger change its ensemble before the fault.
        await asyncio.sleep(1.0)
    warm = confirmed[0] + 0.3 if confirmed else t_fault  # the first gaps include connecting
    gaps_before = [b - a for a, b in pairwise(confirmed) if a >= warm and b <= t_fault]
    after = [t for t in confirmed if t > t_fault]
    last_before = max([t for t in confirmed if t <= t_fault], default=t_fault)
    gaps_after = [b - a for a, b in pairwise([last_before, *after])]
    md = lh.md
    return {
        "fault": fault, "victim": victim_id,
        "stall_ms": round(1000 * max(gaps_after, default=float("nan")), 1),
        "found_ms": round(1000 * (found - t_fault), 1), "changed_ms": round(1000 * (changed - t_fault), 1),
        "gap_before_ms": round(1000 * max(gaps_before, default=0.0), 1),
        "latency_max_ms": round(1000 * max([lat for t, lat in latencies if t > t_fault], default=float("nan")), 1),
        "confirmed_after": len(after),
        "ensemble_changes": len(md.fragments) - 1,
        "replaced_at_close": victim_id not in md.last_ensemble,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    config = ClientConfig(bookie_heartbeat_timeout_ms=args.heartbeat_ms)
    rounds: list[dict[str, Any]] = []
    # A bookie stopped for longer than its registration TTL would be dropped from the
    # registry and come back as a new registration: keep the TTL above a round.
    ttl_s = int(args.before_s + args.after_s) + 5
    with contextlib.ExitStack() as stack:
        uri = stack.enter_context(_procs.EtcdServer()).uri if args.metadata == "etcd" else ""
        cluster = stack.enter_context(_procs.ZbkCluster(n=4, settings={"registration_ttl_s": ttl_s},
                                                        metadata_uri=uri))
        async with AsyncBookKeeper(cluster.metadata, config=config) as bk:
            for fault in args.faults:
                for i in range(args.rounds):
                    r = await one_round(bk, cluster, fault, rng, args)
                    rounds.append(r)
                    print(f"{fault} round {i + 1}: {json.dumps(r)}", file=sys.stderr)
    summary: dict[str, Any] = {}
    for fault in args.faults:
        mine = [r for r in rounds if r["fault"] == fault]
        target = KILL_TARGET_S * 1000 if fault == "kill" else args.heartbeat_ms + KILL_TARGET_S * 1000
        summary[fault] = {
            "target_ms": target,
            **{k: _procs.median_range([r[k] for r in mine]) for k in ("stall_ms", "found_ms", "changed_ms",
                                                                      "gap_before_ms")},
            "replaced_at_close": all(r["replaced_at_close"] for r in mine),
        }
    return {"summary": summary, "rounds": rounds, "bookie_heartbeat_timeout_ms": args.heartbeat_ms, "window": args.window,
            "entry_size": args.entry_size, "load": _procs.loadavg(), "git": _procs.git_rev()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per fault kind")
    ap.add_argument("--faults", nargs="+", choices=FAULTS, default=list(FAULTS))
    ap.add_argument("--heartbeat-ms", type=int, default=500, help="the client's bookie_heartbeat_timeout_ms")
    ap.add_argument("--window", type=int, default=200, help="appends in flight")
    ap.add_argument("--entry-size", type=int, default=1024)
    ap.add_argument("--before-s", type=float, default=1.5, help="writing before the fault")
    ap.add_argument("--after-s", type=float, default=0.0, help="writing after it (default: heartbeat + 1.5 s)")
    ap.add_argument("--seed", type=int, default=1, help="which bookie of each ensemble fails")
    ap.add_argument("--metadata", choices=("etcd", "sqlite"), default="etcd",
                    help="etcd (default): a stopped bookie holds nothing but its lease; the embedded "
                         "sqlite store is one file lock, which a bookie stopped while writing holds")
    ap.add_argument("--max-seconds", type=float, default=300)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.after_s <= 0:
        args.after_s = args.heartbeat_ms / 1000 + 1.5
    _procs.install_signal_handlers(args.max_seconds)
    result = eventloop.run(run(args))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"E3 WQ2 AQ2 on 4 bookies, {args.window} appends of {args.entry_size} B in flight, "
          f"bookie_heartbeat_timeout_ms={args.heartbeat_ms}, load {result['load']}, git {result['git']}")
    print("milliseconds, median (min-max) of the rounds; from the fault: the longest stall, when the client "
          "found the bookie failed, when its ensemble change was written; the longest gap before the fault")
    print(f"{'fault':6} {'stall':22} {'target':>6}  {'found':22} {'changed':22} {'gap before':22} replaced")
    for fault, s in result["summary"].items():
        cells = [f"{s[k]['median']:.0f} ({s[k]['min']:.0f}-{s[k]['max']:.0f})"
                 for k in ("stall_ms", "found_ms", "changed_ms", "gap_before_ms")]
        print(f"{fault:6} {cells[0]:22} {s['target_ms']:>6.0f}  {cells[1]:22} {cells[2]:22} {cells[3]:22} "
              f"{s['replaced_at_close']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
