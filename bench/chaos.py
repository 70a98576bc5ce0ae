"""Long chaos runs (docs/chaos.md): the CI chaos test's harness for N minutes.

    .venv/bin/python bench/chaos.py --minutes 30 [--seed N] [--kinds all|loopback|K,K...] [--dir DIR] [--json]

``--kinds all`` (the default) adds the faults that need each process on a host of its own
(network partitions, power cuts, clock jumps: tests/chaos/hosts.py): run as root, with
nftables, fuse3 and faketime installed. ``--kinds loopback`` is the CI test's five kinds on
loopback, which needs none of that.

Prints the seed first (replay a run's faults with --seed), progress every 15 s, then the
table: faults injected by kind, entries acknowledged, entries lost (must be 0), ledgers
recovered, time to full replication. Exit code 0 when every check passed, 1 otherwise.
Logs, data, plan.txt and report.json stay in --dir (default: a new temporary directory).

The harness lives in tests/chaos/ (it uses the test helpers that start etcd and bookies);
this script puts tests/ on sys.path to import it, as pytest does.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from chaos.faults import KINDS, LOOPBACK_KINDS  # noqa: E402
from chaos.harness import ChaosConfig, run_chaos  # noqa: E402


def parse_kinds(text: str) -> tuple[str, ...]:
    if text == "all":
        return KINDS
    if text == "loopback":
        return LOOPBACK_KINDS
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown kinds {unknown}: all, loopback, or some of {', '.join(KINDS)}")
    return kinds


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=3.0, help="minutes of fault injection (default 3)")
    p.add_argument("--seed", type=int, help="the seed of the fault plan and payloads (default: random)")
    p.add_argument("--settle", type=float, default=120.0,
                   help="seconds the cluster may take to be fully replicated after healing (default 120)")
    p.add_argument("--rate", type=float, default=250.0, help="entries/s per writer (default 250)")
    p.add_argument("--kinds", type=parse_kinds, default=KINDS,
                   help="all (default), loopback, or a comma-separated list of fault kinds")
    p.add_argument("--dir", type=Path, help="where logs and data go (default: a new temporary directory)")
    p.add_argument("--json", action="store_true", help="print the report as JSON after the table")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.settle <= 0 or args.rate <= 0:
        p.error("--minutes, --settle and --rate must be positive")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1 << 31)
    root = args.dir or Path(tempfile.mkdtemp(prefix=f"zbk-chaos-{seed}-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"chaos: seed {seed} (replay: --seed {seed}), {args.minutes:g} minutes of faults, in {root}", flush=True)
    cfg = ChaosConfig(seed=seed, fault_s=args.minutes * 60, settle_s=args.settle, rate_per_writer=args.rate,
                      kinds=args.kinds)
    report = run_chaos(cfg, root, log=lambda m: print(m, flush=True))
    if args.json:
        print(json.dumps(asdict(report), default=str, indent=1))
    return 0 if not report.failures() else 1


if __name__ == "__main__":
    sys.exit(main())
