"""A/B of two zbk trees or two bookie settings, side by side, alternating runs.

Starts two 3-bookie clusters on loopback (embedded metadata, journal fsynced): cluster A from
tree ``--a-tree`` (a directory holding a ``zbk`` package, e.g. ``git archive REV zbk | tar -x
-C DIR``; default: the installed zbk) with bookie settings ``--a-set``, cluster B likewise.
Then alternates `zbk bench` runs (E3 WQ3 AQ2, 1 KiB) between them, A then B, ``--rounds``
times; each client runs from its side's tree. Per run it prints entries/s, p50/p99, the three
bookies' CPU per entry, and the machine's CPU split (/proc/stat: user, system, idle, iowait,
steal) — on a shared VM the system share tells a quiet run from a disturbed one. Last, the
medians of each side and one JSON line. Stops every process it started, by PID.

    .venv/bin/python bench/ab.py --a-tree /tmp/base --window 1000 --rounds 5
    .venv/bin/python bench/ab.py --a-set flush_entry_log_bytes=0 --window 1 --rounds 4

Runs start from the current directory only through ``-m zbk.cli.main``, so run it from a
directory that holds no ``zbk`` package (e.g. ``cd /tmp``) when comparing trees: Python puts
the current directory first on the module path.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _procs import (  # noqa: E402
    EtcdServer,
    ZbkCluster,
    cpu_seconds,
    git_rev,
    install_signal_handlers,
    machine_cpu_ticks,
    median_range,
)


def _settings(text: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in text.split(",") if kv)


def _env(tree: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if tree:
        env["PYTHONPATH"] = str(Path(tree).resolve())
    return env


def _start(settings: dict[str, str], tree: str, metadata_uri: str = "") -> ZbkCluster:
    saved = os.environ.get("PYTHONPATH")
    if tree:  # the bookie processes inherit the environment
        os.environ["PYTHONPATH"] = str(Path(tree).resolve())
    try:
        cluster = ZbkCluster(n=3, settings=dict(settings), metadata_uri=metadata_uri)
        return cluster.__enter__()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def _run(cluster: ZbkCluster, tree: str, args: argparse.Namespace) -> dict[str, Any]:
    pids = [b.pid for b in cluster.bookies]
    cpu0, split0 = sum(cpu_seconds(p) for p in pids), machine_cpu_ticks()
    out = subprocess.run([sys.executable, "-m", "zbk.cli.main", "bench", "--metadata", cluster.metadata,
                          "--seconds", str(args.seconds), "--window", str(args.window), "--entry-size",
                          str(args.size), "--json"], capture_output=True, text=True, env=_env(tree),
                         timeout=args.seconds + 120)
    cpu1, split1 = sum(cpu_seconds(p) for p in pids), machine_cpu_ticks()
    if out.returncode != 0:
        raise RuntimeError(f"zbk bench failed ({out.returncode}):\n{out.stderr[-2000:]}")
    rep: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    d = [b - a for a, b in zip(split0, split1, strict=False)]
    total = sum(d) or 1
    rep["bookie_us_per_entry"] = round((cpu1 - cpu0) / max(1, rep["entries"]) * 1e6, 1)
    rep["cpu_split"] = {"user": d[0] / total, "system": d[2] / total, "idle": d[3] / total,
                        "iowait": d[4] / total, "steal": d[7] / total if len(d) > 7 else 0.0}
    rep["load"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return rep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a-tree", default="", help="directory holding the zbk package of side A (default: installed)")
    ap.add_argument("--b-tree", default="", help="likewise for side B")
    ap.add_argument("--a-set", default="", metavar="K=V,...", help="bookie config overrides of side A")
    ap.add_argument("--b-set", default="", metavar="K=V,...", help="bookie config overrides of side B")
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--max-seconds", type=float, default=1800)
    ap.add_argument("--metadata", choices=("sqlite", "etcd"), default="sqlite",
                    help="each side's metadata store: its own embedded file, or its own etcd member (for trees "
                         "whose embedded stores have different formats; adds never touch metadata)")
    args = ap.parse_args()
    install_signal_handlers(args.max_seconds)
    sides = {"A": (args.a_tree, _settings(args.a_set)), "B": (args.b_tree, _settings(args.b_set))}
    runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    clusters: dict[str, ZbkCluster] = {}
    etcds: list[EtcdServer] = []
    try:
        for name, (tree, settings) in sides.items():
            uri = ""
            if args.metadata == "etcd":
                etcds.append(EtcdServer().start())
                uri = etcds[-1].uri
            clusters[name] = _start(settings, tree, uri)
        for r in range(args.rounds):
            for name, (tree, _) in sides.items():
                rep = _run(clusters[name], tree, args)
                runs[name].append(rep)
                s = rep["cpu_split"]
                print(f"round {r + 1} {name}: {rep['entries_per_s']:>9,.0f} entries/s  p50 {rep['p50_ms']:7.2f}  "
                      f"p99 {rep['p99_ms']:7.2f} ms  bookies {rep['bookie_us_per_entry']:6.0f} us/entry  "
                      f"cpu: user {s['user']:.0%} system {s['system']:.0%} idle {s['idle']:.0%} "
                      f"iowait {s['iowait']:.0%}  (load {rep['load']})", flush=True)
    finally:
        for cluster in clusters.values():
            cluster.stop()
        for etcd in etcds:
            etcd.stop()
    summary: dict[str, Any] = {}
    for name, (tree, settings) in sides.items():
        xs = runs[name]
        summary[name] = {"tree": tree or "installed", "settings": settings,
                         **{k: median_range([x[k] for x in xs])
                            for k in ("entries_per_s", "p50_ms", "p99_ms", "bookie_us_per_entry")}}
        m = summary[name]
        label = ", ".join([tree or "installed", *(f"{k}={v}" for k, v in settings.items())])
        print(f"{name} ({label}): {m['entries_per_s']['median']:,.0f} entries/s, p50 {m['p50_ms']['median']:.2f} ms, "
              f"p99 {m['p99_ms']['median']:.2f} ms, bookies {m['bookie_us_per_entry']['median']:.0f} us/entry (medians)")
    print(json.dumps({"bench": "ab", "git": git_rev(), "window": args.window, "rounds": args.rounds,
                      "seconds": args.seconds, "summary": summary, "runs": runs}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
