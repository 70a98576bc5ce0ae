"""Large frames leave the client without a copy (one zmq.Frame shared by every bookie of a
send_all) and arrive intact, also when they waited in the transport's backlog for a
connection. The "bookies" are plain ROUTER sockets on loopback that decode what they get."""

from __future__ import annotations

import asyncio
import os
import threading

import zmq
from helpers.procs import free_port
from helpers.router import serve_router

from zbk.client.digest import make_digest
from zbk.client.transport import ZmqTransport
from zbk.wire import messages as w
from zbk.wire.codec import encode
from zbk.wire.entry import build_entry
from zbk.wire.frames import _ZERO_COPY_BYTES, encoded
from zbk.wire.status import Status


def _router(port: int, got: list[list[bytes]], bind_after_s: float, stop: threading.Event) -> None:
    def answer(req: w.AddRequest) -> w.AddResponse:
        got.append([bytes(e) for e in req.entries])
        return w.AddResponse(rid=req.rid, status=Status.EOK, ledger_id=req.ledger_id, first_entry_id=0,
                             last_entry_id=len(req.entries) - 1)

    serve_router(port, answer, bind_after_s, stop)


def _request(rid: int, n: int) -> w.AddRequest:
    digest = make_digest("crc32c", b"k")
    entries = [build_entry(7, e, e - 1, os.urandom(1000 + e % 50), digest, ledger_length=1050 * (e + 1))
               for e in range(n)]
    return w.AddRequest(rid=rid, ledger_id=7, master_key=b"\x01" * 32, flags=w.AddFlag(0), entries=entries)


def test_only_frames_of_the_threshold_or_more_become_shared_frames() -> None:
    frames = encoded(_request(1, 200))
    assert [type(f) is zmq.Frame for f in frames] == [len(f) >= _ZERO_COPY_BYTES for f in encode(_request(1, 200))]
    assert type(frames[-1]) is zmq.Frame and len(frames[-1]) > _ZERO_COPY_BYTES  # the packed blobs
    assert not any(type(f) is zmq.Frame for f in encoded(_request(2, 3)))


def test_a_large_add_sent_to_three_bookies_arrives_intact_at_each() -> None:
    stop = threading.Event()
    ports = [free_port() for _ in range(3)]
    got: list[list[list[bytes]]] = [[], [], []]
    # the third bookie binds late: its copy waits in the transport's backlog first
    servers = [threading.Thread(target=_router, args=(port, g, delay, stop), daemon=True)
               for port, g, delay in zip(ports, got, (0.0, 0.0, 0.5), strict=True)]
    for s in servers:
        s.start()
    big, small = _request(0, 300), _request(0, 2)

    async def run() -> list[object]:
        t = ZmqTransport()
        bookies = [f"127.0.0.1:{p}" for p in ports]
        try:
            answers: list[asyncio.Future[object]] = []
            for msg in (big, small, big):
                rid = t.next_rid()
                msg = w.AddRequest(rid=rid, ledger_id=msg.ledger_id, master_key=msg.master_key, flags=msg.flags,
                                   entries=msg.entries)
                futs = [asyncio.get_running_loop().create_future() for _ in bookies]
                t.send_all(bookies, msg, 10.0, [f.set_result for f in futs])
                answers += futs
            return list(await asyncio.gather(*answers))
        finally:
            await t.close()

    try:
        answers = asyncio.run(run())
    finally:
        stop.set()
        for s in servers:
            s.join(5)
    assert all(isinstance(a, w.AddResponse) and a.status == Status.EOK for a in answers), answers
    want = [[bytes(e) for e in m.entries] for m in (big, small, big)]
    for g in got:
        assert g == want
