"""A zbk client for the clock-fault tests, run as a child process so that it can run on a
fake clock (faults.faketime) beside the bookies and auto-recovery processes: on the
embedded store every process that opens the file must share the host's clock, the test
process included, so the test process never opens it and asks this client instead.

``session --metadata URI``: reads commands on stdin, one a line, and answers each with one
JSON line (``{"error": ...}`` if the command failed):

* ``write K N E W A SEED``: creates K ledgers (ensemble E, write quorum W, ack quorum A),
  appends N entries to each (pipelined), closes them; answers ``{"ledgers": {id: acked}}``.
* ``verify SEED ID...``: for each ledger, its metadata and, for every bookie its fragments
  name, the entries assigned to that bookie that it does not serve intact: read from that
  bookie alone, digest checked, payload compared with :func:`payload`. Then the whole
  ledger read through the client. Answers ``{"ledgers": {id: {...}}}``.
* ``state``: the registered bookies, the auditor's leader and the under-replication marks.
* ``exit``.

Payloads are a function of (seed, ledger, index), so what a ledger must hold is known
without trusting any record of the writes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import traceback
from pathlib import Path
from typing import Any

import zbk
from zbk.config import ClientConfig
from zbk.errors import ZbkError
from zbk.metadata.coordination import current_leader
from zbk.metadata.registry import LedgerStore, list_bookies
from zbk.metadata.uri import open_store
from zbk.recovery.underreplication import UnderReplicationRegistry

# The session runs as a script (sys.path[0] is tests/faults): tests/ holds the shared check
# of what a bookie serves.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from recovery.replicas import unreadable_on  # noqa: E402

PASSWORD = b"clock"
CONFIG = ClientConfig(add_timeout_ms=3000, read_timeout_ms=2000, speculative_read_ms=300)


def payload(seed: int, ledger: int, index: int) -> bytes:
    return hashlib.sha256(f"{seed}/{ledger}/{index}".encode()).digest() * 8


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def write(bk: zbk.BookKeeper, ledgers: int, entries: int, e: int, wq: int, aq: int, seed: int) -> dict[str, Any]:
    out: dict[str, int] = {}
    for _ in range(ledgers):
        lh = bk.create_ledger(e, wq, aq, password=PASSWORD)
        futs = [lh.append_async(payload(seed, lh.ledger_id, i)) for i in range(entries)]
        assert [f.result(60) for f in futs] == list(range(entries))
        lh.close()
        out[str(lh.ledger_id)] = entries
    return {"ledgers": out}


def verify(bk: zbk.BookKeeper, store: Any, seed: int, ids: list[int]) -> dict[str, Any]:
    ledgers = LedgerStore(store)
    out: dict[str, Any] = {}
    for lid in ids:
        md, _ = ledgers.read(lid)
        replicas: dict[str, Any] = {}
        for b in sorted(md.all_bookies()):
            try:
                replicas[b] = unreadable_on(b, md, lambda e, lid=md.ledger_id: payload(seed, lid, e))
            except ZbkError as e:
                replicas[b] = f"{type(e).__name__}: {e}"
        rh = bk.open_ledger(lid, password=PASSWORD)
        read = [] if md.last_entry_id < 0 else list(rh.read(0, md.last_entry_id))
        wrong = [e.entry_id for e in read if e.payload != payload(seed, lid, e.entry_id)]
        out[str(lid)] = {"closed": md.is_closed, "last_entry_id": md.last_entry_id,
                         "fragments": [[first, list(b)] for first, b in md.fragments],
                         "bad_replicas": replicas, "read": len(read), "read_wrong": wrong}
    return {"ledgers": out}


def state(store: Any) -> dict[str, Any]:
    reg = UnderReplicationRegistry(store, "clockclient")
    return {"writable": sorted(r.bookie_id for r in list_bookies(store)),
            "readonly": sorted(r.bookie_id for r in list_bookies(store, readonly=True)),
            "leader": current_leader(store),
            "underreplicated": {str(m.ledger_id): list(m.missing_bookies) for m in reg.list()},
            "repairs": [[m.ledger_id, m.bookie_id, m.why] for m in reg.list_repairs()]}


def session(uri: str) -> None:
    store = open_store(uri)
    with zbk.BookKeeper(uri, config=CONFIG) as bk:
        emit({"event": "ready"})
        for line in sys.stdin:
            cmd, *args = line.split()
            try:
                if cmd == "exit":
                    break
                if cmd == "write":
                    k, n, e, wq, aq, seed = (int(a) for a in args)
                    emit(write(bk, k, n, e, wq, aq, seed))
                elif cmd == "verify":
                    emit(verify(bk, store, int(args[0]), [int(a) for a in args[1:]]))
                elif cmd == "state":
                    emit(state(store))
                else:
                    emit({"error": f"unknown command {cmd!r}"})
            except Exception as e:  # noqa: BLE001 - reported to the test, which decides
                emit({"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]})
    store.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["session"])
    p.add_argument("--metadata", required=True)
    a = p.parse_args()
    session(a.metadata)


if __name__ == "__main__":
    main()
