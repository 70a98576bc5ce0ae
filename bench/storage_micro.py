"""Microbenchmark of the storage hot paths: per-operation costs on the machine it runs on.

    .venv/bin/python bench/storage_micro.py [--dir DIR] [--n N] [--only NAME ...]

The directory should be on the disk a bookie would use (fsync costs depend on it).

``index-flush``: a checkpoint's index flush with ``--ledgers`` ledgers (default 10,000)
holding one new entry each, made durable by one syncfs per file system (the default) and
by an fsync per index file, alternating for ``--rounds`` rounds: wall time and the whole
machine's busy CPU (/proc/stat: a syncfs's writeback runs in kernel threads, which the
process's own CPU time would not show), medians with min-max.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _procs import machine_cpu_ticks  # noqa: E402

from zbk.storage.disk import SYNCFS_REPORTS_ERRORS
from zbk.storage.entrylog import EntryLogWriter
from zbk.storage.journal import JournalWriter, RecordType, replay
from zbk.storage.ledgercache import LedgerCache

PAYLOAD = os.urandom(1024)


def per_op(label: str, n: int, fn: Callable[[], object], unit: str = "op") -> None:
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    print(f"{label:<48} {dt / n * 1e6:9.2f} us/{unit}")


def bench_journal(root: str, n: int) -> None:
    d = os.path.join(root, "journal")
    w = JournalWriter(d)
    add = RecordType.ADD

    def appends() -> None:
        for i in range(n):
            if w.append(add, 1, i, PAYLOAD) >= 512 * 1024:
                w.sync(fsync=False)  # as the actor does at the group-bytes threshold

    per_op("journal append (1 KiB; write() per 512 KiB, no fsync)", n, appends)
    w.sync()

    def group_commits() -> None:
        for _ in range(20):
            for i in range(1000):
                w.append(add, 1, i, PAYLOAD)
            w.sync()

    per_op("journal sync of 1000 x 1 KiB (write + fsync)", 20, group_commits, "sync")

    def tiny_syncs() -> None:
        for i in range(200):
            w.append(RecordType.FENCE, i)
            w.sync()

    per_op("journal sync of 1 FENCE record", 200, tiny_syncs, "sync")
    w.close()
    total = n + 20 * 1000 + 200
    per_op("journal replay", total, lambda: sum(1 for _ in replay(d)), "record")


def bench_entrylog(root: str, n: int) -> None:
    w = EntryLogWriter([os.path.join(root, "ledgers")])
    locations: list[int] = []

    def appends() -> None:
        for i in range(n):
            locations.append(w.append(1, i, PAYLOAD))

    per_op("entrylog append (1 KiB, 64 KiB write buffer)", n, appends)

    def reads() -> None:
        for i, location in enumerate(locations):
            w.read(location, 1, i)

    per_op("entrylog read (page cache, crc checked)", n, reads)

    def range_reads() -> None:  # what a ranged READ_ENTRY of 4,096 entries asks of the log
        for first in range(0, n, 4096):
            batch = w.read_entries(1, range(first, first + 4096), locations[first:first + 4096], 8 << 20)
            assert batch.error is None

    per_op("entrylog read_entries, 4,096 per call (runs)", n, range_reads, "entry")
    per_op("entrylog flush after appends (write + fsync)", 1, w.flush, "flush")
    w.close()


def bench_cache(root: str, n: int) -> None:
    c = LedgerCache([os.path.join(root, "index")])

    def puts() -> None:
        for i in range(n):
            c.put(i % 16, i, (1 << 40) | (24 + i))

    per_op("ledger cache put", n, puts)

    def gets() -> None:
        for i in range(n):
            c.get(i % 16, i)

    per_op("ledger cache get (memory)", n, gets)

    def range_gets() -> None:  # ledger 0 holds every 16th entry: a sparse range
        for first in range(0, n, 4096):
            c.get_range(0, first, 4096)

    per_op("ledger cache get_range, 4,096 slots (1 in 16 held)", n, range_gets, "slot")
    pages = c.dirty_bytes // (16 * 1024)
    per_op(f"ledger cache flush ({pages} dirty pages, 16 files)", pages, c.flush, "page")
    c.close()
    c = LedgerCache([os.path.join(root, "index")])
    per_op("ledger cache get (cold: page read from file)", n, gets)
    c.close()


def _machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy since boot (/proc/stat, all CPUs)."""
    ticks = machine_cpu_ticks()
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # minus idle and iowait


def bench_index_flush(root: str, ledgers: int, rounds: int) -> None:
    caches = {}
    for mode in ("syncfs", "fsync"):
        c = caches[mode] = LedgerCache([os.path.join(root, f"index-{mode}")], 256 << 20, syncfs=mode == "syncfs")
        for ledger_id in range(ledgers):
            c.set_master_key(ledger_id, b"k" * 20)
            c.put(ledger_id, 0, (1 << 40) | (24 + ledger_id))
        c.flush()  # creates the files
    if not SYNCFS_REPORTS_ERRORS:
        print("index flush: this kernel's syncfs does not report writeback errors: both modes fsync")
    results: dict[str, list[tuple[float, float]]] = {"syncfs": [], "fsync": []}
    for rnd in range(1, rounds + 1):
        for mode in (("syncfs", "fsync") if rnd % 2 else ("fsync", "syncfs")):
            c = caches[mode]
            for ledger_id in range(ledgers):
                c.put(ledger_id, rnd, (1 << 40) | (24 + rnd * ledgers + ledger_id))
            os.sync()  # nothing else dirty on the file system when the flush starts
            busy0, t0 = _machine_busy_s(), time.perf_counter()
            c.flush()
            results[mode].append((time.perf_counter() - t0, _machine_busy_s() - busy0))
    for mode, runs in results.items():
        walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
        print(f"index flush, {ledgers:,} ledgers, {mode:<6}: wall {statistics.median(walls):.3f} s "
              f"({min(walls):.3f}-{max(walls):.3f}), machine CPU {statistics.median(cpus):.3f} s "
              f"({min(cpus):.3f}-{max(cpus):.3f})")
    for c in caches.values():
        c.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--n", type=int, default=100_000, help="operations per measurement")
    parser.add_argument("--only", action="append", choices=["journal", "entrylog", "cache", "index-flush"],
                        help="run only this part (repeatable; default: all)")
    parser.add_argument("--ledgers", type=int, default=10_000, help="index-flush: dirty ledgers per flush")
    parser.add_argument("--rounds", type=int, default=5, help="index-flush: flushes per mode")
    args = parser.parse_args()
    only = set(args.only or ["journal", "entrylog", "cache", "index-flush"])
    root = tempfile.mkdtemp(prefix="zbk-bench-", dir=args.dir)
    try:
        if "journal" in only:
            bench_journal(root, args.n)
        if "entrylog" in only:
            bench_entrylog(root, args.n)
        if "cache" in only:
            bench_cache(root, args.n)
        if "index-flush" in only:
            bench_index_flush(root, args.ledgers, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
