"""Helpers for the Spark tests: deterministic payloads, ledgers written and read with the
plain client (the reference a Spark read is compared against)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

from zbk.client.sync import BookKeeper, SyncLedgerHandle

T = TypeVar("T")
# Spark gives a Python worker it spawns directly (the streaming source runner, the read
# planner) a fixed 10 s to start and connect back. On a saturated machine importing
# pyspark can take longer; that failure is Spark's, not zbk's, and the cure is what an
# operator does: start the query again from its checkpoint.
WORKER_START_FAILED = "Python worker failed to connect back"


def payload(tag: str, entry: int, size: int = 200) -> bytes:
    """Distinct bytes per (tag, entry), of varying length around ``size``."""
    head = f"{tag}:{entry}:".encode()
    body = hashlib.sha256(head).digest() * (size // 32 + 2)
    return head + body[: size - len(head) + entry % 17]


def append_all(lh: SyncLedgerHandle, payloads: list[bytes]) -> None:
    """Pipelined appends, then one synchronous append so that every earlier entry is
    confirmed to readers (the LAC travels piggybacked on the next entry)."""
    futs = [lh.append_async(p) for p in payloads[:-1]]
    for f in futs:
        f.result()
    if payloads:
        lh.append(payloads[-1])


def client_read(bk: BookKeeper, ledger_id: int, password: bytes = b"") -> dict[tuple[int, int], bytes]:
    """What the plain client reads of a ledger, without recovery: 0..LAC (or last entry)."""
    rh = bk.open_ledger(ledger_id, password=password, recovery=False)
    end = rh.read_last_add_confirmed()
    if end < 0:
        return {}
    return {(ledger_id, e.entry_id): e.payload for e in rh.read(0, end)}


def wait_for(check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.3) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def worker_start_failed(err: BaseException | None) -> bool:
    return err is not None and WORKER_START_FAILED in str(err)


class RestartingQuery:
    """A streaming query restarted from its checkpoint (at most ``restarts_max`` times)
    when, and only when, Spark failed to start one of its Python workers."""

    def __init__(self, start: Callable[[], Any], restarts_max: int = 3) -> None:
        self._start = start
        self.restarts = 0
        self.restarts_max = restarts_max
        self.query = start()

    def check(self) -> None:
        if self.query.isActive:
            return
        err = self.query.exception()
        if worker_start_failed(err) and self.restarts < self.restarts_max:
            self.restarts += 1
            self.query = self._start()
            return
        if err is not None:
            raise AssertionError(f"the streaming query failed: {err}")

    def run_to_end(self, timeout_s: float) -> None:
        """For a query that ends by itself (Trigger.AvailableNow)."""
        while True:
            assert self.query.awaitTermination(timeout_s), f"the query did not finish in {timeout_s}s"
            err = self.query.exception()
            if worker_start_failed(err) and self.restarts < self.restarts_max:
                self.restarts += 1
                self.query = self._start()
                continue
            assert err is None, f"the streaming query failed: {err}"
            return

    def stop(self) -> None:
        self.query.stop()


def retry_worker_start(fn: Callable[[], T], attempts: int = 3) -> T:
    """Run an idempotent Spark action again if Spark failed to start a Python worker."""
    for attempt in range(attempts):
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - re-raised unless it is that one failure
            if not worker_start_failed(e) or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
