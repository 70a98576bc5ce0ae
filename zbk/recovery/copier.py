"""Copying entries between bookies for re-replication and in-place repair.

Entries travel as the raw blobs the writer built (header + digest + payload): the copier
reads one from a replica, checks its digest with the ledger's password (a damaged copy is
never spread), and writes it to the target with a RECOVERY_ADD, which a bookie accepts
even on a fenced ledger. Reads go out concurrently in batches of
``limits.copy_batch_entries_max``; writes are packed into frames of at most
``limits.copy_batch_bytes_max`` and paced by a :class:`RateLimiter` shared by the process.
"""

from __future__ import annotations

import asyncio

from zbk import limits
from zbk.client.bookkeeper import ClientContext
from zbk.client.digest import Digest, master_key
from zbk.client.handles import add_batches
from zbk.clock import SYSTEM_CLOCK, Clock
from zbk.errors import BookieUnavailableError, DigestMismatchError, error_for_status
from zbk.metadata.ledger import LedgerMetadata
from zbk.recovery import metrics as rm
from zbk.tokenbucket import TokenBucket
from zbk.wire import messages as w
from zbk.wire.entry import parse_entry
from zbk.wire.messages import EntryRanges
from zbk.wire.ops import AddFlag
from zbk.wire.status import Status


def positions_held(md: LedgerMetadata, position: int, first: int, last: int) -> list[int]:
    """Entries in ``first..last`` whose write set includes ensemble ``position``:
    e with (position - e) mod E < WQ (the write set is WQ consecutive members from e mod E)."""
    e_size, wq = md.ensemble_size, md.write_quorum
    return [e for e in range(first, last + 1) if (position - e) % e_size < wq]


async def read_checked(ctx: ClientContext, bookie: str, md: LedgerMetadata, entry_id: int,
                       digest: Digest) -> tuple[bytes | None, str]:
    """One entry from one bookie, digest-checked: (blob, "") or (None, what was wrong).
    An unreachable bookie raises BookieUnavailableError."""
    t = ctx.transport
    resp = await t.request(bookie, w.ReadRequest(rid=t.next_rid(), ledger_id=md.ledger_id, first_entry_id=entry_id),
                           ctx.read_timeout_s)
    if resp.status != Status.EOK or not isinstance(resp, w.ReadResponse) or not resp.entries:
        return None, f"read answered {resp.status.name}"
    blob = bytes(resp.entries[0])
    try:
        parse_entry(blob, digest, ledger_id=md.ledger_id, entry_id=entry_id)
    except DigestMismatchError as e:
        return None, f"bad copy ({e})"
    return blob, ""


async def unreadable(ctx: ClientContext, bookie: str, md: LedgerMetadata, entries: list[int],
                     digest: Digest) -> list[tuple[int, str]]:
    """The entries of ``entries`` that ``bookie`` does not return with a good digest, with
    what was wrong; read ``limits.copy_batch_entries_max`` at a time. An unreachable bookie
    raises BookieUnavailableError."""
    bad: list[tuple[int, str]] = []
    for start in range(0, len(entries), limits.copy_batch_entries_max):
        batch = entries[start:start + limits.copy_batch_entries_max]
        got = await asyncio.gather(*(read_checked(ctx, bookie, md, e, digest) for e in batch))
        bad.extend((e, why) for e, (blob, why) in zip(batch, got, strict=True) if blob is None)
    return bad


async def list_entries(ctx: ClientContext, bookie: str, ledger_id: int) -> EntryRanges | None:
    """The entry ids ``bookie`` holds of the ledger; None if it does not know the ledger,
    () if it is in limbo and holds nothing (EUNKNOWN)."""
    t = ctx.transport
    resp = await t.request(bookie, w.ListEntriesRequest(rid=t.next_rid(), ledger_id=ledger_id), ctx.read_timeout_s)
    if resp.status == Status.EOK and isinstance(resp, w.ListEntriesResponse):
        return resp.entry_ranges
    if resp.status == Status.ENOLEDGER:
        return None
    if resp.status == Status.EUNKNOWN:
        return ()
    raise error_for_status(resp.status, f"{bookie}: list entries of ledger {ledger_id}")


class RateLimiter:
    """Bytes per second shared by a process's workers, so that re-replication does not
    starve the bookies' client traffic (``replication_rate_bytes``). A request is let
    through at once and the next one waits for its debt: no request is ever split."""

    def __init__(self, bytes_per_s: float, *, clock: Clock = SYSTEM_CLOCK) -> None:
        assert bytes_per_s > 0, bytes_per_s
        self.clock = clock
        # Capacity 0: an idle limiter saves nothing up, so a burst after a pause is paced too.
        self.bucket = TokenBucket(bytes_per_s, 0.0, now=clock.monotonic())

    async def acquire(self, nbytes: int) -> None:
        # Charged before the wait, so that concurrent workers queue behind each other's debt.
        wait = self.bucket.wait_s(0.0, self.clock.monotonic())
        self.bucket.take(nbytes)
        if wait > 0:
            await asyncio.sleep(wait)


class EntryCopier:
    """Reads good copies from replicas and writes them to a target bookie."""

    def __init__(self, ctx: ClientContext, rate: RateLimiter) -> None:
        self.ctx = ctx
        self.rate = rate
        self.bytes_copied = 0
        self.entries_copied = 0

    async def copy(self, md: LedgerMetadata, entries: list[int], target: str, avoid: set[str]) -> None:
        """Copy ``entries`` of ``md``'s ledger to ``target``, reading from replicas of each
        entry's write set that are not in ``avoid``."""
        digest = self.ctx.digest_for(md.digest, md.password)
        key = master_key(md.password)
        for start in range(0, len(entries), limits.copy_batch_entries_max):
            batch = entries[start:start + limits.copy_batch_entries_max]
            blobs = await asyncio.gather(*(self.read_good_copy(md, e, digest, avoid) for e in batch))
            for chunk in add_batches(blobs, len, limits.copy_batch_bytes_max):
                size = sum(len(b) for b in chunk)
                await self.rate.acquire(size)
                await self.write(md.ledger_id, key, target, chunk)
                self.bytes_copied += size
            rm.REPLICATOR_ENTRIES_COPIED.inc(len(batch))
            self.entries_copied += len(batch)

    async def read_good_copy(self, md: LedgerMetadata, entry_id: int, digest: Digest, avoid: set[str]) -> bytes:
        """A digest-checked blob of ``entry_id`` from a replica of its write set."""
        why: list[str] = []
        for bookie in md.write_set(entry_id):
            if bookie in avoid:
                continue
            try:
                blob, wrong = await read_checked(self.ctx, bookie, md, entry_id, digest)
            except BookieUnavailableError as e:
                why.append(str(e))
                continue
            if blob is not None:
                return blob
            why.append(f"{bookie}: {wrong}")
        raise BookieUnavailableError(f"ledger {md.ledger_id} entry {entry_id}: no other replica answered "
                                     f"with a good copy ({'; '.join(why) or 'no other replica'})")

    async def write(self, ledger_id: int, key: bytes, target: str, blobs: list[bytes]) -> None:
        t = self.ctx.transport
        req = w.AddRequest(rid=t.next_rid(), ledger_id=ledger_id, master_key=key, flags=AddFlag.RECOVERY_ADD,
                           entries=blobs)
        resp = await t.request(target, req, self.ctx.add_timeout_s)
        if resp.status != Status.EOK:
            raise error_for_status(resp.status, f"{target}: recovery add to ledger {ledger_id}")
