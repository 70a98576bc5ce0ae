"""One bookie: window-1 adds alone, then beside a catch-up reader at full speed.

The bookie-side half of `bench/openloop.py --phases rw`, without the client library and
without two other bookies on the same two cores: one bookie, raw protocol (the workers of
bench/scale.py). A ledger of ``--entries`` 1 KiB entries is written, the page cache
dropped, then per round: ``raw-add`` (one entry per ADD_ENTRY, one in flight) for
``--seconds`` alone, then the same beside ``raw-read`` (ranged READ_ENTRY requests of
4,096 entries, ``--read-window`` in flight, over the ledger again and again). Prints the
adds' rate, p50, p99 and max, and the reader's entries/s, per round and as medians.
``--profile FILE`` runs the bookie under py-spy (bench/profile_top.py summarizes it).

    .venv/bin/python bench/beside.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _procs import ZbkCluster, loadavg, median_range  # noqa: E402
from scale import settings, worker  # noqa: E402

SCALE = str(Path(__file__).resolve().parent / "scale.py")


def drop_caches() -> None:
    """Old entries come from the disk at first, as a catch-up reader's would (root only)."""
    subprocess.run(["sh", "-c", "sync; echo 1 > /proc/sys/vm/drop_caches"], check=False, capture_output=True)


def adds(bookie: str, lid: int, seconds: float) -> dict[str, Any]:
    return worker("raw-add", seconds + 120, bookie=bookie, first_lid=lid, ledgers=1, batch=1, window=1, size=1024,
                  seconds=seconds, start_eid=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds of each add run")
    ap.add_argument("--entries", type=int, default=200_000, help="entries of the ledger the reader reads")
    ap.add_argument("--read-window", type=int, default=2, help="read requests in flight")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="bookie config override")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON line too")
    ap.add_argument("--profile", metavar="FILE", help="run the bookie under py-spy (--gil), raw profile here")
    a = ap.parse_args()
    runs: list[dict[str, Any]] = []
    with ZbkCluster(1, settings=settings(a), profile=a.profile) as zc:
        b = zc.bookies[0]
        fill = worker("raw-add", 600, bookie=b.bookie_id, first_lid=1, ledgers=1, batch=500, window=8, size=1024,
                      requests=a.entries // 500, start_eid=0)
        last = fill["entries"] - 1
        drop_caches()
        lid = 100
        for rnd in range(a.rounds):
            for case in ("alone", "reader"):
                lid += 1
                reader = None
                if case == "reader":
                    argv = [sys.executable, SCALE, "--worker", "raw-read", "--bookie", b.bookie_id, "--first-lid", "1",
                            "--last", str(last), "--count", "4096", "--window", str(a.read_window),
                            "--seconds", str(a.seconds + 3)]
                    reader = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
                    time.sleep(1.0)  # the reader is at full speed before the adds start
                load = loadavg()
                r = adds(b.bookie_id, lid, a.seconds)
                reads = None
                if reader is not None:
                    out, _ = reader.communicate(timeout=a.seconds + 120)
                    reads = json.loads(out.strip().splitlines()[-1])["entries_per_s"]
                run = {"round": rnd + 1, "case": case, "adds_per_s": r["entries_per_s"], "p50_ms": r["p50_ms"],
                       "p99_ms": r["p99_ms"], "max_ms": r["max_ms"], "reads_per_s": reads, "load": load}
                runs.append(run)
                print(f"round {rnd + 1} {case:>6}: adds {run['adds_per_s']:>7,.0f}/s  p50 {run['p50_ms']:.2f}  "
                      f"p99 {run['p99_ms']:.2f}  max {run['max_ms']:.2f} ms  reads "
                      f"{'-' if reads is None else f'{reads:,.0f}/s'}  (load {load})", flush=True)
    summary: dict[str, Any] = {}
    for case in ("alone", "reader"):
        mine = [r for r in runs if r["case"] == case]
        summary[case] = {k: median_range([r[k] for r in mine]) for k in ("adds_per_s", "p50_ms", "p99_ms")}
        if case == "reader":
            summary[case]["reads_per_s"] = median_range([r["reads_per_s"] for r in mine])
    for case, s in summary.items():
        print(f"{case:>6}: adds {s['adds_per_s']['median']:,.0f}/s, p99 {s['p99_ms']['median']:.2f} ms "
              f"({s['p99_ms']['min']:.2f}-{s['p99_ms']['max']:.2f})"
              + (f", reads {s['reads_per_s']['median']:,.0f}/s" if "reads_per_s" in s else ""))
    if a.json:
        print(json.dumps({"runs": runs, "summary": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
