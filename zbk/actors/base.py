"""The actor machinery: a plain logic class (the "core") driven by a thin loop thread that
owns the ZeroMQ sockets.

A core never imports zmq and never reads the time. It receives messages and ticks (with
``now`` from an injected clock) and sends messages through the :class:`Outbox` it is
constructed with (the Server also answers clients through the ``reply`` it is constructed
with: :class:`RequestCore`). Tests drive cores directly with a :class:`ListOutbox`; the
bookie gives each core a :class:`SocketOutbox` and drives it with an :class:`ActorLoop`,
which connects that outbox's sockets in its own thread.

Between actors, messages travel over inproc PUSH/PULL sockets, one pipe per (sender,
receiver). Each actor has ONE PULL socket per sending peer, so that the order of messages
from one peer is the order they were sent (ZeroMQ keeps FIFO per pipe, but fair-queues
across pipes). Ordering arguments in zbk/actors/messages.py rely on it.

Hand-over, not copies. All actors of a bookie live in one process, so a message is not
serialized: the sender parks the object in the bookie's :class:`Handoff` table under a
fresh key and sends the 8-byte key over the pipe; the receiver pops the object when the
frame arrives. The pipe still carries one frame per message (so ordering and wake-ups are
exactly those of the pipes), but no pickling happens and no payload bytes are copied.

THE RULE: a message, and everything reachable from it (its lists, dicts, tuples), belongs
to the receiver once it is sent. The sender must not mutate or reuse it afterwards, and
the receiver must not mutate what it received if the sender may still read it (e.g. the
Server keeps the ``entry_ids`` list of the AppendBatch it sent in its PendingAdd, and the
EntryLogger forwards that same list in Appended: nobody mutates it; the records buffer the
EntryLogger sends in a JournalAppend is one it made for that batch and never touches again). Send
freshly built objects; never ``msg.items.append(...)`` after ``send``, never reuse a buffer
list across sends. bytes, ints, strings and tuples of them are immutable and always safe.
The actor simulation of the tests (tests/helpers/actorsim.py) hands messages over the same
way and checks that nothing sent was changed before or after delivery.

A core that raises stops the whole bookie: crash, don't limp. The loop reports the failure
to the supervisor, which exits the process with the actor's distinct exit code.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
from collections.abc import Callable
from typing import Any, Protocol

import zmq

from zbk.clock import Clock
from zbk.errors import ConfigError
from zbk.osthread import name_current_thread, pin_current_thread

log = logging.getLogger(__name__)


class Outbox(Protocol):
    def send(self, dest: str, msg: Any) -> None:
        """Queue ``msg`` for actor ``dest``."""


Reply = Callable[[bytes, list[Any]], None]  # (peer identity, frames): answer a client


class Core(Protocol):
    """An actor's logic. ``outbox`` is given to its constructor, never set afterwards."""

    name: str
    tick_interval_s: float | None
    outbox: Outbox

    def on_message(self, msg: Any, now: float) -> None: ...

    def on_tick(self, now: float) -> None: ...


class RequestCore(Core, Protocol):
    """A core that also serves clients (the Server): requests arrive from its loop's socket,
    and it answers through ``reply``, given to its constructor like its outbox."""

    reply: Reply

    def on_request(self, ident: bytes, frames: list[Any], now: float) -> None: ...


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


_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_keys = itertools.count(1)  # process-wide, so a key is never reused while its object waits


class Handoff:
    """Message objects in transit between the actors of one bookie (see the module docstring).

    ``park`` stores an object and returns the frame to send (its key, 8 bytes little-endian);
    ``take`` pops the object a received frame names. Both are single dict operations, atomic
    under the GIL, so any thread may park and the receiving loop takes. The table is per
    bookie instance (:func:`handoff_for`); objects still parked when a bookie stops (sent but
    never received) go with it (:func:`drop_handoff`).
    """

    __slots__ = ("objects",)

    def __init__(self) -> None:
        self.objects: dict[int, Any] = {}

    def park(self, msg: Any) -> bytes:
        key = next(_keys)
        self.objects[key] = msg
        return key.to_bytes(8, "little")

    def take(self, frame: bytes) -> Any:
        return self.objects.pop(int.from_bytes(frame, "little"))

    def __len__(self) -> int:
        return len(self.objects)


_handoffs: dict[str, Handoff] = {}
_handoffs_lock = threading.Lock()


def handoff_for(instance: str) -> Handoff:
    """The hand-over table of one bookie instance (created on first use)."""
    with _handoffs_lock:
        h = _handoffs.get(instance)
        if h is None:
            h = _handoffs[instance] = Handoff()
        return h


def drop_handoff(instance: str) -> None:
    """Forget an instance's table once its actors have stopped."""
    with _handoffs_lock:
        _handoffs.pop(instance, None)


def send_message(sock: zmq.Socket[Any], handoff: Handoff, msg: Any) -> None:
    """Hand ``msg`` over a PUSH socket connected to an actor's inbound pipe (for senders that
    are not actors, e.g. the admin HTTP handlers; the rule of the module docstring applies).
    A message to an actor that has stopped is dropped (see :meth:`SocketOutbox.send`)."""
    frame = handoff.park(msg)
    try:
        sock.send(frame, zmq.NOBLOCK, copy=True)
    except zmq.Again:
        handoff.take(frame)
        log.info("dropped %s: its actor has stopped", type(msg).__name__)


class SocketOutbox:
    """PUSH sockets, one per destination, each bound by the receiver's loop.

    Made before its core (which is constructed with it); the sockets exist from
    :meth:`connect`, which the core's loop calls in its own thread, until :meth:`close`. A
    message sent after the close goes nowhere (a core fed by ``ActorLoop.drain_inbound``
    after its loop stopped).
    """

    def __init__(self, instance: str, sender: str, peers: list[str]) -> None:
        self.instance, self.sender, self.peers = instance, sender, list(peers)
        self._socks: dict[str, zmq.Socket[Any]] = {}
        self._objects = handoff_for(instance).objects
        self._gone: set[str] = set()
        self._closed = False

    def connect(self, ctx: zmq.Context[Any]) -> None:
        assert not self._socks and not self._closed, "an outbox connects once"
        for peer in self.peers:
            s = ctx.socket(zmq.PUSH)
            s.setsockopt(zmq.SNDHWM, 0)  # inproc between our own actors: bounded upstream instead
            s.setsockopt(zmq.LINGER, 0)
            s.connect(pipe_address(self.instance, self.sender, peer))
            self._socks[peer] = s

    def send(self, dest: str, msg: Any) -> None:
        # Handoff.park, inlined (this is the hottest call of the bookie). From here on the
        # message belongs to the receiver: see "THE RULE" in the module docstring.
        key = next(_keys)
        self._objects[key] = msg
        try:
            # Never blocks while the receiver runs (SNDHWM 0: no high-water mark). It would
            # block forever once the receiver has stopped and closed its PULL socket, which
            # happens while the bookie stops: actors see the stop at different moments, and
            # a Server blocked here kept a clean stop from finishing (dirty marker left set).
            self._socks[dest].send(key.to_bytes(8, "little"), zmq.NOBLOCK, copy=True)
        except zmq.Again:
            # Nothing is lost: whatever waited for this message was not acknowledged yet.
            del self._objects[key]
            if dest not in self._gone:
                self._gone.add(dest)
                log.info("%s: actor %s has stopped; dropping messages to it", self.sender, dest)
        except KeyError:
            del self._objects[key]
            if not self._closed:
                raise  # not connected yet, or not a peer of this sender: a bug

    def close(self) -> None:
        self._closed = True
        socks, self._socks = self._socks, {}
        for s in socks.values():
            s.close(0)


class ActorLoop(threading.Thread):
    """Runs one core: polls its inbound pipes, feeds messages and ticks, reports crashes.

    The core's outbox is a :class:`SocketOutbox` (whose peers are those it sends to); the
    loop connects it in its thread and closes it when it ends. ``extra`` sockets (e.g. the
    Server's ROUTER) are polled too and handed to ``on_extra``.
    """

    def __init__(self, *, ctx: zmq.Context[Any], instance: str, core: Core, senders: list[str],
                 clock: Clock, on_crash: Callable[[str, BaseException], None],
                 stop: threading.Event, cpus: frozenset[int] = frozenset()) -> None:
        super().__init__(name=f"zbk-{core.name}", daemon=True)
        self.cpus = cpus  # confined to these CPUs (the bookie's actor_cpus); empty: not confined
        self.ctx, self.instance, self.core, self.clock = ctx, instance, core, clock
        self.on_crash, self.stop_event = on_crash, stop
        self.inbound: list[zmq.Socket[Any]] = []
        for sender in senders:  # bind before any peer connects (inproc needs bind first on old libzmq)
            s = ctx.socket(zmq.PULL)
            s.setsockopt(zmq.RCVHWM, 0)
            s.setsockopt(zmq.LINGER, 0)
            s.bind(pipe_address(instance, sender, core.name))
            self.inbound.append(s)
        outbox = core.outbox
        assert isinstance(outbox, SocketOutbox) and outbox.sender == core.name and outbox.instance == instance, \
            "a loop's core sends through a SocketOutbox of its own"
        self.outbox = outbox
        self.handoff = handoff_for(instance)
        self.extra: list[zmq.Socket[Any]] = []
        self.ready = threading.Event()
        # Why setup() failed, when the configuration made it impossible (the wire port taken):
        # the loop never ran, so the actor handled nothing.
        self.start_error: ConfigError | None = None
        # True: the inbound pipes stay open when the loop exits, for drain_inbound (the
        # IndexSyncer's, so that the bookie's stop applies index updates it did not read).
        self.keep_inbound = False

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
        name_current_thread(self.name)  # zbk-<core>: tells the actors apart in top -H, strace -f, perf
        try:
            pin_current_thread(self.cpus)
            self.outbox.connect(self.ctx)
            try:
                self.setup()
            except ConfigError as e:  # one clear line, no traceback
                log.error("actor %s cannot start: %s", self.core.name, e)
                self.start_error = e
                raise
            self.ready.set()
            self._loop()
        except BaseException as e:  # noqa: BLE001 - any failure of an actor stops the bookie
            if e is self.start_error:  # not a crash: its owner raises it (Bookie.start)
                self.ready.set()
            else:
                log.exception("actor %s crashed", self.core.name)
                self.ready.set()
                self.on_crash(self.core.name, e)
        finally:
            self.teardown()
            for s in self.extra if self.keep_inbound else self.inbound + self.extra:
                s.close(0)
            self.outbox.close()

    def drain_inbound(self, accept: Callable[[Any], bool]) -> int:
        """After the loop has exited (and every other actor too): feed the core the messages
        still waiting in its inbound pipes for which ``accept`` is true, then close the pipes.
        Returns how many were fed. Anything the core sends meanwhile goes nowhere (its
        outbox is closed)."""
        assert not self.is_alive(), "drain_inbound runs after the loop has stopped"
        self.outbox.close()  # closed by the loop already, unless it never ran
        fed = 0
        take = self.handoff.objects.pop
        for sock in self.inbound:
            while True:
                try:
                    key = sock.recv(_NOBLOCK, copy=True)
                except zmq.Again:
                    break
                msg = take(int.from_bytes(key, "little"), None)
                if msg is not None and accept(msg):
                    self.core.on_message(msg, self.clock.monotonic())
                    fed += 1
            sock.close(0)
        self.inbound = []
        return fed

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

    def _drain(self, sock: zmq.Socket[Any], now: float, budget: int = 1024) -> None:
        # Ends on ZMQ_EVENTS saying the pipe is empty (~1.7 us), not on a failing recv: its
        # zmq.Again costs ~5 us, paid at every wake-up of every actor (five per add).
        recv, take, events = sock.recv, self.handoff.objects.pop, sock.get
        on_message, after_message = self.core.on_message, self.after_message
        for _ in range(budget):
            try:
                key = recv(_NOBLOCK, copy=True)
            except zmq.Again:
                return
            on_message(take(int.from_bytes(key, "little")), now)
            after_message()
            if not int(events(_EVENTS)) & _POLLIN:
                return

    def after_message(self) -> None:
        """Called after each message (the journal commits early here when its group is full)."""


