"""Requests a reader or a recoverer stops waiting for (it has its quorum, or gave up) are
cancelled; one can still end in its own error, raised as it is cancelled (its connection
was lost at that moment). Such an error must be taken, not left for asyncio to log as
"Task exception was never retrieved": the chaos run's autorecovery logs had hundreds."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from zbk.client.reading import abandon
from zbk.errors import BookieUnavailableError


def test_an_abandoned_request_that_fails_as_it_is_cancelled_is_not_reported_as_unretrieved() -> None:
    async def main() -> list[str]:
        seen: list[str] = []
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: seen.append(str(ctx["message"])))

        async def fails_when_cancelled() -> None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                raise BookieUnavailableError("bookie b: connection lost") from None

        tasks: dict[asyncio.Task[Any], str] = {asyncio.ensure_future(fails_when_cancelled()): "b",
                                               asyncio.ensure_future(asyncio.sleep(10)): "c"}
        await asyncio.sleep(0)
        abandon(tasks)
        await asyncio.sleep(0.01)
        assert all(t.done() for t in tasks)
        del tasks
        gc.collect()
        await asyncio.sleep(0)
        return seen

    assert asyncio.run(main()) == []
