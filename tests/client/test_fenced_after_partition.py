"""The seeds' fencing example when the writer is cut off from the bookies and the metadata
store alike, for longer than its ensemble change may wait for the store (the partition
test tests/faults/test_fencing_partition.py, in the simulation).

The bug: the writer's ensemble change failed with MetadataUnavailableError, the handle kept
that error, and every later append raised it, also after healing, when the store would have
said that a recovering reader had fenced and closed the ledger. The writer was never told
that it lost the ledger."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from zbk.config import ClientConfig
from zbk.errors import LedgerFencedError, MetadataUnavailableError

from . import sim
from .sim import Rule, SimCluster, WriteLog, check_persistence
from .test_sim_scenarios import PW, any_msg, payload, recover, write_sequentially


def cut_from_metadata(ctx: Any, cut: list[bool]) -> None:
    """While ``cut[0]``, every metadata call of this client fails as a real one does when no
    etcd member answers within its deadline."""
    for name in ("read_metadata", "write_metadata", "writable_bookies"):
        real = getattr(ctx, name)

        async def call(*args: Any, _real: Any = real, _name: str = name) -> Any:
            if cut[0]:
                await asyncio.sleep(10.0)  # the store's deadline, in virtual time
                raise MetadataUnavailableError(f"{_name}: no etcd member answered")
            return await _real(*args)

        setattr(ctx, name, call)


def test_a_writer_fenced_during_a_long_partition_is_told_fenced_not_metadata_unavailable() -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=4)  # a spare: the writer's ensemble change has a replacement
        writer = c.client("writer")
        lh = await writer.create_ledger(3, 2, 2, password=PW)
        log = WriteLog()
        await write_sequentially(lh, log, seed, 10)

        # The writer is cut off from every bookie and from the metadata store.
        cut = [True]
        assert writer.ctx is not None
        cut_from_metadata(writer.ctx, cut)
        for b in c.bookies.values():
            b.rules.append(Rule("drop", any_msg, client="writer"))
        f10 = log.append(lh, payload(seed, 10))
        md = await recover(c, lh.ledger_id)  # fences the bookies, closes the ledger at 9
        assert md.is_closed and md.last_entry_id == 9
        # The add times out, the change cannot reach the store: while cut off, that is all
        # the writer can know.
        with pytest.raises(MetadataUnavailableError):
            await f10
        with pytest.raises(MetadataUnavailableError):
            await log.append(lh, payload(seed, 10))

        # Healed: the next add fails as fenced, and so does every one after it.
        cut[0] = False
        for b in c.bookies.values():
            b.rules.clear()
        for _ in range(2):
            with pytest.raises(LedgerFencedError):
                await log.append(lh, payload(seed, 10))
        assert sorted(log.acked) == list(range(10))
        assert await check_persistence(c, lh.ledger_id, PW, log) == []
        await writer.close()

    sim.run(scenario())


def test_a_fenced_answer_replaces_metadata_unavailable() -> None:
    """An add still in flight when the change failed for want of the store, answered EFENCED
    when it reaches its bookie: the handle says fenced from then on, without asking the store."""
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=4)
        writer = c.client("writer", config=ClientConfig(add_timeout_ms=60_000))
        lh = await writer.create_ledger(3, 2, 2, password=PW)
        log = WriteLog()
        await write_sequentially(lh, log, seed, 5)
        cut = [True]
        assert writer.ctx is not None
        cut_from_metadata(writer.ctx, cut)
        first, late = lh.md.write_set(5)
        c.bookies[first].rules.append(Rule("drop", any_msg, client="writer"))
        c.bookies[late].rules.append(Rule("delay", any_msg, client="writer", seconds=30.0))
        f5 = log.append(lh, payload(seed, 5))
        await recover(c, lh.ledger_id)
        # The writer's heartbeats find ``first`` silent: its connection closes, the change
        # starts and fails 10 s later, the store being out of reach.
        writer.ctx.transport.connection_lost(first)  # type: ignore[attr-defined]
        with pytest.raises(MetadataUnavailableError):
            await f5
        assert isinstance(lh.failed, MetadataUnavailableError)
        await asyncio.sleep(30.0)  # the delayed add reaches a fenced bookie: EFENCED
        assert isinstance(lh.failed, LedgerFencedError), lh.failed
        with pytest.raises(LedgerFencedError):
            await log.append(lh, payload(seed, 6))  # the store is still silent: told by the bookie
        await writer.close()

    sim.run(scenario())
