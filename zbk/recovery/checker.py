"""The auditor's periodic check of every ledger (run every
``auditor_periodic_check_interval_s``, and at once on ``zbk shell triggeraudit``).

For each ledger, each fragment with an end (all of a closed ledger's; an open ledger's but
the last, which its writer is still filling) and each replica of it that is registered:

* replicas: does the bookie hold every entry the fragment assigns to its position?
  (GET_LIST_OF_ENTRIES_OF_LEDGER, once per ledger and bookie)
* read probes: the fragment's first and last entries the bookie should hold, and
  ``auditor_ledger_verification_percent`` of those between (chosen at random; 100: all),
  read from it and checked with the ledger's digest — catches data the index still lists
  but the disk lost or damaged (a corrupt entry log). Damage between the probes is found
  only by reading it: with the default 0, by a client (which then reads another replica).
* a bookie that answers a listing with EIO has a damaged index: that is damage too.
* placement: each fragment (an open ledger's last one too) against the ledger's own
  placement policy, the one it was created with (zbk/client/placement.py): members
  outside its isolation groups; with racks in use, write sets (WQ consecutive ensemble
  members) on fewer racks than its minimum; with several zones, write sets within one
  zone. Fragments that break it are counted and logged (moving data to fix placement is
  an operator's decision).

A damaged replica gets an in-place repair mark (``why = "check"``), which a replicator
worker repairs from the other replicas. Unregistered bookies are skipped: the lost-bookie
audit handles them. The counts are exported as ``zbk_auditor_check_*`` gauges.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import threading
import time
from dataclasses import dataclass, field

from zbk import limits
from zbk.client.bookkeeper import ClientContext
from zbk.client.digest import Digest
from zbk.client.placement import PlacementPolicy, placement_violations
from zbk.errors import BookieIOError, CorruptMetadataError, NoSuchLedgerError, ZbkError
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import BookieRegistration, LedgerStore, list_bookies
from zbk.recovery import metrics as rm
from zbk.recovery.copier import list_entries, positions_held, unreadable
from zbk.recovery.repair import held
from zbk.recovery.underreplication import UnderReplicationRegistry
from zbk.wire.messages import EntryRanges

log = logging.getLogger(__name__)


@dataclass
class CheckReport:
    ledgers: int = 0
    fragments: int = 0
    damaged: list[tuple[int, str, str]] = field(default_factory=list)  # (ledger, bookie, what)
    placement_violations: int = 0
    unreachable: int = 0  # replicas that did not answer (not marked: maybe a passing blip)
    seconds: float = 0.0


class LedgerChecker:
    def __init__(self, ctx: ClientContext, registry: UnderReplicationRegistry, *,
                 stop: threading.Event | None = None, verification_percent: float = 0.0,
                 rng: random.Random | None = None) -> None:
        assert 0 <= verification_percent <= 100, verification_percent
        self.stop = stop or threading.Event()
        self.ctx = ctx
        self.registry = registry
        self.ledgers = LedgerStore(ctx.store)
        self.verification_percent = verification_percent
        self.rng = rng or random.Random()

    def _probes(self, entries: list[int]) -> list[int]:
        """The entries of one replica's share to read back: the first and the last, and
        ``verification_percent`` of those between, chosen at random (100: every one)."""
        middle = entries[1:-1]
        k = min(len(middle), math.ceil(len(middle) * self.verification_percent / 100))
        return sorted({entries[0], entries[-1], *self.rng.sample(middle, k)})

    async def check_all(self) -> CheckReport:
        t0 = time.monotonic()
        report = CheckReport()
        regs = await asyncio.to_thread(lambda: list_bookies(self.ctx.store) +
                                       list_bookies(self.ctx.store, readonly=True))
        registered = {r.bookie_id: r for r in regs}
        ids = await asyncio.to_thread(lambda: list(self.ledgers.list_ids()))
        sem = asyncio.Semaphore(limits.checker_ledgers_in_flight_max)

        async def one(lid: int) -> None:
            async with sem:
                if self.stop.is_set():
                    return
                await self.check_ledger(lid, registered, report)
                # Marked at once, not when the whole check ends: a check of thousands of
                # ledgers takes minutes, and the replicators can repair meanwhile.
                for _, bookie, what in [d for d in report.damaged if d[0] == lid]:
                    if await asyncio.to_thread(self.registry.mark_repair, lid, bookie, "check", what):
                        log.warning("check: ledger %d on %s: %s; marked for repair", lid, bookie, what)
        await asyncio.gather(*(one(lid) for lid in ids))
        report.seconds = time.monotonic() - t0
        rm.AUDITOR_CHECK_LEDGERS.set(report.ledgers)
        rm.AUDITOR_CHECK_DAMAGED_REPLICAS.set(len(report.damaged))
        rm.AUDITOR_CHECK_PLACEMENT_VIOLATIONS.set(report.placement_violations)
        rm.AUDITOR_CHECK_SECONDS.observe(report.seconds)
        rm.AUDITOR_LAST_CHECK.set(time.time())
        log.info("check: %d ledgers, %d fragments, %d damaged replicas, %d placement violations, "
                 "%d unreachable replicas, %.1f s", report.ledgers, report.fragments, len(report.damaged),
                 report.placement_violations, report.unreachable, report.seconds)
        return report

    async def check_ledger(self, lid: int, registered: dict[str, BookieRegistration], report: CheckReport) -> None:
        try:
            md, _ = await self.ctx.read_metadata(lid)
        except (NoSuchLedgerError, CorruptMetadataError):
            return  # deleted meanwhile; corrupt metadata is reported by its readers
        report.ledgers += 1
        try:
            policy: PlacementPolicy | None = PlacementPolicy.of_ledger(md)
        except CorruptMetadataError as e:
            policy = None
            log.warning("check: %s; placement not checked", e)
        digest = self.ctx.digest_for(md.digest, md.password)
        lists: dict[str, EntryRanges | None] = {}
        hurt: dict[str, str] = {}
        for index, (first, ensemble) in enumerate(md.fragments):
            last = md.fragment_end(index)
            if last < first:
                continue
            # Placement is known for every fragment, the one a writer is filling too.
            broken = placement_violations(ensemble, md.write_quorum, policy, registered) if policy is not None else []
            if broken:
                report.placement_violations += 1
                log.warning("check: ledger %d fragment %d breaks its placement policy: %s", lid, first,
                            "; ".join(broken))
            if not md.is_closed and index == len(md.fragments) - 1:
                continue
            report.fragments += 1
            for position, bookie in enumerate(ensemble):
                if bookie not in registered or bookie in hurt:
                    continue
                what = await self._check_replica(md, bookie, position, first, last, digest, lists, report)
                if what:
                    hurt[bookie] = what
        report.damaged.extend((lid, b, what) for b, what in hurt.items())

    async def _check_replica(self, md: LedgerMetadata, bookie: str, position: int, first: int, last: int,
                             digest: Digest, lists: dict[str, EntryRanges | None], report: CheckReport) -> str:
        """What is wrong with ``bookie``'s part of the fragment ("" if nothing)."""
        entries = positions_held(md, position, first, last)
        if not entries:
            return ""
        try:
            if bookie not in lists:
                try:
                    lists[bookie] = await list_entries(self.ctx, bookie, md.ledger_id)
                except BookieIOError as err:
                    # It answered, with EIO: its index is damaged. That is damage to repair,
                    # not a bookie that did not answer.
                    lists[bookie] = ()
                    return f"cannot list the ledger ({err}) (fragment {first})"
            ranges = lists[bookie]
            if ranges is None:
                return f"does not know the ledger (fragment {first})"
            for e in entries:
                if not held(ranges, e):
                    return f"lacks entry {e} (fragment {first})"
            bad = await unreadable(self.ctx, bookie, md, self._probes(entries), digest)
            if bad:
                e, why = bad[0]
                return f"entry {e}: {why} (fragment {first})"
        except ZbkError as err:
            report.unreachable += 1
            log.info("check: ledger %d: %s did not answer: %s", md.ledger_id, bookie, err)
        return ""
