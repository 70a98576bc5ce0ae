"""A writer with ``pending_adds_max`` appends unconfirmed refuses one more with
TooManyRequestsError, and stays usable: once earlier appends complete it appends again
(the simulation of tests/client/sim.py, real bookie cores)."""

from __future__ import annotations

import asyncio

import pytest

from zbk.client.handles import LedgerHandle
from zbk.config import ClientConfig
from zbk.errors import TooManyRequestsError

from . import sim
from .sim import SimCluster


def test_appends_beyond_pending_adds_max_are_refused_until_earlier_ones_complete() -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        writer = c.client("writer", config=ClientConfig(pending_adds_max=5))
        lh: LedgerHandle = await writer.create_ledger(3, 2, 2, password=b"pw")
        futures = [lh.append(b"entry %d" % i) for i in range(5)]  # one event-loop turn: none confirmed yet
        with pytest.raises(TooManyRequestsError, match="pending_adds_max"):
            lh.append(b"one too many")
        assert await asyncio.gather(*futures) == [0, 1, 2, 3, 4]
        assert await lh.append(b"after the backlog drained") == 5  # the refused one took no entry id
        assert lh.failed is None
        await lh.close()
        assert lh.md.last_entry_id == 5

    sim.run(scenario())
