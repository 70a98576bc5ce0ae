"""The clients of the seeded partition run (test_partition_run.py), run as a script inside a
host (``ip netns exec``) as :mod:`faults.partclient` is. Every ledger operation goes through
:class:`faults.recorded.RecordingClient` into this host's own history file, which the
checker reads afterwards; nothing here judges anything.

Commands (``--metadata URI`` first):

* ``writer --process NAME --seed N --history PATH``: ``--lanes`` lanes, each writing one
  ledger at a time: it creates a ledger (E3 WQ2 AQ2 or E3 WQ3 AQ2, chosen at random), appends
  a random number of entries with a random window of appends in flight (all lanes together at
  most ``--rate`` a second), then closes the ledger (most of the time) or leaves it open for
  the final recovery, and starts the next one. A ledger whose handle failed (fenced by the
  recoverer, or an ensemble change that could not reach etcd) is left as it is.
* ``reader --seed N --history PATH``: a tailing reader (process ``reader``) that follows every
  ledger it finds in the metadata store until the ledger closes, taking up a broken tail
  from the next entry as a new view; and a recoverer (process ``recoverer``, a client of its
  own) that every few seconds opens a ledger that is not closed with recovery, which fences
  its writer and closes it, and reads it whole.
* ``final --out PATH HISTORY...``: after healing, recovers (closes) every ledger the
  histories name that is not closed, and writes the final state (history.py's format).

``writer`` and ``reader`` print ``{"event": "started"}`` once running, and on a line ``stop``
on stdin (or at its end) stop starting operations, settle what is in flight within a bound,
and print ``{"event": "stopped", ...}`` with their counts. Every wait is bounded: an
operation that does not end in time is cancelled (recorded as indeterminate) or left without
a completion (indeterminate too), never waited for again.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import functools
import hashlib
import json
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any, cast

from faults.history import History, HistoryRecorder
from faults.recorded import RecordingClient, RecordingReader, RecordingWriter, final_state
from zbk.client.bookkeeper import AsyncBookKeeper
from zbk.client.handles import LedgerEntry
from zbk.config import ClientConfig
from zbk.errors import ZbkError

PASSWORD = b"partition-run"
# (ensemble, write quorum, ack quorum) of the writers' ledgers.
LEDGER_CONFIGS = ((3, 2, 2), (3, 3, 2))
# A silent bookie fails an add (and starts an ensemble change) after add_timeout_ms; reads
# fail over after speculative_read_ms.
CONFIG = ClientConfig(add_timeout_ms=2000, read_timeout_ms=2000, speculative_read_ms=300)
CALL_TIMEOUT_S = 60.0  # the longest one create, close, open or recovery may take
SETTLE_S = 60.0  # the longest a ledger's adds in flight are waited for
ENTRIES_MIN, ENTRIES_MAX = 50, 400  # appends per ledger
WINDOWS = (1, 4, 16, 32)  # appends in flight per ledger
PAYLOAD_MIN, PAYLOAD_MAX = 32, 2048  # bytes
CLOSE_SHARE = 0.75  # ledgers the writer closes; the others stay open for a recovery
RETRY_S = (0.5, 2.0)  # pause after a failed create
TAILS_MAX = 64
TAIL_POLL_MS = 500
TAIL_RESTART_S = 1.0
SCAN_S = 1.0  # how often the reader lists the ledgers
RECOVER_EVERY_S = (5.0, 12.0)
RECOVER_PICKS = 5  # ledgers looked at per recovery, to find one that is not closed
EXECUTOR_THREADS = 32  # metadata calls block a thread each, up to etcd's deadline


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def payload(process: str, ledger: int, entry: int, length: int) -> bytes:
    """Unique to (writer, ledger, entry), ``length`` bytes or the header's length."""
    head = f"{process} ledger {ledger} entry {entry} ".encode()
    body = hashlib.sha256(head).digest()
    return (head + body * (length // len(body) + 1))[:max(length, len(head))]


def stop_on_stdin(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    """Set ``stop`` on a line ``stop`` or at the end of stdin (the test is gone)."""
    def run() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=run, name="stdin", daemon=True).start()


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Sleep ``seconds``, or less if ``stop`` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def closing(it: AsyncIterator[LedgerEntry]) -> contextlib.aclosing[AsyncGenerator[LedgerEntry, None]]:
    """``async with`` that closes the recording reader's generator at once, not when the
    garbage collector gets to it (it records the step it was in)."""
    return contextlib.aclosing(cast(AsyncGenerator[LedgerEntry, None], it))


def setup_loop() -> asyncio.Event:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(EXECUTOR_THREADS))
    stop = asyncio.Event()
    stop_on_stdin(loop, stop)
    return stop


# --- writer ----------------------------------------------------------------------------------

class Writer:
    def __init__(self, client: RecordingClient, rng: random.Random, stop: asyncio.Event, rate: float) -> None:
        self.client = client
        self.rng = rng
        self.stop = stop
        self.interval_s = 1.0 / rate
        self.next_at = time.monotonic()
        self.counts: Counter[str] = Counter()

    async def lane(self) -> None:
        while not self.stop.is_set():
            ensemble, wq, aq = self.rng.choice(LEDGER_CONFIGS)
            try:
                lh = await asyncio.wait_for(self.client.create_ledger(ensemble, wq, aq, password=PASSWORD),
                                            CALL_TIMEOUT_S)
            except (ZbkError, TimeoutError):
                self.counts["create_failed"] += 1
                await pause(self.stop, self.rng.uniform(*RETRY_S))
                continue
            self.counts["created"] += 1
            await self.write(lh)

    async def _paced(self) -> None:
        """Wait for this host's next append slot (every lane shares the rate)."""
        now = time.monotonic()
        at = max(self.next_at, now)
        self.next_at = at + self.interval_s
        if at > now:
            await pause(self.stop, at - now)

    async def write(self, lh: RecordingWriter) -> None:
        h = lh.handle
        target = self.rng.randint(ENTRIES_MIN, ENTRIES_MAX)
        window = self.rng.choice(WINDOWS)
        inflight: set[asyncio.Future[int]] = set()
        sent = 0
        while sent < target and not self.stop.is_set() and h.failed is None:
            await self._paced()
            while len(inflight) >= window and not self.stop.is_set():
                await asyncio.wait(inflight, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            if self.stop.is_set():
                break
            eid = h.next_entry_id
            try:
                fut = lh.append(payload(self.client.process, lh.ledger_id, eid,
                                        self.rng.randint(PAYLOAD_MIN, PAYLOAD_MAX)))
            except ZbkError:
                self.counts["append_refused"] += 1
                break
            inflight.add(fut)
            fut.add_done_callback(inflight.discard)
            sent += 1
        self.counts["appended"] += sent
        if inflight:
            _, unsettled = await asyncio.wait(inflight, timeout=SETTLE_S)
            self.counts["unsettled"] += len(unsettled)
            if unsettled:
                return  # the handle is stuck: leave the ledger to the final recovery
        if h.failed is not None:
            self.counts["handle_failed"] += 1
            return
        if self.rng.random() >= CLOSE_SHARE:
            self.counts["left_open"] += 1
            return
        try:
            await asyncio.wait_for(lh.close(), CALL_TIMEOUT_S)
            self.counts["closed"] += 1
        except (ZbkError, TimeoutError):
            self.counts["close_failed"] += 1


async def run_writer(uri: str, process: str, seed: int, history: Path, lanes: int, rate: float) -> None:
    stop = setup_loop()
    rng = random.Random(f"{seed}/{process}")
    bk = await AsyncBookKeeper(uri, config=CONFIG).start()
    rec = HistoryRecorder(history)
    writer = Writer(RecordingClient(bk, rec, process), rng, stop, rate)
    t0 = time.monotonic()
    emit({"event": "started", "process": process})
    await asyncio.gather(*(writer.lane() for _ in range(lanes)))
    rec.close()
    emit({"event": "stopped", "process": process, "after_s": round(time.monotonic() - t0, 1),
          "pending": rec.pending, "counts": dict(writer.counts)})
    await bk.close()


# --- reader and recoverer ----------------------------------------------------------------------

class Reader:
    def __init__(self, client: RecordingClient, stop: asyncio.Event) -> None:
        self.client = client
        self.stop = stop
        self.next: dict[int, int] = {}  # ledger -> the entry its next tail starts at
        self.ended: set[int] = set()  # tailed to the close
        self.tails: dict[int, asyncio.Task[None]] = {}
        self.broke_at: dict[int, float] = {}
        self.counts: Counter[str] = Counter()

    async def run(self) -> None:
        while not self.stop.is_set():
            try:
                ids = await asyncio.wait_for(self.client.bk.list_ledgers(), CALL_TIMEOUT_S)
            except (ZbkError, TimeoutError):
                self.counts["scan_failed"] += 1
                ids = []
            now = time.monotonic()
            for lid in sorted(ids):
                if (lid in self.ended or lid in self.tails or len(self.tails) >= TAILS_MAX
                        or now - self.broke_at.get(lid, -TAIL_RESTART_S) < TAIL_RESTART_S):
                    continue
                task = asyncio.create_task(self.tail(lid))
                self.tails[lid] = task
                task.add_done_callback(functools.partial(self._forget, lid))
            await pause(self.stop, SCAN_S)
        tails = list(self.tails.values())
        for task in tails:
            task.cancel()
        if tails:
            await asyncio.wait(tails, timeout=CALL_TIMEOUT_S)

    def _forget(self, lid: int, _task: asyncio.Task[None]) -> None:
        self.tails.pop(lid, None)

    async def tail(self, lid: int) -> None:
        try:
            rh: RecordingReader = await asyncio.wait_for(
                self.client.open_ledger(lid, password=PASSWORD, recovery=False), CALL_TIMEOUT_S)
            self.counts["views"] += 1
            async with closing(rh.tail(self.next.get(lid, 0), poll_timeout_ms=TAIL_POLL_MS)) as steps:
                async for e in steps:
                    self.next[lid] = e.entry_id + 1
                    self.counts["entries"] += 1
            self.ended.add(lid)
        except (ZbkError, TimeoutError):
            self.counts["tail_broke"] += 1
            self.broke_at[lid] = time.monotonic()


class Recoverer:
    def __init__(self, client: RecordingClient, rng: random.Random, stop: asyncio.Event) -> None:
        self.client = client
        self.rng = rng
        self.stop = stop
        self.closed: set[int] = set()  # ledgers seen closed: not worth a recovery
        self.counts: Counter[str] = Counter()

    async def run(self) -> None:
        while not self.stop.is_set():
            await pause(self.stop, self.rng.uniform(*RECOVER_EVERY_S))
            if self.stop.is_set():
                break
            try:
                lid = await self.pick()
                if lid is None:
                    continue
                await asyncio.wait_for(self.recover(lid), CALL_TIMEOUT_S)
                self.counts["recovered"] += 1
            except (ZbkError, TimeoutError):
                self.counts["failed"] += 1

    async def pick(self) -> int | None:
        bk = self.client.bk
        ids = sorted(set(await asyncio.wait_for(bk.list_ledgers(), CALL_TIMEOUT_S)) - self.closed)
        for lid in self.rng.sample(ids, min(RECOVER_PICKS, len(ids))):
            md = await asyncio.wait_for(bk.ledger_metadata(lid), CALL_TIMEOUT_S)
            if not md.is_closed:
                return lid
            self.closed.add(lid)
        return None

    async def recover(self, lid: int) -> None:
        rh = await self.client.open_ledger(lid, password=PASSWORD, recovery=True)
        self.closed.add(lid)
        last = rh.handle.md.last_entry_id
        if last >= 0:
            async with closing(rh.read(0, last)) as entries:
                async for _ in entries:
                    self.counts["entries"] += 1


async def run_reader(uri: str, seed: int, history: Path) -> None:
    stop = setup_loop()
    rng = random.Random(f"{seed}/recoverer")
    rec = HistoryRecorder(history)
    reader_bk = await AsyncBookKeeper(uri, config=CONFIG).start()
    recoverer_bk = await AsyncBookKeeper(uri, config=CONFIG).start()
    reader = Reader(RecordingClient(reader_bk, rec, "reader"), stop)
    recoverer = Recoverer(RecordingClient(recoverer_bk, rec, "recoverer"), rng, stop)
    t0 = time.monotonic()
    emit({"event": "started", "process": "reader"})
    await asyncio.gather(reader.run(), recoverer.run())
    rec.close()
    emit({"event": "stopped", "process": "reader", "after_s": round(time.monotonic() - t0, 1),
          "pending": rec.pending, "counts": dict(reader.counts),
          "recoverer": dict(recoverer.counts), "ended": len(reader.ended)})
    await reader_bk.close()
    await recoverer_bk.close()


# --- the final state -------------------------------------------------------------------------

FINAL_ATTEMPTS = 3
FINAL_RETRY_S = 5.0


async def run_final(uri: str, out: Path, histories: list[Path]) -> None:
    ids = History.load(histories).ledgers()
    errors: list[str] = []
    t0 = time.monotonic()
    async with AsyncBookKeeper(uri, config=CONFIG) as bk:
        for attempt in range(FINAL_ATTEMPTS):
            try:
                final = await final_state(bk, ids, password=PASSWORD, recover=True)
                break
            except ZbkError as e:  # e.g. etcd still electing a leader after healing
                errors.append(f"{type(e).__name__}: {e}")
                if attempt + 1 == FINAL_ATTEMPTS:
                    raise
                await asyncio.sleep(FINAL_RETRY_S)
    final.save(out)
    emit({"event": "final", "ledgers": len(final.ledgers), "named": len(ids), "errors": errors,
          "after_s": round(time.monotonic() - t0, 1)})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--metadata", required=True)
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("writer")
    w.add_argument("--process", required=True)
    w.add_argument("--seed", type=int, required=True)
    w.add_argument("--history", type=Path, required=True)
    w.add_argument("--lanes", type=int, default=2)
    w.add_argument("--rate", type=float, default=40.0, help="appends a second, all lanes together")
    r = sub.add_parser("reader")
    r.add_argument("--seed", type=int, required=True)
    r.add_argument("--history", type=Path, required=True)
    f = sub.add_parser("final")
    f.add_argument("--out", type=Path, required=True)
    f.add_argument("histories", type=Path, nargs="+")
    a = p.parse_args()
    if a.cmd == "writer":
        asyncio.run(run_writer(a.metadata, a.process, a.seed, a.history, a.lanes, a.rate))
    elif a.cmd == "reader":
        asyncio.run(run_reader(a.metadata, a.seed, a.history))
    else:
        asyncio.run(run_final(a.metadata, a.out, a.histories))


if __name__ == "__main__":
    main()
