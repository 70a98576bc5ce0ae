"""The auditor's periodic check of every ledger (run every
``auditor_periodic_check_interval_s``, and at once on ``zbk shell triggeraudit``).

For each ledger, each fragment with an end (all of a closed ledger's; an open ledger's but
the last, which its writer is still filling) and each replica of it that is registered:

* replicas: does the bookie hold every entry the fragment assigns to its position?
  (GET_LIST_OF_ENTRIES_OF_LEDGER, once per ledger and bookie)
* read probes: the fragment's first and last entries the bookie should hold, read from it
  and checked with the ledger's digest — catches data the index still lists but the disk
  lost or damaged (a corrupt entry log).
* placement: with more than one rack among registered bookies, every write set (WQ
  consecutive ensemble members) should span at least two racks. Violations are counted and
  logged (moving data to fix placement is an operator's decision).

A damaged replica gets an in-place repair mark (``why = "check"``), which a replicator
worker repairs from the other replicas. Unregistered bookies are skipped: the lost-bookie
audit handles them. The counts are exported as ``zbk_auditor_check_*`` gauges.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field

from zbk.client.bookkeeper import ClientContext
from zbk.client.digest import Digest
from zbk.errors import CorruptMetadataError, DigestMismatchError, NoSuchLedgerError, ZbkError
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import LedgerStore, list_bookies
from zbk.recovery import metrics as rm
from zbk.recovery.repair import held
from zbk.recovery.underreplication import UnderReplicationRegistry
from zbk.wire import messages as w
from zbk.wire.entry import parse_entry
from zbk.wire.messages import EntryRanges
from zbk.wire.status import Status

log = logging.getLogger(__name__)

ledgers_in_flight_max = 8  # ledgers checked concurrently


@dataclass
class CheckReport:
    ledgers: int = 0
    fragments: int = 0
    damaged: list[tuple[int, str, str]] = field(default_factory=list)  # (ledger, bookie, what)
    placement_violations: int = 0
    unreachable: int = 0  # replicas that did not answer (not marked: maybe a passing blip)
    seconds: float = 0.0


def position_span(md: LedgerMetadata, position: int, first: int, last: int) -> tuple[int, int] | None:
    """The first and last entries of ``first..last`` whose write set includes ``position``."""
    e_size, wq = md.ensemble_size, md.write_quorum
    lo = next((e for e in range(first, min(last, first + e_size) + 1) if (position - e) % e_size < wq), None)
    hi = next((e for e in range(last, max(first, last - e_size) - 1, -1) if (position - e) % e_size < wq), None)
    return None if lo is None or hi is None else (lo, hi)


def write_set_racks_ok(ensemble: tuple[str, ...], wq: int, rack_of: dict[str, str]) -> bool:
    """Does every write set of ``ensemble`` span at least two racks?"""
    n = len(ensemble)
    for start in range(n):
        racks = {rack_of.get(ensemble[(start + k) % n], "") for k in range(min(wq, n))}
        if len(racks) < 2:
            return False
    return True


class LedgerChecker:
    def __init__(self, ctx: ClientContext, registry: UnderReplicationRegistry, *,
                 stop: threading.Event | None = None) -> None:
        self.stop = stop or threading.Event()
        self.ctx = ctx
        self.registry = registry
        self.ledgers = LedgerStore(ctx.store)

    async def check_all(self) -> CheckReport:
        t0 = time.monotonic()
        report = CheckReport()
        regs = await asyncio.to_thread(lambda: list_bookies(self.ctx.store) +
                                       list_bookies(self.ctx.store, readonly=True))
        rack_of = {r.bookie_id: r.rack for r in regs}
        registered = set(rack_of)
        multi_rack = len(set(rack_of.values())) > 1
        ids = await asyncio.to_thread(lambda: list(self.ledgers.list_ids()))
        sem = asyncio.Semaphore(ledgers_in_flight_max)

        async def one(lid: int) -> None:
            async with sem:
                if self.stop.is_set():
                    return
                await self.check_ledger(lid, registered, rack_of if multi_rack else None, report)
        await asyncio.gather(*(one(lid) for lid in ids))
        for lid, bookie, what in report.damaged:
            if await asyncio.to_thread(self.registry.mark_repair, lid, bookie, "check", what):
                log.warning("check: ledger %d on %s: %s; marked for repair", lid, bookie, what)
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

    async def check_ledger(self, lid: int, registered: set[str], rack_of: dict[str, str] | None,
                           report: CheckReport) -> None:
        try:
            md, _ = await self.ctx.read_metadata(lid)
        except (NoSuchLedgerError, CorruptMetadataError):
            return  # deleted meanwhile; corrupt metadata is reported by its readers
        report.ledgers += 1
        digest = self.ctx.digest_for(md.digest, md.password)
        lists: dict[str, EntryRanges | None] = {}
        hurt: dict[str, str] = {}
        for index, (first, ensemble) in enumerate(md.fragments):
            if not md.is_closed and index == len(md.fragments) - 1:
                continue
            last = md.fragment_end(index)
            if last < first:
                continue
            report.fragments += 1
            if rack_of is not None and not write_set_racks_ok(ensemble, md.write_quorum, rack_of):
                report.placement_violations += 1
                log.warning("check: ledger %d fragment %d: a write set of %s spans one rack", lid, first, ensemble)
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
        span = position_span(md, position, first, last)
        if span is None:
            return ""
        try:
            if bookie not in lists:
                lists[bookie] = await self._list(md.ledger_id, bookie)
            ranges = lists[bookie]
            if ranges is None:
                return f"does not know the ledger (fragment {first})"
            e_size, wq = md.ensemble_size, md.write_quorum
            for e in range(span[0], span[1] + 1):
                if (position - e) % e_size < wq and not held(ranges, e):
                    return f"lacks entry {e} (fragment {first})"
            for e in sorted(set(span)):
                why = await self._probe(md, bookie, e, digest)
                if why:
                    return f"entry {e}: {why} (fragment {first})"
        except ZbkError as err:
            report.unreachable += 1
            log.info("check: ledger %d: %s did not answer: %s", md.ledger_id, bookie, err)
        return ""

    async def _list(self, ledger_id: int, bookie: str) -> EntryRanges | None:
        t = self.ctx.transport
        resp = await t.request(bookie, w.ListEntriesRequest(rid=t.next_rid(), ledger_id=ledger_id),
                               self.ctx.read_timeout_s)
        if resp.status == Status.EOK and isinstance(resp, w.ListEntriesResponse):
            return resp.entry_ranges
        if resp.status in (Status.ENOLEDGER, Status.EUNKNOWN):
            return None if resp.status == Status.ENOLEDGER else ()
        raise ZbkError(f"{bookie}: list entries of ledger {ledger_id}: {resp.status.name}")

    async def _probe(self, md: LedgerMetadata, bookie: str, entry_id: int, digest: Digest) -> str:
        t = self.ctx.transport
        resp = await t.request(bookie, w.ReadRequest(rid=t.next_rid(), ledger_id=md.ledger_id,
                                                     first_entry_id=entry_id), self.ctx.read_timeout_s)
        if resp.status != Status.EOK or not isinstance(resp, w.ReadResponse) or not resp.entries:
            return f"read answered {resp.status.name}"
        try:
            parse_entry(bytes(resp.entries[0]), digest, ledger_id=md.ledger_id, entry_id=entry_id)
        except DigestMismatchError as e:
            return f"bad copy ({e})"
        return ""
