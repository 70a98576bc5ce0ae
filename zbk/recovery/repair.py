"""In-place repair: make one living bookie's copy of a ledger whole again.

Two causes, one procedure (marks in ``underreplication/repairs/``, see underreplication.py):

* ``limbo`` — BP-46 phase two. After an unclean shutdown with the journal off, phase one
  fenced every non-closed ledger on the bookie and put it in limbo (it answers EUNKNOWN,
  never an explicit negative, for entries it lacks). The repairer opens and recovers the
  ledger (fence, recovery reads, close at the last recoverable entry), copies to the bookie
  every entry its fragments assign to it that it lacks, checks that it now holds them all,
  and only then sends CLEAR_LIMBO, which the bookie journals before answering.
* ``unclean`` — the rest of BP-46 phase two: the same boot found a CLOSED ledger whose
  entries assigned to the bookie are not all in its index (lost with the unflushed data).
  The repairer copies the missing ones (no recovery: the ledger is closed; no limbo).
* ``check`` — the auditor's periodic check found entries missing or unreadable on the
  bookie. Only closed fragments are repaired (an open ledger's last fragment is still
  being written). Every entry the bookie should hold is read back from it and checked with
  the ledger's digest; missing and damaged ones are rewritten from other replicas.

A bookie that is not registered (down) cannot be repaired now: the attempt fails and
backs off; if it stays away, the auditor's lost-bookie path replaces it instead. A bookie
the ledger's metadata no longer names (re-replicated away meanwhile) needs no entries,
only its limbo cleared.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections.abc import Awaitable, Callable, Sequence

from zbk.client.bookkeeper import ClientContext
from zbk.client.digest import master_key
from zbk.client.recovery import recover
from zbk.errors import (
    BookieIOError,
    BookieUnavailableError,
    NoSuchLedgerError,
    RepairIncompleteError,
    error_for_status,
)
from zbk.metadata.ledger import LedgerMetadata
from zbk.recovery import metrics as rm
from zbk.recovery.copier import (
    EntryCopier,
    list_entries,
    positions_held,
    unreadable,
)
from zbk.recovery.underreplication import RepairMark, UnderReplicationRegistry
from zbk.wire import messages as w
from zbk.wire.messages import EntryRanges
from zbk.wire.status import Status

log = logging.getLogger(__name__)


def expected_entries(md: LedgerMetadata, bookie: str, *, closed_fragments_only: bool) -> list[int]:
    """Entry ids that ``md``'s fragments assign to ``bookie``: entry e of a fragment where
    ``bookie`` is at ensemble position p, with (p - e) mod E < WQ (e's write set)."""
    out: list[int] = []
    for index, (first, ensemble) in enumerate(md.fragments):
        if bookie not in ensemble:
            continue
        if not md.is_closed and index == len(md.fragments) - 1:
            assert closed_fragments_only, "recover an open ledger before repairing its last fragment"
            continue
        out.extend(positions_held(md, ensemble.index(bookie), first, md.fragment_end(index)))
    return out


def held(ranges: Sequence[tuple[int, int]], entry_id: int) -> bool:
    """Is ``entry_id`` inside the sorted, disjoint inclusive ``ranges``?"""
    i = bisect.bisect_right(ranges, (entry_id, float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= entry_id <= ranges[i][1]


def count_missing(ids: list[int], ranges: Sequence[tuple[int, int]]) -> int:
    """How many of ``ids`` lie outside the sorted, disjoint inclusive ``ranges``."""
    return sum(1 for e in ids if not held(ranges, e))


class InPlaceRepairer:
    def __init__(self, ctx: ClientContext, registry: UnderReplicationRegistry, copier: EntryCopier,
                 registered: Callable[[], Awaitable[set[str]]]) -> None:
        self.ctx = ctx
        self.registry = registry
        self.copier = copier
        self.registered = registered

    async def repair(self, mark: RepairMark) -> bool:
        """Repair ``mark`` (the caller holds the ledger's lock); True once its mark is gone."""
        lid, bookie = mark.ledger_id, mark.bookie_id
        try:
            md, _ = await self.ctx.read_metadata(lid)
        except NoSuchLedgerError:
            # Deleted: the bookie's garbage collector drops its copy (and its limbo state).
            await asyncio.to_thread(self.registry.clear_repair, mark)
            return True
        if bookie not in await self.registered():
            raise BookieUnavailableError(f"ledger {lid}: {bookie} is not registered; its repair waits")
        copied = 0
        if bookie in md.all_bookies():
            if mark.why == "limbo" and not md.is_closed:
                log.info("ledger %d: in limbo on %s and not closed: recovering it", lid, bookie)
                md, _ = await recover(self.ctx, lid, md.password)
            copied = await self.fill(md, bookie, verify=mark.why == "check")
        if mark.why == "limbo":
            await self._clear_limbo(md, bookie)
            rm.REPLICATOR_LIMBO_LEDGERS_REPAIRED.inc()
        rm.REPLICATOR_REPAIRS.labels(mark.why).inc()
        await asyncio.to_thread(self.registry.clear_repair, mark)
        log.info("ledger %d: %s repair of %s done (%d entries copied)", lid, mark.why, bookie, copied)
        return True

    async def fill(self, md: LedgerMetadata, bookie: str, *, verify: bool) -> int:
        """Copy to ``bookie`` every entry it should hold but lacks (or, with ``verify``,
        holds damaged); returns how many were copied."""
        want = expected_entries(md, bookie, closed_fragments_only=True)
        if not want:
            return 0
        ranges = await self._listed(md, bookie, verify=verify)
        if ranges is None:
            # Its index cannot list the ledger (EIO: a damaged slot). Each entry's read still
            # answers for itself: rewriting an unreadable one writes its slot anew.
            missing = await self._unreadable(md, bookie, want)
        else:
            missing = [e for e in want if not held(ranges, e)]
            if verify:
                present = [e for e in want if held(ranges, e)]
                missing = sorted(set(missing) | set(await self._unreadable(md, bookie, present)))
        if missing:
            await self.copier.copy(md, missing, bookie, avoid={bookie})
            ranges = await self._listed(md, bookie, verify=verify)
            still = missing if ranges is None else [e for e in missing if not held(ranges, e)]
            if verify and (ranges is None or not still):
                still = await self._unreadable(md, bookie, missing)
            if still:
                raise RepairIncompleteError(f"ledger {md.ledger_id}: {bookie} still lacks {len(still)} entries "
                                            f"(first {still[:5]}) after the copy")
        if ranges is None:
            # Every entry it should hold now reads back intact; what is still damaged lies in
            # slots of entries it does not hold, which no copy can rewrite.
            log.warning("ledger %d: %s serves every entry it should hold, but its index still cannot list "
                        "the ledger (damage outside its entries)", md.ledger_id, bookie)
        return len(missing)

    async def _listed(self, md: LedgerMetadata, bookie: str, *, verify: bool) -> EntryRanges | None:
        """What ``bookie`` lists of the ledger (() if it does not know it); None when a
        verifying repair finds its index damaged (EIO), which only verifying repairs (of a
        check's finding) get past: the others trust the list for what is missing."""
        try:
            return await list_entries(self.ctx, bookie, md.ledger_id) or ()
        except BookieIOError:
            if not verify:
                raise
            return None

    async def _unreadable(self, md: LedgerMetadata, bookie: str, entries: list[int]) -> list[int]:
        """Entries of ``entries`` that ``bookie`` does not return with a good digest."""
        digest = self.ctx.digest_for(md.digest, md.password)
        return [e for e, _ in await unreadable(self.ctx, bookie, md, entries, digest)]

    async def _clear_limbo(self, md: LedgerMetadata, bookie: str) -> None:
        t = self.ctx.transport
        resp = await t.request(bookie, w.ClearLimboRequest(rid=t.next_rid(), ledger_id=md.ledger_id,
                                                           master_key=master_key(md.password)),
                               self.ctx.add_timeout_s)
        if resp.status not in (Status.EOK, Status.ENOLEDGER):
            raise error_for_status(resp.status, f"{bookie}: clear limbo of ledger {md.ledger_id}")
