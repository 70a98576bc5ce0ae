"""The actor machinery: a plain logic class (the "core") driven by a thin loop thread that
owns the ZeroMQ sockets.

A core never imports zmq and never reads the time. It receives messages and ticks (with
``now`` from an injected clock) and sends messages through an :class:`Outbox`. Tests drive
cores directly with a :class:`ListOutbox`; the bookie drives them with :class:`ActorLoop`.

Between actors, messages travel over inproc PUSH/PULL sockets as pickled objects (protocol 5:
bytes payloads are copied once, in C). Each actor has ONE PULL socket per sending peer, so
that the order of messages from one peer is the order they were sent (ZeroMQ keeps FIFO per
pipe, but fair-queues across pipes). Ordering arguments in zbk/actors/bookie.py rely on it.

A core that raises stops the whole bookie: crash, don't limp. The loop reports the failure
to the supervisor, which exits the process with the actor's distinct exit code.
"""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from zbk.clock import Clock

log = logging.getLogger(__name__)


class Outbox(Protocol):
    def send(self, dest: str, msg: Any) -> None:
        """Queue ``msg`` for actor ``dest``."""


class Core(Protocol):
    name: str
    tick_interval_s: float | None

    def on_message(self, msg: Any, now: float) -> None: ...

    def on_tick(self, now: float) -> None: ...


class ListOutbox:
    """An outbox for tests: records (dest, msg) pairs."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    def send(self, dest: str, msg: Any) -> None:
        self.sent.append((dest, msg))

    def take(self, dest: str | None = None, kind: type | None = None) -> list[Any]:
        keep, out = [], []
        for d, m in self.sent:
            if (dest is None or d == dest) and (kind is None or isinstance(m, kind)):
                out.append(m)
            else:
                keep.append((d, m))
        self.sent = keep
        return out


def pipe_address(instance: str, sender: str, receiver: str) -> str:
    return f"inproc://zbk-{instance}-{sender}-to-{receiver}"


class SocketOutbox:
    """PUSH sockets, one per destination, each bound by the receiver's loop."""

    def __init__(self, ctx: zmq.Context[Any], instance: str, sender: str, peers: list[str]) -> None:
        self._socks: dict[str, zmq.Socket[Any]] = {}
        for peer in peers:
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.SNDHWM, 0)  # inproc between our own actors: bounded upstream instead
            s.setsockopt(zmq.LINGER, 0)
            s.connect(pipe_address(instance, sender, peer))
            self._socks[peer] = s

    def send(self, dest: str, msg: Any) -> None:
        # copy=True: a memcpy is cheaper than pyzmq's zero-copy bookkeeping (a GC thread per frame).
        self._socks[dest].send(pickle.dumps(msg, protocol=5), copy=True)

    def close(self) -> None:
        for s in self._socks.values():
            s.close(0)


class ActorLoop(threading.Thread):
    """Runs one core: polls its inbound pipes, feeds messages and ticks, reports crashes.

    ``extra`` sockets (e.g. the Server's ROUTER) are polled too and handed to ``on_extra``.
    """

    def __init__(self, *, ctx: zmq.Context[Any], instance: str, core: Core, senders: list[str],
                 peers: list[str], clock: Clock, on_crash: Callable[[str, BaseException], None],
                 stop: threading.Event) -> None:
        super().__init__(name=f"zbk-{core.name}", daemon=True)
        self.ctx, self.instance, self.core, self.clock = ctx, instance, core, clock
        self.on_crash, self.stop_event = on_crash, stop
        self.inbound: list[zmq.Socket[Any]] = []
        for sender in senders:  # bind before any peer connects (inproc needs bind first on old libzmq)
            s = ctx.socket(zmq.PULL)
            s.setsockopt(zmq.RCVHWM, 0)
            s.setsockopt(zmq.LINGER, 0)
            s.bind(pipe_address(instance, sender, core.name))
            self.inbound.append(s)
        self.peers = peers
        self.outbox: SocketOutbox | None = None
        self.extra: list[zmq.Socket[Any]] = []
        self.ready = threading.Event()

    # Hooks for loops with extra sockets (Server) or special batching (Journal).
    def setup(self) -> None:
        pass

    def on_extra(self, sock: zmq.Socket[Any], now: float) -> None:
        raise AssertionError("no extra sockets")

    def after_batch(self, now: float) -> None:
        """Called after draining everything that was ready (group commit hooks in here)."""

    def teardown(self) -> None:
        pass

    def run(self) -> None:
        try:
            self.outbox = SocketOutbox(self.ctx, self.instance, self.core.name, self.peers)
            self.core.outbox = self.outbox  # type: ignore[attr-defined]
            self.setup()
            self.ready.set()
            self._loop()
        except BaseException as e:  # noqa: BLE001 - any failure of an actor stops the bookie
            log.exception("actor %s crashed", self.core.name)
            self.ready.set()
            self.on_crash(self.core.name, e)
        finally:
            self.teardown()
            for s in self.inbound + self.extra:
                s.close(0)
            if self.outbox:
                self.outbox.close()

    def _loop(self) -> None:
        poller = zmq.Poller()
        for s in self.inbound + self.extra:
            poller.register(s, zmq.POLLIN)
        extra = set(self.extra)
        interval = self.core.tick_interval_s
        next_tick = self.clock.monotonic() + interval if interval else None
        while not self.stop_event.is_set():
            now = self.clock.monotonic()
            timeout_ms = 100.0
            if next_tick is not None:
                timeout_ms = max(0.0, min(timeout_ms, (next_tick - now) * 1000))
            timeout_ms = min(timeout_ms, self.poll_timeout_ms())
            events = dict(poller.poll(int(timeout_ms)))
            now = self.clock.monotonic()
            for sock in events:
                if sock in extra:
                    self.on_extra(sock, now)
                else:
                    self._drain(sock, now)
            self.after_batch(self.clock.monotonic())
            if next_tick is not None and self.clock.monotonic() >= next_tick:
                self.core.on_tick(self.clock.monotonic())
                next_tick = self.clock.monotonic() + (interval or 0)

    def poll_timeout_ms(self) -> float:
        return 100.0

    def _drain(self, sock: zmq.Socket[Any], now: float, budget: int = 1024) -> None:
        for _ in range(budget):
            try:
                raw = sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self.core.on_message(pickle.loads(raw.buffer), now)
            self.after_message()

    def after_message(self) -> None:
        """Called after each message (the journal commits early here when its group is full)."""


