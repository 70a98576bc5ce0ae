"""The client keeps the writable bookies from a watch of the registry (WritableBookies), so
that an ensemble change, what a writer waits on after a bookie failed, makes one metadata
round trip (the ledger's compare-and-set) instead of two in a row.

The bug it fixes: the kill stall of bench/stall.py (target 100 ms) went past its target in
some rounds because the change first listed the registry from the store, through a worker
thread, before it could write the new ensemble."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from zbk.client.bookkeeper import AsyncBookKeeper, WritableBookies
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

    registry_lists = 0

    def list(self, prefix: str, **kw: Any) -> Any:
        if prefix.startswith("bookies/"):
            CountingStore.registry_lists += 1
        return super().list(prefix, **kw)


def test_an_ensemble_change_does_not_list_the_registry() -> None:
    async def main() -> None:
        store = CountingStore(inline_watches=True)
        lease = store.grant_lease(60)
        for i in range(4):
            register_bookie(store, BookieRegistration(f"127.0.0.1:{i + 1}"), lease)

        async with AsyncBookKeeper(store=store) as bk:
            assert bk.ctx is not None
            for _ in range(100):  # the watch is set up in the background of start()
                if bk.ctx.bookies.live:
                    break
                await asyncio.sleep(0.01)
            assert bk.ctx.bookies.live
            before = CountingStore.registry_lists
            assert ids(await bk.ctx.writable_bookies()) == [f"127.0.0.1:{i + 1}" for i in range(4)]
            unregister_bookie(store, "127.0.0.1:4")
            assert ids(await bk.ctx.writable_bookies()) == [f"127.0.0.1:{i + 1}" for i in range(3)]
            assert CountingStore.registry_lists == before  # answered from the watch, not the store

    asyncio.run(main())
