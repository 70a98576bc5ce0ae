"""Fencing and ledger recovery (the seeds' fencing-and-recovery text, BP-46 quorum rules).

1. Mark the ledger IN_RECOVERY by compare-and-set, so that a writer attempting an ensemble
   change sees the version conflict, rereads, and fails as fenced.
2. Fence: READ_LAC with the FENCE flag to the last fragment's ensemble. Complete at
   EC = E - AQ + 1 positive answers (then no ack quorum of unfenced bookies remains);
   stuck at AQ unknown answers (EC can no longer be reached).
3. Recover from max LAC + 1, one entry at a time: read it with the FENCE flag from its
   write set. Positive: one valid copy (digest checked), which is written back with
   recovery adds until AQ bookies hold it. Negative: QC = WQ - AQ + 1 explicit negatives
   (NoSuchEntry / NoSuchLedger) and no positive: no ack quorum can hold the entry, so it
   was never acknowledged and the ledger ends before it. Anything else (EUNKNOWN, timeouts,
   I/O errors, corrupt copies) is unknown: retry, and if it stays unknown, fail the
   recovery. Never truncate on doubt.
4. Close at the last positive entry by CAS. The first of concurrent recoverers wins; the
   others see CLOSED on their conflict and adopt its result.
"""

from __future__ import annotations

import asyncio
import hmac
import logging

from zbk import limits
from zbk.backoff import Backoff
from zbk.client import metrics as cm
from zbk.client.context import HandleContext
from zbk.client.reading import abandon, retrieved
from zbk.client.writing import LedgerHandle
from zbk.errors import (
    BookieUnavailableError,
    DigestMismatchError,
    MetadataVersionError,
    NotEnoughBookiesError,
    UnauthorizedError,
    UnknownLedgerStateError,
    ZbkError,
)
from zbk.metadata.ledger import LedgerMetadata
from zbk.wire import messages as w
from zbk.wire.entry import parse_entry
from zbk.wire.ops import ReadFlag
from zbk.wire.status import Status

log = logging.getLogger(__name__)


def check_password(md: LedgerMetadata, password: bytes) -> None:
    """Raise UnauthorizedError before anything is touched (a wrong password fences nothing)."""
    if not hmac.compare_digest(md.password, password):
        raise UnauthorizedError(f"wrong password for ledger {md.ledger_id}")


async def mark_in_recovery(ctx: HandleContext, md: LedgerMetadata, version: int) -> tuple[LedgerMetadata, int]:
    while md.state == "OPEN":
        target = md.with_state("IN_RECOVERY")
        try:
            return target, await ctx.write_metadata(target, version)
        except MetadataVersionError:
            md, version = await ctx.read_metadata(md.ledger_id)
    return md, version


async def fence(ctx: HandleContext, md: LedgerMetadata, master_key: bytes) -> int:
    """Fence the last ensemble; returns the highest LAC among the positive answers."""
    ensemble = md.last_ensemble
    ec = md.ensemble_size - md.ack_quorum + 1
    t = ctx.transport

    async def one(bookie: str) -> int:
        resp = await t.request(bookie, w.ReadLacRequest(rid=t.next_rid(), ledger_id=md.ledger_id, flags=ReadFlag.FENCE,
                                                        master_key=master_key), ctx.read_timeout_s)
        if resp.status == Status.EUA:
            raise UnauthorizedError(f"{bookie} refused the master key of ledger {md.ledger_id}")
        if resp.status != Status.EOK:
            raise BookieUnavailableError(f"{bookie}: fencing answered {resp.status.name}")
        return int(resp.lac)

    tasks = {asyncio.ensure_future(one(b)): b for b in ensemble}
    positives: list[int] = []
    unknown: dict[str, str] = {}
    try:
        for fut in asyncio.as_completed(list(tasks)):
            try:
                positives.append(await fut)
            except UnauthorizedError:
                raise
            except ZbkError as e:
                unknown[str(len(unknown))] = str(e)
            if len(positives) >= ec:
                return max(positives)
            if len(unknown) >= md.ack_quorum:
                break
    finally:
        abandon(tasks)
    raise BookieUnavailableError(f"ledger {md.ledger_id}: fencing reached {len(positives)} of EC={ec} bookies "
                                 f"({len(unknown)} unknown: {'; '.join(unknown.values())})")


async def recovery_read(ctx: HandleContext, handle: LedgerHandle, entry_id: int,
                        md: LedgerMetadata) -> tuple[str, bytes | None, int]:
    """("positive", blob, ledger_length) or ("negative", None, 0); raises when unknown.

    ``md`` is the metadata as fenced: the write set the writer used. Never the recovery
    handle's own ensemble changes, whose replacement bookies never saw the writer's copies."""
    ws = md.write_set(entry_id)
    qc = md.write_quorum - md.ack_quorum + 1
    t = ctx.transport

    async def one(bookie: str) -> tuple[Status, bytes | None, int]:
        resp = await t.request(bookie, w.ReadRequest(rid=t.next_rid(), ledger_id=md.ledger_id, first_entry_id=entry_id,
                                                     flags=ReadFlag.FENCE, master_key=handle.master_key),
                               ctx.read_timeout_s)
        if resp.status == Status.EUA:
            raise UnauthorizedError(f"{bookie} refused the master key of ledger {md.ledger_id}")
        if isinstance(resp, w.ErrorResponse):  # shed unread (ETOOMANYREQUESTS): unknown
            return resp.status, None, 0
        if resp.entries:
            blob = bytes(resp.entries[0])
            try:
                parsed = parse_entry(blob, handle.digest, ledger_id=md.ledger_id, entry_id=entry_id)
            except DigestMismatchError as e:
                log.warning("recovery of ledger %d entry %d: bad copy on %s: %s", md.ledger_id, entry_id, bookie, e)
                return Status.EIO, None, 0
            return Status.EOK, blob, parsed.ledger_length
        return resp.status, None, 0

    negatives = 0
    seen: list[str] = []
    tasks = {asyncio.ensure_future(one(b)): b for b in ws}
    try:
        for fut in asyncio.as_completed(list(tasks)):
            try:
                status, blob, length = await fut
            except UnauthorizedError:
                raise
            except ZbkError as e:
                seen.append(type(e).__name__)
                continue
            if status == Status.EOK and blob is not None:
                return "positive", blob, length
            seen.append(status.name)
            if status.is_explicit_negative:
                negatives += 1
                if negatives >= qc:
                    return "negative", None, 0
    finally:
        abandon(tasks)
    raise UnknownLedgerStateError(f"ledger {md.ledger_id} entry {entry_id}: neither a copy nor QC={qc} explicit "
                                  f"negatives ({', '.join(seen)}): not truncating")


async def recover(ctx: HandleContext, ledger_id: int, password: bytes) -> tuple[LedgerMetadata, int]:
    """Fence and recover ``ledger_id``; returns the CLOSED metadata and its version."""
    md, version = await ctx.read_metadata(ledger_id)
    check_password(md, password)
    if md.is_closed:
        return md, version
    md, version = await mark_in_recovery(ctx, md, version)
    if md.is_closed:
        return md, version
    handle = LedgerHandle(ctx, md, version, password, recovery=True)
    max_lac = await fence(ctx, md, handle.master_key)
    log.info("ledger %d: fenced, recovering from entry %d", ledger_id, max_lac + 1)
    length = 0
    if max_lac >= 0:
        length = (await handle.read_entry(max_lac)).ledger_length
    handle.lac = max_lac
    handle.next_entry_id = max_lac + 1
    if max_lac + 1 < md.fragments[-1][0]:
        # Recovery starts inside an earlier fragment (entries the writer resent after its
        # last ensemble change carry a stale LAC). Write everything back to the last
        # ensemble, whose failed bookies the handle can replace: a write-back stuck on a
        # dead bookie of an older fragment would be waited for forever. Reads still use the
        # fenced write sets, where the writer's copies are.
        handle.md = md.with_fragment(max_lac + 1, md.last_ensemble)
    last = max_lac
    eid = max_lac + 1
    while True:
        backoff = Backoff(limits.client_recovery_read_backoff_s_min, limits.client_recovery_read_backoff_s_max,
                          attempts_max=limits.client_recovery_read_attempts_max)
        while True:
            try:
                outcome = await recovery_read(ctx, handle, eid, md)
                break
            except (UnknownLedgerStateError, BookieUnavailableError) as e:
                delay = backoff.fail()
                if backoff.exhausted:
                    raise
                log.warning("ledger %d: recovery read of entry %d unknown (%s); retrying", ledger_id, eid, e)
                await asyncio.sleep(delay)
        kind, blob, entry_length = outcome
        if kind == "negative":
            break
        assert blob is not None
        handle.next_entry_id = eid + 1
        # Write back to AQ with recovery adds (pipelined); a failure shows in handle.failed.
        handle._push(eid, blob, 0).add_done_callback(retrieved)
        last, length = eid, entry_length
        eid += 1
    await handle.wait_drained()
    if handle.failed is not None and (handle.lac < last or not isinstance(handle.failed, NotEnoughBookiesError)):
        # A written-back entry short of AQ, or a fence / password failure: no close. (Every
        # entry reaching AQ while the replacement of a dead bookie found no spare is fine:
        # the ledger closes under-replicated and the auditor repairs it.)
        raise handle.failed
    fenced_md, (md, version) = md, (handle.md, handle.version)
    while not md.is_closed:
        closed = md.closed(last, length)
        try:
            version = await ctx.write_metadata(closed, version)
            md = closed
            cm.RECOVERIES.inc()
            log.info("ledger %d: recovered and closed at entry %d (%d bytes)", ledger_id, last, length)
        except MetadataVersionError:
            md, version = await ctx.read_metadata(ledger_id)  # another recoverer won, or a re-replication
            if not md.is_closed:
                md = _with_changes(md, fenced_md, handle.md)
    ctx.send_write_close(md, handle.master_key)
    return md, version


def _with_changes(current: LedgerMetadata, fenced: LedgerMetadata, ours: LedgerMetadata) -> LedgerMetadata:
    """``current`` plus the ensemble changes that the recovery handle kept in memory
    (fragments of ``ours`` that ``fenced`` lacks), in order."""
    for first, bookies in ours.fragments:
        if (first, bookies) not in fenced.fragments:
            current = current.with_fragment(first, bookies)
    return current
