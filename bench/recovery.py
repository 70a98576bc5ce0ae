"""Time to re-replicate a lost bookie's data, and the copy rate (docs/performance.md, "Re-replication").

    .venv/bin/python bench/recovery.py [--gib 1] [--bookies 4] [--entry-size 65536] [--json]

Starts N bookies (embedded metadata) and one `zbk autorecovery` process (delay 0,
replication rate unthrottled), writes ``--gib`` GiB of entries into E3/WQ2/AQ2 ledgers,
closes them, kills one bookie with SIGKILL and measures:

* time from the kill to fully replicated: no under-replication mark left and no ledger
  naming the dead bookie;
* entries and bytes the replicators copied (their metrics) and the copy rate, MB/s.

Every process it starts is stopped by PID (also on Ctrl-C; the run is bounded in time).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _procs  # noqa: E402

LEDGER_BYTES = 64 * 1024 * 1024  # one ledger per 64 MiB written


def metric(url: str, name: str) -> float:
    text = _procs.http_get(url)
    total = 0.0
    for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M):
        total += float(m.group(1))
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--bookies", type=int, default=4)
    ap.add_argument("--entry-size", type=int, default=65536)
    ap.add_argument("--workers", type=int, default=2, help="replicator workers")
    ap.add_argument("--registration-ttl", type=int, default=5,
                    help="bookies' registration_ttl_s: how long a kill -9'd bookie still looks alive")
    ap.add_argument("--max-seconds", type=float, default=1500)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    _procs.install_signal_handlers(args.max_seconds)

    import zbk
    from zbk.metadata import layout
    from zbk.metadata.registry import LedgerStore
    from zbk.metadata.uri import open_store

    total = int(args.gib * 1024**3)
    n_entries = total // args.entry_size
    per_ledger = max(1, LEDGER_BYTES // args.entry_size)
    payload = os.urandom(args.entry_size)
    with _procs.ZbkCluster(n=args.bookies, settings={"registration_ttl_s": args.registration_ttl}) as cluster:
        assert cluster.root is not None
        ar_port = _procs.free_port()
        ar = _procs.start_process(
            [sys.executable, "-m", "zbk.cli.main", "autorecovery", "--metadata", cluster.metadata,
             "--http-port", str(ar_port), "--set", "lost_bookie_recovery_delay_s=0",
             "--set", f"replicator_workers={args.workers}", "--set", "replication_rate_bytes=10000000000"],
            cluster.root / "autorecovery.log")
        ar_metrics = f"http://127.0.0.1:{ar_port}/metrics"
        try:
            t0 = time.monotonic()
            lids: list[int] = []
            with zbk.BookKeeper(cluster.metadata) as bk:
                written = 0
                while written < n_entries:
                    lh = bk.create_ledger(3, 2, 2, password=b"bench")
                    n = min(per_ledger, n_entries - written)
                    futs = [lh.append_async(payload) for _ in range(n)]
                    for f in futs:
                        f.result(120)
                    lh.close()
                    lids.append(lh.ledger_id)
                    written += n
            write_s = time.monotonic() - t0
            store = open_store(cluster.metadata)
            ledgers = LedgerStore(store)
            victim = cluster.bookies[0]
            named = [lid for lid in lids if victim.bookie_id in ledgers.read(lid)[0].all_bookies()]
            for _ in range(100):  # the autorecovery process is up (it had the whole write to start)
                try:
                    metric(ar_metrics, "zbk_auditor_is_leader")
                    break
                except OSError:
                    time.sleep(0.1)
            t_kill = time.monotonic()
            assert victim.proc is not None
            _procs.stop_process(victim.proc, sig=9)
            deadline = t_kill + args.max_seconds
            t_marked = None
            while True:
                marks = store.list(layout.UNDERREPLICATED_LEDGERS)
                if marks and t_marked is None:
                    t_marked = time.monotonic()
                left = [lid for lid in named if victim.bookie_id in ledgers.read(lid)[0].all_bookies()]
                if not marks and not left:
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"not replicated after {args.max_seconds} s: {len(left)} ledgers left")
                time.sleep(0.2)
            took = time.monotonic() - t_kill
            copy_s = max(1e-3, time.monotonic() - (t_marked or t_kill))
            copied = metric(ar_metrics, "zbk_replicator_entries_copied_total")
            store.close()
        finally:
            _procs.stop_process(ar)
    copied_bytes = copied * args.entry_size
    result = {
        "gib_written": round(n_entries * args.entry_size / 1024**3, 3), "entry_size": args.entry_size,
        "ledgers": len(lids), "ledgers_on_dead_bookie": len(named), "write_seconds": round(write_s, 1),
        "write_mb_per_s": round(n_entries * args.entry_size / write_s / 1e6, 1),
        "kill_to_fully_replicated_seconds": round(took, 1),
        # Detection: the dead bookie's registration lives until its lease expires
        # (registration_ttl_s), then the auditor marks its ledgers (delay 0).
        "kill_to_marked_seconds": round((t_marked or t_kill) - t_kill, 1),
        "marked_to_replicated_seconds": round(copy_s, 1), "entries_copied": int(copied),
        "mb_copied": round(copied_bytes / 1e6, 1), "copy_mb_per_s": round(copied_bytes / copy_s / 1e6, 1),
        "bookies": args.bookies, "replicator_workers": args.workers, "registration_ttl_s": args.registration_ttl, "load": _procs.loadavg(),
        "git": _procs.git_rev(),
    }
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:34} {v}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.TimeoutExpired as e:
        sys.exit(f"timed out: {e}")
