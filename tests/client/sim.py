"""Deterministic simulation of a zbk cluster for the client library (docs/contributors.md).

The client's protocol code (zbk/client) and the bookies' cores (zbk/actors) run unchanged;
the network, the disks' failures and time are simulated, in one thread, from one seed:

* :class:`VirtualTimeLoop` is an asyncio event loop whose clock only moves when nothing is
  ready to run: it then jumps to the next timer. A 10 s add timeout costs no wall time, and
  a run is a pure function of its seed. When nothing is ready and no timer is pending, every
  task waits for something that can never happen: :class:`SimDeadlockError`.
* The metadata store is zbk's own :class:`zbk.metadata.memory.MemoryMetadataStore` on the
  virtual clock, with watches delivered inline, so LedgerStore, list_bookies and the
  replicators' registry run on it unchanged.
* :class:`BookieNode` is one bookie: the real ``ServerCore``, ``JournalCore``,
  ``EntryLoggerCore`` and ``IndexCore`` under the actor simulation
  (tests/helpers/actorsim.py), on files of its own in a temporary directory, stepped by
  the loop (one message per callback, in a seeded order; ticks on the virtual clock). A
  crash is kill -9 or a power loss, modelled on the files (the actor simulation's module
  doc says what survives each); a restart boots the real cores on what survived, with
  BP-46 phase one when zbk's bookie would run it (or as a scenario asks). Around the cores
  the node has fault knobs: unreachable, crashed (refused fast), paused (requests held),
  random drops of requests or replies, delays, forced statuses, load shedding, read-only.
* :class:`SimTransport` implements zbk.client.transport.Transport; every request goes
  through the real wire codec to the bookie's ServerCore, which answers in encoded frames
  that the client decodes, so the two exchange exactly what the real ones would.
* :class:`SimContext` is the client's ClientContext with the metadata seams
  (read_metadata / write_metadata / writable_bookies) calling the store directly, after a
  seeded virtual delay, instead of through a worker thread.

Seeds: :func:`seed_from_env` prints ``ZBK_SEED=<n>``; setting ZBK_SEED replays a run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import random
import selectors
import shutil
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from helpers.actorsim import (
    DEFAULT_SETTINGS,
    BookieCores,
    BookieSettings,
    SimDisk,
    VirtualClock,
    open_storage,
    phase_one,
    publish_limbo_marks,
)
from helpers.tasks import await_chain

from zbk.client.bookkeeper import AsyncBookKeeper, ClientContext
from zbk.client.dispatch import _request_then
from zbk.client.handles import LedgerEntry, LedgerHandle
from zbk.config import ClientConfig
from zbk.errors import BookieUnavailableError, ZbkError
from zbk.metadata import layout
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.memory import MemoryMetadataStore
from zbk.metadata.registry import BookieRegistration, LedgerStore, list_bookies
from zbk.wire import messages as w
from zbk.wire.codec import decode_request, decode_response, encode
from zbk.wire.entry import peek_entry_header
from zbk.wire.errors import FrameError
from zbk.wire.ops import AddFlag, ReadFlag
from zbk.wire.status import Status

T = TypeVar("T")

# A dead process: requests in flight to it fail at once (its connections close), new ones
# are refused this fast (the real transport fails adds at once and gives reads a second).
REFUSED_AFTER_S = 0.1
SIM_TIME_LIMIT_S = 24 * 3600.0  # virtual seconds; a run beyond this is a livelock, not a slow test
SAME_INSTANT_STEPS_MAX = 200_000  # loop iterations without the clock moving: a busy loop


# -- seeds ------------------------------------------------------------------------------------
def seed_from_env() -> int:
    """ZBK_SEED if set (a replay), else a fresh random seed; printed either way so that a
    failing run can be replayed with ``ZBK_SEED=<n>``."""
    env = os.environ.get("ZBK_SEED")
    seed = int(env) if env else random.SystemRandom().randrange(2**32)
    print(f"ZBK_SEED={seed}")
    return seed


# -- virtual time -----------------------------------------------------------------------------
class SimDeadlockError(RuntimeError):
    """Nothing is ready and no timer is pending: every task waits forever."""


class SimTimeLimitError(RuntimeError):
    """Virtual time passed the run's limit: something keeps retrying without progress."""


class SimCoreError(RuntimeError):
    """A bookie's core raised: the bookie would have stopped with an actor's exit code."""


class SimLivelockError(RuntimeError):
    """The loop kept running callbacks without the clock moving: a busy loop that never
    waits (a retry without a sleep), which would spin forever on a real loop too."""


class _VirtualSelector(selectors.BaseSelector):
    """A selector that never waits: asked to wait ``timeout`` seconds, it advances the
    virtual clock by that much instead. The loop asks for exactly the time to its next
    timer, so the clock jumps from timer to timer."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        self._loop = loop
        self._keys: dict[Any, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._keys.pop(fileobj)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        self._loop.check_failure()
        if timeout is None:
            raise SimDeadlockError("no task can make progress and no timer is pending:\n" + _pending_tasks(self._loop))
        self._loop.advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys


def _pending_tasks(loop: asyncio.AbstractEventLoop) -> str:
    """Every unfinished task and where it waits (its await chain), for a stuck run's report."""
    return "\n".join(sorted(f"  {t.get_name()}: {await_chain(t.get_coro())}" for t in asyncio.all_tasks(loop)))


class _InlineExecutor(concurrent.futures.ThreadPoolExecutor):
    """Runs ``asyncio.to_thread`` work at once, in the loop's thread: no threads may run in
    a simulation (they would race the virtual clock and break replay)."""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine, as a thread pool would
            fut.set_exception(e)
        return fut


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on a virtual clock that starts at 0 and jumps to the next timer
    whenever no callback is ready."""

    def __init__(self, *, time_limit_s: float = SIM_TIME_LIMIT_S,
                 same_instant_steps_max: int = SAME_INSTANT_STEPS_MAX) -> None:
        self._now = 0.0
        self._time_limit_s = time_limit_s
        self._same_instant_steps = 0
        self._same_instant_steps_max = same_instant_steps_max
        super().__init__(selector=_VirtualSelector(self))
        # Timers are compared against now + resolution; float sums of jumps may miss a
        # timer's exact time by an ulp, so allow a microsecond.
        self._clock_resolution = 1e-6
        self.set_default_executor(_InlineExecutor())
        self.closers: list[Callable[[], None]] = []  # called by run() at the end (SimCluster.close)
        self.failure: BaseException | None = None  # see fail()

    def time(self) -> float:
        return self._now

    def fail(self, error: BaseException) -> None:
        """A bookie's core raised (in a loop callback, where asyncio would only log it): the
        run ends with :class:`SimCoreError` at the next loop iteration. A core that raises
        stops the whole bookie in zbk; here it is a finding."""
        if self.failure is None:
            self.failure = error

    def check_failure(self) -> None:
        if self.failure is not None:
            raise SimCoreError(f"a bookie core raised {type(self.failure).__name__}: {self.failure}") from self.failure

    def advance(self, seconds: float) -> None:
        """Called once per loop iteration, with 0 when callbacks are ready."""
        if seconds <= 0:
            self._same_instant_steps += 1
            if self._same_instant_steps > self._same_instant_steps_max:
                raise SimLivelockError(f"{self._same_instant_steps_max} loop iterations at virtual time "
                                       f"{self._now:.6f}s without the clock moving:\n" + _pending_tasks(self))
            return
        self._same_instant_steps = 0
        self._now += seconds
        if self._now > self._time_limit_s:
            raise SimTimeLimitError(f"virtual time passed {self._time_limit_s:.0f}s:\n" + _pending_tasks(self))

    def _write_to_self(self) -> None:
        # The self-pipe wakes a select() blocked while another thread schedules a callback:
        # ours never blocks and no other thread runs, so there is nothing to wake.
        return None


def run(main: Coroutine[Any, Any, T], *, time_limit_s: float = SIM_TIME_LIMIT_S,
        same_instant_steps_max: int = SAME_INSTANT_STEPS_MAX) -> T:
    """Run ``main`` on a fresh virtual-time loop; leftover tasks are cancelled after it."""
    loop = VirtualTimeLoop(time_limit_s=time_limit_s, same_instant_steps_max=same_instant_steps_max)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            leftovers = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in leftovers:
                t.cancel()
            if leftovers:
                loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
        except (SimDeadlockError, SimTimeLimitError, SimLivelockError, SimCoreError):
            pass  # a task that ignores cancellation: the original outcome is what matters
        finally:
            for close in loop.closers:
                close()
            loop.close()


# -- bookies ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BootPolicy:
    """BP-46 phase one at a restart, for every ledger that is not CLOSED and has the bookie
    in an ensemble. zbk's bookie does both after an unclean shutdown whenever adds were not
    durable (journal_write_data or journal_sync_data off) or its disks were replaced; the
    scenarios also turn either off, to show what each one protects."""

    fence: bool = True  # mark it fenced, so no plain add is accepted (scenario 1)
    limbo: bool = True  # mark it limbo, so no read answers an explicit negative (scenario 2)


NO_PROTECTION = BootPolicy(fence=False, limbo=False)
ZBK_BOOT = None  # restart(ZBK_BOOT): phase one exactly when zbk's bookie runs it


@dataclass(frozen=True, slots=True)
class Rule:
    """A targeted network fault: applies to messages from client ``client`` (None: any)
    for which ``match(msg)`` holds.

    drop        the request never arrives (the client times out)
    drop_reply  the request is processed but its answer is lost (the client times out)
    delay       the request arrives ``seconds`` later than it otherwise would
    delay_reply the answer arrives ``seconds`` later
    """

    action: Literal["drop", "drop_reply", "delay", "delay_reply"]
    match: Callable[[Any], bool]
    client: str | None = None
    seconds: float = 0.0


Answer = Callable[[Any], None]  # takes a decoded response, or the exception that fails the request


class BookieNode:
    """One bookie of the simulation: the real cores on files under the cluster's directory
    (see the module doc), run on the cluster's loop, plus fault knobs. Requests arrive
    through SimCluster.send; the ServerCore's answers go back through the ``reply`` given
    with each request (later for long polls, and for everything while paused)."""

    def __init__(self, cluster: SimCluster, bookie_id: str, settings: BookieSettings) -> None:
        self.cluster = cluster
        self.loop: VirtualTimeLoop = cluster.loop
        self.id = bookie_id
        self.settings = settings
        self.root = cluster.root / bookie_id.replace(":", "_")
        self.disk = SimDisk()
        self.rng = random.Random(cluster.rng.getrandbits(64))  # the order the cores' messages go in
        self.cores: BookieCores | None = None
        self.incarnation = 0  # bumped by each crash: requests in flight to the old one are lost
        self.disks_replaced = False
        self.phase_one_ledgers = 0  # open ledgers the last boot fenced / put in limbo
        self._routes: dict[tuple[bytes, int], Answer] = {}  # (client, rid) -> where its answer goes
        self._step_handle: asyncio.Handle | None = None
        self._tick_handle: asyncio.TimerHandle | None = None
        self._injected = itertools.count(1)
        # Fault knobs.
        self.running = False  # False after crash(): connections are refused at once
        self.unreachable = False  # "down": requests and answers vanish, clients time out
        self.paused = False  # alive but frozen: requests wait, the cores do nothing, until resume()
        self.read_only = False
        self.drop_rate = 0.0  # fraction of requests lost (half before, half after processing)
        self.delay_s = 0.0  # each message takes uniform(0, delay_s) longer, FIFO per connection
        self.shed_rate = 0.0  # fraction of requests answered ETOOMANYREQUESTS unread
        self.add_status: Status | None = None  # forced answers per op, nothing done
        self.read_status: Status | None = None
        self.lac_status: Status | None = None
        self.add_status_of: dict[int, Status] = {}  # ledger id -> forced answer to its plain adds
        self.rules: list[Rule] = []
        self._held: list[Callable[[], None]] = []
        # What it has seen, for assertions.
        self.requests = 0
        self.fence_requests = 0
        self._boot(ZBK_BOOT)

    def __repr__(self) -> str:
        return f"<BookieNode {self.id}>"

    # -- the process --------------------------------------------------------------------------
    def _boot(self, policy: BootPolicy | None) -> None:
        """Start the real cores on the files (the storage half of BookieBoot.boot, phase one,
        the limbo repair marks): the first boot, or a restart after a crash."""
        self.disk.revive()
        storage = open_storage(self.root, self.settings, self.disk, VirtualClock(self.loop.time))
        if policy is None:
            protect = self.disks_replaced or (storage.unclean and not self.settings.durable_adds)
            policy = BootPolicy(fence=protect, limbo=protect)
        meta = self.cluster.meta
        self.phase_one_ledgers = 0
        if policy.fence or policy.limbo:
            self.phase_one_ledgers = phase_one(storage.cache, meta, self.id, fence=policy.fence, limbo=policy.limbo)
        publish_limbo_marks(storage.cache, meta, self.id)
        self.disks_replaced = False
        self.cores = BookieCores(self.root, storage, self.settings, self.disk, self.rng, reply=self._reply,
                                 now=self.loop.time())
        if self.read_only:
            self.cores.server.set_forced_read_only(True)
        self.running = True
        self._schedule_tick()

    @property
    def server(self) -> Any:
        assert self.cores is not None, f"{self.id} is not running"
        return self.cores.server

    def _step(self) -> None:
        """One delivery between the cores (one loop callback, so that other events of the
        same instant interleave with the cores' work)."""
        self._step_handle = None
        if self.cores is None or self.paused:
            return
        try:
            self.cores.step(self.loop.time())
        except BaseException as e:
            self.loop.fail(e)
            raise
        self._kick()

    def _kick(self) -> None:
        """After the cores' state changed: the next step if something is ready, and an
        earlier tick if the Server now has work for one (BookieCores skips its idle ticks)."""
        cores = self._running_cores()
        if cores is None:
            return
        if self._step_handle is None and cores.busy():
            self._step_handle = self.loop.call_soon(self._step)
        if self._tick_handle is None or cores.server_tick_before(self._tick_handle.when()):
            self._schedule_tick()

    def _running_cores(self) -> BookieCores | None:
        return None if self.paused else self.cores

    def _schedule_tick(self) -> None:
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        self._tick_handle = None
        cores = self._running_cores()
        if cores is not None:
            self._tick_handle = self.loop.call_at(cores.next_tick_at(), self._tick)

    def _tick(self) -> None:
        self._tick_handle = None
        if self.cores is None or self.paused:
            return
        try:
            self.cores.tick(self.loop.time())
        except BaseException as e:
            self.loop.fail(e)
            raise
        self._kick()  # arms the next tick too

    def _stop_cores(self, *, power_loss: bool) -> None:
        for handle in (self._step_handle, self._tick_handle):
            if handle is not None:
                handle.cancel()
        self._step_handle = self._tick_handle = None
        self._routes.clear()
        if self.cores is not None:
            self.cores.crash(power_loss=power_loss)
            self.cores = None

    # -- faults ------------------------------------------------------------------------------
    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        """Process what arrived while paused, in order; the cores go on from where they were."""
        self.paused = False
        held, self._held = self._held, []
        for work in held:
            work()
        self._kick()
        self._schedule_tick()

    def crash(self, *, power_loss: bool = True) -> None:
        """The process dies (kill -9, or the machine loses power: the default, which loses
        more). Held and in-flight requests go with it; clients are refused until
        :meth:`restart`."""
        assert self.running, f"{self.id} is not running"
        self.running = False
        self.paused = False
        self.incarnation += 1
        self._held.clear()
        self.cluster.connections_closed(self.id)
        self._stop_cores(power_loss=power_loss)
        self.cluster.unregister(self.id)

    def wipe(self) -> None:
        """Crash and lose the disks too (a replaced disk: the cookie check fails, BP-46)."""
        self.crash()
        self.disk.wipe(self.root)
        self.disks_replaced = True

    def restart(self, boot: BootPolicy | None = ZBK_BOOT) -> int:
        """Start again after :meth:`crash` on the files that survived; ``boot``: phase one
        as zbk decides (ZBK_BOOT), or as given. Returns how many ledgers phase one marked."""
        assert not self.running, f"{self.id} is running"
        self._boot(boot)
        self.cluster.register(self.id)
        return self.phase_one_ledgers

    def set_read_only(self, read_only: bool) -> None:
        """Refuse adds with EREADONLY (the Server's own read-only mode, as an operator sets
        it) and move the registration to readonly, as a full disk does."""
        self.read_only = read_only
        if self.running:
            self.server.set_forced_read_only(read_only)
            self.cluster.register(self.id)

    def clear_faults(self) -> None:
        """Heal everything but a crash (see :meth:`restart`)."""
        self.unreachable = False
        if self.read_only:
            self.set_read_only(False)
        self.drop_rate = self.delay_s = self.shed_rate = 0.0
        self.add_status = self.read_status = self.lac_status = None
        self.add_status_of.clear()
        self.rules.clear()
        if self.paused:
            self.resume()

    def close(self) -> None:
        """The simulation is over: release the files (a kill -9, nothing written)."""
        self._stop_cores(power_loss=False)
        self.running = False

    # -- delivery (called by SimCluster) --------------------------------------------------------
    def arrive(self, incarnation: int, work: Callable[[], None]) -> None:
        if not self.running or self.unreachable or incarnation != self.incarnation:
            return  # lost with the connection
        if self.paused:
            self._held.append(work)
        else:
            work()

    def can_answer(self, incarnation: int) -> bool:
        return self.running and not self.unreachable and incarnation == self.incarnation

    def handle(self, client: str, req: Any, frames: list[bytes], reply: Answer) -> None:
        """A request from ``client``: a forced answer, or the ServerCore's."""
        self.requests += 1
        flags = getattr(req, "flags", 0)
        if isinstance(req, (w.ReadRequest, w.ReadLacRequest)) and flags & ReadFlag.FENCE:
            self.fence_requests += 1
        forced = self._forced(req)
        if forced is not None:
            reply(forced)
            return
        ident = client.encode()
        if isinstance(req, w.MultiAddRequest) and self.add_status_of:
            frames, reply = self._split_multi_add(req, frames, reply)
            if not frames:
                return
        self._routes[(ident, req.rid)] = reply
        assert self.cores is not None
        self.cores.request(ident, frames, self.loop.time())
        self._kick()

    def _forced(self, req: Any) -> Any | None:
        """The answer of a knob that answers without doing anything, or None."""
        rid = req.rid
        if self.shed_rate and self.cluster.rng.random() < self.shed_rate:
            return w.ErrorResponse(rid=rid, status=Status.ETOOMANYREQUESTS)
        if isinstance(req, w.AddRequest):
            status = self.add_status
            if status is None and not req.flags:
                status = self.add_status_of.get(req.ledger_id)
            if status is not None:
                first, last = peek_entry_header(req.entries[0])[1], peek_entry_header(req.entries[-1])[1]
                return w.AddResponse(rid=rid, status=status, ledger_id=req.ledger_id, first_entry_id=first,
                                     last_entry_id=last)
        elif isinstance(req, w.MultiAddRequest) and self.add_status is not None:
            return w.MultiAddResponse(rid=rid, status=Status.EOK, statuses=tuple([self.add_status] * len(req.parts)))
        elif isinstance(req, w.ReadRequest) and self.read_status is not None:
            first = req.previous_lac + 1 if req.flags & ReadFlag.LONG_POLL else req.first_entry_id
            return w.ReadResponse(rid=rid, status=self.read_status, ledger_id=req.ledger_id, first_entry_id=first,
                                  lac=-1, entries=())
        elif isinstance(req, w.ReadLacRequest) and self.lac_status is not None:
            return w.ReadLacResponse(rid=rid, status=self.lac_status, ledger_id=req.ledger_id, lac=-1)
        return None

    def _split_multi_add(self, req: w.MultiAddRequest, frames: list[bytes],
                         reply: Answer) -> tuple[list[bytes], Answer]:
        """``add_status_of`` on a MULTI_ADD: the parts of those ledgers get their forced
        status, the others go to the Server as a MULTI_ADD of their own; the answer joins
        both. No frames: every part was answered."""
        parts = list(req.parts)
        forced = [None if p.flags else self.add_status_of.get(p.ledger_id) for p in parts]
        if all(st is None for st in forced):
            return frames, reply
        kept = [i for i, st in enumerate(forced) if st is None]
        if not kept:
            reply(w.MultiAddResponse(rid=req.rid, status=Status.EOK, statuses=tuple(forced)))
            return [], reply

        def joined(resp: Any) -> None:
            if isinstance(resp, w.MultiAddResponse):
                statuses = list(forced)
                for i, st in zip(kept, resp.statuses, strict=True):
                    statuses[i] = st
                resp = w.MultiAddResponse(rid=req.rid, status=resp.status, statuses=tuple(statuses))
            reply(resp)

        sub = w.MultiAddRequest(rid=req.rid, parts=[parts[i] for i in kept])
        return [bytes(f) for f in encode(sub)], joined

    def _reply(self, ident: bytes, frames: list[Any]) -> None:
        """The ServerCore answers: over the network, a copy of its frames, decoded by the
        client as ZmqTransport does (an undecodable answer fails the request it names)."""
        data = [bytes(f) for f in frames]
        try:
            resp: Any = decode_response(data)
            rid = resp.rid
        except FrameError as e:
            self.cluster.stats.bad_responses += 1
            if e.rid is None:
                return
            rid, resp = e.rid, BookieUnavailableError(f"{self.id}: bad response ({e})")
        route = self._routes.pop((ident, rid), None)
        if route is not None:
            route(resp)

    # -- inspection ---------------------------------------------------------------------------
    def is_fenced(self, ledger_id: int) -> bool:
        st = self.server.ledgers.get(ledger_id)
        return st is not None and st.fenced

    def is_limbo(self, ledger_id: int) -> bool:
        st = self.server.ledgers.get(ledger_id)
        return st is not None and st.limbo

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        """Would a read of the entry find it here now?"""
        assert self.cores is not None, f"{self.id} is not running"
        return entry_id in self.cores.locations(ledger_id)

    def entries(self, ledger_id: int) -> dict[int, bytes]:
        """Every entry of the ledger a read would find here now, by entry id."""
        assert self.cores is not None, f"{self.id} is not running"
        return self.cores.entries(ledger_id)

    def put_entry(self, ledger_id: int, key: bytes, blob: bytes) -> None:
        """Store ``blob`` as a plain add with master key ``key``, now, as a buggy writer
        could (scenario: a gap); returns once the bookie acknowledged it."""
        rid = next(self._injected)
        answers: list[Any] = []
        ident = b"sim:put_entry"
        self._routes[(ident, rid)] = answers.append
        req = w.AddRequest(rid=rid, ledger_id=ledger_id, master_key=key, flags=AddFlag(0), entries=[blob])
        assert self.cores is not None
        self.cores.request(ident, [bytes(f) for f in encode(req)], self.loop.time())
        for _ in range(10_000):
            if answers:
                break
            self.cores.step(self.loop.time())
        assert answers and answers[0].status == Status.EOK, answers
        self._kick()


# -- the network and the cluster ------------------------------------------------------------------
@dataclass(slots=True)
class SimStats:
    requests: int = 0
    dropped: int = 0
    metadata_writes: int = 0
    ensemble_changes: int = 0
    bad_responses: int = 0  # answers the client's decoder refused


def _sim_dir() -> str | None:
    """Where the bookies' files go: memory (/dev/shm) where there is one, else the default."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


class SimCluster:
    """Bookies, the metadata store and the network between them and the clients.

    Create it inside the running VirtualTimeLoop (it is closed, and its files removed, when
    :func:`run` ends). ``rng`` (from ``seed``) decides every random network fate and seeds
    each bookie's own generator, so a run replays from its seed. ``settings``: the bookies'
    configuration. ``trace`` (when enabled) records every message and its fate, to compare
    runs.
    """

    def __init__(self, seed: int, *, bookies: int = 3, settings: BookieSettings = DEFAULT_SETTINGS,
                 trace: bool = False) -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualTimeLoop), "a SimCluster lives on a VirtualTimeLoop (sim.run)"
        self.loop = loop
        self.loop.closers.append(self.close)
        self.root = Path(tempfile.mkdtemp(prefix="zbk-sim-", dir=_sim_dir()))
        self.seed = seed
        self.rng = random.Random(seed)
        self.meta = MemoryMetadataStore(clock=VirtualClock(self.loop.time), inline_watches=True)
        self.bookies: dict[str, BookieNode] = {}
        self.metadata_delay_s = 0.0  # each metadata call takes uniform(0, this) each way
        # Awaited by every client just before a metadata write lands: scripts use it to act at
        # an exact point of a protocol ("just before the recoverer commits the close").
        self.before_metadata_write: Callable[[LedgerMetadata], Awaitable[None]] | None = None
        self.closed_at: dict[int, float] = {}  # ledger id -> virtual time its CLOSED state landed
        self.stats = SimStats()
        self.trace: list[str] | None = [] if trace else None
        self._fifo: dict[tuple[str, str, str], float] = {}  # (client, bookie, direction) -> last arrival
        self._clients = itertools.count(1)
        self._transports: list[SimTransport] = []
        for i in range(bookies):
            self.add_bookie(f"b{i + 1}:3181", settings)

    def add_bookie(self, bookie_id: str, settings: BookieSettings = DEFAULT_SETTINGS) -> BookieNode:
        b = self.bookies[bookie_id] = BookieNode(self, bookie_id, settings)
        self.register(bookie_id)
        return b

    def close(self) -> None:
        """Stop every bookie and remove their files."""
        for b in self.bookies.values():
            b.close()
        self.meta.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def register(self, bookie_id: str) -> None:
        """Publish the bookie as writable or readonly (by its read_only knob)."""
        self.unregister(bookie_id)
        reg = BookieRegistration(bookie_id, state="readonly" if self.bookies[bookie_id].read_only else "writable")
        self.meta.put(reg.key, reg.encode())

    def unregister(self, bookie_id: str) -> None:
        # A dead bookie's lease expires: writers stop choosing it for new ensembles.
        self.meta.delete(layout.writable_key(bookie_id))
        self.meta.delete(layout.readonly_key(bookie_id))

    def bookie(self, bookie_id: str) -> BookieNode:
        return self.bookies[bookie_id]

    def ledger(self, ledger_id: int) -> LedgerMetadata:
        """The ledger's metadata as stored now."""
        return LedgerStore(self.meta).read(ledger_id)[0]

    def heal(self, boot: BootPolicy | None = ZBK_BOOT) -> None:
        """End every fault: crashed bookies restart (phase one as ``boot`` says, see
        BookieNode.restart), the others are healed."""
        for b in self.bookies.values():
            if not b.running:
                b.restart(boot)
            b.clear_faults()
        self.metadata_delay_s = 0.0

    def _log(self, text: str) -> None:
        if self.trace is not None:
            self.trace.append(f"{self.loop.time():.6f} {text}")

    def _log_msg(self, src: str, dst: str, msg: Any, note: str = "") -> None:
        if self.trace is not None:  # describing every message costs: only when tracing
            self._log(f"{src}->{dst} {_describe(msg)}{note}")

    # -- clients ------------------------------------------------------------------------------
    def client(self, name: str | None = None, *, config: ClientConfig | None = None) -> AsyncBookKeeper:
        """A started client (its own transport, placement rng and name for rules)."""
        name = name or f"c{next(self._clients)}"
        rng = random.Random(self.rng.getrandbits(64))
        transport = SimTransport(self, name)
        self._transports.append(transport)
        bk = AsyncBookKeeper(store=self.meta, transport=transport, config=config, rng=rng)
        bk.ctx = SimContext(self, transport, bk.config, rng)
        return bk

    def connections_closed(self, bookie_id: str) -> None:
        """``bookie_id`` died: every client's requests in flight to it fail now, as the real
        transport's socket monitor makes them fail when the connection closes."""
        for t in self._transports:
            t.connection_lost(bookie_id)

    async def metadata_hop(self) -> None:
        if self.metadata_delay_s > 0:
            await asyncio.sleep(self.rng.uniform(0, self.metadata_delay_s))

    # -- the network --------------------------------------------------------------------------
    def _when(self, client: str, bookie: BookieNode, direction: str, extra: float) -> float:
        # Messages of one connection arrive in the order sent (TCP), each after its delay.
        delay = extra + (self.rng.uniform(0, bookie.delay_s) if bookie.delay_s > 0 else 0.0)
        key = (client, bookie.id, direction)
        t = max(self.loop.time() + delay, self._fifo.get(key, 0.0))
        self._fifo[key] = t
        return t

    def send(self, client: str, bookie_id: str, msg: Any, fut: asyncio.Future[Any]) -> None:
        """Deliver ``msg`` from ``client`` to ``bookie_id``; its answer resolves ``fut``
        (unless lost: then the client's own timeout fires)."""
        self.stats.requests += 1
        b = self.bookies.get(bookie_id)
        if b is None:
            self._log_msg(client, bookie_id, msg, ": no such bookie")
            return
        if not b.running:
            self._log_msg(client, bookie_id, msg, ": refused (crashed)")
            err = BookieUnavailableError(f"bookie {bookie_id} refused the connection")
            self.loop.call_later(REFUSED_AFTER_S, _fail, fut, err)
            return
        frames = [bytes(f) for f in encode(msg)]  # what the network carries: a copy
        req = decode_request(frames)
        drop, drop_reply, delay, reply_delay = False, False, 0.0, 0.0
        for rule in b.rules:
            if (rule.client is None or rule.client == client) and _matches(rule, req):
                if rule.action == "drop":
                    drop = True
                elif rule.action == "drop_reply":
                    drop_reply = True
                elif rule.action == "delay":
                    delay += rule.seconds
                else:
                    reply_delay += rule.seconds
        if b.drop_rate > 0 and self.rng.random() < b.drop_rate:
            if self.rng.random() < 0.5:
                drop = True
            else:
                drop_reply = True
        if drop:
            self.stats.dropped += 1
            self._log_msg(client, bookie_id, msg, ": dropped")
            return
        incarnation = b.incarnation

        def reply(resp: Any) -> None:
            if not b.can_answer(incarnation):
                self._log_msg(bookie_id, client, resp, ": lost (bookie gone)")
                return
            if drop_reply:
                self.stats.dropped += 1
                self._log_msg(bookie_id, client, resp, ": reply dropped")
                return
            self.loop.call_at(self._when(client, b, "reply", reply_delay), deliver, resp)

        def deliver(resp: Any) -> None:
            if isinstance(resp, BaseException):
                self._log(f"{bookie_id}->{client} undecodable: {resp}")
                _fail(fut, resp)
                return
            self._log_msg(bookie_id, client, resp)
            if not fut.done():
                fut.set_result(resp)

        def work() -> None:
            self._log_msg(client, bookie_id, req)
            b.handle(client, req, frames, reply)

        self.loop.call_at(self._when(client, b, "request", delay), b.arrive, incarnation, work)


def _matches(rule: Rule, req: Any) -> bool:
    """A MULTI_ADD is one message: a rule about any of its parts decides its fate."""
    if isinstance(req, w.MultiAddRequest):
        return rule.match(req) or any(rule.match(part) for part in req.parts)
    return rule.match(req)


def _fail(fut: asyncio.Future[Any], err: BaseException) -> None:
    if not fut.done():
        fut.set_exception(err)


def _describe(msg: Any) -> str:
    name = type(msg).__name__.removesuffix("Request").removesuffix("Response")
    parts = [name]
    if isinstance(msg, w.AddRequest):
        ids = [peek_entry_header(b)[1] for b in msg.entries]
        parts.append(f"{ids}{' recovery' if msg.flags & AddFlag.RECOVERY_ADD else ''}")
    elif isinstance(msg, w.MultiAddRequest):
        parts.extend(f"{p.ledger_id}:{[peek_entry_header(b)[1] for b in p.entries]}" for p in msg.parts)
    elif isinstance(msg, w.MultiAddResponse):
        parts.append(",".join(Status(s).name for s in msg.statuses))
    elif isinstance(msg, (w.ReadRequest, w.ReadLacRequest)):
        if isinstance(msg, w.ReadRequest):
            parts.append(f"{msg.first_entry_id}+{msg.count}")
        if msg.flags & ReadFlag.FENCE:
            parts.append("fence")
        if msg.flags & ReadFlag.LONG_POLL:
            parts.append(f"poll>{msg.previous_lac}")
        if msg.flags & ReadFlag.SPARSE:
            parts.append("sparse")
    status = getattr(msg, "status", None)
    if status is not None:
        parts.append(Status(status).name)
    if isinstance(msg, w.ReadResponse):
        parts.append(f"n={len(msg.entries)} lac={msg.lac}")
    elif isinstance(msg, w.ReadLacResponse):
        parts.append(f"lac={msg.lac}")
    return " ".join(parts)


class SimTransport:
    """zbk.client.transport.Transport over SimCluster: one per client."""

    def __init__(self, cluster: SimCluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self._rids = itertools.count(1)
        self._keys = itertools.count(1)
        self._pending: dict[int, tuple[str, asyncio.Future[Any]]] = {}  # key -> (bookie, answer)
        self._tasks: set[asyncio.Task[None]] = set()
        self.failed_at: dict[str, float] = {}
        self.closed = False

    def next_rid(self) -> int:
        return next(self._rids)

    def suspect(self, bookie: str, within_s: float = 5.0) -> bool:
        t = self.failed_at.get(bookie)
        return t is not None and self.cluster.loop.time() - t < within_s

    async def request(self, bookie: str, msg: Any, timeout_s: float) -> Any:
        if self.closed:
            raise BookieUnavailableError("client is closed")
        fut: asyncio.Future[Any] = self.cluster.loop.create_future()
        key = next(self._keys)
        self._pending[key] = (bookie, fut)
        self.cluster.send(self.name, bookie, msg, fut)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            self.failed_at[bookie] = self.cluster.loop.time()
            raise BookieUnavailableError(f"bookie {bookie} did not answer within {timeout_s:.1f}s") from None
        except BookieUnavailableError:
            self.failed_at[bookie] = self.cluster.loop.time()
            raise
        finally:
            self._pending.pop(key, None)

    def send(self, bookie: str, msg: Any, timeout_s: float, callback: Callable[[Any], None]) -> None:
        """request() in a task, its outcome handed to ``callback`` (the real transport's
        send() does without the task; the sim keeps one path for both)."""

        task = self.cluster.loop.create_task(_request_then(self, bookie, msg, timeout_s, callback))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def connection_lost(self, bookie: str) -> None:
        for b, fut in self._pending.values():
            if b == bookie and not fut.done():
                fut.set_exception(BookieUnavailableError(f"bookie {bookie}: connection lost"))

    async def close(self) -> None:
        self.closed = True
        for _, fut in self._pending.values():
            if not fut.done():
                fut.set_exception(BookieUnavailableError("client closed"))
        self._pending.clear()


class SimContext(ClientContext):
    """ClientContext whose metadata calls reach the in-memory store directly (no worker
    thread), each after a seeded virtual delay so that metadata races interleave."""

    def __init__(self, cluster: SimCluster, transport: SimTransport, config: ClientConfig,
                 rng: random.Random) -> None:
        super().__init__(cluster.meta, transport, config, rng)
        self.cluster = cluster
        self.ledgers = LedgerStore(cluster.meta)

    async def read_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        await self.cluster.metadata_hop()
        result = self.ledgers.read(ledger_id)
        await self.cluster.metadata_hop()
        return result

    async def write_metadata(self, md: LedgerMetadata, version: int) -> int:
        await self.cluster.metadata_hop()
        if self.cluster.before_metadata_write is not None:
            await self.cluster.before_metadata_write(md)
        old, _ = self.ledgers.read(md.ledger_id)
        new_version = self.ledgers.write(md, version)
        self.cluster.stats.metadata_writes += 1
        if md.state != "CLOSED" and md.fragments != old.fragments:
            self.cluster.stats.ensemble_changes += 1
        if md.is_closed:
            self.cluster.closed_at.setdefault(md.ledger_id, self.cluster.loop.time())
        self.cluster._log(f"metadata {md.ledger_id}: {md.state} last={md.last_entry_id} "
                          f"fragments={[(f, list(e)) for f, e in md.fragments]}")
        await self.cluster.metadata_hop()
        return new_version

    async def writable_bookies(self) -> list[BookieRegistration]:
        await self.cluster.metadata_hop()
        result = list_bookies(self.cluster.meta)
        await self.cluster.metadata_hop()
        return result

    async def replacements(self, md: LedgerMetadata, ensemble: list[str], positions: Sequence[int], *,
                           exclude: Set[str], first_attempt: bool) -> list[str]:
        # No watched list here: every change reads the registry, one metadata call as before.
        return self.placement.replace(await self.writable_bookies(), md, ensemble, positions, exclude=exclude)


# -- workloads and the persistence property ------------------------------------------------------
@dataclass
class WriteLog:
    """What a writer appended and what it was told: the ground truth to check against."""

    written: dict[int, bytes] = field(default_factory=dict)  # entry id -> payload appended
    acked: dict[int, bytes] = field(default_factory=dict)  # entry id -> payload confirmed
    acked_at: dict[int, float] = field(default_factory=dict)  # entry id -> virtual time of its ack
    failed: dict[int, BaseException] = field(default_factory=dict)
    futures: list[asyncio.Future[int]] = field(default_factory=list)

    def append(self, lh: LedgerHandle, payload: bytes) -> asyncio.Future[int]:
        """``lh.append(payload)``, recording the outcome (raises as append does)."""
        eid = lh.next_entry_id
        fut = lh.append(payload)
        self.written[eid] = payload
        self.futures.append(fut)

        def done(f: asyncio.Future[int]) -> None:
            if f.cancelled():
                return
            err = f.exception()
            if err is None:
                assert f.result() == eid, (f.result(), eid)
                self.acked[eid] = payload
                self.acked_at[eid] = asyncio.get_running_loop().time()
            else:
                self.failed[eid] = err

        fut.add_done_callback(done)
        return fut

    async def settle(self) -> None:
        """Wait until every append has an outcome."""
        if self.futures:
            await asyncio.gather(*self.futures, return_exceptions=True)


async def check_persistence(cluster: SimCluster, ledger_id: int, password: bytes, log: WriteLog) -> list[str]:
    """The persistence property of a CLOSED ledger, as a list of violations (empty: holds).

    Every acknowledged entry is at or below the last entry; every entry up to the last is
    readable and holds exactly what the writer appended with that id; the length matches.
    Reads use a fresh client: call after healing, so that an unreadable entry means lost."""
    md = cluster.ledger(ledger_id)
    problems: list[str] = []
    if not md.is_closed:
        return [f"ledger {ledger_id} is {md.state}, not CLOSED"]
    last = md.last_entry_id
    closed_at = cluster.closed_at.get(ledger_id, float("inf"))
    after = sorted(e for e in log.acked if e > last and log.acked_at[e] > closed_at)
    before = sorted(e for e in log.acked if e > last and log.acked_at[e] <= closed_at)
    if before:  # BP-46 scenario 2: recovery truncated entries acknowledged earlier
        problems.append(f"acknowledged entries {before} are beyond the closed last entry {last} (truncated)")
    if after:  # BP-46 scenario 1: a writer was acknowledged after the close
        problems.append(f"acknowledged entries {after} are beyond the closed last entry {last} "
                        "(acknowledged after the close)")
    bk = cluster.client("checker")
    try:
        rh = await bk.open_ledger(ledger_id, password=password)
        entries: list[LedgerEntry] = []
        if last >= 0:
            try:  # the ranged / pipelined path readers use...
                entries = [e async for e in rh.read(0, last)]
            except ZbkError:  # ...and entry by entry to name each unreadable one
                entries = []
                for eid in range(last + 1):
                    try:
                        entries.append(await rh.read_entry(eid))
                    except ZbkError as e:
                        problems.append(f"entry {eid} (of 0..{last}{', acknowledged' if eid in log.acked else ''}) "
                                        f"is unreadable: {type(e).__name__}: {e}")
        for entry in entries:
            if entry.payload != log.written.get(entry.entry_id):
                problems.append(f"entry {entry.entry_id} holds {entry.payload[:20]!r}, the writer appended "
                                f"{log.written.get(entry.entry_id, b'nothing')[:20]!r}")
        expected_length = sum(len(log.written.get(e, b"")) for e in range(last + 1))
        if md.length != expected_length:
            problems.append(f"closed length {md.length} != {expected_length} bytes of entries 0..{last}")
    finally:
        await bk.close()
    return problems

