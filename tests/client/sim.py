"""Deterministic simulation of a zbk cluster for the client library (docs/client.md).

The client's protocol code (zbk/client) runs unchanged; everything around it is simulated
in one thread, in virtual time, from one seed:

* :class:`VirtualTimeLoop` is an asyncio event loop whose clock only moves when nothing is
  ready to run: it then jumps to the next timer. A 10 s add timeout costs no wall time, and
  a run is a pure function of its seed. When nothing is ready and no timer is pending, every
  task waits for something that can never happen: :class:`SimDeadlockError`.
* :class:`MemoryMetadataStore` is a dict with etcd's revision/CAS model (the contract of
  zbk/metadata/store.py), so LedgerStore and list_bookies run on it unchanged.
* :class:`SimBookie` mirrors the request semantics of the real bookie (zbk/actors/server.py):
  master key (EUA), fencing creates the ledger, EFENCED for plain adds to fenced ledgers,
  RECOVERY_ADD accepted, limbo turns explicit negatives into EUNKNOWN, LAC = the highest
  LAC piggybacked on stored entries, long polls. It adds fault knobs: unreachable, crashed
  (refused fast), paused (answers held), random drops of requests or replies, delays,
  forced statuses, load shedding, and crashes that lose what was not synced, followed by
  BP-46 phase one (fence + limbo) on restart if asked.
* :class:`SimTransport` implements zbk.client.transport.Transport; every message goes
  through the real wire codec (encode, then decode) on the way in and out, so the client
  and the simulated bookie exchange exactly what the real ones would.
* :class:`SimContext` is the client's ClientContext with the metadata seams
  (read_metadata / write_metadata / writable_bookies) calling the in-memory store directly,
  after a seeded virtual delay, instead of through a worker thread.

Seeds: :func:`seed_from_env` prints ``ZBK_SEED=<n>``; setting ZBK_SEED replays a run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import random
import selectors
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from zbk import limits
from zbk.client.bookkeeper import AsyncBookKeeper, ClientContext
from zbk.client.digest import master_key
from zbk.client.dispatch import _request_then
from zbk.client.handles import LedgerEntry, LedgerHandle
from zbk.config import ClientConfig
from zbk.errors import (
    BookieUnavailableError,
    KeyExistsError,
    LeaseExpiredError,
    MetadataVersionError,
    ZbkError,
)
from zbk.metadata import layout
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import BookieRegistration, LedgerStore, list_bookies
from zbk.metadata.store import KeyValue, WatchCallback, WatchEvent, iter_prefix
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
        if timeout is None:
            raise SimDeadlockError("no task can make progress and no timer is pending:\n" + _pending_tasks(self._loop))
        self._loop.advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys


def _pending_tasks(loop: asyncio.AbstractEventLoop) -> str:
    """Every unfinished task and where it waits (its await chain), for a stuck run's report."""
    lines = []
    for t in asyncio.all_tasks(loop):
        chain: list[str] = []
        coro: Any = t.get_coro()
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is not None:
                chain.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        lines.append(f"  {t.get_name()}: {' -> '.join(chain)}")
    return "\n".join(sorted(lines))


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

    def time(self) -> float:
        return self._now

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
        except (SimDeadlockError, SimTimeLimitError, SimLivelockError):
            pass  # a task that ignores cancellation: the original outcome is what matters
        finally:
            loop.close()


# -- metadata ---------------------------------------------------------------------------------
class _MemoryWatch:
    def __init__(self, store: MemoryMetadataStore, prefix: str, callback: WatchCallback, last: int) -> None:
        self.store, self.prefix, self.callback = store, prefix, callback
        self._last = last

    def deliver(self, ev: WatchEvent) -> None:
        if ev.key.startswith(self.prefix):
            self._last = ev.revision
            self.callback(ev)

    def cancel(self) -> None:
        if self in self.store._watches:
            self.store._watches.remove(self)

    @property
    def last_revision(self) -> int:
        return self._last


class MemoryMetadataStore:
    """The MetadataStore contract (zbk/metadata/store.py) on a dict: one store-wide
    revision, a key's version is the revision of its last change, CAS compares it. Calls
    are synchronous and instantaneous; SimContext adds the network delay around them.
    Watches are delivered inline, in revision order."""

    uri = "memory://sim"

    def __init__(self) -> None:
        self._data: dict[str, KeyValue] = {}
        self._rev = 0
        self._log: list[WatchEvent] = []  # every change, for watches from an old revision
        self._watches: list[_MemoryWatch] = []
        self._leases: dict[int, set[str]] = {}
        self._lease_ids = itertools.count(1)

    def _changed(self, ev: WatchEvent) -> None:
        self._log.append(ev)
        for watch in list(self._watches):
            watch.deliver(ev)

    def get(self, key: str) -> KeyValue | None:
        return self._data.get(key)

    def put(self, key: str, value: bytes, *, lease: int | None = None) -> int:
        if lease is not None and lease not in self._leases:
            raise LeaseExpiredError(f"lease {lease} is gone")
        self._rev += 1
        old = self._data.get(key)
        if old is not None and old.lease is not None:
            self._leases.get(old.lease, set()).discard(key)
        if lease is not None:
            self._leases[lease].add(key)
        self._data[key] = KeyValue(key, bytes(value), self._rev, old.create_revision if old else self._rev, lease)
        self._changed(WatchEvent("put", key, bytes(value), self._rev))
        return self._rev

    def create(self, key: str, value: bytes, *, lease: int | None = None) -> int:
        if key in self._data:
            raise KeyExistsError(f"{key} exists")
        return self.put(key, value, lease=lease)

    def cas(self, key: str, value: bytes, version: int, *, lease: int | None = None) -> int:
        kv = self._data.get(key)
        if kv is None or kv.version != version:
            raise MetadataVersionError(f"{key}: version {version} is not current")
        return self.put(key, value, lease=lease)

    def delete(self, key: str, *, version: int | None = None) -> bool:
        kv = self._data.get(key)
        if kv is None:
            if version is not None:
                raise MetadataVersionError(f"{key} is absent")
            return False
        if version is not None and kv.version != version:
            raise MetadataVersionError(f"{key}: version {version} is not current")
        del self._data[key]
        if kv.lease is not None:
            self._leases.get(kv.lease, set()).discard(key)
        self._rev += 1
        self._changed(WatchEvent("delete", key, None, self._rev))
        return True

    def list(self, prefix: str, *, start_after: str | None = None,
             limit: int = limits.metadata_list_page_keys) -> list[KeyValue]:
        keys = sorted(k for k in self._data if k.startswith(prefix) and (start_after is None or k > start_after))
        return [self._data[k] for k in keys[:limit]]

    def revision(self) -> int:
        return self._rev

    def watch(self, prefix: str, callback: WatchCallback, *, start_revision: int | None = None) -> _MemoryWatch:
        start = self._rev + 1 if start_revision is None else start_revision  # never compacted
        watch = _MemoryWatch(self, prefix, callback, start - 1)
        for ev in self._log:
            if ev.revision >= start:
                watch.deliver(ev)
        self._watches.append(watch)
        return watch

    def grant_lease(self, ttl_s: int) -> int:
        lease = next(self._lease_ids)
        self._leases[lease] = set()
        return lease

    def keepalive(self, lease: int, *, timeout_s: float | None = None) -> None:
        if lease not in self._leases:
            raise LeaseExpiredError(f"lease {lease} is gone")

    def revoke_lease(self, lease: int) -> None:
        for key in sorted(self._leases.pop(lease, set())):
            self.delete(key)

    def close(self) -> None:
        self._watches.clear()


# -- bookies ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BootPolicy:
    """What a bookie does at boot after an unclean shutdown (BP-46 phase one), for every
    ledger that is not CLOSED and has it in an ensemble."""

    fence: bool = True  # mark it fenced, so no plain add is accepted (scenario 1)
    limbo: bool = True  # mark it limbo, so no read answers an explicit negative (scenario 2)


NO_PROTECTION = BootPolicy(fence=False, limbo=False)


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


@dataclass(slots=True)
class _Poll:
    req: w.ReadRequest
    reply: Callable[[Any], None]


@dataclass(slots=True)
class SimLedger:
    """A bookie's state of one ledger: what it holds now and what survives a crash."""

    master_key: bytes | None
    fenced: bool = False
    fence_synced: bool = False
    limbo: bool = False  # set by phase one only, always durably
    entries: dict[int, bytes] = field(default_factory=dict)
    synced: dict[int, bytes] = field(default_factory=dict)
    explicit_lac: int = -1  # journaled by WRITE_LAC, so durable
    lac: int = -1
    polls: list[_Poll] = field(default_factory=list)
    write_closed: bool = False

    def recompute_lac(self) -> None:
        self.lac = max([self.explicit_lac, *(peek_entry_header(b)[2] for b in self.entries.values())])


class SimBookie:
    """One bookie: the request semantics of zbk/actors/server.py on in-memory state, plus
    fault knobs. Requests arrive through SimCluster.send; answers go back through the
    ``reply`` callback given with each request (later, for long polls and paused bookies).

    Durability: with ``journal_data`` an add is synced before it is acknowledged (the
    journal); without, it is synced only by :meth:`flush` (the entry log's periodic sync)
    and a crash loses it. ``journal_fence`` likewise for the fence bit: zbk's real bookie
    and BP-46 journal it always; turning it off is the pre-BP-46 journal-less bookie.
    """

    def __init__(self, cluster: SimCluster, bookie_id: str, *, journal_data: bool = True,
                 journal_fence: bool = True) -> None:
        self.cluster = cluster
        self.id = bookie_id
        self.journal_data = journal_data
        self.journal_fence = journal_fence
        self.ledgers: dict[int, SimLedger] = {}
        self.incarnation = 0  # bumped by each crash: requests in flight to the old one are lost
        # Fault knobs.
        self.running = True  # False after crash(): connections are refused at once
        self.unreachable = False  # "down": requests and answers vanish, clients time out
        self.paused = False  # alive but frozen: requests and answers are held until resume()
        self.read_only = False
        self.drop_rate = 0.0  # fraction of requests lost (half before, half after processing)
        self.delay_s = 0.0  # each message takes uniform(0, delay_s) longer, FIFO per connection
        self.shed_rate = 0.0  # fraction of requests answered ETOOMANYREQUESTS unread
        self.add_status: Status | None = None  # forced answers (no side effect) per op
        self.read_status: Status | None = None
        self.lac_status: Status | None = None
        self.rules: list[Rule] = []
        self._held: list[Callable[[], None]] = []
        # What it has seen, for assertions.
        self.requests = 0
        self.fence_requests = 0

    def __repr__(self) -> str:
        return f"<SimBookie {self.id}>"

    # -- faults ------------------------------------------------------------------------------
    def pause(self) -> None:
        self.paused = True

    def resume(self) -> None:
        """Process what arrived while paused, in order, and send the held answers."""
        self.paused = False
        held, self._held = self._held, []
        for work in held:
            work()

    def flush(self) -> None:
        """Sync everything (the entry log's periodic flush)."""
        for st in self.ledgers.values():
            st.synced = dict(st.entries)
            st.fence_synced = st.fenced

    def crash(self) -> None:
        """The process dies: unsynced adds (and, without ``journal_fence``, fences) are lost,
        held and in-flight requests with them. Clients are refused until :meth:`restart`."""
        self.running = False
        self.paused = False
        self.incarnation += 1
        self._held.clear()
        self.cluster.connections_closed(self.id)
        for st in self.ledgers.values():
            st.entries = dict(st.synced)
            st.fenced = st.fence_synced
            st.polls.clear()
            st.recompute_lac()
        self.cluster.unregister(self.id)

    def wipe(self) -> None:
        """Crash and lose the disks too (a replaced disk: a fixed cookie, BP-46)."""
        self.crash()
        self.ledgers.clear()

    def restart(self, boot: BootPolicy = NO_PROTECTION) -> int:
        """Start again after :meth:`crash`. With ``boot``, run BP-46 phase one as zbk's bookie
        does (zbk/bookie/boot.py): each non-closed ledger with this bookie in an ensemble
        becomes fenced and/or limbo, durably. Returns how many ledgers it marked."""
        assert not self.running, f"{self.id} is running"
        marked = 0
        if boot.fence or boot.limbo:
            for kv in iter_prefix(self.cluster.meta, layout.LEDGERS):
                md = LedgerMetadata.decode(kv.value)
                if md.is_closed or self.id not in md.all_bookies():
                    continue
                st = self._ensure(md.ledger_id, master_key(md.password))
                if boot.fence:
                    st.fenced = st.fence_synced = True
                if boot.limbo:
                    st.limbo = True
                marked += 1
        self.running = True
        self.cluster.register(self.id)
        return marked

    def set_read_only(self, read_only: bool) -> None:
        """Refuse adds with EREADONLY and move the registration to readonly (as a full disk does)."""
        self.read_only = read_only
        if self.running:
            self.cluster.register(self.id)

    def clear_faults(self) -> None:
        """Heal everything but a crash (see :meth:`restart`)."""
        self.unreachable = False
        if self.read_only:
            self.set_read_only(False)
        self.drop_rate = self.delay_s = self.shed_rate = 0.0
        self.add_status = self.read_status = self.lac_status = None
        self.rules.clear()
        if self.paused:
            self.resume()

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

    def hold(self, work: Callable[[], None]) -> bool:
        """Hold an answer produced while paused (a long poll expiring); True if held."""
        if self.paused:
            self._held.append(work)
            return True
        return False

    # -- requests (mirror of zbk/actors/server.py) --------------------------------------------
    def handle(self, req: Any, reply: Callable[[Any], None]) -> None:
        self.requests += 1
        if self.shed_rate and self.cluster.rng.random() < self.shed_rate:
            reply(w.ErrorResponse(rid=req.rid, status=Status.ETOOMANYREQUESTS))
            return
        if isinstance(req, w.AddRequest):
            reply(self._add(req))
        elif isinstance(req, w.MultiAddRequest):  # each part as if it came alone
            reply(w.MultiAddResponse(rid=req.rid, status=Status.EOK,
                                     statuses=tuple(self._add(part).status for part in req.parts)))
        elif isinstance(req, w.ReadRequest):
            self._read(req, reply)
        elif isinstance(req, w.ReadLacRequest):
            reply(self._read_lac(req))
        elif isinstance(req, w.WriteLacRequest):
            reply(self._write_lac(req))
        elif isinstance(req, w.ForceLedgerRequest):
            reply(self._force(req))
        elif isinstance(req, w.WriteCloseRequest):
            reply(self._write_close(req))
        elif isinstance(req, w.BookieInfoRequest):
            reply(w.BookieInfoResponse(rid=req.rid, status=Status.EOK, free_bytes=0, total_bytes=0,
                                       state="readonly" if self.read_only else "writable", ledgers=len(self.ledgers),
                                       limbo_ledgers=sum(1 for s in self.ledgers.values() if s.limbo)))
        elif isinstance(req, w.ListEntriesRequest):
            reply(self._list_entries(req))
        else:
            raise AssertionError(f"unexpected request {req!r}")

    @staticmethod
    def _key_ok(st: SimLedger | None, key: bytes | None) -> bool:
        if st is None or st.master_key is None:
            return True
        return key is not None and key == st.master_key

    def _ensure(self, lid: int, key: bytes) -> SimLedger:
        # The master key of a new ledger is journaled before anything is acknowledged.
        st = self.ledgers.get(lid)
        if st is None:
            st = self.ledgers[lid] = SimLedger(master_key=key)
        elif st.master_key is None:
            st.master_key = key
        return st

    def _add(self, req: w.AddRequest) -> w.AddResponse:
        first, last = peek_entry_header(req.entries[0])[1], peek_entry_header(req.entries[-1])[1]

        def answer(status: Status) -> w.AddResponse:
            return w.AddResponse(rid=req.rid, status=status, ledger_id=req.ledger_id, first_entry_id=first,
                                 last_entry_id=last)

        if self.read_only:
            return answer(Status.EREADONLY)
        st = self.ledgers.get(req.ledger_id)
        if not self._key_ok(st, req.master_key):
            return answer(Status.EUA)
        if st is not None and st.fenced and not req.flags & AddFlag.RECOVERY_ADD:
            return answer(Status.EFENCED)
        if self.add_status is not None:
            return answer(self.add_status)
        parsed = [peek_entry_header(blob) for blob in req.entries]
        if any(lid != req.ledger_id or not 0 <= eid <= limits.entry_id_max for lid, eid, _ in parsed):
            return answer(Status.EBADREQ)
        st = self._ensure(req.ledger_id, req.master_key)
        max_lac = -1
        for blob, (_, eid, lac) in zip(req.entries, parsed, strict=True):
            st.entries[eid] = bytes(blob)
            if self.journal_data:
                st.synced[eid] = st.entries[eid]
            max_lac = max(max_lac, lac)
        if max_lac > st.lac:
            self._advance_lac(st, max_lac)
        return answer(Status.EOK)

    def _advance_lac(self, st: SimLedger, lac: int) -> None:
        st.lac = lac
        ready = [p for p in st.polls if p.req.previous_lac < lac]
        st.polls = [p for p in st.polls if p.req.previous_lac >= lac]
        for p in ready:
            self._start_read(p.req, p.reply)

    def _fence(self, lid: int, key: bytes | None) -> Status | None:
        """Fence ``lid`` (creating it here if new: BP-46); EUA on a wrong master key."""
        st = self.ledgers.get(lid)
        if not self._key_ok(st, key):
            return Status.EUA
        self.fence_requests += 1
        if st is not None and st.fenced:
            return None
        assert key is not None, "the codec refuses FENCE without a master key"
        st = self._ensure(lid, key)
        st.fenced = True
        if self.journal_fence:
            st.fence_synced = True
        return None

    def _read(self, req: w.ReadRequest, reply: Callable[[Any], None]) -> None:
        lid = req.ledger_id
        if self.read_status is not None:
            reply(self._read_response(req, [], self.read_status))
            return
        if req.flags & ReadFlag.FENCE:
            err = self._fence(lid, req.master_key)
            if err is not None:
                reply(self._read_response(req, [], err))
                return
        st = self.ledgers.get(lid)
        if req.flags & ReadFlag.LONG_POLL and st is not None and st.lac <= req.previous_lac:
            poll = _Poll(req, reply)
            st.polls.append(poll)
            timeout = min(req.timeout_ms, limits.long_poll_timeout_ms_max) / 1000.0
            self.cluster.loop.call_later(timeout, self._expire_poll, st, poll, self.incarnation)
            return
        self._start_read(req, reply)

    def _expire_poll(self, st: SimLedger, poll: _Poll, incarnation: int) -> None:
        if incarnation != self.incarnation or poll not in st.polls:
            return
        if self.hold(lambda: self._expire_poll(st, poll, incarnation)):
            return
        st.polls.remove(poll)
        poll.reply(self._read_response(poll.req, [], Status.EOK))

    def _start_read(self, req: w.ReadRequest, reply: Callable[[Any], None]) -> None:
        st = self.ledgers.get(req.ledger_id)
        first, count = req.first_entry_id, req.count
        if req.flags & ReadFlag.LONG_POLL:
            first = req.previous_lac + 1
            count = max(0, min(count, (st.lac if st else -1) - req.previous_lac))
        blobs: list[bytes] = []
        size = 0
        sparse = bool(req.flags & ReadFlag.SPARSE)  # every held entry of the range, not a prefix
        if st is not None:
            for eid in range(first, first + count):
                blob = st.entries.get(eid)
                if blob is None:
                    if sparse:
                        continue
                    break
                if blobs and size + len(blob) > limits.read_response_bytes_max:
                    break
                blobs.append(blob)
                size += len(blob)
        reply(self._read_response(req, blobs))

    def _read_response(self, req: w.ReadRequest, blobs: list[bytes], status: Status | None = None) -> w.ReadResponse:
        st = self.ledgers.get(req.ledger_id)
        if status is None:
            if blobs or req.flags & ReadFlag.LONG_POLL:
                status = Status.EOK
            elif st is not None and st.limbo:
                status = Status.EUNKNOWN  # BP-46: it may have lost the entry, so it can not say "absent"
            else:
                status = Status.ENOENTRY if st is not None else Status.ENOLEDGER
        first = req.previous_lac + 1 if req.flags & ReadFlag.LONG_POLL else req.first_entry_id
        return w.ReadResponse(rid=req.rid, status=status, ledger_id=req.ledger_id, first_entry_id=first,
                              lac=st.lac if st else -1, entries=tuple(blobs))

    def _read_lac(self, req: w.ReadLacRequest) -> w.ReadLacResponse:
        lid = req.ledger_id
        if self.lac_status is not None:
            return w.ReadLacResponse(rid=req.rid, status=self.lac_status, ledger_id=lid, lac=-1)
        if req.flags & ReadFlag.FENCE:
            err = self._fence(lid, req.master_key)
            if err is not None:
                return w.ReadLacResponse(rid=req.rid, status=err, ledger_id=lid, lac=-1)
        st = self.ledgers.get(lid)
        if st is None:
            return w.ReadLacResponse(rid=req.rid, status=Status.ENOLEDGER, ledger_id=lid, lac=-1)
        return w.ReadLacResponse(rid=req.rid, status=Status.EOK, ledger_id=lid, lac=st.lac)

    def _write_lac(self, req: w.WriteLacRequest) -> w.WriteLacResponse:
        st = self.ledgers.get(req.ledger_id)
        if st is None:
            return w.WriteLacResponse(rid=req.rid, status=Status.ENOLEDGER, ledger_id=req.ledger_id)
        if not self._key_ok(st, req.master_key):
            return w.WriteLacResponse(rid=req.rid, status=Status.EUA, ledger_id=req.ledger_id)
        st.explicit_lac = max(st.explicit_lac, req.lac)
        if req.lac > st.lac:
            self._advance_lac(st, req.lac)
        return w.WriteLacResponse(rid=req.rid, status=Status.EOK, ledger_id=req.ledger_id)

    def _force(self, req: w.ForceLedgerRequest) -> w.ForceLedgerResponse:
        st = self.ledgers.get(req.ledger_id)
        if st is None:
            return w.ForceLedgerResponse(rid=req.rid, status=Status.ENOLEDGER, ledger_id=req.ledger_id)
        st.synced = dict(st.entries)
        return w.ForceLedgerResponse(rid=req.rid, status=Status.EOK, ledger_id=req.ledger_id)

    def _write_close(self, req: w.WriteCloseRequest) -> w.WriteCloseResponse:
        st = self.ledgers.get(req.ledger_id)
        if st is None:
            return w.WriteCloseResponse(rid=req.rid, status=Status.ENOLEDGER, ledger_id=req.ledger_id)
        if not self._key_ok(st, req.master_key):
            return w.WriteCloseResponse(rid=req.rid, status=Status.EUA, ledger_id=req.ledger_id)
        st.write_closed = True
        return w.WriteCloseResponse(rid=req.rid, status=Status.EOK, ledger_id=req.ledger_id)

    def _list_entries(self, req: w.ListEntriesRequest) -> w.ListEntriesResponse:
        st = self.ledgers.get(req.ledger_id)
        if st is None:
            return w.ListEntriesResponse(rid=req.rid, status=Status.ENOLEDGER, ledger_id=req.ledger_id)
        ranges: list[tuple[int, int]] = []
        for eid in sorted(st.entries):
            if ranges and ranges[-1][1] == eid - 1:
                ranges[-1] = (ranges[-1][0], eid)
            else:
                ranges.append((eid, eid))
        status = Status.EUNKNOWN if not ranges and st.limbo else Status.EOK
        return w.ListEntriesResponse(rid=req.rid, status=status, ledger_id=req.ledger_id, entry_ranges=tuple(ranges))

    # -- inspection ---------------------------------------------------------------------------
    def is_fenced(self, ledger_id: int) -> bool:
        st = self.ledgers.get(ledger_id)
        return st is not None and st.fenced

    def has_entry(self, ledger_id: int, entry_id: int) -> bool:
        st = self.ledgers.get(ledger_id)
        return st is not None and entry_id in st.entries

    def put_entry(self, ledger_id: int, key: bytes, blob: bytes) -> None:
        """Store ``blob`` directly, as a buggy writer could (scenario: a gap)."""
        st = self._ensure(ledger_id, key)
        _, eid, lac = peek_entry_header(blob)
        st.entries[eid] = st.synced[eid] = blob
        if lac > st.lac:
            self._advance_lac(st, lac)


# -- the network and the cluster ------------------------------------------------------------------
@dataclass(slots=True)
class SimStats:
    requests: int = 0
    dropped: int = 0
    metadata_writes: int = 0
    ensemble_changes: int = 0
    bad_responses: int = 0  # answers the client's decoder refused


class SimCluster:
    """Bookies, the metadata store and the network between them and the clients.

    Create it inside the running VirtualTimeLoop. ``rng`` (from ``seed``) decides every
    random network fate, so a run replays from its seed. ``trace`` (when enabled) records
    every message and its fate, to compare runs.
    """

    def __init__(self, seed: int, *, bookies: int = 3, journal_data: bool = True, journal_fence: bool = True,
                 wire: bool = True, trace: bool = False) -> None:
        self.loop = asyncio.get_running_loop()
        self.seed = seed
        self.rng = random.Random(seed)
        self.meta = MemoryMetadataStore()
        self.wire = wire  # round-trip every message through the real codec
        self.bookies: dict[str, SimBookie] = {}
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
            self.add_bookie(f"b{i + 1}:3181", journal_data=journal_data, journal_fence=journal_fence)

    def add_bookie(self, bookie_id: str, *, journal_data: bool = True, journal_fence: bool = True) -> SimBookie:
        b = self.bookies[bookie_id] = SimBookie(self, bookie_id, journal_data=journal_data,
                                                journal_fence=journal_fence)
        self.register(bookie_id)
        return b

    def register(self, bookie_id: str) -> None:
        """Publish the bookie as writable or readonly (by its read_only knob)."""
        self.unregister(bookie_id)
        reg = BookieRegistration(bookie_id, state="readonly" if self.bookies[bookie_id].read_only else "writable")
        self.meta.put(reg.key, reg.encode())

    def unregister(self, bookie_id: str) -> None:
        # A dead bookie's lease expires: writers stop choosing it for new ensembles.
        self.meta.delete(layout.writable_key(bookie_id))
        self.meta.delete(layout.readonly_key(bookie_id))

    def bookie(self, bookie_id: str) -> SimBookie:
        return self.bookies[bookie_id]

    def ledger(self, ledger_id: int) -> LedgerMetadata:
        """The ledger's metadata as stored now."""
        return LedgerStore(self.meta).read(ledger_id)[0]

    def heal(self, boot: BootPolicy = NO_PROTECTION) -> None:
        """End every fault: crashed bookies restart (with ``boot``), the others are healed."""
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
    def _when(self, client: str, bookie: SimBookie, direction: str, extra: float) -> float:
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
        req = decode_request(encode(msg)) if self.wire else msg
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
            if b.hold(lambda: reply(resp)):
                return
            if not b.can_answer(incarnation):
                self._log_msg(bookie_id, client, resp, ": lost (bookie gone)")
                return
            if drop_reply:
                self.stats.dropped += 1
                self._log_msg(bookie_id, client, resp, ": reply dropped")
                return
            self.loop.call_at(self._when(client, b, "reply", reply_delay), deliver, resp)

        def deliver(resp: Any) -> None:
            self._log_msg(bookie_id, client, resp)
            if fut.done():
                return
            if not self.wire:
                fut.set_result(resp)
                return
            try:
                fut.set_result(decode_response(encode(resp)))
            except FrameError as e:
                # As ZmqTransport does: the request named by an undecodable answer fails.
                self.stats.bad_responses += 1
                self._log(f"{bookie_id}->{client} undecodable: {e}")
                fut.set_exception(BookieUnavailableError(f"{bookie_id}: bad response ({e})"))

        def work() -> None:
            self._log_msg(client, bookie_id, req)
            b.handle(req, reply)

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

