"""A zbk client run as a script inside a host of a fault test (``ip netns exec``), so that
the test process itself never joins a namespace. It reports on stdout, one JSON object a
line; the test drives its phases through stdin.

Commands (``--metadata URI`` first):

* ``wait BOOKIE_ID...``: until the metadata store answers and every bookie is registered
  as writable; prints ``{"registered": [...]}``.
* ``registered``: prints ``{"registered": [...]}``, the writable bookies now.
* ``zombie-writer --before N --after M``: creates a ledger (E2 WQ2 AQ2), appends N entries,
  prints ``{"event": "ready", ...}`` with its ensemble, waits for a line on stdin (the test
  cuts the network meanwhile), appends M more, closes the ledger, reads it back with a fresh
  client, and prints ``{"event": "done", ...}``: what was acknowledged, what failed, the
  ledger's fragments, what the read returned, and which bookies are registered.
* ``read LEDGER_ID``: prints ``{"entries": {id: digest}, "last_entry_id": ...}``.

Entries are identified by the digest of their payload (:func:`digest`).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import sys
import time
from typing import Any

import zbk
from zbk.config import ClientConfig
from zbk.errors import ZbkError
from zbk.metadata.registry import list_bookies
from zbk.metadata.uri import open_store

PASSWORD = b"netns"
# Short timeouts: a silent (partitioned) bookie fails an add after add_timeout_ms, which is
# what starts the ensemble change; reads fail over after speculative_read_ms.
CONFIG = ClientConfig(add_timeout_ms=2000, read_timeout_ms=2000, speculative_read_ms=300)


def payload(i: int) -> bytes:
    return hashlib.sha256(f"entry {i}".encode()).digest() * 8


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def registered(uri: str) -> list[str]:
    store = open_store(uri)
    try:
        return [r.bookie_id for r in list_bookies(store)]
    finally:
        store.close()


def cmd_wait(uri: str, bookies: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            now = registered(uri)
            if set(bookies) <= set(now):
                emit({"registered": now})
                return
            last = now
        except Exception as e:  # noqa: BLE001 - etcd not up yet: retry until the deadline
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.2)
    raise SystemExit(f"not ready in {timeout_s} s: {last}")


def read_back(uri: str, ledger_id: int) -> dict[str, Any]:
    with zbk.BookKeeper(uri, config=CONFIG) as bk:
        rh = bk.open_ledger(ledger_id, password=PASSWORD)
        last = rh.last_add_confirmed
        entries = {} if last < 0 else {e.entry_id: digest(e.payload) for e in rh.read(0, last)}
        return {"entries": entries, "last_entry_id": last}


def cmd_zombie_writer(uri: str, before: int, after: int) -> None:
    acked: dict[int, str] = {}
    failed: list[dict[str, Any]] = []
    with zbk.BookKeeper(uri, config=CONFIG) as bk:
        lh = bk.create_ledger(2, 2, 2, password=PASSWORD)
        for i in range(before):
            acked[lh.append(payload(i))] = digest(payload(i))
        emit({"event": "ready", "ledger_id": lh.ledger_id, "ensemble": list(lh.metadata.last_ensemble)})
        sys.stdin.readline()
        t0 = time.monotonic()
        futs = [(i, lh.append_async(payload(i))) for i in range(before, before + after)]
        longest = 0.0
        for i, f in futs:
            try:
                eid = f.result(120)
                acked[eid] = digest(payload(i))
            except (ZbkError, concurrent.futures.TimeoutError) as e:
                failed.append({"index": i, "error": f"{type(e).__name__}: {e}"})
            longest = max(longest, time.monotonic() - t0)
        fragments = [[first, list(bookies)] for first, bookies in lh.metadata.fragments]
        lh.close()
        closed_last = lh.metadata.last_entry_id
    back = read_back(uri, lh.ledger_id)
    emit({"event": "done", "ledger_id": lh.ledger_id, "acked": acked, "failed": failed,
          "fragments": fragments, "closed_last_entry_id": closed_last, "append_s": longest,
          "read": back["entries"], "registered": registered(uri)})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--metadata", required=True)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("wait")
    w.add_argument("bookies", nargs="*")
    w.add_argument("--timeout", type=float, default=60.0)
    sub.add_parser("registered")
    z = sub.add_parser("zombie-writer")
    z.add_argument("--before", type=int, default=50)
    z.add_argument("--after", type=int, default=200)
    r = sub.add_parser("read")
    r.add_argument("ledger_id", type=int)
    a = p.parse_args()
    if a.cmd == "wait":
        cmd_wait(a.metadata, a.bookies, a.timeout)
    elif a.cmd == "registered":
        emit({"registered": registered(a.metadata)})
    elif a.cmd == "zombie-writer":
        cmd_zombie_writer(a.metadata, a.before, a.after)
    else:
        emit(read_back(a.metadata, a.ledger_id))


if __name__ == "__main__":
    main()
