"""How the client reaches bookies: one request in, one response (or a typed error) out.

:class:`Transport` is the seam between the client's protocol logic and the network. The
real one (:class:`ZmqTransport`) keeps one DEALER per bookie, pipelines requests with ids,
and routes responses to futures (``request``) or callbacks (``send``, the write path: no
task or future per request); the simulation harness (tests/client/sim.py) implements the
same protocol in virtual time, carrying each request's frames to a bookie's real cores and
their answer back, and can drop, delay or pause them, or answer negative/unknown.

With CURVE (zbk/wire/curve.py) every DEALER is a CURVE client of its bookie, and a monitor
watches its handshakes: a bookie that refuses our key makes requests to it fail at once
with UnauthorizedError instead of waiting for a connection that will never come.
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
from zbk.wire.codec import decode_response, encode
from zbk.wire.curve import CurveClient
from zbk.wire.errors import FrameError

log = logging.getLogger(__name__)

# pyzmq's send_multipart calls the Python-level Socket.send per frame and ORs IntFlag enums
# each time (~2.3 us a frame); the C-level send with int flags costs ~0.65 us. An add
# request of 1,000 entries is 1,001 frames, so this is most of the client's send cost.
_send_frame = zmq.backend.Socket.send
_MORE = int(zmq.SNDMORE) | int(zmq.DONTWAIT)
_LAST = int(zmq.DONTWAIT)
# Plain ints for the per-send look at ZMQ_EVENTS: "&" with the IntFlag zmq.POLLIN goes through
# the enum machinery (EnumType.__call__, ~2.5 % of the client's samples at 10,000 ledgers).
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)


# Frames of this size or more are sent without a copy (pyzmq's own threshold for copy=False).
_ZERO_COPY_BYTES = zmq.COPY_THRESHOLD
_Frame = zmq.Frame


def _encoded(msg: Any) -> list[Any]:
    """``encode(msg)`` with every frame of _ZERO_COPY_BYTES or more wrapped in a zmq.Frame
    that references the bytes: sent to three bookies, a packed add request's blob frame
    (hundreds of KiB) is then copied zero times instead of three; the bytes are immutable
    and the Frame keeps them alive until libzmq has sent every copy (copying would be more
    than half the CPU of sending such a request). Smaller frames are copied: that is
    cheaper than a Frame's bookkeeping."""
    return [_Frame(f) if len(f) >= _ZERO_COPY_BYTES else f for f in encode(msg)]


def _send_frames(sock: zmq.Socket[Any], frames: list[Any]) -> None:
    """send_multipart(frames, DONTWAIT), copying each frame except the zmq.Frame ones
    (_encoded). Raises zmq.Again before sending anything if the message cannot be queued:
    ZeroMQ takes a multipart message whole or not at all."""
    last = len(frames) - 1
    for i, f in enumerate(frames):
        _send_frame(sock, f, _LAST if i == last else _MORE, f.__class__ is not _Frame, False)


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


_HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                     | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class _Peer:
    def __init__(self, ctx: zmq.asyncio.Context, bookie: str, curve: CurveClient | None) -> None:
        self.bookie = bookie
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, limits.socket_hwm_messages)
        self.sock.setsockopt(zmq.RCVHWM, limits.socket_hwm_messages)
        self.sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for a bookie we are not connected to
        self.monitor: zmq.asyncio.Socket | None = None
        self.handshake_error: ZbkError | None = None  # the last handshake failed (CURVE)
        if curve is not None:
            try:
                curve.apply(self.sock, bookie)  # ConfigError: no server key for this bookie
            except BaseException:
                self.sock.close(0)
                raise
            self.monitor = self.sock.get_monitor_socket(_HANDSHAKE_EVENTS)
        self.sock.connect(f"tcp://{bookie}")
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
        self.backlog: deque[tuple[list[Any], float, Callable[[BaseException | None], None]]] = deque()
        self.flusher: asyncio.Task[None] | None = None


class ZmqTransport:
    def __init__(self, *, curve: CurveClient | None = None) -> None:
        self.ctx = zmq.asyncio.Context()
        self.curve = curve
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
            p = self.peers[bookie] = _Peer(self.ctx, bookie, self.curve)
            loop.add_reader(p.fd, self._readable, p)
            if p.monitor is not None:
                p.watcher = loop.create_task(self._watch(p))
        return p

    async def _watch(self, p: _Peer) -> None:
        """Follow the CURVE handshakes of one peer's socket (reconnects included)."""
        assert p.monitor is not None
        while True:
            try:
                event = parse_monitor_message(await p.monitor.recv_multipart())
            except (zmq.ZMQError, asyncio.CancelledError):
                return
            kind = event["event"]
            if kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                p.handshake_error = None
            elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                p.handshake_error = UnauthorizedError(
                    f"bookie {p.bookie} refused this client's CURVE key (ZAP status {event['value']})")
            else:
                p.handshake_error = BookieUnavailableError(
                    f"bookie {p.bookie}: CURVE handshake failed (wrong server key, or the bookie does not use CURVE)")
            if p.handshake_error is not None:
                log.warning("%s", p.handshake_error)

    def _readable(self, p: _Peer) -> None:
        """Dispatch every response waiting on ``p``'s socket."""
        p.read_scheduled = False
        raw = p.raw
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
            self._dispatch(p, frames)

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
                 callbacks: Sequence[Callable[[Any], None]]) -> None:
        """``send`` of one message to several bookies (callbacks[i] for bookies[i]), encoded
        once: the write path sends identical adds to every bookie of a write set. The rid
        is the same on each connection; rids only need to be unique per bookie."""
        loop = asyncio.get_running_loop()
        if self.closed:
            for callback in callbacks:
                loop.call_soon(callback, BookieUnavailableError("client is closed"))
            return
        frames = _encoded(msg)
        rid = msg.rid
        started = time.monotonic()
        for bookie, callback in zip(bookies, callbacks, strict=True):
            p = self._peer(bookie)
            self._send_in_order(p, frames, timeout_s, functools.partial(self._sent, p, rid, started, timeout_s, callback))

    def _sent(self, p: _Peer, rid: int, started: float, timeout_s: float, callback: Callable[[Any], None],
              err: BaseException | None) -> None:
        loop = asyncio.get_running_loop()
        if err is not None:
            loop.call_soon(callback, err)
            return
        left = max(0.0, timeout_s - (time.monotonic() - started))
        p.calls[rid] = (callback, loop.call_later(left, self._expire, p, rid, timeout_s))

    def _send_in_order(self, p: _Peer, frames: list[Any], timeout_s: float,
                       done: Callable[[BaseException | None], None]) -> None:
        """Send ``frames`` to ``p`` now if nothing is queued before them, else queue them
        behind what is; ``done(None)`` right after the send, ``done(error)`` if it cannot
        be sent. IMMEDIATE makes a send fail with EAGAIN while there is no connection (a new
        peer, or a dead or restarting bookie): the queue then waits up to a second per
        request for one (a restarted bookie is reached again after ZeroMQ's reconnect
        interval plus a handshake; failing sooner turned a restart into an ensemble change)."""
        if not p.backlog:
            try:
                _send_frames(p.raw, frames)
            except zmq.Again:
                pass
            except zmq.ZMQError as e:  # the socket was closed under us (client shutting down)
                done(BookieUnavailableError(f"bookie {p.bookie}: {e}"))
                return
            else:
                self._poke(p)
                done(None)
                return
        p.backlog.append((frames, time.monotonic() + min(timeout_s, 1.0), done))
        if p.flusher is None:
            p.flusher = asyncio.get_running_loop().create_task(self._flush_backlog(p))

    async def _flush_backlog(self, p: _Peer) -> None:
        """Send ``p``'s queued requests in order as the connection allows. Never poll(POLLOUT)
        on the async socket: pyzmq queues a send behind a pending poll future and ignores
        DONTWAIT then, which hung a recovery on a SIGSTOPped bookie."""
        try:
            while p.backlog:
                frames, deadline, done = p.backlog[0]
                err: BaseException | None = None
                try:
                    _send_frames(p.raw, frames)
                except zmq.Again:
                    if p.handshake_error is not None:  # connected, but the bookie refused us
                        err = p.handshake_error
                    elif time.monotonic() >= deadline:
                        err = BookieUnavailableError(f"bookie {p.bookie} is not connected")
                    else:
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
            # block a caller longer than timeout_s.
            return await asyncio.wait_for(self._exchange(p, msg, fut, timeout_s), timeout_s)
        except (TimeoutError, ZbkTimeoutError):
            self.failed_at[bookie] = time.monotonic()
            raise BookieUnavailableError(f"bookie {bookie} did not answer within {timeout_s:.1f}s") from None
        finally:
            p.waiting.pop(msg.rid, None)

    async def _exchange(self, p: _Peer, msg: Any, fut: asyncio.Future[Any], timeout_s: float) -> Any:
        sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(err: BaseException | None) -> None:
            if sent.done():  # the caller gave up (timeout) while the request was queued
                return
            if err is None:
                sent.set_result(None)
            else:
                sent.set_exception(err)

        self._send_in_order(p, _encoded(msg), timeout_s, done)
        await sent
        return await fut

    async def close(self) -> None:
        self.closed = True
        loop = asyncio.get_running_loop()
        for p in self.peers.values():
            loop.remove_reader(p.fd)
            if p.flusher is not None:
                p.flusher.cancel()
            while p.backlog:
                p.backlog.popleft()[2](BookieUnavailableError("client closed"))
            for callback, timer in p.calls.values():
                timer.cancel()
                callback(BookieUnavailableError("client closed"))
            p.calls.clear()
            if p.watcher:
                p.watcher.cancel()
            if p.monitor is not None:
                p.sock.disable_monitor()
                p.monitor.close(0)
            for fut in p.waiting.values():
                if not fut.done():
                    fut.set_exception(BookieUnavailableError("client closed"))
                    fut.exception()  # mark retrieved: its caller may be gone already at shutdown
            p.sock.close(0)
        self.peers.clear()
        self.ctx.term()
