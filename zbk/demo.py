"""The README's main job: a sample workload through the client library.

Run it against a running cluster, e.g. `zbk sandbox` in another terminal (same directory):

    python -m zbk.demo                      # metadata of ./zbk-sandbox
    python -m zbk.demo --metadata sqlite:///tmp/c/meta.db --entries 100000

It writes 1 KiB entries into a few ledgers (ensemble 3, write quorum 2, ack quorum 2),
closes them, reopens each with recovery (as a new reader would after a writer's crash),
reads every entry back, checks every byte, and prints the throughput and the metadata.
scripts/demo.sh starts a sandbox, runs this, and stops the sandbox.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import zbk
from zbk.metadata.registry import list_bookies
from zbk.metadata.uri import open_store

PASSWORD = b"demo"


def wait_for_bookies(uri: str, count: int, timeout_s: float) -> None:
    """Block until ``count`` bookies are registered as writable, then list them."""
    store = open_store(uri)
    try:
        deadline = time.monotonic() + timeout_s
        while len(bookies := list_bookies(store)) < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"demo: only {len(bookies)} of {count} bookies registered after {timeout_s:.0f} s")
            time.sleep(0.2)
    finally:
        store.close()
    print(f"cluster: metadata {uri}")
    for b in bookies:
        print(f"  bookie {b.bookie_id}  metrics {b.http_url}/metrics")


def payload(ledger_id: int, entry_id: int, filler: bytes) -> bytes:
    """Every entry differs (its ids lead), so a misplaced entry cannot pass the check."""
    return f"{ledger_id:08d}:{entry_id:08d}:".encode() + filler


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"demo: FAILED: {what}")


def rate(count: int, size: int, seconds: float) -> str:
    return f"{count:,} entries in {seconds:.2f} s: {count / seconds:,.0f} entries/s, {count * size / seconds / 1e6:.1f} MB/s"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metadata", default=f"sqlite:///{os.path.abspath('zbk-sandbox')}/meta.db")
    ap.add_argument("--bookies", type=int, default=3, help="wait until this many bookies are up")
    ap.add_argument("--ledgers", type=int, default=4)
    ap.add_argument("--entries", type=int, default=20_000, help="entries in all (spread over the ledgers)")
    ap.add_argument("--entry-size", type=int, default=1024)
    args = ap.parse_args(argv)
    wait_for_bookies(args.metadata, args.bookies, timeout_s=60)
    filler = os.urandom(args.entry_size - len(payload(0, 0, b"")))
    per_ledger = args.entries // args.ledgers
    total = per_ledger * args.ledgers

    with zbk.BookKeeper(args.metadata) as bk:
        # Write: every append is pipelined; each future resolves to the entry id once two
        # of the entry's bookies have fsynced it.
        t0 = time.perf_counter()
        ledgers = [bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PASSWORD,
                                    custom_metadata={"app": b"demo"}) for _ in range(args.ledgers)]
        futures = [(lh, [lh.append_async(payload(lh.ledger_id, e, filler)) for e in range(per_ledger)])
                   for lh in ledgers]
        for lh, futs in futures:
            check([f.result() for f in futs] == list(range(per_ledger)), f"ledger {lh.ledger_id}: entry ids out of order")
            lh.close()
        print(f"wrote {rate(total, args.entry_size, time.perf_counter() - t0)}")

        # Read: open with recovery (fences the ledger, settles its last entry), read it all back.
        t0 = time.perf_counter()
        for lh in ledgers:
            rh = bk.open_ledger(lh.ledger_id, password=PASSWORD)
            check(rh.is_closed and rh.last_add_confirmed == per_ledger - 1,
                  f"ledger {lh.ledger_id} recovered to entry {rh.last_add_confirmed}, expected {per_ledger - 1}")
            count = 0
            for e in rh.read(0, rh.last_add_confirmed):
                check(e.entry_id == count and e.payload == payload(lh.ledger_id, count, filler),
                      f"ledger {lh.ledger_id} entry {count}: wrong entry or bytes")
                count += 1
            check(count == per_ledger, f"ledger {lh.ledger_id}: read {count} entries, expected {per_ledger}")
        print(f"read back and verified {rate(total, args.entry_size, time.perf_counter() - t0)}")

        for lh in ledgers:
            md = bk.ledger_metadata(lh.ledger_id)
            print(f"  ledger {lh.ledger_id}: {md.state}, entries 0..{md.last_entry_id}, {md.length:,} bytes, "
                  f"E{md.ensemble_size} WQ{md.write_quorum} AQ{md.ack_quorum}, ensembles {md.ensembles}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
