"""Replicator workers: make under-replicated ledgers whole again.

A pass of a worker first clears, in one sweep, the marks (``underreplication/ledgers/``)
whose every named bookie is registered again (step 2 would find nothing lost: the common
end of a bookie that was away longer than the recovery delay, which costs no copy and
should not cost a lock per ledger either). Each removal is a compare-and-delete at the
version listed, so a loss the auditor adds meanwhile keeps its mark. Then it works on one
of the other marks, in random order so that workers spread out:

1. Take the ledger's lease-bound lock (skip it if another worker holds it, or if it is
   backing off after a failure), then read the mark again: the pass's list is older than
   the lock, and a mark another worker finished meanwhile is skipped, not worked twice.
2. The ledger's *lost* bookies: those the mark names that are registered neither
   writable nor read-only. Only named ones: the auditor applies the recovery delay, so a
   bookie merely restarting is never replaced (nor an open ledger fenced because of it).
   A named bookie that registered again is trusted to hold its data (finding lost data on
   a living bookie is the periodic fragment check's job).
3. If the ledger is not closed and its last fragment has a lost bookie, a writer may still
   be about to replace it: wait ``open_ledger_rereplication_grace_period_s`` after first
   seeing it, then fence, recover and close it (:func:`zbk.client.recovery.recover`).
4. For each fragment and each lost bookie in it: choose a writable replacement not in the
   fragment, copy every entry the lost position held (entry e where the position is in
   e's write set) from the surviving replicas — raw blobs, digest checked with the
   ledger's password — with batched RECOVERY_ADDs, then compare-and-set the fragment's
   new ensemble into the metadata.
5. Remove the mark, only at the version read in step 1 and only if no fragment names a
   lost bookie any more. Release the lock. A failure backs the ledger off and releases it.

Workers also take the in-place repair marks (``underreplication/repairs/``: limbo ledgers
after BP-46 phase one, replicas the periodic check found damaged) under the same per-ledger
lock and back-off: see :mod:`zbk.recovery.repair`.

Workers run as asyncio tasks that share one client context (one DEALER per bookie).

Before each pass a worker reads the cluster's auto-recovery switch
(:mod:`zbk.recovery.switch`): while an operator has it off the pass takes no mark, so
nothing is repaired until it is on again (a ledger already being worked on is finished).
"""

from __future__ import annotations

import asyncio
import logging
import random

from zbk import limits
from zbk.backoff import Backoff
from zbk.client import placement
from zbk.client.bookkeeper import ClientContext
from zbk.client.recovery import recover
from zbk.clock import SYSTEM_CLOCK, Clock
from zbk.errors import (
    BookieUnavailableError,
    MetadataVersionError,
    NoSuchLedgerError,
    ZbkError,
)
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import list_bookies
from zbk.recovery import metrics as rm
from zbk.recovery.copier import EntryCopier, RateLimiter, positions_held
from zbk.recovery.repair import InPlaceRepairer
from zbk.recovery.switch import is_enabled
from zbk.recovery.underreplication import RepairMark, UnderReplicatedLedger, UnderReplicationRegistry

log = logging.getLogger(__name__)


class Replicator:
    """N workers sharing one client context, a registry, and the process lease."""

    def __init__(self, ctx: ClientContext, registry: UnderReplicationRegistry, lease: int, *, workers: int = 1,
                 grace_period_s: float = 30.0, rate_bytes_per_s: float = 64 * 1024 * 1024,
                 rng: random.Random | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        assert workers >= 1, workers
        self.ctx = ctx
        self.registry = registry
        self.lease = lease
        self.workers = workers
        self.grace_period_s = grace_period_s
        self.copier = EntryCopier(ctx, RateLimiter(rate_bytes_per_s))
        self.repairer = InPlaceRepairer(ctx, registry, self.copier, self._registered)
        self.rng = rng or random.Random()
        self.clock = clock
        self._backoff: dict[int, Backoff] = {}  # ledger -> its retries (after failures, or its grace wait)
        self._first_seen_open: dict[int, float] = {}  # ledger -> when we first saw its last fragment hurt
        self._busy: set[int] = set()  # ledgers a worker of this process is on (locks are per owner)
        self._stop = asyncio.Event()

    @property
    def rate(self) -> RateLimiter:
        return self.copier.rate

    @rate.setter
    def rate(self, value: RateLimiter) -> None:
        self.copier.rate = value

    async def run(self) -> None:
        await asyncio.gather(*(self._worker(i) for i in range(self.workers)))

    def stop(self) -> None:
        """Ask workers to stop after their current step (call on the loop's thread)."""
        self._stop.set()

    async def _worker(self, index: int) -> None:
        while not self._stop.is_set():
            try:
                did = await self.run_once()
            except ZbkError as e:
                log.warning("replicator worker %d: %s", index, e)
                did = False
            if not did:
                try:
                    await asyncio.wait_for(self._stop.wait(), limits.replicator_idle_poll_interval_s)
                except TimeoutError:
                    pass

    async def run_once(self) -> bool:
        """Sweep the marks of bookies that are back, then work on one other marked ledger we
        could lock; True if the sweep cleared a mark or a ledger was made whole."""
        enabled = await asyncio.to_thread(is_enabled, self.ctx.store)
        rm.AUTORECOVERY_ENABLED.set(1 if enabled else 0)
        if not enabled:
            return False
        marks: list[UnderReplicatedLedger | RepairMark] = []
        marks.extend(await asyncio.to_thread(self.registry.list))
        marks.extend(await asyncio.to_thread(self.registry.list_repairs))
        self._forget_unmarked({m.ledger_id for m in marks})
        swept = await self._sweep_returned(marks)
        marks = [m for m in marks if isinstance(m, RepairMark) or m.ledger_id not in swept]
        self.rng.shuffle(marks)
        for mark in marks:
            lid = mark.ledger_id
            if self._stop.is_set():
                return False
            b = self._backoff.get(lid)
            if lid in self._busy or (b is not None and not b.ready()):
                continue
            self._busy.add(lid)
            try:
                if not await asyncio.to_thread(self.registry.try_lock, lid, self.lease):
                    continue
                try:
                    # The list is older than the lock: another worker may have finished this
                    # mark (and released the lock) since. Work from the mark as it is now.
                    current = await asyncio.to_thread(self._current, mark)
                    if current is None:
                        continue
                    return await self._attempt(current) or bool(swept)
                finally:
                    await asyncio.to_thread(self.registry.unlock, lid)
            finally:
                self._busy.discard(lid)
        return bool(swept)

    async def _sweep_returned(self, marks: list[UnderReplicatedLedger | RepairMark]) -> set[int]:
        """Clear the under-replication marks that name only registered bookies; returns the
        ledgers handled (cleared, or their mark changed since the listing: a later pass sees
        it again)."""
        candidates = [m for m in marks if isinstance(m, UnderReplicatedLedger) and m.ledger_id not in self._busy]
        if not candidates:  # an idle pass reads no registrations
            return set()
        registered = await self._registered()
        returned = [m for m in candidates if set(m.missing_bookies) <= registered]
        if not returned:
            return set()
        self._busy.update(m.ledger_id for m in returned)
        try:
            cleared = await asyncio.to_thread(lambda: sum(self.registry.clear(m) for m in returned))
        finally:
            self._busy.difference_update(m.ledger_id for m in returned)
        rm.REPLICATOR_LEDGERS_REPLICATED.inc(cleared)
        log.info("cleared %d of %d under-replication marks whose bookies are registered again", cleared,
                 len(returned))
        return {m.ledger_id for m in returned}

    def _current(self, mark: UnderReplicatedLedger | RepairMark) -> UnderReplicatedLedger | RepairMark | None:
        if isinstance(mark, RepairMark):
            return self.registry.get_repair(mark.ledger_id, mark.bookie_id)
        return self.registry.get(mark.ledger_id)

    def _forget_unmarked(self, marked: set[int]) -> None:
        """Drop back-off and grace state of ledgers that others repaired (bounded memory)."""
        for table in (self._backoff, self._first_seen_open):
            for lid in [lid for lid in table if lid not in marked]:
                del table[lid]

    async def _attempt(self, mark: UnderReplicatedLedger | RepairMark) -> bool:
        lid = mark.ledger_id
        try:
            if isinstance(mark, RepairMark):
                done = await self.repairer.repair(mark)
            else:
                done = await self.replicate_ledger(mark)
        except ZbkError as e:
            delay = self._backoff_of(lid).fail()
            log.warning("ledger %d: re-replication failed, retrying in %.1f s: %s", lid, delay, e)
            return False
        if done:
            self._backoff.pop(lid, None)
            self._first_seen_open.pop(lid, None)
        return done

    def _backoff_of(self, lid: int) -> Backoff:
        b = self._backoff.get(lid)
        if b is None:
            b = self._backoff[lid] = Backoff(limits.replicator_backoff_s_min, limits.replicator_backoff_s_max,
                                             jitter=limits.replicator_backoff_jitter, clock=self.clock, rng=self.rng)
        return b

    async def replicate_ledger(self, mark: UnderReplicatedLedger) -> bool:
        """Make the ledger whole and clear its mark; False if it must wait (grace period)."""
        lid = mark.ledger_id
        try:
            md, version = await self.ctx.read_metadata(lid)
        except NoSuchLedgerError:
            await asyncio.to_thread(self.registry.clear, mark)  # deleted: nothing left to repair
            return True
        registered = await self._registered()
        lost = set(mark.missing_bookies) - registered
        if not md.is_closed and lost & set(md.last_ensemble):
            if not self._grace_over(lid):
                return False
            log.info("ledger %d: open with a lost bookie in its last fragment: recovering it", lid)
            md, version = await recover(self.ctx, lid, md.password)
        for index in range(len(md.fragments)):
            for bookie in sorted(lost & set(md.fragments[index][1])):
                md, version = await self._replace_in_fragment(md, version, index, bookie, lost)
        md, _ = await self.ctx.read_metadata(lid)
        if md.all_bookies() & lost:
            raise BookieUnavailableError(f"ledger {lid}: still names lost bookies {sorted(md.all_bookies() & lost)}")
        if await asyncio.to_thread(self.registry.clear, mark):
            rm.REPLICATOR_LEDGERS_REPLICATED.inc()
            log.info("ledger %d: re-replicated (lost %s)", lid, sorted(lost))
        return True

    def _grace_over(self, lid: int) -> bool:
        now = self.clock.monotonic()
        first = self._first_seen_open.setdefault(lid, now)
        left = first + self.grace_period_s - now
        if left > 0:
            # Not a failure: come back once the writer had its chance to change ensembles.
            b = self._backoff_of(lid)
            b.reset()
            b.hold_until(now + left)
            log.info("ledger %d: open, waiting %.1f s more for its writer before recovering it", lid, left)
            return False
        return True

    async def _registered(self) -> set[str]:
        def both() -> set[str]:
            return {r.bookie_id for r in list_bookies(self.ctx.store)} | \
                   {r.bookie_id for r in list_bookies(self.ctx.store, readonly=True)}
        return await asyncio.to_thread(both)

    async def _replace_in_fragment(self, md: LedgerMetadata, version: int, index: int, old: str,
                                   lost: set[str], *, read_from_old: bool = False) -> tuple[LedgerMetadata, int]:
        """Copy fragment ``index``'s entries of ``old`` to a replacement, then CAS the new
        ensemble in. Returns the metadata as written. ``read_from_old``: ``old`` is alive
        (a decommission) and may serve as a source, the only one of a WQ=1 ledger."""
        first, ensemble = md.fragments[index]
        position = ensemble.index(old)
        writable = await self.ctx.writable_bookies()
        # Under the ledger's own policy: an isolated ledger's copies stay in its groups.
        new = placement.choose_replacement(writable, list(ensemble), position, write_quorum=md.write_quorum,
                                           policy=placement.PlacementPolicy.of_ledger(md), exclude=lost,
                                           rng=self.rng)
        last = md.fragment_end(index)
        # An open last fragment has no end yet; replicate_ledger recovers (closes) such a
        # ledger before it gets here, so this would be a bug, not a state to copy from.
        assert md.is_closed or index + 1 < len(md.fragments), (md.ledger_id, index)
        entries = positions_held(md, position, first, last) if last >= first else []
        await self.copier.copy(md, entries, new, (lost - {old}) if read_from_old else lost | {old})
        while True:
            try:
                updated = md.with_replaced_bookie(index, old, new)
                version = await self.ctx.write_metadata(updated, version)
                log.info("ledger %d fragment %d: %s -> %s (%d entries copied)", md.ledger_id, first, old, new,
                         len(entries))
                return updated, version
            except MetadataVersionError:
                # A writer's ensemble change or a close raced us: redo on fresh metadata if
                # this fragment is unchanged (then our copies are still the right ones).
                fresh, version = await self.ctx.read_metadata(md.ledger_id)
                if fresh.fragments[index] != md.fragments[index] or fresh.fragment_end(index) != last:
                    raise MetadataVersionError(f"ledger {md.ledger_id}: fragment {first} changed during copy") from None
                md = fresh
