"""Writing a ledger: LedgerHandle (the write path of zbk/client/handles.py). Its ensemble
changes are in zbk/client/ensemble.py, the batches of adds it hands the AddDispatcher in
zbk/client/adds.py.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any

from zbk import limits
from zbk.client import metrics as cm
from zbk.client.adds import Batch, PendingAdd
from zbk.client.context import AddScheduler, HandleContext, WriteSet
from zbk.client.reading import ReadHandle
from zbk.errors import (
    BookieUnavailableError,
    LedgerClosedError,
    LedgerFencedError,
    MetadataUnavailableError,
    MetadataVersionError,
    TooManyRequestsError,
    UnauthorizedError,
    ZbkError,
    error_for_status,
)
from zbk.metadata.ledger import LedgerMetadata
from zbk.wire import messages as w
from zbk.wire.entry import build_entry, with_lac
from zbk.wire.ops import AddFlag
from zbk.wire.status import Status

# Named as the module this code was split from: log configuration and output stay as they were.
log = logging.getLogger("zbk.client.handles")

# No bookie to replace. Not a set: with 10,000 open handles every container per handle is an
# object each full collection of the cyclic GC walks (an empty frozenset is not tracked).
_NO_BOOKIES: frozenset[str] = frozenset()


class LedgerHandle(ReadHandle):
    """The single writer of a ledger (asyncio); ``AsyncBookKeeper.create_ledger`` returns one.

    It is also a `ReadHandle`: entries up to its own LAC can be read through it.
    Appends are pipelined: each returns at once with a future, many can be in flight, and
    the futures complete in entry order. When a bookie fails, the handle replaces it (an
    ensemble change) and sends the pending entries again; the application sees a failure
    only when no replacement is possible, or when another client fenced the ledger. A
    failed handle stays failed: every later call raises the same error.
    """

    __slots__ = ("recovery", "deferred_sync", "last_confirmed", "next_entry_id", "length", "pushed_length", "pending",
                 "failed", "closing", "_dispatcher", "_unsent", "_rescan", "_ws_md", "_ws_first", "_ws_rot", "_ws_mask",
                 "_add_flags", "_changing", "_to_replace", "_changes_without_progress", "_tasks", "_drain_event",
                 "lac_sent", "_explicit", "_rechecking", "_batches", "_batches_max", "_loop")

    def __init__(self, ctx: HandleContext, md: LedgerMetadata, version: int, password: bytes, *,
                 recovery: bool = False, deferred_sync: bool = False) -> None:
        """A writer; `AsyncBookKeeper.create_ledger` makes them, applications do not.

        Args:
            ctx: What the client's handles share: transport, metadata store, settings.
            md: The ledger's metadata.
            version: Its version in the metadata store (for compare-and-set).
            password: The ledger's password.
            recovery: Write recovery adds (ledger recovery and re-replication), which
                fenced bookies accept.
            deferred_sync: Confirm appends before they are on disk (``force()`` makes
                them durable).
        """
        super().__init__(ctx, md, version, password)
        self.recovery = recovery  # recovery adds (used by ledger recovery and re-replication)
        # DEFERRED_SYNC: appends complete once AQ bookies have them (not yet fsynced); the LAC,
        # all that readers may see, advances only when force() made them durable.
        self.deferred_sync = deferred_sync and not recovery
        self.last_confirmed = -1  # highest entry confirmed by AQ acks (== lac unless deferred)
        self.next_entry_id = 0 if md.last_entry_id < 0 or md.is_closed else md.last_entry_id + 1
        self.length = 0  # confirmed bytes
        self.pushed_length = 0
        self.pending: deque[PendingAdd] = deque()
        self.failed: ZbkError | None = None
        self.closing = False
        self._dispatcher: AddScheduler = ctx.adds
        self._unsent: list[PendingAdd] = []  # appended since the last _collect
        self._rescan = False  # look at every pending entry at the next _collect (ensemble change)
        self._ws_md: LedgerMetadata | None = None  # _write_set's cache
        self._ws_first = 0
        self._ws_rot: tuple[WriteSet, ...] = ()  # tuples of str and int: untracked by the GC
        self._ws_mask = 0
        flags = AddFlag.RECOVERY_ADD if self.recovery else AddFlag(0)
        self._add_flags = flags | AddFlag.DEFERRED_SYNC if self.deferred_sync else flags
        self._changing = False
        # Not a set, nor a set of tasks below until there is one: with 10,000 open handles
        # every container per handle is an object each full collection of the cyclic GC
        # walks (empty frozensets and tuples are not tracked).
        self._to_replace: frozenset[str] = _NO_BOOKIES
        # Ensemble changes since an entry was last confirmed: bounds a writer flapping between
        # bookies that each fail at once (two with failing disks) instead of spinning forever.
        self._changes_without_progress = 0
        self._tasks: set[asyncio.Task[Any]] | None = None
        # Set when ``pending`` empties, made only while something waits for that (close,
        # recovery): with many ledgers each entry empties its handle's pending, and an Event
        # set and cleared per entry would be a measurable part of the client's CPU.
        self._drain_event: asyncio.Event | None = None
        # The highest LAC the bookies were sent, piggybacked on an add or by WRITE_LAC, and the
        # client's explicit-LAC check (zbk/client/explicitlac.py) when it is on. Recovery
        # writes back entries of a ledger it is closing: no reader needs its LAC.
        self.lac_sent = -1
        self._explicit = None if self.recovery else ctx.explicit_lac
        self._rechecking: asyncio.Future[None] | None = None  # _recheck's look at the metadata, while under way
        # The last entry of each batch of new entries sent and not yet confirmed, oldest first
        # (see _may_send_batch). A tuple of ints, which the cyclic GC does not track.
        self._batches: tuple[int, ...] = ()
        self._batches_max = ctx.config.add_batches_in_flight_max
        # The loop the client runs on (handles are made in its coroutines). Kept, because
        # asyncio.get_running_loop() makes a getpid() system call each time, and an append
        # needs the loop for its future.
        self._loop = asyncio.get_running_loop()

    # -- appending ----------------------------------------------------------------------------
    def append(self, payload: bytes) -> asyncio.Future[int]:
        """Queue ``payload`` as the ledger's next entry; it is sent within this event-loop turn.

        Not a coroutine: the entry id is taken at the call, so entries follow call order
        whatever the caller awaits. ``await lh.append(p)`` waits for the confirmation;
        collecting the futures and awaiting them later pipelines the appends.

        Args:
            payload: The entry's bytes.

        Returns:
            A future that completes with the entry's id once AQ bookies of its write set
            have it and every earlier entry is confirmed; futures complete in entry order.
            It fails with `LedgerFencedError`, `NotEnoughBookiesError`, `UnauthorizedError`,
            a `MetadataError` (an ensemble change could not be recorded),
            `NoSuchLedgerError` (the ledger was deleted), or `BookieUnavailableError` (the
            client was closed). A failed future leaves it unknown whether the entry is
            stored: open the ledger with recovery to know.

        Raises:
            LedgerClosedError: The handle was closed, or the ledger is full.
            TooManyRequestsError: ``pending_adds_max`` appends are already unconfirmed.
            ZbkError: The handle failed earlier: its error, raised again.
        """
        if self.failed is not None:
            if isinstance(self.failed, MetadataUnavailableError):
                return self._recheck()
            raise self.failed
        if self.closing or self.md.is_closed:
            raise LedgerClosedError(f"ledger {self.ledger_id} is closed")
        if len(self.pending) >= self.ctx.config.pending_adds_max:
            # Backpressure: typed, so that a caller can tell "wait and append again" from a failure.
            raise TooManyRequestsError(f"ledger {self.ledger_id}: {self.ctx.config.pending_adds_max} adds pending "
                                       "(pending_adds_max)")
        if self.next_entry_id > limits.entry_id_max:
            raise LedgerClosedError(f"ledger {self.ledger_id} is full ({limits.entry_id_max + 1} entries)")
        size = len(payload)
        self.pushed_length += size
        eid = self.next_entry_id
        self.next_entry_id += 1
        lac = self.lac_sent = self.lac
        blob = build_entry(self.ledger_id, eid, lac, payload, self.digest, ledger_length=self.pushed_length)
        return self._push(eid, blob, size)

    def _recheck(self) -> asyncio.Future[int]:
        """An append to a handle that failed because the metadata store did not answer (an
        ensemble change that could not be written): that error says nothing of whether the
        ledger is still this writer's. A writer cut off from bookies and store alike while a
        recovering reader fenced and closed its ledger would be told "metadata unavailable"
        forever, and never that it lost the ledger. So the append asks the store again, and
        fails as fenced if the ledger is closed or in recovery now; with the old error if it
        is still open or the store is still silent. Nothing is sent either way: the entries
        the failed change left unconfirmed may be missing, and no later entry may follow
        them."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        if self._rechecking is None:
            self._rechecking = loop.create_future()
            self._spawn(self._look_again(self._rechecking))

        def answer(_: asyncio.Future[None]) -> None:
            assert self.failed is not None
            if not fut.done():
                fut.set_exception(self.failed)

        self._rechecking.add_done_callback(answer)
        return fut

    async def _look_again(self, done: asyncio.Future[None]) -> None:
        try:
            await self._fresh_metadata_unless_fenced()
        except LedgerFencedError as e:
            self._fail(e)
        except ZbkError:
            pass  # still no answer (or no ledger): the handle keeps its error
        finally:
            self._rechecking = None
            done.set_result(None)

    def _push(self, eid: int, blob: bytes, size: int) -> asyncio.Future[int]:
        if self.failed is not None:
            raise self.failed  # nothing would send it: a recovery would wait for it forever
        a = PendingAdd(eid, blob, size, time.monotonic(), self._loop)
        self.pending.append(a)
        unsent = self._unsent
        unsent.append(a)
        if len(unsent) == 1:  # the others were woken for, or wait for _advance or a change's end
            self._dispatcher.wake(self)
        return a

    def _schedule_flush(self) -> None:
        """Send every pending entry again where it is missing (after an ensemble change)."""
        self._rescan = True
        self._dispatcher.wake(self)

    def _write_set(self, entry_id: int) -> WriteSet:
        """md.write_set as ((bookie, bit), ...) and its bit mask, from rotations of the last
        ensemble cached per metadata object."""
        md = self.md
        if md is not self._ws_md:
            first, ensemble = md.fragments[-1]
            self._ws_md, self._ws_first = md, first
            self._ws_rot = rot = self._dispatcher.rotations(ensemble, md.write_quorum)
            masks = {m for _, m in rot}  # one when WQ == E: _collect sends new entries as one part
            self._ws_mask = masks.pop() if len(masks) == 1 else 0
        if entry_id >= self._ws_first:
            return self._ws_rot[entry_id % len(self._ws_rot)]
        return self._dispatcher.write_set_of(md.write_set(entry_id))

    def _collect(self, out: dict[str, Batch[LedgerHandle]], fresh: dict[int, Batch[LedgerHandle]]) -> None:
        """Called by the AddDispatcher once per event-loop turn: add to ``out`` every pending
        entry's bookies of its write set that it has not been sent to, per bookie (a part of
        that bookie's batch). Only new entries are looked at, except after an ensemble change
        (then all pending ones). A handle with a single new entry, the common case with many
        ledgers, puts it in ``fresh`` instead: one batch per write set (its bit mask), for
        all of that set's bookies at once, rather than a part in each bookie's batch. So do
        new entries that share one write set (WQ == E), as one part, not entry by entry."""
        if self._changing or self.failed is not None:
            return  # the change ends with _schedule_flush(): everything is looked at then
        adds: Any = self._unsent
        if self._batches_max and not self._rescan and adds:
            if not self._may_send_batch():
                return  # they wait in _unsent; _advance wakes the dispatcher when a batch is confirmed
            self._batches += (adds[-1].entry_id,)
            if self.lac > self.lac_sent and not self.recovery:
                # The batch's last entry carries the LAC confirmed while it waited: a bookie
                # raises its LAC to the highest an add brings, and a tailing reader's long
                # poll is answered by this add rather than by one appended after it.
                last = adds[-1]
                last.blob = with_lac(last.blob, self.lac, self.digest)
                self.lac_sent = self.lac
        if self._rescan:
            self._rescan = False
            adds.clear()
            adds = self.pending
        elif len(adds) > 1:
            self._unsent = []
        write_set = self._write_set
        if len(adds) == 1:  # the common case with many ledgers: no per-handle lists
            a = adds[0]
            if adds is self._unsent:
                adds.clear()  # reused: a new list per turn would live until the next (GC churn)
            sent = a.sent
            pairs, mask = write_set(a.entry_id)
            if not sent:
                a.sent = mask
                batch = fresh.get(mask)
                if batch is None:
                    batch = fresh[mask] = Batch()
                batch.add_one(self, a)
                return
            for b, bit in pairs:
                if not sent & bit:
                    sent |= bit
                    batch = out.get(b)
                    if batch is None:
                        batch = out[b] = Batch()
                    batch.add_one(self, a)
            a.sent = sent
            return
        if adds and adds is not self.pending:  # new entries, sent nowhere yet
            first = adds[0].entry_id
            write_set(first)  # refreshes _ws_mask
            mask = self._ws_mask
            if mask and first >= self._ws_first:  # one write set for all: one part for all its bookies
                for a in adds:
                    a.sent = mask
                fresh.setdefault(mask, Batch()).add(self, adds)
                return
        mine: dict[str, list[PendingAdd]] = {}
        for a in adds:
            sent = a.sent
            for b, bit in write_set(a.entry_id)[0]:
                if not sent & bit:
                    sent |= bit
                    lst = mine.get(b)
                    if lst is None:
                        mine[b] = [a]
                    else:
                        lst.append(a)
            a.sent = sent
        for b, lst in mine.items():
            batch = out.get(b)
            if batch is None:
                batch = out[b] = Batch()
            batch.add(self, lst)

    def _may_send_batch(self) -> bool:
        """Whether fewer than ``add_batches_in_flight_max`` batches of new entries are sent
        and unconfirmed. Otherwise new appends wait, and go out together once one is
        confirmed: a busy writer makes one request per batch rather than one per entry, and
        a bookie's actors hand over one message per batch (docs/performance.md, "Fixed
        rates"). A writer with nothing unconfirmed sends each append at once."""
        batches, confirmed = self._batches, self.last_confirmed
        while batches and batches[0] <= confirmed:
            batches = batches[1:]
        self._batches = batches
        return len(batches) < self._batches_max

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        tasks = self._tasks
        if tasks is None:
            tasks = self._tasks = set()
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    def _add_request(self, rid: int, adds: list[PendingAdd]) -> w.AddRequest:
        return w.AddRequest(rid=rid, ledger_id=self.ledger_id, master_key=self.master_key, flags=self._add_flags,
                            entries=[a.blob for a in adds])

    def _add_failed(self, bookie: str, adds: list[PendingAdd], err: BaseException) -> None:
        """The request carrying ``adds`` to ``bookie`` got no answer (or the transport refused it)."""
        if isinstance(err, UnauthorizedError):  # CURVE: this client's key is refused
            self._fail(err)
        elif getattr(self.ctx.transport, "closed", False):
            # The client is shutting down (its requests fail with "client closed"): no
            # ensemble change, which would only go to metadata for every open ledger.
            self._fail(err if isinstance(err, ZbkError) else BookieUnavailableError(str(err)))
        else:
            self._bookie_failed(bookie, adds, str(err))

    def _add_answered(self, bookie: str, adds: list[PendingAdd], status: Status, now: float | None = None,
                      latencies: list[float] | None = None) -> None:
        if status == Status.EOK:
            bit = self._dispatcher.bit(bookie)
            for a in adds:
                if a.sent & bit:  # not re-routed away from this bookie meanwhile
                    a.acked |= bit
            self._advance(now, latencies)
        elif status == Status.EFENCED:
            self._fail(LedgerFencedError(f"ledger {self.ledger_id} was fenced (by {bookie}): another client is recovering it"))
        elif status == Status.EUA:
            self._fail(UnauthorizedError(f"ledger {self.ledger_id}: {bookie} refused the master key"))
        else:
            self._bookie_failed(bookie, adds, status.name)

    def _advance(self, now: float | None = None, latencies: list[float] | None = None) -> None:
        """Confirm, in entry order, the pending entries that AQ bookies acknowledged. Their
        latencies go to ``latencies`` (observed by the caller, once per response) or, without
        it, straight to the histogram."""
        pending = self.pending
        if not pending:
            self._drained()
            return
        aq = self.md.ack_quorum
        counted = -1  # the bookies whose acks count: all of them, except during a change
        if self._changing:
            # The new fragment starts at the LAC the change read, so an entry confirmed now
            # belongs to it, where a bookie being replaced holds nothing: only acks of the
            # bookies that stay count (its replacement is never sent an entry confirmed
            # before the change lands). The change confirms the rest once it is in (ensemble.py).
            bit = self._dispatcher.bit
            for b in self._to_replace:
                counted &= ~bit(b)
        if (pending[0].acked & counted).bit_count() < aq:
            return
        if now is None:
            now = time.monotonic()
        lat = [] if latencies is None else latencies
        length = self.length
        while pending and (pending[0].acked & counted).bit_count() >= aq:
            a = pending.popleft()
            eid = a.entry_id
            length += a.size
            lat.append(now - a.started)
            a.blob = b""  # settled: the future may outlive it in the caller's hands
            if not a.done():
                a.set_result(eid)
        self.last_confirmed = eid
        self.length = length
        self._changes_without_progress = 0
        if not self.deferred_sync:
            self.lac = self.last_confirmed
            if self._explicit is not None:
                self._explicit.note(self)
        if latencies is None:
            cm.ADD_ENTRY_SECONDS.observe_many(lat)
        if self._unsent and self._batches_max and self._may_send_batch():
            self._dispatcher.wake(self)  # appends held back by _collect
        if not pending:
            self._drained()

    def _drained(self) -> None:
        """``pending`` is empty: wake whoever waits in wait_drained."""
        ev = self._drain_event
        if ev is not None:
            self._drain_event = None
            ev.set()

    async def wait_drained(self) -> None:
        """Wait until no append is pending (each confirmed or failed) and no ensemble change
        is under way.

        A change started by a bookie failing after its entries reached AQ elsewhere (WQ >
        AQ) must land before the close, or the ledger closes with the failed bookie in its
        last ensemble and the change then fails against the closed metadata. It raises
        nothing: the appends' futures carry their failures.
        """
        while self.pending or self._changing:
            ev = self._drain_event
            if ev is None:
                ev = self._drain_event = asyncio.Event()
            await ev.wait()

    # The failure half of the write path works on the handle from zbk/client/ensemble.py,
    # which imports this module: imported when a bookie fails, not at import time.
    def _bookie_failed(self, bookie: str, adds: list[PendingAdd], why: str) -> None:
        from zbk.client.ensemble import bookie_failed

        bookie_failed(self, bookie, adds, why)

    async def _fresh_metadata_unless_fenced(self) -> tuple[LedgerMetadata, int]:
        from zbk.client.ensemble import fresh_metadata_unless_fenced

        return await fresh_metadata_unless_fenced(self)

    def _fail(self, err: ZbkError) -> None:
        # Fenced is the last word: it replaces "metadata unavailable", which only said that
        # the store was silent (a bookie answering EFENCED after a change failed that way).
        if self.failed is None or (isinstance(err, LedgerFencedError)
                                   and isinstance(self.failed, MetadataUnavailableError)):
            self.failed = err
        for a in self.pending:
            a.blob = b""  # settled: the future may outlive it in the caller's hands
            if not a.done():
                a.set_exception(err)
        self.pending.clear()
        self._drained()

    # -- closing ------------------------------------------------------------------------------
    async def close(self) -> None:
        """Wait for the pending appends, then close the ledger at its LAC.

        The close is a compare-and-set of the ledger's metadata: readers then see the
        ledger's final length. The advisory WRITE_CLOSE (BP-32) goes to the ensemble
        without waiting. Closing a closed handle does nothing. A ``deferred_sync`` ledger is
        made durable (`force`) first.

        Raises:
            LedgerFencedError: Another client fenced the ledger (it closes it itself).
            ZbkError: The handle failed earlier: the error it failed with
                (`NotEnoughBookiesError`, `UnauthorizedError`...).
            BookieUnavailableError: ``force()`` of a ``deferred_sync`` ledger failed.
            MetadataError: The metadata store failed or cannot be reached.
        """
        if self.md.is_closed:
            return
        self.closing = True
        await self.wait_drained()
        if self.failed is not None and not isinstance(self.failed, LedgerFencedError):
            raise self.failed
        if self.deferred_sync and self.failed is None:
            await self.force()  # close only at a durable LAC
        md, version = self.md, self.version
        while True:
            if md.is_closed:
                break
            if md.state == "IN_RECOVERY" and not self.recovery:
                raise LedgerFencedError(f"ledger {self.ledger_id} is being recovered by another client")
            if self.failed is not None:
                raise self.failed
            closed = md.closed(self.lac, self.length)
            try:
                version = await self.ctx.write_metadata(closed, version)
                md = closed
                break
            except MetadataVersionError:
                md, version = await self.ctx.read_metadata(self.ledger_id)
        self.md, self.version = md, version
        self.lac = md.last_entry_id
        self.ctx.send_write_close(self.md, self.master_key)

    async def force(self) -> int:
        """Make every entry confirmed so far durable and advance the LAC to it.

        For ledgers created with ``deferred_sync=True``, whose appends complete once AQ
        bookies have the entry in memory: FORCE_LEDGER goes to the bookies that hold them.
        A no-op for other ledgers, whose entries are durable when confirmed.

        Returns:
            The LAC after the call.

        Raises:
            BookieUnavailableError: A bookie did not make them durable; the LAC then stays
                where it was.
        """
        target = self.last_confirmed
        if not self.deferred_sync or target <= self.lac:
            return self.lac
        md = self.md
        first_frag = md.fragment_index(self.lac + 1)
        bookies = {b for _, ens in md.fragments[first_frag:] for b in ens}
        t = self.ctx.transport

        async def one(bookie: str) -> None:
            resp = await t.request(bookie, w.ForceLedgerRequest(rid=t.next_rid(), ledger_id=self.ledger_id),
                                   self.ctx.add_timeout_s)
            if resp.status != Status.EOK:
                raise error_for_status(resp.status, f"{bookie}: FORCE_LEDGER of ledger {self.ledger_id}")

        results = await asyncio.gather(*(one(b) for b in bookies), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise BookieUnavailableError(f"ledger {self.ledger_id}: force failed on {len(errors)} bookie(s): "
                                         f"{errors[0]}")
        self.lac = max(self.lac, target)
        if self._explicit is not None:
            self._explicit.note(self)
        return self.lac

