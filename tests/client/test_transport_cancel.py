"""A request cancelled in the loop iteration in which its answer arrives raises
CancelledError, rather than returning the answer to a caller that gave up on it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from zbk.client.transport import ZmqTransport
from zbk.wire import messages as w


def test_regression_chaos_seed_330810027_a_cancel_in_the_tick_the_answer_arrives_is_not_lost() -> None:
    """Python 3.11's asyncio.wait_for swallows a cancellation delivered in the same loop
    iteration as its inner task completes (python/cpython#86296), and request() timed its
    exchange with it. In the 30-minute chaos run (seed 330810027) a tailing reader's own
    timeout cancelled tail() while it waited for a long poll whose answer came in that tick:
    the cancellation was lost, tail() went on polling an idle ledger, and the reader's
    wait_for waited for that cancellation for ever."""

    async def run() -> Any:
        t = ZmqTransport()
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def exchange(p: Any, msg: Any, fut: Any, timeout_s: float) -> Any:
            return await answer

        t._exchange = exchange  # type: ignore[method-assign]
        try:
            call = asyncio.ensure_future(t.request("127.0.0.1:1", w.BookieInfoRequest(rid=t.next_rid()), 5.0))
            for _ in range(3):
                await asyncio.sleep(0)  # request() is parked on the answer
            answer.set_result("the answer")
            call.cancel()
            return await asyncio.gather(call, return_exceptions=True)
        finally:
            await t.close()

    [outcome] = asyncio.run(run())
    assert isinstance(outcome, asyncio.CancelledError), outcome


def test_a_request_still_times_out() -> None:
    async def run() -> Any:
        t = ZmqTransport()

        async def exchange(p: Any, msg: Any, fut: Any, timeout_s: float) -> Any:
            await asyncio.sleep(3600)

        t._exchange = exchange  # type: ignore[method-assign]
        try:
            return await t.request("127.0.0.1:1", w.BookieInfoRequest(rid=t.next_rid()), 0.05)
        finally:
            await t.close()

    with pytest.raises(Exception, match="did not answer within 0.1s"):
        asyncio.run(run())
