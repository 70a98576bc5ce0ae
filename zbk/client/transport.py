"""How the client reaches bookies: one request in, one response (or a typed error) out.

:class:`Transport` is the seam between the client's protocol logic and the network. The
real one (:class:`ZmqTransport`) keeps one DEALER per bookie, pipelines requests with ids,
and routes responses to futures (``request``) or callbacks (``send``, the write path: no
task or future per request); the simulation harness (tests/client/sim.py) implements the
same protocol in virtual time, carrying each request's frames to a bookie's real cores and
their answer back, and can drop, delay or pause them, or answer negative/unknown.

Failure detection. A monitor (ZeroMQ's socket monitor) follows each DEALER's connection on
the event loop. When the connection closes (the bookie died, or the ZMTP heartbeats found it
silent for ``bookie_heartbeat_timeout_ms``: a paused process or a cut network), every request in
flight to it fails at once with BookieUnavailableError: its answer can no longer come, since
libzmq drops a closed connection's queues and a new connection is a new peer to the bookie.
Until a new connection completes its handshake, a writer's adds to it fail at once too (reads
and recovery wait a moment for the reconnection). So a writer starts its ensemble change at
that moment, not when an add times out.

With CURVE (zbk/wire/curve.py) every DEALER is a CURVE client of its bookie, and the monitor
also watches its handshakes: a bookie that refuses our key makes requests to it fail at once
with UnauthorizedError instead of waiting for a connection that will never come.

Addresses. Requests name bookies by id; a :class:`BookieResolver` (zbk/metadata/resolver.py)
gives the address a DEALER connects to, from its cache or, for a bookie it does not know, by
reading the registration in a worker thread while the first requests wait in the backlog.
Whenever a send finds no connection, the registration is read again (at most every
``bookie_address_reread_interval_ms``, only while requests wait): a bookie restarted at
another address under the same stable id is then found there, and the DEALER leaves the old
address for the new one. Without a resolver (tests) a bookie's id is its address.

Identity. An address can be taken by another bookie (one started on the port of a name-id
bookie killed -9, while the dead one's registration still lives), and its explicit negatives
for ledgers it never held must not reach a reader or a recoverer. Every bookie announces its
id in the handshake of each connection (zbk/wire/identity.py), and every answer is checked
against the id it was asked of, on the answer itself (~0.2 us), not at a (re)connection
event: the monitor reports those on its own socket, possibly after the new connection's
first answers were read. An answer from another bookie is dropped and the peer treated as
lost (its requests fail with BookieUnavailableError, as for a dead bookie); the DEALER leaves
the address and the registration is read again. A bookie that announces no id (older) is
taken at its word.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from zbk import limits
from zbk.errors import BookieUnavailableError, UnauthorizedError, ZbkError, ZbkTimeoutError
from zbk.metadata.resolver import BookieResolver
from zbk.wire.codec import decode_response
from zbk.wire.curve import CurveClient
from zbk.wire.errors import FrameError
from zbk.wire.frames import encoded, send_frames
from zbk.wire.identity import PROPERTY, wrong_bookie

log = logging.getLogger(__name__)

# Plain ints for the per-send look at ZMQ_EVENTS: "&" with the IntFlag zmq.POLLIN goes through
# the enum machinery (EnumType.__call__, ~2.5 % of the client's samples at 10,000 ledgers).
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_frame_get = zmq.Frame.get
_BOOKIE_ID = PROPERTY.encode()  # bytes: Frame.get encodes a str on every call


class Transport(Protocol):
    def next_rid(self) -> int: ...

    def suspect(self, bookie: str, within_s: float = 5.0) -> bool: ...

    async def request(self, bookie: str, msg: Any, timeout_s: float) -> Any:
        """Send ``msg`` (its rid from next_rid) and return the response. Raises
        BookieUnavailableError when the bookie does not answer within ``timeout_s``."""

    def send(self, bookie: str, msg: Any, timeout_s: float, callback: Callable[[Any], None]) -> None:
        """``request`` without a coroutine: ``callback`` gets the response, or the error
        ``request`` would raise (a ZbkError instance), exactly once, never synchronously
        from inside this call. The write path's hot loop uses it."""

    async def close(self) -> None: ...


# A connection is up once its ZMTP handshake succeeded (HANDSHAKE_SUCCEEDED comes for every
# mechanism, NULL included), and gone at DISCONNECTED (also after a heartbeat timeout). The
# failed-handshake events are watched with CURVE only: without it, the only way a handshake
# fails is a connection dropped in the middle of it, which DISCONNECTED reports too.
_LINK_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
_HANDSHAKE_FAILED_EVENTS = (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                            | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


def heartbeat_options(timeout_ms: int) -> dict[int, int]:
    """The ZMTP heartbeat socket options under which a silent bookie's connection closes
    within ``timeout_ms`` (0: no heartbeats). libzmq sends a PING every HEARTBEAT_IVL and
    closes the connection when nothing at all arrived for HEARTBEAT_TIMEOUT after one; a
    peer that goes silent just after a PING is found out after at most IVL + TIMEOUT, so the
    two halves of ``timeout_ms`` bound it (and no sooner than half of it). HEARTBEAT_TTL
    asks the bookie to drop this connection after ``timeout_ms`` without hearing from us (a
    partitioned or paused client), two PINGs' worth of margin; libzmq keeps it in tenths of
    a second, and below 100 ms it is 0, off."""
    if timeout_ms <= 0:
        return {}
    ivl = max(1, timeout_ms // 2)
    return {zmq.HEARTBEAT_IVL: ivl, zmq.HEARTBEAT_TIMEOUT: max(1, timeout_ms - ivl), zmq.HEARTBEAT_TTL: timeout_ms}


class _Peer:
    def __init__(self, ctx: zmq.asyncio.Context, bookie: str, curve: CurveClient | None,
                 bookie_heartbeat_timeout_ms: int, address: str | None) -> None:
        self.bookie = bookie
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, limits.socket_hwm_messages)
        self.sock.setsockopt(zmq.RCVHWM, limits.socket_hwm_messages)
        self.sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for a bookie we are not connected to
        for opt, value in heartbeat_options(bookie_heartbeat_timeout_ms).items():
            self.sock.setsockopt(opt, value)
        self.handshake_error: ZbkError | None = None  # the last handshake failed (CURVE)
        self.connected = False  # a connection has completed its handshake and not closed since
        # The connection closed and no new one has completed its handshake yet: adds fail at
        # once (ZmqTransport._send_in_order).
        self.lost = False
        events = _LINK_EVENTS
        if curve is not None:
            try:
                curve.apply(self.sock, bookie)  # ConfigError: no server key for this bookie
            except BaseException:
                self.sock.close(0)
                raise
            events |= _HANDSHAKE_FAILED_EVENTS
        self.monitor: zmq.asyncio.Socket = self.sock.get_monitor_socket(events)
        # Where the DEALER connects (None: not known yet, or the bookie has none registered),
        # and the re-read of the registration under way, if any (ZmqTransport._relocate).
        self.address: str | None = None
        self.left: set[str] = set()  # endpoints it was connected to before (detach)
        # (address, id) of the last bookie found answering in this one's place (_refuse).
        self.refused: tuple[str, str] | None = None
        self.anonymous = False  # an answer without an announced id came (logged once)
        self.locating: asyncio.Task[None] | None = None
        self.located_at = -float("inf")
        if address is not None:
            self.attach(address)
        # All sends and receives go through a plain (synchronous) view of the socket, never
        # blocking: pyzmq's asyncio wrappers cost a future and several callbacks per message.
        # The loop watches the socket's FD (add_reader); since a ZeroMQ FD only signals new
        # activity, every send is followed by a look at ZMQ_EVENTS (_poke).
        self.raw: zmq.Socket[Any] = zmq.Socket.shadow(self.sock.underlying)
        self.fd = int(self.raw.getsockopt(zmq.FD))
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.calls: dict[int, tuple[Callable[[Any], None], asyncio.TimerHandle]] = {}
        self.read_scheduled = False
        self.watcher: asyncio.Task[None] | None = None
        # Requests that could not be sent yet (no connection), in the order they were made;
        # later requests queue behind them, so a bookie receives one client's requests in
        # the order the client made them (a FORCE_LEDGER never overtakes the adds before it).
        # Each with its deadline, its done callback, and whether a lost connection fails it at
        # once (fail_if_lost: a writer's add).
        self.backlog: deque[tuple[list[Any], float, Callable[[BaseException | None], None], bool]] = deque()
        self.flusher: asyncio.Task[None] | None = None

    def attach(self, address: str) -> None:
        endpoint = f"tcp://{address}"
        self.left.discard(endpoint)
        self.sock.connect(endpoint)
        self.address = address

    def detach(self) -> None:
        if self.address is not None:
            endpoint = f"tcp://{self.address}"
            try:
                self.sock.disconnect(endpoint)
            except zmq.ZMQError:
                pass  # never connected: nothing to leave
            # Its connection's last events may still be on their way: _on_event drops them.
            # (libzmq names a connection by the endpoint as given, mostly: one made again
            # after a reconnection to a host name carries the resolved address.)
            self.left.add(endpoint)
            self.address = None

    def unreachable(self) -> str:
        """Why a request found no connection, for its error."""
        if self.address is None and self.refused is not None:
            return wrong_bookie(self.bookie, self.refused[1], self.refused[0])
        if self.address is None:
            return f"bookie {self.bookie} is not connected: no registered address"
        return f"bookie {self.bookie} is not connected (at {self.address})"


class ZmqTransport:
    def __init__(self, *, curve: CurveClient | None = None,
                 bookie_heartbeat_timeout_ms: int = limits.client_heartbeat_timeout_ms_default,
                 resolver: BookieResolver | None = None) -> None:
        self.ctx = zmq.asyncio.Context()
        self.curve = curve
        self.resolver = resolver  # None: a bookie's id is its address
        self.reread_s = limits.bookie_address_reread_interval_ms / 1000
        self.bookie_heartbeat_timeout_ms = bookie_heartbeat_timeout_ms
        self.peers: dict[str, _Peer] = {}
        self._rids = itertools.count(1)
        self.closed = False
        self.failed_at: dict[str, float] = {}  # bookie -> when it last failed to answer

    def suspect(self, bookie: str, within_s: float = 5.0) -> bool:
        """Did ``bookie`` fail to answer in the last ``within_s`` seconds? Readers ask such
        bookies last."""
        t = self.failed_at.get(bookie)
        return t is not None and time.monotonic() - t < within_s

    def next_rid(self) -> int:
        return next(self._rids)

    def _peer(self, bookie: str) -> _Peer:
        p = self.peers.get(bookie)
        if p is None:
            loop = asyncio.get_running_loop()
            address = bookie if self.resolver is None else self.resolver.cached(bookie)
            p = self.peers[bookie] = _Peer(self.ctx, bookie, self.curve, self.bookie_heartbeat_timeout_ms, address)
            loop.add_reader(p.fd, self._readable, p)
            p.watcher = loop.create_task(self._watch(p))
            if address is None:
                self._relocate(p)
        return p

    def _relocate(self, p: _Peer) -> None:
        """``p`` has no connection and a request waits for one: read its registration again
        in a worker thread, unless that is under way or was done less than reread_s ago.
        Without a resolver, go back to the id's address if _refuse left it."""
        if p.locating is not None or p.connected or self.closed:
            return  # connected: a send that cannot go now waits for the high-water mark
        if self.resolver is None and p.address is not None:
            return
        now = time.monotonic()
        if now - p.located_at < self.reread_s:
            return
        p.located_at = now
        if self.resolver is None:
            p.attach(p.bookie)
            return
        p.locating = asyncio.get_running_loop().create_task(self._locate(p, self.resolver))

    async def _locate(self, p: _Peer, resolver: BookieResolver) -> None:
        try:
            address = await asyncio.to_thread(resolver.refresh, p.bookie)
        except Exception as e:  # noqa: BLE001 - an unreachable store: keep the address we have
            log.warning("cannot read the registration of bookie %s: %s", p.bookie, e)
            return
        finally:
            p.locating = None
        if self.closed or self.peers.get(p.bookie) is not p or address == p.address:
            return
        if p.address is not None:
            # Also when the bookie has no registration now: whatever answers at its old
            # address may be another bookie that took the port.
            log.info("bookie %s: registered address %s, was %s", p.bookie, address, p.address)
            p.detach()
            if p.connected:  # connected meanwhile: its requests in flight get no answer now
                p.connected = False
                self._lost(p)
        if address is not None:
            p.attach(address)

    async def _watch(self, p: _Peer) -> None:
        """Follow one peer's connections (reconnects included) on the event loop."""
        while True:
            try:
                event = parse_monitor_message(await p.monitor.recv_multipart())
            except (zmq.ZMQError, asyncio.CancelledError):
                return
            endpoint = event["endpoint"]
            self._on_event(p, event["event"], event["value"],
                           endpoint.decode(errors="replace") if isinstance(endpoint, bytes) else str(endpoint))

    def _on_event(self, p: _Peer, kind: int, value: int, endpoint: str = "") -> None:
        if endpoint in p.left:
            return  # the connection to an address the peer has left (_locate)
        if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            p.handshake_error = None
            p.lost = False
            p.connected = True
        elif kind == zmq.EVENT_DISCONNECTED:
            p.connected = False
            self._lost(p)
        else:
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                p.handshake_error = UnauthorizedError(
                    f"bookie {p.bookie} refused this client's CURVE key (ZAP status {value})")
            else:
                p.handshake_error = BookieUnavailableError(
                    f"bookie {p.bookie}: CURVE handshake failed (wrong server key, or the bookie does not use CURVE)")
            log.warning("%s", p.handshake_error)

    def _lost(self, p: _Peer, refused: str | None = None) -> None:
        """``p``'s connection closed: fail every request in flight to it now, and the adds
        queued for it (sends made between the close and this report found no connection and
        were queued to wait for one). Answers that arrived before the close are still in the
        socket: they are taken first. ``refused``: not a close but another bookie answering
        (_refuse, whose caller is reading the socket already); the errors say so."""
        if not p.lost and refused is None:
            log.info("lost the connection to bookie %s", p.bookie)
        p.lost = True
        self.failed_at[p.bookie] = time.monotonic()
        if refused is None:
            self._readable(p)
        why = refused or f"bookie {p.bookie}: connection lost"
        if any(item[3] for item in p.backlog):
            queued, p.backlog = p.backlog, deque()
            for item in queued:
                if item[3]:  # never sent: the requests queued behind it keep their order
                    item[2](BookieUnavailableError(why))
                else:
                    p.backlog.append(item)
        calls, p.calls = p.calls, {}
        for callback, timer in calls.values():
            timer.cancel()
            callback(BookieUnavailableError(why))
        waiting, p.waiting = p.waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(BookieUnavailableError(why))

    def _refuse(self, p: _Peer, actual: str) -> None:
        """An answer on ``p``'s connection came from bookie ``actual``: another bookie has
        ``p``'s address. The answer is dropped (it is not ``p``'s to give) and ``p`` is
        treated as lost: what is in flight to it fails, so readers go to other replicas and
        a writer changes its ensemble. The DEALER leaves the address (nothing more is sent
        there) and the registration is read again; it goes back only to an address the
        registration names, where every answer is checked again."""
        if p.address is not None:  # the first such answer on this connection
            p.refused = (p.address, actual)
            log.warning("%s; reading its registration again", wrong_bookie(p.bookie, actual, p.address))
            p.detach()
        p.connected = False
        self._lost(p, refused=wrong_bookie(p.bookie, actual, p.refused[0] if p.refused else None))
        self._relocate(p)

    def _anonymous(self, p: _Peer) -> None:
        if not p.anonymous:
            p.anonymous = True
            log.debug("bookie %s announces no id (an older bookie): its answers are not checked", p.bookie)

    def _readable(self, p: _Peer) -> None:
        """Dispatch every response waiting on ``p``'s socket; one given by another bookie
        than ``p``'s goes to _refuse, never to a caller."""
        p.read_scheduled = False
        raw = p.raw
        expected = p.bookie
        while True:
            try:
                # Look at ZMQ_EVENTS first (~3 us) rather than end every wake-up with a failed
                # recv: zmq.Again is a Python exception built with enum look-ups (~13 us), on
                # the critical path of a window-1 writer. Reading ZMQ_EVENTS until it shows no
                # POLLIN is also what re-arms the edge-triggered FD.
                if not int(raw.getsockopt(_EVENTS)) & _POLLIN:
                    return
                frames = raw.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            except zmq.ZMQError:  # closed under us (client shutting down)
                return
            try:
                actual = _frame_get(frames[0], _BOOKIE_ID)  # the id this connection's peer announced
            except zmq.ZMQError:  # none announced (EINVAL): an older bookie
                actual = expected
                self._anonymous(p)
            if actual == expected:
                self._dispatch(p, frames)
            else:
                self._refuse(p, str(actual))

    def _poke(self, p: _Peer) -> None:
        """After a send: a ZeroMQ FD does not signal again for messages libzmq took in during
        the send, so look at the socket's events and read them on the next turn."""
        if not p.read_scheduled and int(p.raw.getsockopt(_EVENTS)) & _POLLIN:
            p.read_scheduled = True
            asyncio.get_running_loop().call_soon(self._readable, p)

    def _dispatch(self, p: _Peer, frames: list[Any]) -> None:
        try:
            resp = decode_response([f.buffer for f in frames])
        except FrameError as e:
            # A response we cannot read: fail the request it names, if any; the caller
            # then treats this bookie as unknown for that request.
            log.warning("undecodable response from %s: %s", p.bookie, e)
            if e.rid is not None:
                self._resolve(p, e.rid, BookieUnavailableError(f"{p.bookie}: bad response ({e})"))
            return
        self._resolve(p, resp.rid, resp)

    def _resolve(self, p: _Peer, rid: int, result: Any) -> None:
        call = p.calls.pop(rid, None)
        if call is not None:
            call[1].cancel()
            call[0](result)
            return
        fut = p.waiting.pop(rid, None)
        if fut is not None and not fut.done():
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)

    def send(self, bookie: str, msg: Any, timeout_s: float, callback: Callable[[Any], None]) -> None:
        self.send_all((bookie,), msg, timeout_s, (callback,))

    def send_all(self, bookies: Sequence[str], msg: Any, timeout_s: float,
                 callbacks: Sequence[Callable[[Any], None]], *, fail_if_lost: bool = True) -> None:
        """``send`` of one message to several bookies (callbacks[i] for bookies[i]), encoded
        once: the write path sends identical adds to every bookie of a write set. The rid
        is the same on each connection; rids only need to be unique per bookie.
        ``fail_if_lost``: see _send_in_order."""
        loop = asyncio.get_running_loop()
        if self.closed:
            for callback in callbacks:
                loop.call_soon(callback, BookieUnavailableError("client is closed"))
            return
        frames = encoded(msg)
        rid = msg.rid
        started = time.monotonic()
        for bookie, callback in zip(bookies, callbacks, strict=True):
            p = self._peer(bookie)
            self._send_in_order(p, frames, timeout_s, functools.partial(self._sent, p, rid, started, timeout_s, callback),
                                fail_if_lost=fail_if_lost)

    def _sent(self, p: _Peer, rid: int, started: float, timeout_s: float, callback: Callable[[Any], None],
              err: BaseException | None) -> None:
        loop = asyncio.get_running_loop()
        if err is not None:
            loop.call_soon(callback, err)
            return
        left = max(0.0, timeout_s - (time.monotonic() - started))
        p.calls[rid] = (callback, loop.call_later(left, self._expire, p, rid, timeout_s))

    def _send_in_order(self, p: _Peer, frames: list[Any], timeout_s: float,
                       done: Callable[[BaseException | None], None], *, fail_if_lost: bool = False) -> None:
        """Send ``frames`` to ``p`` now if nothing is queued before them, else queue them
        behind what is; ``done(None)`` right after the send, ``done(error)`` if it cannot
        be sent. IMMEDIATE makes a send fail with EAGAIN while there is no connection (a new
        peer, or a dead or restarting bookie): the queue then waits up to a second per
        request for one (a restarted bookie is reached again after ZeroMQ's reconnect
        interval plus a handshake; failing sooner failed a recovery that began just after
        every bookie restarted). With ``fail_if_lost`` (a writer's adds), a peer whose
        connection closed fails at once instead: a writer has somewhere else to go, its
        ensemble change, and every moment spent waiting stalls its ledger."""
        if not p.backlog:
            try:
                send_frames(p.raw, frames)
            except zmq.Again:
                self._relocate(p)
            except zmq.ZMQError as e:  # the socket was closed under us (client shutting down)
                done(BookieUnavailableError(f"bookie {p.bookie}: {e}"))
                return
            else:
                self._poke(p)
                done(None)
                return
        if fail_if_lost and p.lost:
            self.failed_at[p.bookie] = time.monotonic()
            done(BookieUnavailableError(f"bookie {p.bookie}: connection lost"))
            return
        p.backlog.append((frames, time.monotonic() + min(timeout_s, 1.0), done, fail_if_lost))
        if p.flusher is None:
            p.flusher = asyncio.get_running_loop().create_task(self._flush_backlog(p))

    async def _flush_backlog(self, p: _Peer) -> None:
        """Send ``p``'s queued requests in order as the connection allows. Never poll(POLLOUT)
        on the async socket: pyzmq queues a send behind a pending poll future and ignores
        DONTWAIT then, which hung a recovery on a SIGSTOPped bookie."""
        try:
            while p.backlog:
                frames, deadline, done, _ = p.backlog[0]
                err: BaseException | None = None
                try:
                    send_frames(p.raw, frames)
                except zmq.Again:
                    if p.handshake_error is not None:  # connected, but the bookie refused us
                        err = p.handshake_error
                    elif time.monotonic() >= deadline:
                        err = BookieUnavailableError(p.unreachable())
                    else:
                        self._relocate(p)
                        await asyncio.sleep(0.01)
                        continue
                    self.failed_at[p.bookie] = time.monotonic()
                except zmq.ZMQError as e:
                    err = BookieUnavailableError(f"bookie {p.bookie}: {e}")
                p.backlog.popleft()
                if err is None:
                    self._poke(p)
                done(err)
        finally:
            p.flusher = None

    def _expire(self, p: _Peer, rid: int, timeout_s: float) -> None:
        call = p.calls.pop(rid, None)
        if call is not None:
            self.failed_at[p.bookie] = time.monotonic()
            call[0](BookieUnavailableError(f"bookie {p.bookie} did not answer within {timeout_s:.1f}s"))

    async def request(self, bookie: str, msg: Any, timeout_s: float) -> Any:
        if self.closed:
            raise BookieUnavailableError("client is closed")
        p = self._peer(bookie)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        p.waiting[msg.rid] = fut
        try:
            # The send is inside the timeout too: nothing about a dead or hung bookie may
            # block a caller longer than timeout_s. asyncio.timeout, not wait_for: in Python
            # 3.11, wait_for loses a cancellation that arrives in the loop iteration in which
            # the answer does (python/cpython#86296), and a caller that gave up (a reader's
            # own timeout around tail()) then never stops.
            async with asyncio.timeout(timeout_s):
                return await self._exchange(p, msg, fut, timeout_s)
        except (TimeoutError, ZbkTimeoutError):
            self.failed_at[bookie] = time.monotonic()
            raise BookieUnavailableError(f"bookie {bookie} did not answer within {timeout_s:.1f}s") from None
        finally:
            p.waiting.pop(msg.rid, None)
            if fut.done() and not fut.cancelled():
                fut.exception()  # taken: a lost connection fails the send and the answer alike

    async def _exchange(self, p: _Peer, msg: Any, fut: asyncio.Future[Any], timeout_s: float) -> Any:
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(err: BaseException | None) -> None:
            if sent.done():  # the caller gave up (timeout) while the request was queued
                return
            if err is None:
                sent.set_result(None)
            else:
                sent.set_exception(err)

        self._send_in_order(p, encoded(msg), timeout_s, done)
        await sent
        return await fut

    async def close(self) -> None:
        self.closed = True
        loop = asyncio.get_running_loop()
        for p in self.peers.values():
            loop.remove_reader(p.fd)
            if p.flusher is not None:
                p.flusher.cancel()
            if p.locating is not None:
                p.locating.cancel()
            while p.backlog:
                p.backlog.popleft()[2](BookieUnavailableError("client closed"))
            for callback, timer in p.calls.values():
                timer.cancel()
                callback(BookieUnavailableError("client closed"))
            p.calls.clear()
            if p.watcher:
                p.watcher.cancel()
            p.sock.disable_monitor()
            p.monitor.close(0)
            for fut in p.waiting.values():
                if not fut.done():
                    fut.set_exception(BookieUnavailableError("client closed"))
                    fut.exception()  # mark retrieved: its caller may be gone already at shutdown
            p.sock.close(0)
        self.peers.clear()
        self.ctx.term()
