"""The writable bookies of an ensemble change (zbk.client.bookies): a list kept by a watch
of the registry answers a change's first attempt, so the change makes one metadata round
trip; the store answers whatever the list cannot (it lags the registry by one delivery).

The bug it fixes: the kill stall of bench/stall.py (target 100 ms) went past its target in
some rounds because each change listed the registry from the store, through a worker
thread, before it could write the new ensemble. A first version used the list for every
listing and broke two end-to-end tests (a creation that saw a bookie already gone, a
change that found no replacement the store knew of): the tests below pin down where the
list may answer and where the store must."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from zbk.client.bookies import WritableBookies
from zbk.client.bookkeeper import AsyncBookKeeper, ClientContext
from zbk.errors import NotEnoughBookiesError
from zbk.metadata.memory import MemoryMetadataStore
from zbk.metadata.registry import BookieRegistration, list_bookies, register_bookie, unregister_bookie


def ids(regs: list[BookieRegistration]) -> list[str]:
    return [r.bookie_id for r in regs]


def test_the_watched_list_follows_the_registry() -> None:
    store = MemoryMetadataStore(inline_watches=True)
    lease = store.grant_lease(60)
    for b in ("127.0.0.1:1", "127.0.0.1:2"):
        register_bookie(store, BookieRegistration(b), lease)
    cache = WritableBookies(store)
    cache.start()
    assert cache.live and ids(cache.snapshot()) == ["127.0.0.1:1", "127.0.0.1:2"]
    register_bookie(store, BookieRegistration("127.0.0.1:3"), lease)
    ro = dataclasses.replace(BookieRegistration("127.0.0.1:1"), state="readonly")
    register_bookie(store, ro, lease)  # read-only: out of the writable list
    unregister_bookie(store, "127.0.0.1:2")
    assert ids(cache.snapshot()) == ids(list_bookies(store)) == ["127.0.0.1:3"]
    store.revoke_lease(lease)  # every registration expires with its lease
    assert cache.snapshot() == []
    cache.close()
    assert not cache.live
    register_bookie(store, BookieRegistration("127.0.0.1:4"), store.grant_lease(60))
    assert cache.snapshot() == []  # closed: no more events


class CountingStore(MemoryMetadataStore):
    """Counts the reads of the bookie registry (``list`` under ``bookies/``)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.registry_lists = 0

    def list(self, prefix: str, **kw: Any) -> Any:
        if prefix.startswith("bookies/"):
            self.registry_lists += 1
        return super().list(prefix, **kw)


@contextlib.asynccontextmanager
async def client_of(bookies: int) -> AsyncIterator[tuple[CountingStore, int, AsyncBookKeeper, ClientContext]]:
    """A registry of ``bookies`` bookies under one lease, and a client whose watch is live
    (it starts with the client's first ledger, which this creates)."""
    store = CountingStore(inline_watches=True)
    lease = store.grant_lease(60)
    for i in range(bookies):
        register_bookie(store, BookieRegistration(f"127.0.0.1:{i + 1}"), lease)
    bk = await AsyncBookKeeper(store=store).start()
    try:
        assert bk.ctx is not None
        assert not bk.ctx.bookies.live  # a client that only reads sets up no watch
        await bk.create_ledger(3, 2, 2)
        for _ in range(200):  # the watch is set up in the background of the first creation
            if bk.ctx.bookies.live:
                break
            await asyncio.sleep(0.01)
        assert bk.ctx.bookies.live, "the registry watch never went live"
        yield store, lease, bk, bk.ctx
    finally:
        await bk.close()


def test_a_first_attempt_is_placed_from_the_watched_list() -> None:
    async def main() -> None:
        async with client_of(4) as (store, _, bk, ctx):
            lh = await bk.create_ledger(3, 2, 2)
            ensemble = list(lh.md.last_ensemble)
            before = store.registry_lists
            new = await ctx.replacements(lh.md, ensemble, [0], exclude={ensemble[0]}, first_attempt=True)
            assert store.registry_lists == before  # answered from the watch, not the store
            spare = ({f"127.0.0.1:{i + 1}" for i in range(4)} - set(ensemble)).pop()
            assert new == [spare, *ensemble[1:]]
            # Later attempts read the store: the list may still show a bookie that is gone.
            await ctx.replacements(lh.md, ensemble, [0], exclude={ensemble[0]}, first_attempt=False)
            assert store.registry_lists == before + 1

    asyncio.run(main())


def test_a_bookie_the_list_has_not_seen_yet_is_found_in_the_store() -> None:
    async def main() -> None:
        async with client_of(3) as (store, lease, bk, ctx):
            lh = await bk.create_ledger(3, 2, 2)
            ensemble = list(lh.md.last_ensemble)
            ctx.bookies.close()  # the list stops following: the next registration is unseen
            ctx.bookies.live = True
            register_bookie(store, BookieRegistration("127.0.0.1:9"), lease)
            new = await ctx.replacements(lh.md, ensemble, [1], exclude={ensemble[1]}, first_attempt=True)
            assert new[1] == "127.0.0.1:9"
            unregister_bookie(store, "127.0.0.1:9")
            with pytest.raises(NotEnoughBookiesError):
                await ctx.replacements(lh.md, ensemble, [1], exclude={ensemble[1]}, first_attempt=True)

    asyncio.run(main())


def test_creation_reads_the_store_not_the_list() -> None:
    async def main() -> None:
        async with client_of(4) as (store, _, bk, ctx):
            ctx.bookies.close()  # a list that no longer follows the registry
            ctx.bookies.live = True
            unregister_bookie(store, "127.0.0.1:4")
            for _ in range(20):
                lh = await bk.create_ledger(3, 2, 2)
                assert "127.0.0.1:4" not in lh.md.last_ensemble

    asyncio.run(main())
