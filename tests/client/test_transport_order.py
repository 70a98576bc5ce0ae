"""The real transport sends one client's requests to a bookie in the order they were made,
also while it waits for a connection (a FORCE_LEDGER must not overtake the adds before it:
the bookie would answer ENOLEDGER for a ledger whose adds it has not seen yet).

The "bookie" is a plain ROUTER socket on loopback that binds only after the requests were
made, records the order of the request ids it receives and answers each."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from helpers.procs import free_port
from helpers.router import serve_router

from zbk.client.transport import ZmqTransport
from zbk.wire import messages as w
from zbk.wire.status import Status


def _router(port: int, got: list[int], bind_after_s: float, stop: threading.Event) -> None:
    def answer(req: Any) -> w.BookieInfoResponse:
        got.append(req.rid)
        return w.BookieInfoResponse(rid=req.rid, status=Status.EOK, free_bytes=1, total_bytes=1, state="writable",
                                    ledgers=0, limbo_ledgers=0)

    serve_router(port, answer, bind_after_s, stop)


def test_requests_made_before_the_connection_arrive_in_order() -> None:
    port = free_port()
    got: list[int] = []
    stop = threading.Event()
    n_sends, n_requests = 40, 5
    server = threading.Thread(target=_router, args=(port, got, 0.3, stop), daemon=True)
    server.start()

    async def run() -> list[int]:
        t = ZmqTransport()
        bookie = f"127.0.0.1:{port}"
        made: list[int] = []
        answered: list[int] = []
        try:
            requests = []
            for i in range(n_sends + n_requests):
                rid = t.next_rid()
                made.append(rid)
                msg = w.BookieInfoRequest(rid=rid)
                if i % 9 == 8:  # a request() now and then, between callback sends
                    requests.append(asyncio.ensure_future(t.request(bookie, msg, 5.0)))
                else:
                    t.send(bookie, msg, 5.0, lambda resp: answered.append(resp.rid))
                await asyncio.sleep(0.003)  # spread over several retry periods of the queue
            await asyncio.gather(*requests)
            deadline = time.monotonic() + 5
            while len(answered) < n_sends and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert sorted(answered) == sorted(set(made) - {r.result().rid for r in requests})
            return made
        finally:
            await t.close()

    try:
        made = asyncio.run(run())
    finally:
        stop.set()
        server.join(10)
    assert got == made, f"the bookie received {got}, the client made {made}"
