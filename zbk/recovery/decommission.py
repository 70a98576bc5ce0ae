"""Decommission: move everything a bookie holds to other bookies (`zbk shell recover B`).

For every ledger whose fragments name the bookie, under the ledger's re-replication lock
(so auto-recovery never works on it at the same time): an open ledger whose last fragment
names it is fenced, recovered and closed first (its writer can no longer add); then each
fragment's entries of the bookie's position are copied to a replacement chosen by the
placement policy and the new ensemble is compare-and-set into the metadata — the same
steps as re-replication (:mod:`zbk.recovery.replicator`). If the bookie still answers
(read-only), it serves as a source too. Finally every ledger is scanned again: the bookie
is safe to remove only if no ledger names it.

A writable bookie is refused: new ledgers would keep landing on it. Set it read-only
(PUT /api/v1/bookie/state) or stop it first.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

from zbk import limits
from zbk.client.bookkeeper import ClientContext
from zbk.client.recovery import recover
from zbk.errors import CorruptMetadataError, MetadataVersionError, NoSuchLedgerError, OperationRefusedError
from zbk.metadata.registry import LedgerStore, list_bookies
from zbk.recovery.replicator import Replicator
from zbk.recovery.underreplication import UnderReplicationRegistry

log = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]


@dataclass
class DecommissionReport:
    bookie: str
    ledgers: list[int] = field(default_factory=list)
    recovered_open: list[int] = field(default_factory=list)
    entries_copied: int = 0
    bytes_copied: int = 0
    seconds: float = 0.0
    still_named_by: list[int] = field(default_factory=list)

    @property
    def safe_to_remove(self) -> bool:
        return not self.still_named_by


def ledgers_naming(store: LedgerStore, bookie: str) -> list[int]:
    out = []
    for lid in store.list_ids():
        try:
            md, _ = store.read(lid)
        except (NoSuchLedgerError, CorruptMetadataError):
            continue
        if bookie in md.all_bookies():
            out.append(lid)
    return out


async def decommission(ctx: ClientContext, registry: UnderReplicationRegistry, lease: int, bookie: str, *,
                       rate_bytes_per_s: float = 64 * 1024 * 1024, progress: Progress | None = None) -> DecommissionReport:
    t0 = time.monotonic()
    writable = {r.bookie_id for r in await asyncio.to_thread(list_bookies, ctx.store)}
    if bookie in writable:
        raise OperationRefusedError(f"{bookie} is writable: set it read-only (PUT /api/v1/bookie/state) or stop it "
                              "before decommissioning it")
    readonly = {r.bookie_id for r in await asyncio.to_thread(list_bookies, ctx.store, readonly=True)}
    alive = bookie in readonly
    ledgers = LedgerStore(ctx.store)
    report = DecommissionReport(bookie, await asyncio.to_thread(ledgers_naming, ledgers, bookie))
    rep = Replicator(ctx, registry, lease, rate_bytes_per_s=rate_bytes_per_s, rng=random.Random())
    for done, lid in enumerate(report.ledgers):
        if progress is not None:
            progress(done, len(report.ledgers), f"decommissioning {bookie}")
        await _with_lock(registry, lease, lid, partial(_move_ledger, ctx, rep, lid, bookie, alive, report))
    if progress is not None:
        progress(len(report.ledgers), len(report.ledgers), f"decommissioning {bookie}")
    report.entries_copied = rep.copier.entries_copied
    report.bytes_copied = rep.copier.bytes_copied
    report.still_named_by = await asyncio.to_thread(ledgers_naming, ledgers, bookie)
    report.seconds = time.monotonic() - t0
    return report


async def _with_lock(registry: UnderReplicationRegistry, lease: int, lid: int,
                     work: Callable[[], Awaitable[None]]) -> None:
    deadline = time.monotonic() + limits.decommission_lock_wait_s_max
    while not await asyncio.to_thread(registry.try_lock, lid, lease):
        if time.monotonic() > deadline:
            raise MetadataVersionError(f"ledger {lid}: locked by {registry.lock_holder(lid)} for "
                                       f"{limits.decommission_lock_wait_s_max:.0f} s")
        await asyncio.sleep(limits.decommission_lock_poll_s)
    try:
        await work()
    finally:
        await asyncio.to_thread(registry.unlock, lid)


async def _move_ledger(ctx: ClientContext, rep: Replicator, lid: int, bookie: str, alive: bool,
                       report: DecommissionReport) -> None:
    try:
        md, version = await ctx.read_metadata(lid)
    except NoSuchLedgerError:
        return
    if not md.is_closed and bookie in md.last_ensemble:
        log.info("ledger %d: open with %s in its last fragment: recovering (closing) it", lid, bookie)
        md, version = await recover(ctx, lid, md.password)
        report.recovered_open.append(lid)
    for index in range(len(md.fragments)):
        if bookie in md.fragments[index][1]:
            md, version = await rep._replace_in_fragment(md, version, index, bookie, {bookie}, read_from_old=alive)
