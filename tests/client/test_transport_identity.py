"""The client refuses answers from a bookie other than the one it asked (zbk/wire/identity.py).

Stand-in bookies are real ZeroMQ ROUTER sockets on threads of this process, announcing an id
in their handshake (ZMQ_METADATA ``X-Bookie-Id``) or none, and answering BOOKIE_INFO with
``ledgers=tag`` so that a test sees which one answered. Each counts the requests it
answered: a refused answer is one the client really received."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth
from helpers.procs import free_port

from zbk.client.raw import BookieConnection
from zbk.client.transport import ZmqTransport
from zbk.errors import BookieUnavailableError
from zbk.metadata import layout
from zbk.metadata.memory import MemoryMetadataStore
from zbk.metadata.registry import BookieRegistration
from zbk.metadata.resolver import BookieResolver
from zbk.wire import messages as w
from zbk.wire.codec import decode_request, encode
from zbk.wire.curve import CurveClient
from zbk.wire.identity import announce


class StandIn:
    """A ROUTER on 127.0.0.1:port announcing ``bookie_id`` (None: nothing), answering
    BOOKIE_INFO with ``ledgers=tag``."""

    def __init__(self, port: int, tag: int, bookie_id: str | None, curve_secret_key: bytes | None = None) -> None:
        self.port, self.tag = port, tag
        self.answered = 0
        self.stop_event = threading.Event()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if curve_secret_key is not None:  # a CURVE server taking any client (no ZAP handler)
            self.sock.setsockopt(zmq.CURVE_SERVER, 1)
            self.sock.setsockopt(zmq.CURVE_SECRETKEY, curve_secret_key)
        if bookie_id is not None:
            announce(self.sock, bookie_id)
        self.sock.bind(f"tcp://127.0.0.1:{port}")
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop_event.is_set():
            if not self.sock.poll(20):
                continue
            ident, *frames = self.sock.recv_multipart()
            rid = decode_request(frames).rid
            self.answered += 1  # before the answer: a client may have it before this thread runs on
            self.sock.send_multipart([ident, *encode(w.BookieInfoResponse(
                rid=rid, status=0, free_bytes=1, total_bytes=1, state="writable", ledgers=self.tag, limbo_ledgers=0))])

    def close(self) -> None:
        if self.stop_event.is_set():
            return
        self.stop_event.set()
        self.thread.join(5)
        self.sock.close(0)
        self.ctx.term()


@pytest.fixture
def stand_ins() -> Iterator[list[StandIn]]:
    """Stand-ins a test starts (append them); all closed at the end, failures included."""
    made: list[StandIn] = []
    try:
        yield made
    finally:
        for s in made:
            s.close()


def register(store: MemoryMetadataStore, bookie_id: str, address: str) -> None:
    store.put(layout.writable_key(bookie_id), BookieRegistration(bookie_id, address=address).encode())


def info_request(t: ZmqTransport) -> Any:
    return w.BookieInfoRequest(rid=t.next_rid())


async def info(t: ZmqTransport, bookie: str, timeout_s: float = 5.0) -> int:
    return int((await t.request(bookie, info_request(t), timeout_s)).ledgers)


async def refused(t: ZmqTransport, bookie: str, impostor: StandIn, within_s: float = 10.0) -> BookieUnavailableError:
    """A request to ``bookie`` that ``impostor`` answered and the transport refused: the
    error it raised. (The first requests may find no connection yet.)"""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        before = impostor.answered
        with pytest.raises(BookieUnavailableError) as e:
            await info(t, bookie, timeout_s=2.0)
        if impostor.answered > before:
            return e.value
        assert loop.time() < deadline, f"{bookie}: the impostor never got a request"
        await asyncio.sleep(0.05)


async def sent_and_refused(t: ZmqTransport, bookie: str, impostor: StandIn,
                           within_s: float = 10.0) -> BookieUnavailableError:
    """``refused`` through ``send`` (the write path's way): the callback gets the error,
    never synchronously."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        before = impostor.answered
        got: list[Any] = []
        t.send(bookie, info_request(t), 2.0, got.append)
        assert got == [], "the callback ran inside send"
        for _ in range(1000):
            if got:
                break
            await asyncio.sleep(0.005)
        assert len(got) == 1 and isinstance(got[0], BookieUnavailableError), got
        if impostor.answered > before:
            return got[0]
        assert loop.time() < deadline, f"{bookie}: the impostor never got a request"
        await asyncio.sleep(0.05)


async def answered_by(t: ZmqTransport, bookie: str, tag: int, within_s: float = 20.0) -> None:
    """Until a request to ``bookie`` is answered, by the stand-in tagged ``tag``; no other
    stand-in's answer may come back meanwhile."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        try:
            got = await info(t, bookie, timeout_s=2.0)
            assert got == tag, f"{bookie}: an answer from the stand-in tagged {got} was delivered"
            return
        except BookieUnavailableError:
            pass
        assert loop.time() < deadline, f"{bookie} never answered from the stand-in tagged {tag}"
        await asyncio.sleep(0.05)


def test_an_answer_from_another_bookie_is_refused_and_the_right_one_is_found(
        stand_ins: list[StandIn], caplog: pytest.LogCaptureFixture) -> None:
    wrong_port, right_port = free_port(), free_port()
    stand_ins.append(impostor := StandIn(wrong_port, tag=66, bookie_id="bookie-x"))
    stand_ins.append(StandIn(right_port, tag=1, bookie_id="bookie-a"))
    store = MemoryMetadataStore()
    register(store, "bookie-a", f"127.0.0.1:{wrong_port}")  # stale: bookie-x has that port now
    caplog.set_level(logging.WARNING, logger="zbk.client.transport")

    async def run() -> None:
        t = ZmqTransport(resolver=BookieResolver(store))
        try:
            err = await refused(t, "bookie-a", impostor)
            assert "bookie-x" in str(err) and "bookie-a" in str(err), err
            assert t.suspect("bookie-a"), "refused like a dead bookie: readers ask it last"
            err = await sent_and_refused(t, "bookie-a", impostor)
            assert "bookie-x" in str(err), err
            # The registration moves to where bookie-a is: the transport reads it again
            # (it left the impostor's address) and is answered there.
            register(store, "bookie-a", f"127.0.0.1:{right_port}")
            await answered_by(t, "bookie-a", 1)
            assert t.peers["bookie-a"].address == f"127.0.0.1:{right_port}"
        finally:
            await t.close()

    try:
        asyncio.run(run())
    finally:
        store.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("bookie-a" in m and "bookie-x" in m and f"127.0.0.1:{wrong_port}" in m for m in warnings), warnings


def test_an_impostor_on_the_port_of_a_dead_bookie_is_refused_until_the_bookie_is_back(stand_ins: list[StandIn]) -> None:
    """The kill -9 case: bookie-a's connection is up, bookie-a goes, bookie-x binds its port
    while the registration still names it; then bookie-x goes and bookie-a comes back there."""
    port = free_port()
    stand_ins.append(first := StandIn(port, tag=1, bookie_id="bookie-a"))
    store = MemoryMetadataStore()
    register(store, "bookie-a", f"127.0.0.1:{port}")

    async def run() -> None:
        t = ZmqTransport(resolver=BookieResolver(store), bookie_heartbeat_timeout_ms=500)
        try:
            assert await info(t, "bookie-a") == 1
            first.close()
            stand_ins.append(impostor := StandIn(port, tag=66, bookie_id="bookie-x"))
            for _ in range(3):  # refused each time it is reached again (registration re-read)
                await refused(t, "bookie-a", impostor)
            impostor.close()
            stand_ins.append(StandIn(port, tag=2, bookie_id="bookie-a"))
            await answered_by(t, "bookie-a", 2)
        finally:
            await t.close()

    try:
        asyncio.run(run())
    finally:
        store.close()


def test_host_port_ids_are_checked_without_a_resolver_and_silent_peers_are_taken(stand_ins: list[StandIn]) -> None:
    """No resolver (the id is the address): a process announcing another bookie's id at this
    address is refused, and tried again there after a pause; a peer announcing nothing (an
    older bookie) is answered as before."""
    port, other, old = free_port(), free_port(), free_port()
    bookie = f"127.0.0.1:{port}"
    stand_ins.append(impostor := StandIn(port, tag=66, bookie_id=f"127.0.0.1:{other}"))
    stand_ins.append(StandIn(old, tag=9, bookie_id=None))

    async def run() -> None:
        t = ZmqTransport()
        try:
            err = await refused(t, bookie, impostor)
            assert f"127.0.0.1:{other}" in str(err), err
            impostor.close()
            stand_ins.append(StandIn(port, tag=5, bookie_id=bookie))
            await answered_by(t, bookie, 5)
            assert await info(t, f"127.0.0.1:{old}") == 9
        finally:
            await t.close()

    asyncio.run(run())


def test_the_raw_connection_refuses_another_bookie_by_name(stand_ins: list[StandIn]) -> None:
    port, old = free_port(), free_port()
    stand_ins.append(StandIn(port, tag=66, bookie_id="bookie-x"))
    stand_ins.append(StandIn(old, tag=9, bookie_id=None))
    with BookieConnection("bookie-a", timeout_s=5, address=f"127.0.0.1:{port}") as c:
        with pytest.raises(BookieUnavailableError) as e:
            c.call(w.BookieInfoRequest(rid=c.next_rid()))
        assert "bookie-a" in str(e.value) and "bookie-x" in str(e.value), e.value
    with BookieConnection("bookie-x", timeout_s=5, address=f"127.0.0.1:{port}") as c:
        assert c.call(w.BookieInfoRequest(rid=c.next_rid())).ledgers == 66
    with BookieConnection(f"127.0.0.1:{old}", timeout_s=5) as c:
        assert c.call(w.BookieInfoRequest(rid=c.next_rid())).ledgers == 9


def test_the_id_comes_through_a_curve_handshake_too(stand_ins: list[StandIn], tmp_path: Path) -> None:
    """With CURVE the properties travel encrypted in the handshake: still there, still checked."""
    server_pub, server_secret = zmq.auth.create_certificates(str(tmp_path), "server")
    _, client_secret = zmq.auth.create_certificates(str(tmp_path), "client")
    _, secret = zmq.auth.load_certificate(server_secret)
    assert secret is not None
    port, right = free_port(), free_port()
    stand_ins.append(impostor := StandIn(port, tag=66, bookie_id="127.0.0.1:1", curve_secret_key=secret))
    stand_ins.append(StandIn(right, tag=4, bookie_id=f"127.0.0.1:{right}", curve_secret_key=secret))
    curve = CurveClient(client_secret, server_public_key_file=server_pub)

    async def run() -> None:
        t = ZmqTransport(curve=curve)
        try:
            err = await refused(t, f"127.0.0.1:{port}", impostor)
            assert "127.0.0.1:1" in str(err), err
            assert await info(t, f"127.0.0.1:{right}") == 4
        finally:
            await t.close()

    asyncio.run(run())
