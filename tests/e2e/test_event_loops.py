"""The asyncio client does the same on uvloop and on asyncio's own loop, against real
bookies: pipelined appends through a bookie's kill (an ensemble change), a tail that follows
the writer in the same loop and ends at the close, ranged reads, and a delete. zbk's own
programs pick the loop in zbk/eventloop.py; an application may run either."""

from __future__ import annotations

import asyncio
import hashlib
import time

import pytest

import zbk
from zbk import eventloop
from zbk.config import ClientConfig
from zbk.errors import NoSuchLedgerError

PW = b"pw"
FAST = ClientConfig(add_timeout_ms=1500, read_timeout_ms=1500, speculative_read_ms=300)


def data(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * 8


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_the_client_on_each_loop(cluster, kind: str) -> None:
    c = cluster(4)
    n = 6_000

    async def run() -> None:
        assert eventloop.loop_name(asyncio.get_running_loop()) == kind
        async with zbk.AsyncBookKeeper(c.uri, config=FAST) as writer, \
                zbk.AsyncBookKeeper(c.uri, config=FAST) as reader:
            lh = await writer.create_ledger(3, 3, 2, password=PW)
            assert await asyncio.gather(*(lh.append(data(i)) for i in range(n // 2))) == list(range(n // 2))
            rh = await reader.open_ledger(lh.ledger_id, password=PW, recovery=False)
            seen: list[bytes] = []

            async def follow() -> None:
                async for e in rh.tail(0):
                    seen.append(e.payload)

            tail = asyncio.ensure_future(follow())
            victim = lh.metadata.ensembles[0][1]
            c.by_id(victim).kill9()
            futs = [lh.append(data(i)) for i in range(n // 2, n)]
            assert await asyncio.gather(*futs) == list(range(n // 2, n))
            deadline = time.monotonic() + 15
            while len(lh.metadata.fragments) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert victim not in lh.metadata.fragments[-1][1]
            await lh.close()
            await asyncio.wait_for(tail, 30)
            assert seen == [data(i) for i in range(n)]
            closed = await reader.open_ledger(lh.ledger_id, password=PW)
            assert closed.last_add_confirmed == n - 1
            got = [e.payload async for e in closed.read(0, n - 1)]
            assert got == [data(i) for i in range(n)]
            await writer.delete_ledger(lh.ledger_id)
            with pytest.raises(NoSuchLedgerError):
                await reader.open_ledger(lh.ledger_id, password=PW)

    with asyncio.Runner(loop_factory=eventloop.loop_factory(kind)) as runner:
        runner.run(run())
