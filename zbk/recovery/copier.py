"""Copying entries between bookies for re-replication and in-place repair.

Entries travel as the raw blobs the writer built (header + digest + payload): the copier
reads them from a replica, checks each digest with the ledger's password (a damaged copy is
never spread), and writes them to the target with a RECOVERY_ADD, which a bookie accepts
even on a fenced ledger. Entries are copied in batches of ``limits.copy_batch_entries_max``.
A batch is read from each source bookie in ranged requests, one per stripe (the entry ids
of one remainder divided by E), packed; an entry those do not bring (a bad copy, a bookie
that does not answer or predates stripes) is then read on its own from any replica. Writes
are packed into frames of at most ``limits.copy_batch_bytes_max`` and paced by a
:class:`RateLimiter` shared by the process.
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
from zbk.wire.entry import check_structure, parse_entry
from zbk.wire.messages import EntryRanges
from zbk.wire.ops import AddFlag, ReadFlag
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


async def read_held(ctx: ClientContext, bookie: str, md: LedgerMetadata, entries: list[int],
                    digest: Digest) -> dict[int, bytes]:
    """Good copies of ``entries`` (ascending) that ``bookie`` returns to ranged reads, by entry
    id: one SPARSE, packed request per run of them along a stripe (ids of one remainder
    divided by E, each E after the last), asked again from where an answer of the bookie's
    response limit stopped. Not in the result: what it lacks, damaged copies, and whatever
    follows an error in a run (the caller reads those on their own). An unreachable bookie
    raises BookieUnavailableError."""
    size = md.ensemble_size
    runs: list[list[int]] = []
    open_runs: dict[int, list[int]] = {}  # by remainder: the run the next id of that stripe extends
    for e in entries:
        run = open_runs.get(e % size)
        if run is None or run[-1] + size != e:
            run = open_runs[e % size] = []
            runs.append(run)
        run.append(e)
    got: dict[int, bytes] = {}
    await asyncio.gather(*(_read_stripe(ctx, bookie, md, run, (size, run[0] % size), digest, got) for run in runs))
    return got


async def _read_stripe(ctx: ClientContext, bookie: str, md: LedgerMetadata, wanted: list[int],
                       stripe: tuple[int, int], digest: Digest, got: dict[int, bytes]) -> None:
    t = ctx.transport
    want = set(wanted)
    first, last = wanted[0], wanted[-1]
    while first <= last:
        req = w.ReadRequest(rid=t.next_rid(), ledger_id=md.ledger_id, first_entry_id=first,
                            count=min(last - first + 1, limits.entries_per_read_request_max),
                            flags=ReadFlag.SPARSE, stripe=stripe, packed=True)
        resp = await t.request(bookie, req, ctx.read_timeout_s)
        blobs = resp.entries if isinstance(resp, w.ReadResponse) else ()
        nxt = first
        for raw in blobs:
            blob = bytes(raw)
            header = check_structure(blob)
            if isinstance(header, str):
                return  # nothing tells where it stopped: the rest is read entry by entry
            eid = header[2]
            nxt = max(nxt, eid + 1)
            if eid in want:
                try:
                    parse_entry(blob, digest, ledger_id=md.ledger_id, entry_id=eid)
                except DigestMismatchError:
                    continue  # read again on its own, from another replica
                got[eid] = blob
        if resp.status != Status.EOK or nxt == first:
            return  # an error past the entries before it, or nothing more held
        first = nxt


async def unreadable(ctx: ClientContext, bookie: str, md: LedgerMetadata, entries: list[int],
                     digest: Digest) -> list[tuple[int, str]]:
    """The entries of ``entries`` (ascending) that ``bookie`` does not return with a good
    digest, with what was wrong: read ``limits.copy_batch_entries_max`` at a time, in ranged
    requests, and what those do not bring once more on its own (for the reason). An
    unreachable bookie raises BookieUnavailableError."""
    bad: list[tuple[int, str]] = []
    for start in range(0, len(entries), limits.copy_batch_entries_max):
        batch = entries[start:start + limits.copy_batch_entries_max]
        held = await read_held(ctx, bookie, md, batch, digest)
        rest = [e for e in batch if e not in held]
        got = await asyncio.gather(*(read_checked(ctx, bookie, md, e, digest) for e in rest))
        bad.extend((e, why) for e, (blob, why) in zip(rest, got, strict=True) if blob is None)
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
            blobs = await self.read_batch(md, batch, digest, avoid)
            for chunk in add_batches(blobs, len, limits.copy_batch_bytes_max):
                size = sum(len(b) for b in chunk)
                await self.rate.acquire(size)
                await self.write(md.ledger_id, key, target, chunk)
                self.bytes_copied += size
            rm.REPLICATOR_ENTRIES_COPIED.inc(len(batch))
            self.entries_copied += len(batch)

    async def read_batch(self, md: LedgerMetadata, batch: list[int], digest: Digest, avoid: set[str]) -> list[bytes]:
        """Digest-checked blobs of ``batch`` (ascending), in its order: each entry from the
        first replica of its write set not in ``avoid``, in ranged requests to each such
        bookie; what those do not bring, from any replica on its own."""
        sources: dict[str, list[int]] = {}
        for e in batch:
            source = next((b for b in md.write_set(e) if b not in avoid), None)
            if source is not None:
                sources.setdefault(source, []).append(e)

        async def from_source(bookie: str, entries: list[int]) -> dict[int, bytes]:
            try:
                return await read_held(self.ctx, bookie, md, entries, digest)
            except BookieUnavailableError:
                return {}  # its entries are read on their own below, from any replica

        got: dict[int, bytes] = {}
        for held in await asyncio.gather(*(from_source(b, es) for b, es in sources.items())):
            got.update(held)
        rest = [e for e in batch if e not in got]
        for e, blob in zip(rest, await asyncio.gather(*(self.read_good_copy(md, e, digest, avoid) for e in rest)),
                           strict=True):
            got[e] = blob
        return [got[e] for e in batch]

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
