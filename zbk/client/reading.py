"""Reading a ledger: ReadHandle (the read path of zbk/client/handles.py).

Read path: the write set in order; after speculative_read_ms without an answer the next
replica is asked too; every entry's digest is checked; a negative or corrupt answer moves to
the next replica. Reads stop at the LAC (or the last entry of a closed ledger).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterable
from dataclasses import dataclass
from typing import Any

from zbk import limits
from zbk.client.context import HandleContext
from zbk.client.digest import Digest
from zbk.client.ranges import read_ahead
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


def abandon(tasks: Iterable[asyncio.Future[Any]]) -> None:
    """Cancel the requests not waited for any more. One may still end in its own error (its
    reply failed as it was cancelled): that error is taken here, so asyncio does not log it
    as never retrieved; what the bookies answered was decided without it."""
    for task in tasks:
        task.cancel()
        task.add_done_callback(retrieved)


def retrieved(fut: asyncio.Future[Any]) -> None:
    """A done callback that takes ``fut``'s error, for futures whose error is reported some
    other way (or does not matter): asyncio then does not log it as never retrieved."""
    if not fut.cancelled():
        fut.exception()


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """One entry as a read returns it, its digest checked.

    Attributes:
        ledger_id: The ledger it belongs to.
        entry_id: Its id: 0 for the first entry of the ledger, then one more per entry.
        payload: The bytes the writer appended.
        ledger_length: The payload bytes of entries ``0..entry_id`` together, as the writer
            counted them (from the entry's header).
    """

    ledger_id: int
    entry_id: int
    payload: bytes
    ledger_length: int = 0  # payload bytes of entries 0..entry_id (from the entry header)


class ReadHandle:
    """Reads a ledger (asyncio); ``AsyncBookKeeper.open_ledger`` returns one.

    Opened with recovery the ledger is closed and every entry up to its last is readable.
    Opened without, it reads up to the last add confirmed (LAC) it learns from the bookies,
    and can follow the writer with `tail` until the ledger closes.

    Attributes:
        ledger_id: The ledger's id.
    """

    # Slots, not a __dict__: a client may hold 10,000 open handles, and a write touches its
    # handle's fields several times per entry.
    __slots__ = ("ctx", "md", "version", "ledger_id", "password", "digest", "master_key", "lac")

    def __init__(self, ctx: HandleContext, md: LedgerMetadata, version: int, password: bytes) -> None:
        """A handle on a ledger; `AsyncBookKeeper` makes handles, applications do not.

        Args:
            ctx: What the client's handles share: transport, metadata store, settings.
            md: The ledger's metadata.
            version: Its version in the metadata store (for compare-and-set).
            password: The ledger's password.
        """
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
        """Whether the ledger was closed, as far as this handle's metadata knows."""
        return self.md.is_closed

    @property
    def last_add_confirmed(self) -> int:
        """The last add confirmed (LAC) this handle knows, -1 before the first entry.

        Entries ``0..last_add_confirmed`` are readable. Of a closed ledger it is the last
        entry. It does not ask the bookies: `read_last_add_confirmed` does.
        """
        return self.lac

    @property
    def metadata(self) -> LedgerMetadata:
        """The ledger's metadata as this handle last read it (or wrote it, for a writer)."""
        return self.md

    async def refresh_metadata(self) -> LedgerMetadata:
        """Read the ledger's metadata again from the store (to notice a close, say).

        Returns:
            The current metadata; of a closed ledger, the LAC becomes its last entry.

        Raises:
            NoSuchLedgerError: The ledger was deleted.
            MetadataError: The metadata store failed or cannot be reached.
        """
        self.md, self.version = await self.ctx.read_metadata(self.ledger_id)
        if self.md.is_closed:
            self.lac = self.md.last_entry_id
        return self.md

    # -- LAC --------------------------------------------------------------------------------
    async def read_last_add_confirmed(self) -> int:
        """Ask the bookies of the last ensemble for their LAC and keep the highest.

        A bookie learns the LAC from the adds (each carries the writer's LAC when it was
        built, so it lags one entry behind) and from explicit LAC
        (``explicit_lac_interval_ms``).

        Returns:
            The highest LAC any of them reports, or this handle's if higher; the last entry
            of a closed ledger, without asking.

        Raises:
            BookieUnavailableError: No bookie of the last ensemble answered.
        """
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
        """Read one entry from the bookies of its write set, without checking the LAC.

        The replicas are asked in order; after ``speculative_read_ms`` without an answer the
        next one is asked too. A copy that fails its digest check is skipped.

        Args:
            entry_id: The entry's id.
            flags: Wire read flags (recovery uses ``ReadFlag.FENCE``); none for a plain read.

        Returns:
            The entry.

        Raises:
            NoSuchEntryError: Every replica said it lacks the entry.
            UnknownLedgerStateError: A replica in limbo (BP-46) may have lost it.
            BookieUnavailableError: No replica answered with a good copy.
            UnauthorizedError: A bookie refused the password.
        """
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
            abandon(tasks)
        raise _read_error(self.ledger_id, entry_id, errors)

    def _read_order(self, entry_id: int, turn: int = 0) -> list[str]:
        """The write set in order, from its ``turn``-th bookie on (round the end), bookies
        that recently failed to answer last."""
        ws = self.md.write_set(entry_id)
        turn %= len(ws)
        suspect = self.ctx.transport.suspect
        return sorted(ws[turn:] + ws[:turn], key=suspect)  # stable: keeps that order within each group

    async def _read_one(self, bookie: str, first: int, count: int,
                        flags: ReadFlag = NO_FLAGS) -> tuple[list[LedgerEntry], Status]:
        """Entries [first, first+count) that ``bookie`` holds contiguously, digest-checked, and
        the status of the first one it did not return."""
        t = self.ctx.transport
        key = self.master_key if flags & ReadFlag.FENCE else None
        resp = await self._ask(bookie, w.ReadRequest(rid=t.next_rid(), ledger_id=self.ledger_id, first_entry_id=first,
                                                     count=count, flags=flags, master_key=key, packed=count > 1))
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

    async def _ask(self, bookie: str, req: w.ReadRequest) -> Any:
        """``bookie``'s answer to ``req``. A bookie older than the optional keys of ranged
        reads (a stripe, packed entries) refuses them with EBADREQ: it is asked again without
        them, and then answers with every entry it holds, one frame each."""
        t = self.ctx.transport
        resp = await t.request(bookie, req, self.ctx.read_timeout_s)
        if (req.packed or req.stripe is not None) and isinstance(resp, w.ErrorResponse) \
                and resp.status == Status.EBADREQ:
            resp = await t.request(bookie, dataclasses.replace(req, rid=t.next_rid(), stripe=None, packed=False),
                                   self.ctx.read_timeout_s)
        return resp

    def _readable_end(self) -> int:
        return self.md.last_entry_id if self.md.is_closed else self.lac

    async def read(self, first: int, last: int) -> AsyncIterator[LedgerEntry]:
        """Read entries ``first..last`` inclusive, in order (an async iterator).

        Only confirmed entries are returned: when ``last`` is beyond the LAC this handle
        knows, the bookies are asked for theirs first.

        Args:
            first: The first entry id (>= 0).
            last: The last entry id (>= ``first``).

        Yields:
            The entries, each digest-checked.

        Raises:
            NoSuchEntryError: A bad range, ``last`` beyond the LAC (or the last entry of a
                closed ledger), or an entry that no replica has.
            UnknownLedgerStateError: A replica in limbo (BP-46) may have lost an entry.
            BookieUnavailableError: No replica of an entry answered with it.
            UnauthorizedError: A bookie refused the password.
        """
        if first < 0 or last < first:
            raise NoSuchEntryError(f"ledger {self.ledger_id}: bad range {first}..{last}")
        end = self._readable_end()
        if last > end and not self.md.is_closed:
            end = await self.read_last_add_confirmed()
        if last > end:
            raise NoSuchEntryError(f"ledger {self.ledger_id}: entry {last} is beyond the last confirmed {end}")
        async with contextlib.aclosing(self._read_range(first, last)) as entries:
            async for e in entries:
                yield e

    async def read_unconfirmed(self, first: int, last: int) -> AsyncIterator[LedgerEntry]:
        """Entries ``first..last`` inclusive, in order, also those beyond the LAC (BookKeeper's
        readUnconfirmedEntries): whatever the bookies of the handle's metadata hold, without
        recovery or fencing, so nothing changes for the writer.

        An entry beyond the LAC may never have been acknowledged to the writer, and recovery
        may yet truncate the ledger before it: a reader that acts on one must accept that.
        Entries up to the LAC are confirmed and read as ``read()`` reads them.

        Args:
            first: The first entry id wanted (>= 0).
            last: The last entry id wanted (>= ``first``); of a closed ledger, entries past
                its last entry are never returned (they were truncated by its close).

        Yields:
            The entries from ``first`` that the bookies hold, one after the other. It ends
            early, before ``last``, at the first entry beyond the LAC that every replica of
            its write set says it lacks (the writer may not have sent it yet); it may end
            before yielding anything.

        Raises:
            NoSuchEntryError: A bad range, or an entry up to the LAC that no replica has.
            BookieUnavailableError: An entry's replicas neither returned it nor all said
                that they lack it (some did not answer): whether it exists is unknown.
            UnknownLedgerStateError: A replica in limbo (BP-46) may have lost it.
            UnauthorizedError: A bookie refused the password.
        """
        if first < 0 or last < first:
            raise NoSuchEntryError(f"ledger {self.ledger_id}: bad range {first}..{last}")
        if self.md.is_closed:
            last = min(last, self.md.last_entry_id)
        if first > last:
            return
        async with contextlib.aclosing(self._read_range(first, last, confirmed=self._readable_end())) as entries:
            async for e in entries:
                yield e

    async def _read_range(self, first: int, last: int, *,
                          confirmed: int | None = None) -> AsyncGenerator[LedgerEntry, None]:
        """Entries ``first..last``. With ``confirmed``, an entry past it that every replica
        lacks ends the range instead of raising NoSuchEntryError (read_unconfirmed)."""
        md = self.md

        def chunk(f: int, n: int, k: int) -> Awaitable[list[LedgerEntry]]:
            if md.write_quorum == md.ensemble_size:
                # Chunk k asks the (first + k)-th bookie of the ensemble first: a one-entry read
                # the first of the entry's write set, consecutive chunks consecutive bookies.
                return self._read_chunk(f, n, first + k - f)
            # With WQ < E a bookie holds only its stripes: each chunk is read as stripes, one per bookie.
            return self._read_striped(f, n)

        # Closed with the caller: its reads ahead are cancelled when the caller stops.
        ahead = read_ahead(md, first, last, chunk, lambda eid: self._read_or_end(eid, confirmed))
        async with contextlib.aclosing(ahead) as entries:
            async for e in entries:
                yield e

    async def _read_chunk(self, first: int, count: int, turn: int) -> list[LedgerEntry]:
        """Entries first.. (at most ``count``) from the first bookie that answers with any,
        [] when none does. Every bookie of the write set holds the chunk (WQ = E): it is asked
        of them from the ``turn``-th on, bookies that failed lately last."""
        for b in self._read_order(first, turn):
            try:
                batch, _ = await self._read_one(b, first, count)
            except BookieUnavailableError:
                continue
            if batch:
                return batch
        return []

    async def _read_or_end(self, entry_id: int, confirmed: int | None) -> LedgerEntry | None:
        """read_entry(entry_id); None if it is past ``confirmed`` and no replica has it."""
        if confirmed is None or entry_id <= confirmed:
            return await self.read_entry(entry_id)
        try:
            return await self.read_entry(entry_id)
        except NoSuchEntryError:
            return None

    async def _read_striped(self, first: int, count: int) -> list[LedgerEntry]:
        """Entries first.. (at most ``count``, within one fragment) where WQ < E, as the
        contiguous prefix that the stripes bring. The entries whose id % E is r are held by
        the r-th bookie of the fragment and the WQ - 1 after it; each such stripe is asked
        (SPARSE) of the first of those that has not failed lately, so every entry comes once."""
        md = self.md
        _, ensemble = md.fragment_for(first)
        size = len(ensemble)
        suspect = self.ctx.transport.suspect
        asks = []
        for r in sorted({(first + i) % size for i in range(min(size, count))}):
            holders = [ensemble[(r + k) % size] for k in range(md.write_quorum)]
            asks.append(self._read_stripe(min(holders, key=suspect), first, count, (size, r)))
        got: dict[int, LedgerEntry] = {}
        for stripe in await asyncio.gather(*asks):
            for e in stripe:
                got[e.entry_id] = e
        out: list[LedgerEntry] = []
        eid = first
        while eid in got:
            out.append(got[eid])
            eid += 1
        return out

    async def _read_stripe(self, bookie: str, first: int, count: int, stripe: tuple[int, int]) -> list[LedgerEntry]:
        """The entries of first..first+count-1 with id % stripe[0] == stripe[1] that ``bookie``
        holds, digest-checked (a bad copy is dropped); [] if it does not answer."""
        t = self.ctx.transport
        modulus, residue = stripe
        try:
            resp = await self._ask(bookie, w.ReadRequest(rid=t.next_rid(), ledger_id=self.ledger_id,
                                                         first_entry_id=first, count=count, flags=ReadFlag.SPARSE,
                                                         stripe=stripe, packed=True))
        except BookieUnavailableError:
            return []
        if resp.status == Status.EUA:
            raise UnauthorizedError(f"{bookie}: wrong password for ledger {self.ledger_id}")
        out: list[LedgerEntry] = []
        for blob in getattr(resp, "entries", ()):  # an ErrorResponse (shed unread) has none
            try:
                e = parse_entry(blob, self.digest, ledger_id=self.ledger_id)
            except DigestMismatchError as err:
                log.warning("ledger %d: bad copy from %s: %s", self.ledger_id, bookie, err)
                continue
            if first <= e.entry_id < first + count and e.entry_id % modulus == residue:
                out.append(LedgerEntry(self.ledger_id, e.entry_id, bytes(e.payload), e.ledger_length))
        return out

    async def tail(self, start: int = 0, *, poll_timeout_ms: int = 1000) -> AsyncGenerator[LedgerEntry, None]:
        """Follow the ledger: yield every entry from ``start`` as it becomes confirmed, and
        stop after the last entry once the ledger is closed.

        With nothing new to read it long-polls bookies of the last ensemble, as many at once
        as ``ClientConfig.tail_long_polls`` (2) says, and it reads the metadata again at
        most once a second to notice a close. Each bookie learns a new LAC on its own
        schedule, and a writer's add needs only the ack quorum, so the first of two
        answers comes sooner than the answer of one bookie, which is at times the slowest;
        the other answer's entries already yielded are skipped, not checked again. A bookie
        that does not answer a poll is left for the next one of the ensemble, without an
        error. A long poll's answer carries the entries from the polled LAC + 1 up to the
        bookie's LAC that it holds: those are yielded as they came, so a reader keeping up
        with the writer needs one request per new LAC and bookie polled, not a poll and
        then a read. Only what the answers lack (another bookie's stripe, a bad copy) is
        read afterwards.

        The bookies learn the LAC from the writer's next add (or its close): the last entry
        of an idle writer shows up only then, unless the writer's client sends explicit
        LACs (``explicit_lac_interval_ms``).

        Args:
            start: The first entry id to yield.
            poll_timeout_ms: How long a bookie holds a long poll before answering that
                nothing new came.

        Yields:
            The entries from ``start`` in order, each once.

        Raises:
            NoSuchEntryError: An entry up to the LAC that no replica has.
            UnknownLedgerStateError: A replica in limbo (BP-46) may have lost an entry.
            BookieUnavailableError: No replica of an entry up to the LAC answered with it.
            UnauthorizedError: A bookie refused the password.
            NoSuchLedgerError: The ledger was deleted while being followed.
            MetadataError: The metadata store failed or cannot be reached.
        """
        nxt = start
        bookie_i = 0
        last_md_check = 0.0
        t = self.ctx.transport
        loop = asyncio.get_running_loop()
        # The polls waiting, by bookie: (a token of this poll, the LAC it was sent with). A
        # poll no longer wanted is only forgotten: its answer, when it comes, matches no
        # token and is dropped. Answers are taken from a deque, filled by the transport's
        # callbacks, rather than by a task per poll: a tenth less of the reader's CPU.
        polls: dict[str, tuple[int, int]] = {}
        answers: deque[tuple[str, int, Any]] = deque()
        tokens = itertools.count()
        answer_came = asyncio.Event()
        unpacked: set[str] = set()  # bookies older than packed answers (they refused them): polled without

        def answered(bookie: str, token: int, result: Any) -> None:
            answers.append((bookie, token, result))
            answer_came.set()

        while True:
            end = self._readable_end()
            if nxt <= end:
                async with contextlib.aclosing(self._read_range(nxt, end)) as entries:
                    async for e in entries:
                        yield e
                nxt = end + 1
                continue
            if self.md.is_closed:
                return
            now = loop.time()  # the clock of the polls' own timeouts
            if now - last_md_check > 1.0:  # notice a close (or ensemble change) by the writer
                last_md_check = now
                await self.refresh_metadata()
                if self.md.is_closed:
                    continue
            ensemble = self.md.last_ensemble
            wanted = [ensemble[(bookie_i + k) % len(ensemble)]
                      for k in range(min(self.ctx.config.tail_long_polls, len(ensemble)))]
            for b in [b for b in polls if b not in wanted]:
                del polls[b]
            for b in wanted:
                if b not in polls:
                    token, polled = next(tokens), self.lac
                    polls[b] = (token, polled)
                    t.send(b, w.ReadRequest(rid=t.next_rid(), ledger_id=self.ledger_id, first_entry_id=polled + 1,
                                            count=limits.entries_per_read_request_max, flags=ReadFlag.LONG_POLL,
                                            previous_lac=polled, timeout_ms=poll_timeout_ms,
                                            packed=b not in unpacked),
                           poll_timeout_ms / 1000 + self.ctx.read_timeout_s, functools.partial(answered, b, token))
            if not answers:
                answer_came.clear()
                await answer_came.wait()
            failed: str | None = None
            while answers:
                b, token, resp = answers.popleft()
                if polls.get(b, (-1, 0))[0] != token:
                    continue  # a poll given up (the ensemble moved on, or a bookie failed)
                polled = polls.pop(b)[1]
                if isinstance(resp, BaseException):
                    if not isinstance(resp, BookieUnavailableError):
                        raise resp
                    failed = b
                    continue
                if resp.status == Status.EBADREQ and b not in unpacked:
                    unpacked.add(b)  # polled again at once, as the bookie understands
                    continue
                lac = getattr(resp, "lac", -1)  # an ErrorResponse (shed request) carries none
                if lac > self.lac:
                    self.lac = lac
                for e in self._polled_entries(b, resp, polled, lac, nxt):
                    if e.entry_id == nxt:
                        yield e
                        nxt += 1
                if resp.status not in (Status.EOK, Status.ENOENTRY):  # ENOENTRY: the poll timed out
                    failed = b
            if failed is not None:
                # The bookies after the one that failed take over; the bookie itself is
                # polled again only once the rotation comes back to it.
                bookie_i = ensemble.index(failed) + 1 if failed in ensemble else bookie_i + 1
                await asyncio.sleep(0.05)

    def _polled_entries(self, bookie: str, resp: Any, polled: int, lac: int, wanted: int) -> list[LedgerEntry]:
        """The entries a long poll's answer carries from ``wanted`` on (those before it were
        yielded already, from another bookie's answer), digest-checked, up to the first bad
        copy (read again from another replica by the caller's next read)."""
        out: list[LedgerEntry] = []
        if not isinstance(resp, w.ReadResponse) or resp.first_entry_id != polled + 1:
            return out
        for i, blob in enumerate(resp.entries):
            entry_id = polled + 1 + i
            if entry_id > lac:  # a bookie only returns entries up to its LAC; anything else is not confirmed
                break
            if entry_id < wanted:
                continue
            try:
                e = parse_entry(blob, self.digest, ledger_id=self.ledger_id, entry_id=entry_id)
            except DigestMismatchError as err:
                log.warning("ledger %d entry %d from %s: %s", self.ledger_id, entry_id, bookie, err)
                break
            out.append(LedgerEntry(self.ledger_id, entry_id, bytes(e.payload), e.ledger_length))
        return out


def _read_error(ledger_id: int, entry_id: int, errors: dict[str, Status | str]) -> ZbkError:
    what = ", ".join(f"{b}: {s.name if isinstance(s, Status) else s}" for b, s in errors.items())
    if errors and all(isinstance(s, Status) and s.is_explicit_negative for s in errors.values()):
        return NoSuchEntryError(f"ledger {ledger_id} entry {entry_id}: no replica has it ({what})")
    if any(s == Status.EUNKNOWN for s in errors.values()):
        return UnknownLedgerStateError(f"ledger {ledger_id} entry {entry_id}: ({what})")
    return BookieUnavailableError(f"ledger {ledger_id} entry {entry_id}: no replica answered with it ({what})")

