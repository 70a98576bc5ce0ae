"""Reading a ledger: ReadHandle (the read path of zbk/client/handles.py).

Read path: the write set in order; after speculative_read_ms without an answer the next
replica is asked too; every entry's digest is checked; a negative or corrupt answer moves to
the next replica. Reads stop at the LAC (or the last entry of a closed ledger).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from zbk import limits
from zbk.client.context import HandleContext
from zbk.client.digest import Digest
from zbk.errors import (
    BookieUnavailableError,
    DigestMismatchError,
    NoSuchEntryError,
    UnauthorizedError,
    UnknownLedgerStateError,
    ZbkError,
    error_for_status,
)
from zbk.metadata.ledger import LedgerMetadata
from zbk.wire import messages as w
from zbk.wire.entry import parse_entry
from zbk.wire.ops import ReadFlag
from zbk.wire.status import Status

# Named as the module this code was split from: log configuration and output stay as they were.
log = logging.getLogger("zbk.client.handles")
NO_FLAGS = ReadFlag(0)


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    ledger_id: int
    entry_id: int
    payload: bytes
    ledger_length: int = 0  # payload bytes of entries 0..entry_id (from the entry header)


class ReadHandle:
    """Reads a ledger. Opened with recovery it is closed; without, it reads up to the LAC it
    learns from the bookies and can tail the ledger until it closes."""

    # Slots, not a __dict__: a client may hold 10,000 open handles, and a write touches its
    # handle's fields several times per entry.
    __slots__ = ("ctx", "md", "version", "ledger_id", "password", "digest", "master_key", "lac")

    def __init__(self, ctx: HandleContext, md: LedgerMetadata, version: int, password: bytes) -> None:
        self.ctx = ctx
        self.md = md
        self.version = version
        self.ledger_id = md.ledger_id
        self.password = password
        self.digest: Digest = ctx.digest_for(md.digest, password)
        self.master_key = ctx.master_key_for(password)
        self.lac = md.last_entry_id if md.is_closed else -1

    # -- state ------------------------------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        return self.md.is_closed

    @property
    def last_add_confirmed(self) -> int:
        return self.lac

    @property
    def metadata(self) -> LedgerMetadata:
        return self.md

    async def refresh_metadata(self) -> LedgerMetadata:
        self.md, self.version = await self.ctx.read_metadata(self.ledger_id)
        if self.md.is_closed:
            self.lac = self.md.last_entry_id
        return self.md

    # -- LAC --------------------------------------------------------------------------------
    async def read_last_add_confirmed(self) -> int:
        """The highest LAC any bookie of the last ensemble reports (the last entry if closed)."""
        if self.md.is_closed:
            return self.lac
        ensemble = self.md.last_ensemble
        results = await asyncio.gather(*(self._read_lac(b) for b in ensemble), return_exceptions=True)
        lacs = [r for r in results if isinstance(r, int)]
        if not lacs:
            raise BookieUnavailableError(f"ledger {self.ledger_id}: no bookie of {list(ensemble)} answered READ_LAC")
        self.lac = max(self.lac, *lacs)
        return self.lac

    async def _read_lac(self, bookie: str) -> int:
        t = self.ctx.transport
        resp = await t.request(bookie, w.ReadLacRequest(rid=t.next_rid(), ledger_id=self.ledger_id),
                               self.ctx.read_timeout_s)
        if resp.status == Status.EOK:
            return int(resp.lac)
        if resp.status in (Status.ENOLEDGER, Status.ENOENTRY):
            return -1
        raise error_for_status(resp.status, f"{bookie}: READ_LAC of ledger {self.ledger_id}")

    # -- reads --------------------------------------------------------------------------------
    async def read_entry(self, entry_id: int, *, flags: ReadFlag = NO_FLAGS) -> LedgerEntry:
        """One entry from its write set (speculative reads, digest checked)."""
        ws = self._read_order(entry_id)
        errors: dict[str, Status | str] = {}
        spec = self.ctx.speculative_read_s
        tasks: dict[asyncio.Task[Any], str] = {}
        nxt = 0
        def start() -> None:
            nonlocal nxt
            tasks[asyncio.ensure_future(self._read_one(ws[nxt], entry_id, 1, flags))] = ws[nxt]
            nxt += 1

        try:
            while True:
                if not tasks:
                    if nxt >= len(ws):
                        break
                    start()
                done, _ = await asyncio.wait(tasks, timeout=spec if nxt < len(ws) else None,
                                             return_when=asyncio.FIRST_COMPLETED)
                if not done:  # speculative read: nobody answered in time, ask the next replica too
                    start()
                    continue
                for task in done:
                    b = tasks.pop(task)
                    try:
                        entries, status = task.result()
                    except UnauthorizedError:
                        raise
                    except ZbkError as e:
                        errors[b] = type(e).__name__
                        continue
                    if entries:
                        return entries[0]
                    errors[b] = status
        finally:
            for task in tasks:
                task.cancel()
        raise _read_error(self.ledger_id, entry_id, errors)

    def _read_order(self, entry_id: int) -> list[str]:
        """The write set in order, bookies that recently failed to answer last."""
        ws = self.md.write_set(entry_id)
        suspect = self.ctx.transport.suspect
        return sorted(ws, key=suspect)  # stable: keeps write-set order within each group

    async def _read_one(self, bookie: str, first: int, count: int,
                        flags: ReadFlag = NO_FLAGS) -> tuple[list[LedgerEntry], Status]:
        """Entries [first, first+count) that ``bookie`` holds contiguously, digest-checked, and
        the status of the first one it did not return."""
        t = self.ctx.transport
        key = self.master_key if flags & ReadFlag.FENCE else None
        resp = await t.request(bookie, w.ReadRequest(rid=t.next_rid(), ledger_id=self.ledger_id, first_entry_id=first,
                                                     count=count, flags=flags, master_key=key), self.ctx.read_timeout_s)
        if resp.status == Status.EUA:
            raise UnauthorizedError(f"{bookie}: wrong password for ledger {self.ledger_id}")
        if isinstance(resp, w.ErrorResponse):  # shed unread (ETOOMANYREQUESTS): no entries field
            return [], resp.status
        out: list[LedgerEntry] = []
        for i, blob in enumerate(resp.entries):
            try:
                e = parse_entry(blob, self.digest, ledger_id=self.ledger_id, entry_id=first + i)
            except DigestMismatchError as err:
                log.warning("ledger %d entry %d from %s: %s", self.ledger_id, first + i, bookie, err)
                return out, Status.EIO
            out.append(LedgerEntry(self.ledger_id, first + i, bytes(e.payload), e.ledger_length))
        return out, resp.status

    def _readable_end(self) -> int:
        return self.md.last_entry_id if self.md.is_closed else self.lac

    async def read(self, first: int, last: int) -> AsyncIterator[LedgerEntry]:
        """Entries ``first..last`` inclusive, in order. Beyond the LAC (or the last entry of
        a closed ledger) is NoSuchEntryError: unconfirmed entries are never returned."""
        if first < 0 or last < first:
            raise NoSuchEntryError(f"ledger {self.ledger_id}: bad range {first}..{last}")
        end = self._readable_end()
        if last > end and not self.md.is_closed:
            end = await self.read_last_add_confirmed()
        if last > end:
            raise NoSuchEntryError(f"ledger {self.ledger_id}: entry {last} is beyond the last confirmed {end}")
        async for e in self._read_range(first, last):
            yield e

    async def read_unconfirmed(self, first: int, last: int) -> AsyncIterator[LedgerEntry]:
        """Entries ``first..last`` inclusive, in order, also those beyond the LAC (BookKeeper's
        readUnconfirmedEntries): whatever the bookies of the handle's metadata hold, without
        recovery or fencing, so nothing changes for the writer.

        An entry beyond the LAC may never have been acknowledged to the writer, and recovery
        may yet truncate the ledger before it: a reader that acts on one must accept that.
        Entries up to the LAC are confirmed and read as ``read()`` reads them.

        :param first: the first entry id wanted (>= 0).
        :param last: the last entry id wanted (>= ``first``); of a closed ledger, entries past
            its last entry are never returned (they were truncated by its close).
        :returns: an async iterator over the entries from ``first`` that the bookies hold,
            one after the other: it ends early, before ``last``, at the first entry beyond
            the LAC that every replica of its write set says it lacks (the writer may not
            have sent it yet). It may end before yielding anything.
        :raises NoSuchEntryError: a bad range, or an entry up to the LAC that no replica has.
        :raises BookieUnavailableError: an entry's replicas neither returned it nor all
            said that they lack it (some did not answer): whether it exists is unknown.
        :raises UnknownLedgerStateError: a replica in limbo (BP-46) may have lost it.
        :raises UnauthorizedError: a bookie refused the password.
        """
        if first < 0 or last < first:
            raise NoSuchEntryError(f"ledger {self.ledger_id}: bad range {first}..{last}")
        if self.md.is_closed:
            last = min(last, self.md.last_entry_id)
        if first > last:
            return
        async for e in self._read_range(first, last, confirmed=self._readable_end()):
            yield e

    async def _read_range(self, first: int, last: int, *, confirmed: int | None = None) -> AsyncIterator[LedgerEntry]:
        """Entries ``first..last``. With ``confirmed``, an entry past it that every replica
        lacks ends the range instead of raising NoSuchEntryError (read_unconfirmed)."""
        md = self.md
        if md.write_quorum == md.ensemble_size:
            # Every bookie of a fragment holds every entry: ranged reads, one bookie at a time.
            nxt = first
            while nxt <= last:
                frag_i = _fragment_index(md, nxt)
                frag_end = min(last, md.fragment_end(frag_i))
                batch: list[LedgerEntry] = []
                for b in self._read_order(nxt):
                    try:
                        batch, _ = await self._read_one(b, nxt, min(frag_end - nxt + 1,
                                                                   limits.entries_per_read_request_max))
                    except BookieUnavailableError:
                        continue
                    if batch:
                        break
                if not batch:  # the per-entry path: errors and speculation
                    entry = await self._read_or_end(nxt, confirmed)
                    if entry is None:
                        return
                    batch = [entry]
                for e in batch:
                    yield e
                nxt += len(batch)
            return
        # Otherwise each bookie holds only its stripes: ask every (non-suspect) bookie of the
        # fragment for the whole chunk with SPARSE and merge by entry id. A round that yields
        # nothing new falls back to the per-entry path (speculation, typed errors).
        nxt = first
        while nxt <= last:
            frag_i = _fragment_index(md, nxt)
            end = min(last, md.fragment_end(frag_i), nxt + limits.entries_per_read_request_max - 1)
            ensemble = [b for b in md.fragments[frag_i][1] if not self.ctx.transport.suspect(b)]
            got: dict[int, LedgerEntry] = {}
            while nxt <= end:
                results = await asyncio.gather(*(self._read_sparse(b, nxt, end) for b in ensemble),
                                               return_exceptions=True)
                for r in results:
                    if isinstance(r, list):
                        for e in r:
                            got.setdefault(e.entry_id, e)
                if nxt not in got:
                    entry = await self._read_or_end(nxt, confirmed)
                    if entry is None:
                        return
                    got[nxt] = entry
                while nxt <= end and nxt in got:
                    yield got.pop(nxt)
                    nxt += 1

    async def _read_or_end(self, entry_id: int, confirmed: int | None) -> LedgerEntry | None:
        """read_entry(entry_id); None if it is past ``confirmed`` and no replica has it."""
        if confirmed is None or entry_id <= confirmed:
            return await self.read_entry(entry_id)
        try:
            return await self.read_entry(entry_id)
        except NoSuchEntryError:
            return None

    async def _read_sparse(self, bookie: str, first: int, last: int) -> list[LedgerEntry]:
        """Every entry of first..last that ``bookie`` holds (digest-checked; bad copies dropped)."""
        t = self.ctx.transport
        resp = await t.request(bookie, w.ReadRequest(rid=t.next_rid(), ledger_id=self.ledger_id, first_entry_id=first,
                                                     count=last - first + 1, flags=ReadFlag.SPARSE),
                               self.ctx.read_timeout_s)
        out: list[LedgerEntry] = []
        for blob in getattr(resp, "entries", ()):
            try:
                e = parse_entry(blob, self.digest, ledger_id=self.ledger_id)
            except DigestMismatchError as err:
                log.warning("ledger %d: bad copy from %s: %s", self.ledger_id, bookie, err)
                continue
            if first <= e.entry_id <= last:
                out.append(LedgerEntry(self.ledger_id, e.entry_id, bytes(e.payload), e.ledger_length))
        return out

    async def tail(self, start: int = 0, *, poll_timeout_ms: int = 1000) -> AsyncIterator[LedgerEntry]:
        """Follow the ledger: yield every entry from ``start`` as it becomes confirmed, and
        stop after the last entry once the ledger is closed.

        A long poll's answer carries the entries from the polled LAC + 1 up to the bookie's
        LAC that it holds: those are yielded as they came, so a reader keeping up with the
        writer needs one request per new LAC, not a poll and then a read. Only what the
        answer lacks (another bookie's stripe, a bad copy) is read afterwards."""
        nxt = start
        bookie_i = 0
        last_md_check = 0.0
        while True:
            end = self._readable_end()
            if nxt <= end:
                async for e in self._read_range(nxt, end):
                    yield e
                nxt = end + 1
                continue
            if self.md.is_closed:
                return
            now = asyncio.get_running_loop().time()  # the clock of the polls' own timeouts
            if now - last_md_check > 1.0:  # notice a close (or ensemble change) by the writer
                last_md_check = now
                await self.refresh_metadata()
                if self.md.is_closed:
                    continue
            ensemble = self.md.last_ensemble
            b = ensemble[bookie_i % len(ensemble)]
            t = self.ctx.transport
            polled = self.lac
            try:
                resp = await t.request(b, w.ReadRequest(rid=t.next_rid(), ledger_id=self.ledger_id,
                                                        first_entry_id=polled + 1,
                                                        count=limits.entries_per_read_request_max,
                                                        flags=ReadFlag.LONG_POLL, previous_lac=polled,
                                                        timeout_ms=poll_timeout_ms),
                                       poll_timeout_ms / 1000 + self.ctx.read_timeout_s)
            except BookieUnavailableError:
                bookie_i += 1
                await asyncio.sleep(0.05)
                continue
            lac = getattr(resp, "lac", -1)  # an ErrorResponse (shed request) carries none
            if lac > self.lac:
                self.lac = lac
            for e in self._polled_entries(b, resp, polled, lac):
                if e.entry_id == nxt:
                    yield e
                    nxt += 1
            if resp.status not in (Status.EOK, Status.ENOENTRY):  # ENOENTRY: the poll timed out
                bookie_i += 1
                await asyncio.sleep(0.05)

    def _polled_entries(self, bookie: str, resp: Any, polled: int, lac: int) -> list[LedgerEntry]:
        """The entries a long poll's answer carries, from ``polled`` + 1, digest-checked, up
        to the first bad copy (read again from another replica by the caller's next read)."""
        out: list[LedgerEntry] = []
        if not isinstance(resp, w.ReadResponse) or resp.first_entry_id != polled + 1:
            return out
        for i, blob in enumerate(resp.entries):
            entry_id = polled + 1 + i
            if entry_id > lac:  # a bookie only returns entries up to its LAC; anything else is not confirmed
                break
            try:
                e = parse_entry(blob, self.digest, ledger_id=self.ledger_id, entry_id=entry_id)
            except DigestMismatchError as err:
                log.warning("ledger %d entry %d from %s: %s", self.ledger_id, entry_id, bookie, err)
                break
            out.append(LedgerEntry(self.ledger_id, entry_id, bytes(e.payload), e.ledger_length))
        return out


def _fragment_index(md: LedgerMetadata, entry_id: int) -> int:
    idx = 0
    for i, (first, _) in enumerate(md.fragments):
        if first <= entry_id:
            idx = i
    return idx


def _read_error(ledger_id: int, entry_id: int, errors: dict[str, Status | str]) -> ZbkError:
    what = ", ".join(f"{b}: {s.name if isinstance(s, Status) else s}" for b, s in errors.items())
    if errors and all(isinstance(s, Status) and s.is_explicit_negative for s in errors.values()):
        return NoSuchEntryError(f"ledger {ledger_id} entry {entry_id}: no replica has it ({what})")
    if any(s == Status.EUNKNOWN for s in errors.values()):
        return UnknownLedgerStateError(f"ledger {ledger_id} entry {entry_id}: ({what})")
    return BookieUnavailableError(f"ledger {ledger_id} entry {entry_id}: no replica answered with it ({what})")

