"""The actor machinery: a plain logic class (the "core") driven by a thin loop thread that
owns the ZeroMQ sockets.

A core never imports zmq and never reads the time. It receives messages and ticks (with
``now`` from an injected clock) and sends messages through an :class:`Outbox`. Tests drive
cores directly with a :class:`ListOutbox`; the bookie drives them with :class:`ActorLoop`.

Between actors, messages travel over inproc PUSH/PULL sockets, one pipe per (sender,
receiver). Each actor has ONE PULL socket per sending peer, so that the order of messages
from one peer is the order they were sent (ZeroMQ keeps FIFO per pipe, but fair-queues
across pipes). Ordering arguments in zbk/actors/messages.py rely on it.

Hand-over, not copies. All actors of a bookie live in one process, so a message is not
serialized: each (sender, receiver) pipe has a :class:`Pipe`, a FIFO queue of message
objects shared by both ends (per bookie instance, see :func:`handoff_for`). The sender
appends the message to the queue and, unless a wake-up is already on its way, sends an
empty frame over the inproc pipe; the receiver, woken by that frame in its zmq poll, takes
every message queued so far, in order. So the order of messages from one peer is their
send order, an actor still sleeps in zmq poll until a peer has something for it, no
pickling happens, and a burst of messages costs one frame instead of one frame each.

No lost wake-up: the sender appends, then sends a frame if ``armed`` is false (and sets
it); the receiver, after taking a frame off the pipe, clears ``armed`` and only then looks
at the queue, taking everything it holds at that moment. A message appended before the
clear is in the queue when the receiver looks; one appended after it finds ``armed``
false, or set again by a sender who then sent another frame, and so has a frame coming.

THE RULE: a message, and everything reachable from it (its lists, dicts, tuples), belongs
to the receiver once it is sent. The sender must not mutate or reuse it afterwards, and
the receiver must not mutate what it received if the sender may still read it (e.g. the
Server keeps the ``entry_ids`` list of the AppendBatch it sent in its PendingAdd, and the
EntryLogger forwards that same list in Appended and JournalAppend: nobody mutates it). Send
freshly built objects; never ``msg.items.append(...)`` after ``send``, never reuse a buffer
list across sends. bytes, ints, strings and tuples of them are immutable and always safe.
tests/actors/test_gc.py delivers messages the same way and checks that nothing sent was
changed before or after delivery.

A core that raises stops the whole bookie: crash, don't limp. The loop reports the failure
to the supervisor, which exits the process with the actor's distinct exit code.
"""

from __future__ import annotations

import logging
import math
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from zbk.clock import Clock

log = logging.getLogger(__name__)
_NOBLOCK = int(zmq.NOBLOCK)


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


class Pipe:
    """The message queue of one (sender, receiver) pipe; ``armed``: a wake-up frame for it
    is on the inproc pipe (see the module docstring for why no wake-up is lost)."""

    __slots__ = ("queue", "armed")

    def __init__(self) -> None:
        self.queue: deque[Any] = deque()
        self.armed = False


class Handoff:
    """The :class:`Pipe` objects of one bookie instance, shared by senders and receivers."""

    def __init__(self) -> None:
        self._pipes: dict[tuple[str, str], Pipe] = {}
        self._lock = threading.Lock()

    def pipe(self, sender: str, receiver: str) -> Pipe:
        with self._lock:
            p = self._pipes.get((sender, receiver))
            if p is None:
                p = self._pipes[(sender, receiver)] = Pipe()
            return p

    def queued(self) -> int:
        """Messages sent and not yet taken, over all pipes (tests, diagnostics)."""
        with self._lock:
            return sum(len(p.queue) for p in self._pipes.values())


_handoffs: dict[str, Handoff] = {}
_handoffs_lock = threading.Lock()


def handoff_for(instance: str) -> Handoff:
    """The pipes of one bookie instance (created on first use)."""
    with _handoffs_lock:
        h = _handoffs.get(instance)
        if h is None:
            h = _handoffs[instance] = Handoff()
        return h


def drop_handoff(instance: str) -> None:
    """Forget an instance's pipes once its actors have stopped (what is still queued there
    was never received)."""
    with _handoffs_lock:
        _handoffs.pop(instance, None)


class SocketOutbox:
    """One PUSH socket per destination, connected to the inproc pipe the receiver's loop
    bound, and that pipe's message queue. Not thread-safe: one sending thread (or a lock)."""

    def __init__(self, ctx: zmq.Context[Any], instance: str, sender: str, peers: list[str]) -> None:
        self._dests: dict[str, tuple[Pipe, zmq.Socket[Any]]] = {}
        handoff = handoff_for(instance)
        for peer in peers:
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.SNDHWM, 0)  # inproc between our own actors: bounded upstream instead
            s.setsockopt(zmq.LINGER, 0)
            s.connect(pipe_address(instance, sender, peer))
            self._dests[peer] = (handoff.pipe(sender, peer), s)

    def send(self, dest: str, msg: Any) -> None:
        # From here on the message belongs to the receiver: see "THE RULE" above.
        pipe, sock = self._dests[dest]
        pipe.queue.append(msg)
        if not pipe.armed:
            pipe.armed = True
            sock.send(b"", copy=True)

    def close(self) -> None:
        for _, s in self._dests.values():
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
        self.pipes: dict[zmq.Socket[Any], Pipe] = {}
        handoff = handoff_for(instance)
        for sender in senders:  # bind before any peer connects (inproc needs bind first on old libzmq)
            s = ctx.socket(zmq.PULL)
            s.setsockopt(zmq.RCVHWM, 0)
            s.setsockopt(zmq.LINGER, 0)
            s.bind(pipe_address(instance, sender, core.name))
            self.inbound.append(s)
            self.pipes[s] = handoff.pipe(sender, core.name)
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
        monotonic, poll, stopped = self.clock.monotonic, poller.poll, self.stop_event.is_set
        now = monotonic()
        next_tick = now + interval if interval else None
        while not stopped():
            timeout_ms = 100.0
            if next_tick is not None:
                timeout_ms = max(0.0, min(timeout_ms, (next_tick - now) * 1000))
            timeout_ms = min(timeout_ms, self.poll_timeout_ms())
            # Rounded up: int() made the last millisecond before each tick a busy loop of poll(0).
            events = poll(math.ceil(timeout_ms))
            now = monotonic()
            for sock, _ in events:
                if sock in extra:
                    self.on_extra(sock, now)
                else:
                    self._drain(sock, now)
            now = monotonic()
            self.after_batch(now)
            if next_tick is not None:
                now = monotonic()
                if now >= next_tick:
                    self.core.on_tick(now)
                    now = monotonic()
                    next_tick = now + (interval or 0)

    def poll_timeout_ms(self) -> float:
        return 100.0

    def _drain(self, sock: zmq.Socket[Any], now: float) -> None:
        """The pipe's wake-up frame is here (poll said so): take it, clear ``armed``, then
        every message queued at this moment (later ones have a wake-up frame of their own
        coming, see the module docstring)."""
        sock.recv(_NOBLOCK, copy=True)
        pipe = self.pipes[sock]
        pipe.armed = False
        queue = pipe.queue
        take = queue.popleft
        on_message, after_message = self.core.on_message, self.after_message
        for _ in range(len(queue)):
            on_message(take(), now)
            after_message()

    def after_message(self) -> None:
        """Called after each message (the journal commits early here when its group is full)."""


