"""Clients for the partition tests, run as a script inside a host (``ip netns exec``), as
:mod:`faults.zbkclient` is. Each reports on stdout, one JSON object a line; a session reads
its commands on stdin, one a line, and answers each with one line (a ``stream`` also
announces with a ``streaming`` line that it is under way).

Every count and every wait is bounded, so that no command can hang a test: a future not
completed in time is reported as ``pending`` (indeterminate), never waited for again.

Payloads are a function of (ledger, index): :func:`payload`; an acknowledged entry is
recorded as ``{entry id: digest of the payload sent}`` and checked against what reads back.

Commands (``--metadata URI`` first, ``--add-timeout-ms`` optional):

* ``writer --ensemble E --wq W --aq A --before N``: creates a ledger, appends N entries one
  by one, prints ``{"event": "ready", ...}``, then serves these commands on stdin:

  - ``append K``: K appends one by one, stopping at the first failure;
  - ``inflight K SECONDS``: K appends at once, then waits up to SECONDS for all of them;
  - ``stream MAX SECONDS WINDOW RATE SIGNAL``: appends with up to WINDOW in flight and at
    most RATE a second until one fails, MAX were sent or SECONDS passed; prints
    ``{"event": "streaming"}`` once SIGNAL of them were acknowledged, and
    ``{"event": "ensemble-change", ...}`` whenever the ledger gains a fragment;
  - ``close``: closes the ledger; ``exit``.

  Each answer carries ``acked`` (entry id -> digest), ``failed`` (index, error type, code),
  ``pending`` (indexes not completed in time) and the handle's fragments.
* ``recover LEDGER_ID``: opens the ledger with recovery (fences and closes it), then reads
  it whole; prints how long the recovery took, where it closed, and every entry's digest.
* ``churn --ensemble E --wq W --aq A``: many ledgers, commands on stdin:

  - ``open K N``: creates K ledgers and appends N entries to each (they stay open);
  - ``append N``: N more to every open ledger whose handle has not failed;
  - ``create K N``: creates K ledgers, appends N to each and closes them;
  - ``close``: closes every open ledger; ``exit``.

  Appends go out to every ledger at once (pipelined) and are waited for within a bound.
* ``readall LEDGER_ID...``: opens each ledger with recovery and reads it whole.
* ``registry``: watches bookie registrations, commands on stdin: ``gone BOOKIE_ID SECONDS``
  and ``back BOOKIE_ID SECONDS`` poll every 0.1 s until the bookie is unregistered (or
  registered again), and answer how long that took from the command (null: not in time).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import sys
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import zbk
from zbk.client.sync import SyncLedgerHandle
from zbk.config import ClientConfig
from zbk.errors import ZbkError
from zbk.metadata.registry import list_bookies
from zbk.metadata.uri import open_store

PASSWORD = b"partition"
WAIT_S = 30.0  # the longest a command waits for one future
POLL_S = 0.1


def payload(ledger: int, index: int) -> bytes:
    return hashlib.sha256(f"ledger {ledger} entry {index}".encode()).digest() * 8


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def error(index: int, e: BaseException) -> dict[str, Any]:
    return {"index": index, "error": type(e).__name__, "code": getattr(e, "code", None), "message": str(e)[:300]}


def config(add_timeout_ms: int) -> ClientConfig:
    # Reads fail over after speculative_read_ms; a silent bookie fails an add (and starts an
    # ensemble change) after add_timeout_ms.
    return ClientConfig(add_timeout_ms=add_timeout_ms, read_timeout_ms=2000, speculative_read_ms=300)


def fragments(lh: Any) -> list[list[Any]]:
    return [[first, list(bookies)] for first, bookies in lh.metadata.fragments]


@dataclass
class Ledger:
    """One ledger this client writes: what it sent and what came of it."""

    lh: SyncLedgerHandle
    next_index: int = 0
    acked: dict[int, str] = field(default_factory=dict)
    failed: list[dict[str, Any]] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)  # indeterminate: no answer in time
    closed_last: int | None = None
    close_error: str | None = None

    @property
    def ledger_id(self) -> int:
        return self.lh.ledger_id

    def send(self) -> tuple[int, concurrent.futures.Future[int]]:
        i = self.next_index
        self.next_index += 1
        return i, self.lh.append_async(payload(self.ledger_id, i))

    def settle(self, i: int, fut: concurrent.futures.Future[int], deadline: float) -> bool:
        """Record the outcome of append ``i``; False if it failed or did not complete."""
        try:
            eid = fut.result(max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            self.pending.append(i)
            return False
        except ZbkError as e:
            self.failed.append(error(i, e))
            return False
        # One writer, entry ids in call order: entry i is append i. Recorded as sent, so
        # that a mismatch shows as a wrong payload in the test, not as a crash here.
        self.acked[eid] = digest(payload(self.ledger_id, i))
        return True

    def report(self) -> dict[str, Any]:
        return {"ledger_id": self.ledger_id, "acked": self.acked, "failed": self.failed, "pending": self.pending,
                "sent": self.next_index, "fragments": fragments(self.lh), "closed_last": self.closed_last,
                "close_error": self.close_error}

    def close(self) -> None:
        try:
            self.lh.close()
            self.closed_last = self.lh.metadata.last_entry_id
        except ZbkError as e:
            self.close_error = f"{type(e).__name__}: {e}"


# --- writer ----------------------------------------------------------------------------------

def cmd_writer(uri: str, cfg: ClientConfig, ensemble: int, wq: int, aq: int, before: int) -> None:
    with zbk.BookKeeper(uri, config=cfg) as bk:
        led = Ledger(bk.create_ledger(ensemble, wq, aq, password=PASSWORD))
        deadline = time.monotonic() + WAIT_S
        for _ in range(before):
            i, fut = led.send()
            if not led.settle(i, fut, deadline):
                break
        emit({"event": "ready", "ensemble": list(led.lh.metadata.last_ensemble), **led.report()})
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "exit":
                break
            t0 = time.monotonic()
            base = (len(led.acked), len(led.failed), len(led.pending), led.next_index)
            extra: dict[str, Any] = {}
            if words[0] == "append":
                for _ in range(int(words[1])):
                    i, fut = led.send()
                    if not led.settle(i, fut, time.monotonic() + WAIT_S):
                        break
            elif words[0] == "inflight":
                futs = [led.send() for _ in range(int(words[1]))]
                deadline = time.monotonic() + float(words[2])
                for i, fut in futs:
                    led.settle(i, fut, deadline)
            elif words[0] == "stream":
                extra = stream(led, int(words[1]), float(words[2]), int(words[3]), float(words[4]), int(words[5]))
            elif words[0] == "close":
                led.close()
            else:
                raise SystemExit(f"unknown command {line!r}")
            emit({"event": words[0], "elapsed_s": round(time.monotonic() - t0, 3),
                  "new": {"acked": len(led.acked) - base[0], "failed": len(led.failed) - base[1],
                          "pending": len(led.pending) - base[2], "sent": led.next_index - base[3]},
                  **extra, **led.report()})


def stream(led: Ledger, most: int, seconds: float, window: int, rate: float, signal_after: int) -> dict[str, Any]:
    """Appends with ``window`` in flight, ``rate`` a second at most, until one fails, ``most``
    were sent or ``seconds`` passed; then settles what is in flight (bounded). The rate
    bounds how much a test reads back, however long the stream waits for its end."""
    t0 = time.monotonic()
    stop_at = t0 + seconds
    inflight: deque[tuple[int, concurrent.futures.Future[int]]] = deque()
    sent = acked = 0
    signalled = stopping = False
    last_ack_s: float | None = None
    first_failure_s: float | None = None
    changes: list[float] = []
    n_fragments = len(led.lh.metadata.fragments)
    while True:
        while not stopping and sent < most and len(inflight) < window and time.monotonic() < stop_at:
            early = t0 + sent / rate - time.monotonic()
            if early > 0:
                if inflight:
                    break  # settle the oldest meanwhile
                time.sleep(early)
            inflight.append(led.send())
            sent += 1
        if not inflight:
            break
        i, fut = inflight.popleft()
        ok = led.settle(i, fut, time.monotonic() + WAIT_S)
        if len(led.lh.metadata.fragments) > n_fragments:
            n_fragments = len(led.lh.metadata.fragments)
            changes.append(round(time.monotonic() - t0, 3))
            emit({"event": "ensemble-change", "after_s": changes[-1], "fragments": fragments(led.lh)})
        if ok:
            acked += 1
            last_ack_s = time.monotonic() - t0
            if not signalled and acked >= signal_after:
                signalled = True
                emit({"event": "streaming", "acked": acked})
        else:
            if first_failure_s is None:
                first_failure_s = time.monotonic() - t0
            stopping = True  # send no more; settle what is in flight
    return {"streamed": sent, "stream_acked": acked, "last_ack_s": last_ack_s, "first_failure_s": first_failure_s,
            "ensemble_changes_s": changes}


# --- recoverer and readers -------------------------------------------------------------------

def read_whole(bk: zbk.BookKeeper, ledger_id: int) -> dict[str, Any]:
    t0 = time.monotonic()
    rh = bk.open_ledger(ledger_id, password=PASSWORD)  # with recovery: fences and closes
    opened_s = time.monotonic() - t0
    last = rh.last_add_confirmed
    entries = {} if last < 0 else {e.entry_id: digest(e.payload) for e in rh.read(0, last)}
    return {"ledger_id": ledger_id, "closed": rh.is_closed, "last_entry_id": last, "open_s": round(opened_s, 3),
            "fragments": [[first, list(b)] for first, b in rh.metadata.fragments], "entries": entries}


def cmd_recover(uri: str, cfg: ClientConfig, ledger_id: int) -> None:
    t0 = time.monotonic()
    with zbk.BookKeeper(uri, config=cfg) as bk:
        connected_s = time.monotonic() - t0
        out = read_whole(bk, ledger_id)
    emit({"connect_s": round(connected_s, 3), **out})


def cmd_readall(uri: str, cfg: ClientConfig, ledger_ids: Iterable[int]) -> None:
    ledgers = {}
    with zbk.BookKeeper(uri, config=cfg) as bk:
        for lid in ledger_ids:
            try:
                ledgers[lid] = read_whole(bk, lid)
            except ZbkError as e:
                ledgers[lid] = {"ledger_id": lid, "error": f"{type(e).__name__}: {e}"}
    emit({"ledgers": ledgers})


# --- churn -----------------------------------------------------------------------------------

def cmd_churn(uri: str, cfg: ClientConfig, ensemble: int, wq: int, aq: int) -> None:
    ledgers: dict[int, Ledger] = {}
    open_ids: list[int] = []
    with zbk.BookKeeper(uri, config=cfg) as bk:

        def create(k: int) -> tuple[list[Ledger], list[dict[str, Any]]]:
            made, errors = [], []
            for n in range(k):
                t0 = time.monotonic()
                try:
                    led = Ledger(bk.create_ledger(ensemble, wq, aq, password=PASSWORD))
                except ZbkError as e:
                    errors.append({**error(n, e), "after_s": round(time.monotonic() - t0, 3)})
                    continue
                ledgers[led.ledger_id] = led
                made.append(led)
            return made, errors

        def write(targets: list[Ledger], n: int) -> None:
            # A ledger that failed an append (fenced, say) is written no more.
            live = [led for led in targets if not led.failed and not led.pending]
            futs = [(led, *led.send()) for _ in range(n) for led in live]
            deadline = time.monotonic() + WAIT_S
            for led, i, fut in futs:
                led.settle(i, fut, deadline)

        emit({"event": "started"})
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "exit":
                break
            t0 = time.monotonic()
            errors: list[dict[str, Any]] = []
            touched: list[Ledger] = []
            if words[0] in ("open", "create"):
                touched, errors = create(int(words[1]))
                write(touched, int(words[2]))
                if words[0] == "open":
                    open_ids.extend(led.ledger_id for led in touched)
                else:
                    for led in touched:
                        led.close()
            elif words[0] == "append":
                touched = [ledgers[lid] for lid in open_ids]
                write(touched, int(words[1]))
            elif words[0] == "close":
                touched = [ledgers[lid] for lid in open_ids]
                for led in touched:
                    led.close()
                open_ids.clear()
            else:
                raise SystemExit(f"unknown command {line!r}")
            emit({"event": words[0], "elapsed_s": round(time.monotonic() - t0, 3), "create_errors": errors,
                  "ledgers": {led.ledger_id: led.report() for led in touched}})


# --- registry ------------------------------------------------------------------------------

def cmd_registry(uri: str) -> None:
    store = open_store(uri)
    try:
        emit({"event": "started", "registered": [r.bookie_id for r in list_bookies(store)]})
        for line in sys.stdin:
            words = line.split()
            if not words:
                continue
            if words[0] == "exit":
                break
            if words[0] not in ("gone", "back"):
                raise SystemExit(f"unknown command {line!r}")
            bookie, want = words[1], words[0] == "back"
            t0 = time.monotonic()
            deadline = t0 + float(words[2])
            after: float | None = None
            now: list[str] = []
            errors = 0
            while time.monotonic() < deadline:
                try:
                    now = [r.bookie_id for r in list_bookies(store)]
                except ZbkError:
                    errors += 1  # the store did not answer in its own deadline: poll again
                    continue
                if (bookie in now) == want:
                    after = round(time.monotonic() - t0, 3)
                    break
                time.sleep(POLL_S)
            emit({"event": words[0], "bookie": bookie, "after_s": after, "registered": now, "errors": errors})
    finally:
        store.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--metadata", required=True)
    p.add_argument("--add-timeout-ms", type=int, default=2000)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("writer", "churn"):
        s = sub.add_parser(name)
        s.add_argument("--ensemble", type=int, default=3)
        s.add_argument("--wq", type=int, default=2)
        s.add_argument("--aq", type=int, default=2)
        if name == "writer":
            s.add_argument("--before", type=int, default=20)
    sub.add_parser("recover").add_argument("ledger_id", type=int)
    sub.add_parser("readall").add_argument("ledger_ids", type=int, nargs="*")
    sub.add_parser("registry")
    a = p.parse_args()
    cfg = config(a.add_timeout_ms)
    if a.cmd == "writer":
        cmd_writer(a.metadata, cfg, a.ensemble, a.wq, a.aq, a.before)
    elif a.cmd == "churn":
        cmd_churn(a.metadata, cfg, a.ensemble, a.wq, a.aq)
    elif a.cmd == "recover":
        cmd_recover(a.metadata, cfg, a.ledger_id)
    elif a.cmd == "registry":
        cmd_registry(a.metadata)
    else:
        cmd_readall(a.metadata, cfg, a.ledger_ids)


if __name__ == "__main__":
    main()
