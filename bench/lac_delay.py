"""Explicit LAC: how long after a writer's last acknowledged add a tailing reader sees it
(docs/performance.md, "Explicit LAC").

    .venv/bin/python bench/lac_delay.py [--trials 30] [--interval-ms 200] [--json]

Starts three bookies (embedded metadata). A writer client with ``explicit_lac_interval_ms``
and a reader client (each its own connections; both on one event loop, so that one clock
times both ends) share an E3 WQ2 AQ2 ledger; the reader follows it with ``tail()``. Each
trial waits a random idle time (one to two intervals, so the writer's LAC check is at any
phase), appends one entry, and times from the moment the append is acknowledged to the
moment the reader's ``tail()`` yields that entry. An idle writer's last entry reaches the
bookies only through WRITE_LAC, so this is the explicit LAC's delay. The bound to hold is
``interval + 100 ms``; the exit code is 1 if the largest delay exceeds it.

Every process it starts is stopped by PID (also on Ctrl-C; the run is bounded in time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _procs  # noqa: E402

from zbk import eventloop  # noqa: E402

BOUND_SLACK_MS = 100  # the delay may exceed the interval by this much (the figure's bound)


async def measure(metadata: str, args: argparse.Namespace) -> list[float]:
    import zbk

    rng = random.Random(args.seed)
    interval_s = args.interval_ms / 1000
    loop = asyncio.get_running_loop()
    async with zbk.AsyncBookKeeper(metadata, explicit_lac_interval_ms=args.interval_ms) as wbk, \
            zbk.AsyncBookKeeper(metadata) as rbk:
        lh = await wbk.create_ledger(3, 2, 2, password=b"pw")
        await lh.append(b"first")
        rh = await rbk.open_ledger(lh.ledger_id, password=b"pw", recovery=False)
        seen: dict[int, float] = {}
        arrived = asyncio.Event()

        async def follow() -> None:
            async for e in rh.tail(0):
                seen[e.entry_id] = loop.time()
                arrived.set()

        reader = asyncio.ensure_future(follow())
        delays: list[float] = []
        try:
            for _ in range(args.trials):
                await asyncio.sleep(interval_s * (1 + rng.random()))
                acked: list[float] = []
                fut = lh.append(b"x" * args.size)
                fut.add_done_callback(lambda _f, a=acked: a.append(loop.time()))  # the moment of the ack
                eid = await fut
                deadline = acked[0] + interval_s + args.give_up_s
                while eid not in seen and loop.time() < deadline:
                    arrived.clear()
                    try:
                        await asyncio.wait_for(arrived.wait(), deadline - loop.time())
                    except TimeoutError:
                        break
                if eid not in seen:
                    raise SystemExit(f"entry {eid} not seen {interval_s + args.give_up_s:.1f} s after its ack")
                delays.append((seen[eid] - acked[0]) * 1000)
            await lh.close()
            await asyncio.wait_for(reader, 30)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    return delays


def report(delays: list[float], args: argparse.Namespace) -> dict[str, Any]:
    vs = sorted(delays)
    bound = args.interval_ms + BOUND_SLACK_MS
    return {"interval_ms": args.interval_ms, "trials": len(vs), "bound_ms": bound,
            "min_ms": round(vs[0], 1), "p50_ms": round(_procs.pct(vs, 0.5), 1),
            "p90_ms": round(_procs.pct(vs, 0.9), 1), "max_ms": round(vs[-1], 1),
            "mean_ms": round(sum(vs) / len(vs), 1), "within_bound": vs[-1] <= bound,
            "commit": _procs.git_rev(), "load": _procs.loadavg()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--interval-ms", type=int, default=200, help="the writer's explicit_lac_interval_ms")
    ap.add_argument("--size", type=int, default=1024, help="payload bytes")
    ap.add_argument("--seed", type=int, default=1, help="of the idle times between trials")
    ap.add_argument("--give-up-s", type=float, default=10.0, help="a trial fails this long past the interval")
    ap.add_argument("--max-seconds", type=float, default=600)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.trials < 1 or args.interval_ms <= 0:
        ap.error("--trials must be >= 1 and --interval-ms > 0")
    _procs.install_signal_handlers(args.max_seconds)
    with _procs.ZbkCluster(n=3) as cluster:
        delays = eventloop.run(measure(cluster.metadata, args))
    out = report(delays, args)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"explicit LAC delay, interval {out['interval_ms']} ms, {out['trials']} trials "
              f"(commit {out['commit']}, load {out['load']}):")
        print(f"  min {out['min_ms']} ms, p50 {out['p50_ms']} ms, p90 {out['p90_ms']} ms, max {out['max_ms']} ms, "
              f"mean {out['mean_ms']} ms; bound {out['bound_ms']} ms: {'held' if out['within_bound'] else 'EXCEEDED'}")
    return 0 if out["within_bound"] else 1


if __name__ == "__main__":
    sys.exit(main())
