"""Explicit LAC under the deterministic simulation (tests/client/sim.py; ``ZBK_SEED=<n>``
replays a run).

An idle writer with ``explicit_lac_interval_ms`` sends its LAC with WRITE_LAC within that
interval: another client's ``tail()`` and ``read_last_add_confirmed()`` then see its last
entry; without it they do not. A busy writer sends no WRITE_LAC, and an idle one sends one
per LAC, not one per interval.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from zbk.client.handles import LedgerHandle, ReadHandle
from zbk.config import ClientConfig
from zbk.errors import ConfigError
from zbk.wire import messages as w

from . import sim
from .sim import SimCluster, WriteLog

PW = b"secret"
INTERVAL_MS = 200


def payload(eid: int) -> bytes:
    return f"entry {eid}".encode()


class Requests:
    """Counts what a client's SimTransport sends, by message type: its send() goes through
    its request(), so wrapping request() sees everything."""

    def __init__(self, transport: Any) -> None:
        self.sent: list[tuple[str, Any]] = []
        inner = transport.request

        async def request(bookie: str, msg: Any, timeout_s: float) -> Any:
            self.sent.append((bookie, msg))
            return await inner(bookie, msg, timeout_s)

        transport.request = request

    def count(self, kind: type) -> int:
        return sum(1 for _, m in self.sent if isinstance(m, kind))


async def writer(c: SimCluster, interval_ms: int, e: int = 3, wq: int = 3, aq: int = 2,
                 ) -> tuple[LedgerHandle, WriteLog, Requests]:
    bk = c.client("writer", config=ClientConfig(explicit_lac_interval_ms=interval_ms))
    lh = await bk.create_ledger(e, wq, aq, password=PW)
    return lh, WriteLog(), Requests(bk._ctx().transport)


async def reader(c: SimCluster, lh: LedgerHandle, config: ClientConfig | None = None,
                 ) -> tuple[ReadHandle, Requests]:
    bk = c.client("reader", config=config)
    rh = await bk.open_ledger(lh.ledger_id, password=PW, recovery=False)
    return rh, Requests(bk._ctx().transport)


async def follow(rh: ReadHandle, seen: dict[int, float]) -> None:
    """Tail ``rh`` recording when (virtual time) each entry was seen."""
    async for entry in rh.tail(0, poll_timeout_ms=1000):
        seen[entry.entry_id] = asyncio.get_running_loop().time()


async def idle_writer_scenario(seed: int, interval_ms: int) -> tuple[dict[int, float], WriteLog, int, int]:
    """A writer appends 5 entries and goes idle for 2 s while another client tails it;
    returns when each entry was seen, the log, the reader's read_last_add_confirmed() at the
    end and the WRITE_LACs the writer sent."""
    c = SimCluster(seed, bookies=3)
    lh, log, sent = await writer(c, interval_ms)
    rh, _ = await reader(c, lh)
    seen: dict[int, float] = {}
    task = asyncio.ensure_future(follow(rh, seen))
    for i in range(5):
        await log.append(lh, payload(i))
        await asyncio.sleep(0.01)
    await asyncio.sleep(2.0)
    lac = await rh.read_last_add_confirmed()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return seen, log, lac, sent.count(w.WriteLacRequest)


def test_idle_writer_last_entry_seen_within_the_interval() -> None:
    seed = sim.seed_from_env()
    seen, log, lac, write_lacs = sim.run(idle_writer_scenario(seed, INTERVAL_MS))
    assert sorted(seen) == [0, 1, 2, 3, 4]
    delay = seen[4] - log.acked_at[4]
    # Two ticks of half an interval at most; the simulated network adds no delay.
    assert 0 <= delay <= INTERVAL_MS / 1000 + 0.01, delay
    assert lac == 4
    # One idle period, one LAC to send: a second tick with nothing new sends nothing.
    assert write_lacs == 3  # one WRITE_LAC to each bookie of the ensemble


def test_without_explicit_lac_the_last_entry_stays_unseen() -> None:
    """The control: what the test above shows is the explicit LAC's doing."""
    seed = sim.seed_from_env()
    seen, _, lac, write_lacs = sim.run(idle_writer_scenario(seed, 0))
    assert sorted(seen) == [0, 1, 2, 3]
    assert lac == 3
    assert write_lacs == 0


def test_busy_writer_sends_no_write_lac_and_a_slow_one_one_per_entry() -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        lh, log, sent = await writer(c, INTERVAL_MS)
        for i in range(100):  # every 20 ms: each add carries the LAC before the next tick
            await log.append(lh, payload(i))
            await asyncio.sleep(0.02)
        assert sent.count(w.WriteLacRequest) == 0
        for i in range(100, 105):  # every 300 ms: idle longer than the interval each time
            await log.append(lh, payload(i))
            await asyncio.sleep(0.3)
        assert sent.count(w.WriteLacRequest) == 3 * 5
        await lh.close()
        await asyncio.sleep(1.0)
        assert sent.count(w.WriteLacRequest) == 3 * 5  # nothing for a closed ledger

    sim.run(scenario())


def test_explicit_lac_interval_must_be_off_or_at_least_the_minimum() -> None:
    ClientConfig(explicit_lac_interval_ms=0).validate()
    ClientConfig(explicit_lac_interval_ms=10).validate()
    for bad in (-1, 5):
        with pytest.raises(ConfigError, match="explicit_lac_interval_ms"):
            ClientConfig(explicit_lac_interval_ms=bad).validate()
