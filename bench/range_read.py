"""Range reads through the client library: entries/s and CPU per entry of reading a closed
ledger whole with ``read()``, for several quorum layouts (docs/performance.md, "Range reads
by layout").

    .venv/bin/python bench/range_read.py [--entries 100000] [--rounds 3] [--layouts 3,2,2 3,3,2] [--json]

Starts three bookies (embedded metadata, journal fsynced), writes one ledger of ``--entries``
entries of ``--size`` bytes per layout (E,WQ,AQ), closes them, and then, round after round,
reads each ledger from its first entry to its last in alternation, one reader on one event
loop. A round's figure is the entries read per wall-clock second, and the CPU seconds the
client process and the three bookie processes spent per entry while it read. With WQ < E
every bookie holds only its stripes of the entries, so the layouts differ in how a range is
asked for (docs/guide/client.md, "Reading ranges").

Every process it starts is stopped by PID (also on Ctrl-C; the run is bounded in time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _procs  # noqa: E402

from zbk import eventloop  # noqa: E402

PASSWORD = b"zbk-range-read"


def parse_layout(text: str) -> tuple[int, int, int]:
    e, wq, aq = (int(x) for x in text.split(","))
    if not e >= wq >= aq >= 1 or e > 3:
        raise argparse.ArgumentTypeError(f"layout {text!r}: need 3 >= E >= WQ >= AQ >= 1")
    return e, wq, aq


async def measure(cluster: _procs.ZbkCluster, args: argparse.Namespace) -> list[dict[str, Any]]:
    import zbk

    payload = os.urandom(args.size)
    pids = [b.pid for b in cluster.bookies]
    rows: list[dict[str, Any]] = []
    async with zbk.AsyncBookKeeper(cluster.metadata) as bk:
        ledgers: dict[tuple[int, int, int], int] = {}
        for layout in args.layouts:
            lh = await bk.create_ledger(*layout, password=PASSWORD)
            window: list[asyncio.Future[int]] = []
            for _ in range(args.entries):
                window.append(lh.append(payload))
                if len(window) >= 1000:
                    await asyncio.gather(*window)
                    window.clear()
            await asyncio.gather(*window)
            await lh.close()
            ledgers[layout] = lh.ledger_id
        _procs.wait_idle(pids)  # the writes' checkpoints and index flushes are not in the figures
        for r in range(args.rounds):
            for layout, lid in ledgers.items():
                rh = await bk.open_ledger(lid, password=PASSWORD)
                wall, cpu = time.perf_counter(), time.process_time()
                bookies = sum(_procs.cpu_seconds(p) for p in pids)
                n = 0
                async for _ in rh.read(0, rh.last_add_confirmed):
                    n += 1
                wall = time.perf_counter() - wall
                cpu = time.process_time() - cpu
                bookies = sum(_procs.cpu_seconds(p) for p in pids) - bookies
                assert n == args.entries, (n, args.entries)
                rows.append({"layout": ",".join(map(str, layout)), "round": r, "entries": n,
                             "entries_per_s": round(n / wall), "client_us_per_entry": round(1e6 * cpu / n, 2),
                             "bookies_us_per_entry": round(1e6 * bookies / n, 2)})
                if not args.json:
                    row = rows[-1]
                    print(f"round {r} E,WQ,AQ {row['layout']}: {row['entries_per_s']:,} entries/s, client "
                          f"{row['client_us_per_entry']} us, bookies {row['bookies_us_per_entry']} us per entry",
                          flush=True)
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for layout in dict.fromkeys(r["layout"] for r in rows):
        mine = [r for r in rows if r["layout"] == layout]
        out[layout] = {k: _procs.pct(sorted(r[k] for r in mine), 0.5)
                       for k in ("entries_per_s", "client_us_per_entry", "bookies_us_per_entry")}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=1024, help="payload bytes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--layouts", type=parse_layout, nargs="+", default=[(3, 2, 2), (3, 3, 2)],
                    help="E,WQ,AQ of each ledger (at most 3 bookies)")
    ap.add_argument("--max-seconds", type=float, default=900)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.entries < 1 or args.rounds < 1:
        ap.error("--entries and --rounds must be >= 1")
    _procs.install_signal_handlers(args.max_seconds)
    with _procs.ZbkCluster(n=3) as cluster:
        rows = eventloop.run(measure(cluster, args))
    medians = summary(rows)
    result = {"commit": _procs.git_rev(), "load": _procs.loadavg(), "rounds": rows, "medians": medians}
    if args.json:
        print(json.dumps(result))
    else:
        print(f"medians of {args.rounds} rounds (commit {result['commit']}, load {result['load']}):")
        for layout, m in medians.items():
            print(f"  E,WQ,AQ {layout}: {m['entries_per_s']:,.0f} entries/s, client {m['client_us_per_entry']} us, "
                  f"bookies {m['bookies_us_per_entry']} us per entry")
    return 0


if __name__ == "__main__":
    sys.exit(main())
