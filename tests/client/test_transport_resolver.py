"""The real transport (ZmqTransport) with a BookieResolver: requests name a bookie by its id,
the DEALER connects to the address its registration records, and follows the bookie when
it comes back elsewhere under the same id (BP-41). Stand-in bookies are ROUTER sockets on
threads of this process that answer BOOKIE_INFO with a tag saying which one answered."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from helpers.procs import free_port

from zbk.client.transport import ZmqTransport
from zbk.errors import BookieUnavailableError
from zbk.metadata import layout
from zbk.metadata.memory import MemoryMetadataStore
from zbk.metadata.registry import BookieRegistration
from zbk.metadata.resolver import BookieResolver
from zbk.wire import messages as w
from zbk.wire.codec import decode_request, encode


class StandIn:
    """A ROUTER on 127.0.0.1:port answering BOOKIE_INFO with ``ledgers=tag``."""

    def __init__(self, port: int, tag: int) -> None:
        self.port, self.tag = port, tag
        self.stop_event = threading.Event()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(f"tcp://127.0.0.1:{port}")
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop_event.is_set():
            if not self.sock.poll(20):
                continue
            ident, *frames = self.sock.recv_multipart()
            rid = decode_request(frames).rid
            self.sock.send_multipart([ident, *encode(w.BookieInfoResponse(
                rid=rid, status=0, free_bytes=1, total_bytes=1, state="writable", ledgers=self.tag, limbo_ledgers=0))])

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join(5)
        self.sock.close(0)
        self.ctx.term()


class CountingStore(MemoryMetadataStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def get(self, key: str) -> Any:
        if key.startswith("bookies/"):
            self.reads += 1
        return super().get(key)


@pytest.fixture
def store() -> Iterator[CountingStore]:
    s = CountingStore()
    try:
        yield s
    finally:
        s.close()


def register(store: MemoryMetadataStore, bookie_id: str, address: str) -> None:
    store.put(layout.writable_key(bookie_id), BookieRegistration(bookie_id, address=address).encode())


async def info(t: ZmqTransport, bookie: str, timeout_s: float = 10.0) -> int:
    resp = await t.request(bookie, w.BookieInfoRequest(rid=t.next_rid()), timeout_s)
    return int(resp.ledgers)


async def answered_by(t: ZmqTransport, bookie: str, tag: int, within_s: float = 20.0) -> None:
    """Until a request to ``bookie`` is answered by the stand-in tagged ``tag``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while True:
        try:
            if await info(t, bookie, timeout_s=2.0) == tag:
                return
        except BookieUnavailableError:
            pass
        assert loop.time() < deadline, f"{bookie} never answered from the stand-in tagged {tag}"
        await asyncio.sleep(0.05)


def test_a_name_id_is_reached_at_its_registered_address_and_followed_when_it_moves(store: CountingStore) -> None:
    first, second = free_port(), free_port()
    a = StandIn(first, tag=1)
    b: StandIn | None = None
    register(store, "bookie-a", f"127.0.0.1:{first}")

    async def run() -> None:
        nonlocal b
        t = ZmqTransport(resolver=BookieResolver(store), bookie_heartbeat_timeout_ms=500)
        try:
            assert await info(t, "bookie-a") == 1
            reads = store.reads
            for _ in range(50):
                assert await info(t, "bookie-a") == 1
            assert store.reads == reads, "requests to a connected bookie read no metadata"
            # The bookie goes, and comes back under the same id on another port.
            a.close()
            b = StandIn(second, tag=2)
            register(store, "bookie-a", f"127.0.0.1:{second}")
            await answered_by(t, "bookie-a", 2)
            assert t.peers["bookie-a"].address == f"127.0.0.1:{second}"
            # Re-reads happened only while requests waited, a few per second at most.
            assert store.reads - reads <= 40
        finally:
            await t.close()

    try:
        asyncio.run(run())
    finally:
        a.close() if not a.stop_event.is_set() else None
        if b is not None:
            b.close()


def test_an_unregistered_name_fails_then_is_found_once_it_registers(store: CountingStore) -> None:
    port = free_port()
    a = StandIn(port, tag=7)

    async def run() -> None:
        t = ZmqTransport(resolver=BookieResolver(store))
        try:
            with pytest.raises(BookieUnavailableError, match="no registered address"):
                await info(t, "bookie-b", timeout_s=1.5)
            register(store, "bookie-b", f"127.0.0.1:{port}")
            await answered_by(t, "bookie-b", 7)
        finally:
            await t.close()

    try:
        asyncio.run(run())
    finally:
        a.close()


def test_host_port_ids_work_with_and_without_a_registration(store: CountingStore) -> None:
    port, moved = free_port(), free_port()
    a, b = StandIn(port, tag=3), StandIn(moved, tag=4)
    bookie = f"127.0.0.1:{port}"

    async def run() -> None:
        t = ZmqTransport(resolver=BookieResolver(store))
        try:
            assert await info(t, bookie) == 3  # unregistered: its id is its address
            plain = ZmqTransport()  # no resolver at all: the id is the address
            try:
                assert await info(plain, bookie) == 3
            finally:
                await plain.close()
            # Registered with another address (advertised_address): a new client goes there.
            register(store, bookie, f"127.0.0.1:{moved}")
            t2 = ZmqTransport(resolver=BookieResolver(store))
            try:
                assert await info(t2, bookie) == 4
            finally:
                await t2.close()
        finally:
            await t.close()

    try:
        asyncio.run(run())
    finally:
        a.close()
        b.close()
