"""A writer at full speed through the failure of a bookie of its ensemble, on real bookie
processes: kill -9 (its connections close) and SIGSTOP (silent: a stand-in for a network
partition, found by the client's heartbeats).

Each test checks that the ensemble change started at the failure, not at a timeout: the
longest time without a confirmed add is far below the add timeout (30 s here), and the
ledger closes with the failed bookie replaced in its last ensemble. The bounds are loose,
for a shared and noisy machine; bench/stall.py measures the figures (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import time
from collections.abc import Callable
from itertools import pairwise

import pytest
from helpers.bookie import BookieProcess, resume

from zbk.client.bookkeeper import AsyncBookKeeper
from zbk.config import ClientConfig

PW = b"pw"
ADD_TIMEOUT_MS = 30_000  # what would find the failure without detection
WINDOW = 200  # appends in flight


def data(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * 8


async def write_through(uri: str, ensemble: tuple[int, int, int], fault: Callable[[str], None], *,
                        heartbeat_ms: int, before_s: float = 1.0, after_s: float = 2.0) -> tuple[float, int, int]:
    """Write a new ledger at full speed; ``fault(bookie)`` one bookie of its ensemble after
    ``before_s``; go on for ``after_s``; close it. Returns the longest time without a
    confirmed add from the fault on (the gap it falls in included), the ledger and how many
    entries it has."""
    config = ClientConfig(add_timeout_ms=ADD_TIMEOUT_MS, read_timeout_ms=5000, bookie_heartbeat_timeout_ms=heartbeat_ms)
    async with AsyncBookKeeper(uri, config=config) as bk:
        lh = await bk.create_ledger(*ensemble, password=PW)
        confirmed: list[float] = []
        room = asyncio.Semaphore(WINDOW)
        futures: list[asyncio.Future[int]] = []
        writing = [True]

        def done(_: asyncio.Future[int]) -> None:
            room.release()
            confirmed.append(time.monotonic())

        async def writer() -> None:
            while writing[0]:
                await room.acquire()
                fut = lh.append(data(len(futures)))
                fut.add_done_callback(done)
                futures.append(fut)

        task = asyncio.ensure_future(writer())
        await asyncio.sleep(before_s)
        victim = lh.md.last_ensemble[1]
        t_fault = time.monotonic()
        fault(victim)
        await asyncio.sleep(after_s)
        writing[0] = False
        await task
        assert [await f for f in futures] == list(range(len(futures)))
        await lh.close()
        md = await bk.ledger_metadata(lh.ledger_id)
        assert md.is_closed and md.last_entry_id == len(futures) - 1
        assert victim not in md.last_ensemble, f"closed with {victim} in its last ensemble: {md.fragments}"
        assert len(md.fragments) == 2, md.fragments  # one change, from the failure on
        before = max([t for t in confirmed if t <= t_fault], default=t_fault)
        stall = max(b - a for a, b in pairwise([before, *[t for t in confirmed if t > t_fault]]))
        return stall, lh.ledger_id, len(futures)


async def read_back(uri: str, ledger_id: int, n: int) -> None:
    async with AsyncBookKeeper(uri, config=ClientConfig(read_timeout_ms=5000)) as bk:
        rh = await bk.open_ledger(ledger_id, password=PW)
        got = [e.payload async for e in rh.read(0, n - 1)]
        assert got == [data(i) for i in range(n)]


def _pid_of(c: object, bookie: str) -> int:
    b: BookieProcess = c.by_id(bookie)  # type: ignore[attr-defined]
    assert b.proc is not None
    return b.proc.pid


@pytest.mark.parametrize("ensemble", [(3, 2, 2), (3, 3, 2)], ids=["E3WQ2AQ2", "E3WQ3AQ2"])
def test_kill_of_an_ensemble_bookie_changes_the_ensemble_at_once(cluster, ensemble) -> None:
    """With WQ = AQ the writer cannot confirm without the dead bookie: the stall is the time
    to find it dead. With WQ > AQ the two others confirm everything: unless the change
    starts at the kill, a ledger closed soon after it (here half a second) keeps the dead
    bookie in its last ensemble."""
    c = cluster(4)
    # Heartbeats far slower than the test: only the closed connection can tell.
    stall, lid, n = asyncio.run(write_through(c.uri, ensemble, lambda b: os.kill(_pid_of(c, b), signal.SIGKILL),
                                              heartbeat_ms=60_000, after_s=0.5))
    assert stall < 3.0, f"adds stalled {stall:.2f}s after the kill"
    asyncio.run(read_back(c.uri, lid, n))


def test_a_stopped_ensemble_bookie_is_found_by_the_heartbeats(cluster, etcd_uri) -> None:
    # On etcd: the embedded store is one file lock, which a bookie stopped in the middle of
    # a metadata write would hold, stopping every metadata write (ensemble changes, the
    # close) with it; a stopped etcd client holds nothing but its lease.
    c = cluster(4, uri=etcd_uri)
    heartbeat_ms = 1000
    stopped: list[str] = []

    def stop(bookie: str) -> None:
        os.kill(_pid_of(c, bookie), signal.SIGSTOP)
        stopped.append(bookie)

    try:
        stall, lid, n = asyncio.run(write_through(c.uri, (3, 2, 2), stop, heartbeat_ms=heartbeat_ms,
                                                  after_s=heartbeat_ms / 1000 + 2.0))
    finally:
        for b in stopped:
            resume(c.by_id(b))
    assert stall < heartbeat_ms / 1000 + 4.0, f"adds stalled {stall:.2f}s after the stop"
    asyncio.run(read_back(c.uri, lid, n))

