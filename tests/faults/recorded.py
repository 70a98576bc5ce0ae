"""zbk's asyncio client with every ledger operation written to a history (history.py) as it
happens, and the collection of the final state after healing.

    rec = HistoryRecorder(run_dir / "history.jsonl")
    client = RecordingClient(bk, rec, "w0")          # bk: a started AsyncBookKeeper
    lh = await client.create_ledger(3, 2, 2, password=pw)
    fut = lh.append(payload)                          # invoke now; ok / info when fut completes
    ...
    final = await final_state(bk, History.load([...]).ledgers(), password=pw)

How outcomes are classified (the checker's soundness rests on it): an error that leaves
the effect of an operation unknown is ``info``; ``fail`` only where nothing can have
happened. An append refused by ``append()`` itself was never sent: ``fail``. An append whose
future fails may have reached a bookie and may be kept by a recovery: ``info``, whatever
the error. A create, close or recovery that failed is ``info`` unless its error says it
was refused before any write (no bookies, bad arguments, wrong password, no such ledger,
fenced). A read that failed is ``fail`` unless it timed out or lost its bookies, and it
carries the entries it returned before the error.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterable
from typing import Any

from zbk.client.bookkeeper import AsyncBookKeeper
from zbk.client.handles import LedgerEntry, LedgerHandle, ReadHandle
from zbk.errors import (
    BadRequestError,
    BookieUnavailableError,
    LedgerFencedError,
    MetadataUnavailableError,
    NoSuchEntryError,
    NoSuchLedgerError,
    NotEnoughBookiesError,
    UnauthorizedError,
    ZbkError,
    ZbkTimeoutError,
)

from .history import Digests, FinalLedger, FinalState, HistoryRecorder, Op, digest

# Errors after which nobody knows whether the request took effect.
INDETERMINATE: tuple[type[BaseException], ...] = (TimeoutError, asyncio.CancelledError, ZbkTimeoutError,
                                                  BookieUnavailableError, MetadataUnavailableError)
# Errors of a create, close or recovery that was refused before it wrote anything.
REFUSED: tuple[type[BaseException], ...] = (NotEnoughBookiesError, BadRequestError, UnauthorizedError,
                                            NoSuchLedgerError, LedgerFencedError)
FINAL_READ_ATTEMPTS = 3
FINAL_READ_RETRY_S = 0.3


def record_error(rec: HistoryRecorder, op: Op, err: BaseException, *, effect: bool,
                 entries: list[tuple[int, bytes]] | None = None) -> None:
    """Record ``err`` as the outcome of ``op``; ``effect``: the op may change the cluster."""
    if isinstance(err, INDETERMINATE) or (effect and not isinstance(err, REFUSED)):
        rec.info(op, err, entries=entries)
    else:
        rec.fail(op, err, entries=entries)


class RecordingClient:
    """Creates and opens ledgers through ``bk``, as client ``process`` of the history."""

    def __init__(self, bk: AsyncBookKeeper, recorder: HistoryRecorder, process: str) -> None:
        self.bk = bk
        self.recorder = recorder
        self.process = process
        self._views = itertools.count()

    def next_view(self) -> str:
        return f"{self.process}/{next(self._views)}"

    async def create_ledger(self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2,
                            **kw: Any) -> RecordingWriter:
        op = self.recorder.invoke(self.process, "create")
        try:
            lh = await self.bk.create_ledger(ensemble, write_quorum, ack_quorum, **kw)
        except BaseException as e:
            record_error(self.recorder, op, e, effect=True)
            raise
        self.recorder.ok(op, ledger=lh.ledger_id)
        return RecordingWriter(self, lh)

    async def open_ledger(self, ledger_id: int, *, password: bytes = b"", recovery: bool = True) -> RecordingReader:
        """``open_recover`` (fences, recovers and closes) or ``open`` (neither)."""
        op = self.recorder.invoke(self.process, "open_recover" if recovery else "open", ledger=ledger_id)
        try:
            h = await self.bk.open_ledger(ledger_id, password=password, recovery=recovery)
        except BaseException as e:
            record_error(self.recorder, op, e, effect=recovery)
            raise
        self.recorder.ok(op, last=h.md.last_entry_id if h.is_closed else h.last_add_confirmed, closed=h.is_closed)
        return RecordingReader(self, h)


class RecordingReader:
    def __init__(self, client: RecordingClient, handle: ReadHandle) -> None:
        self.client = client
        self.handle = handle
        self.ledger_id = handle.ledger_id

    @property
    def _rec(self) -> HistoryRecorder:
        return self.client.recorder

    def _invoke(self, kind: str, **fields: Any) -> Op:
        return self._rec.invoke(self.client.process, kind, ledger=self.ledger_id, **fields)

    async def read_last_add_confirmed(self) -> int:
        op = self._invoke("read_lac")
        try:
            lac = await self.handle.read_last_add_confirmed()
        except BaseException as e:
            record_error(self._rec, op, e, effect=False)
            raise
        self._rec.ok(op, last=lac)
        return lac

    async def read_entry(self, entry_id: int) -> LedgerEntry:
        op = self._invoke("read", first=entry_id, last=entry_id)
        try:
            e = await self.handle.read_entry(entry_id)
        except BaseException as err:
            record_error(self._rec, op, err, effect=False)
            raise
        self._rec.ok(op, entries=[(e.entry_id, e.payload)])
        return e

    async def read(self, first: int, last: int) -> AsyncIterator[LedgerEntry]:
        """Entries first..last, recorded as one ``read`` when the iteration ends (a consumer
        that stops early has read what it was given)."""
        op = self._invoke("read", first=first, last=last)
        got: list[tuple[int, bytes]] = []
        try:
            async for e in self.handle.read(first, last):
                got.append((e.entry_id, e.payload))
                yield e
        except GeneratorExit:
            self._rec.ok(op, entries=got)
            raise
        except BaseException as err:
            record_error(self._rec, op, err, effect=False, entries=got)
            raise
        self._rec.ok(op, entries=got)

    async def tail(self, start: int = 0, *, poll_timeout_ms: int = 1000) -> AsyncIterator[LedgerEntry]:
        """Follow the ledger. Each entry it yields is one ``tail`` step of one view, recorded
        before the entry is handed over; the step that finds the ledger closed ends it."""
        view = self.client.next_view()
        inner = self.handle.tail(start, poll_timeout_ms=poll_timeout_ms)
        nxt = start
        try:
            while True:
                op = self._invoke("tail", first=nxt, view=view)
                try:
                    e = await inner.__anext__()
                except StopAsyncIteration:
                    self._rec.ok(op, entries=[], end=True)
                    return
                except BaseException as err:
                    record_error(self._rec, op, err, effect=False)
                    raise
                self._rec.ok(op, entries=[(e.entry_id, e.payload)])
                nxt = e.entry_id + 1
                yield e
        finally:
            await inner.aclose()  # type: ignore[attr-defined]


class RecordingWriter(RecordingReader):
    handle: LedgerHandle

    def __init__(self, client: RecordingClient, handle: LedgerHandle) -> None:
        super().__init__(client, handle)

    def append(self, payload: bytes) -> asyncio.Future[int]:
        # The handle gives ids in call order from next_entry_id: read it before the call, so
        # an append that never completes still names the id it was sent as.
        op = self._invoke("append", entry=self.handle.next_entry_id, payload=payload)
        try:
            fut = self.handle.append(payload)
        except BaseException as e:
            self._rec.fail(op, e)  # refused before it was sent
            raise
        self._rec.watch_append(op, fut)
        return fut

    async def close(self) -> None:
        op = self._invoke("close")
        try:
            await self.handle.close()
        except BaseException as e:
            record_error(self._rec, op, e, effect=True)
            raise
        self._rec.ok(op, last=self.handle.md.last_entry_id)


# -- the final state --------------------------------------------------------------------------------
async def final_state(bk: AsyncBookKeeper, ledger_ids: Iterable[int], *, password: bytes = b"",
                      recover: bool = False) -> FinalState:
    """What the cluster holds for ``ledger_ids``, read back after healing: each ledger's
    state, last entry (its LAC if not closed) and the digest of every entry that reads.
    ``recover``: first open each ledger that is not closed with recovery (not recorded).
    A ledger without metadata is left out; an entry that fails FINAL_READ_ATTEMPTS reads in
    a row, or that every replica says it does not have, is left out."""
    out = FinalState()
    for lid in sorted(set(ledger_ids)):
        try:
            md = await bk.ledger_metadata(lid)
            if recover and not md.is_closed:
                md = (await bk.open_ledger(lid, password=password)).md
            rh = await bk.open_ledger(lid, password=password, recovery=False)
        except NoSuchLedgerError:
            continue
        last = md.last_entry_id if md.is_closed else rh.last_add_confirmed
        out.ledgers[lid] = FinalLedger(md.is_closed, last, Digests(await _read_back(rh, last)))
    return out


async def _read_back(rh: ReadHandle, last: int) -> dict[int, str]:
    got: dict[int, str] = {}
    nxt = 0
    while nxt <= last:
        try:  # the ranged path first; entry by entry from where it fails
            async for e in rh.read(nxt, last):
                got[e.entry_id] = digest(e.payload)
                nxt = e.entry_id + 1
        except ZbkError:
            for attempt in range(FINAL_READ_ATTEMPTS):
                try:
                    got[nxt] = digest((await rh.read_entry(nxt)).payload)
                    break
                except NoSuchEntryError:
                    break  # every replica said it has no such entry: asking again tells nothing new
                except ZbkError:
                    if attempt + 1 < FINAL_READ_ATTEMPTS:
                        await asyncio.sleep(FINAL_READ_RETRY_S)
            nxt += 1
    return got
