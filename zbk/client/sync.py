"""BookKeeper: the synchronous facade over AsyncBookKeeper (API.md).

The asyncio core runs on one background thread; each call is submitted to it. append_async
returns a concurrent.futures.Future; calls from one thread are submitted in order, so
entry ids follow call order and futures complete in entry order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

from zbk import limits
from zbk.client.bookkeeper import AsyncBookKeeper
from zbk.client.handles import LedgerEntry, LedgerHandle, ReadHandle
from zbk.config import ClientConfig
from zbk.metadata.ledger import LedgerMetadata

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="zbk-client", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        # Cancel what is still running (a tail's long poll, an advisory write-close) so that
        # nothing is destroyed pending when the loop goes away.
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


class SyncReadHandle:
    def __init__(self, lt: _LoopThread, handle: ReadHandle) -> None:
        self._lt = lt
        self._h = handle

    @property
    def ledger_id(self) -> int:
        return self._h.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        return self._h.last_add_confirmed

    @property
    def is_closed(self) -> bool:
        return self._h.is_closed

    @property
    def metadata(self) -> LedgerMetadata:
        return self._h.metadata

    def read_last_add_confirmed(self) -> int:
        return self._lt.run(self._h.read_last_add_confirmed())

    def read(self, first: int, last: int) -> Iterator[LedgerEntry]:
        """Entries first..last inclusive, fetched in chunks."""
        nxt = first
        while nxt <= last:
            end = min(last, nxt + limits.client_sync_read_entries_max - 1)
            chunk = self._lt.run(_collect(self._h.read(nxt, end)))
            yield from chunk
            nxt = end + 1

    def read_unconfirmed(self, first: int, last: int) -> Iterator[LedgerEntry]:
        """Entries ``first..last`` inclusive, also those beyond the LAC, without recovery
        (BookKeeper's readUnconfirmedEntries), fetched in chunks.

        :param first: the first entry id wanted (>= 0).
        :param last: the last entry id wanted (>= ``first``); of a closed ledger, nothing past
            its last entry is returned.
        :returns: an iterator over the entries from ``first`` that the bookies hold, in order;
            it ends early at the first entry beyond the LAC that no replica has (possibly
            before yielding anything). Entries beyond the LAC may never have been
            acknowledged to the writer, and recovery may yet cut the ledger before them.
        :raises NoSuchEntryError: a bad range, or an entry up to the LAC that no replica has.
        :raises BookieUnavailableError: replicas did not answer, so an entry's existence is
            unknown.
        :raises UnknownLedgerStateError: a replica in limbo (BP-46) may have lost an entry.
        :raises UnauthorizedError: a bookie refused the password.
        """
        nxt = first
        while True:
            end = min(last, nxt + limits.client_sync_read_entries_max - 1)
            chunk = self._lt.run(_collect(self._h.read_unconfirmed(nxt, end)))
            yield from chunk
            if len(chunk) < end - nxt + 1 or end >= last:  # ended early, or done
                return
            nxt = end + 1

    def tail(self, start: int = 0) -> Iterator[LedgerEntry]:
        agen: AsyncGenerator[LedgerEntry, None] = self._h.tail(start)  # type: ignore[assignment]
        try:
            while True:
                try:
                    yield self._lt.run(_anext(agen))
                except StopAsyncIteration:
                    return
        finally:
            self._lt.run(agen.aclose())


class SyncLedgerHandle(SyncReadHandle):
    _h: LedgerHandle

    def __init__(self, lt: _LoopThread, handle: LedgerHandle) -> None:
        super().__init__(lt, handle)
        # Appends cross to the loop thread in batches: one wake-up of the loop carries every
        # append queued since the last one (a wake-up per call costs a syscall and a Task).
        self._queue: deque[tuple[bytes, concurrent.futures.Future[int]]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def append(self, payload: bytes) -> int:
        return self.append_async(payload).result()

    def append_async(self, payload: bytes) -> concurrent.futures.Future[int]:
        """Entry ids follow call order; futures complete in entry order."""
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        with self._lock:
            self._queue.append((payload, fut))
            wake = not self._scheduled
            self._scheduled = True
        if wake:
            self._lt.loop.call_soon_threadsafe(self._drain)
        return fut

    def _drain(self) -> None:
        """On the loop thread: hand every queued payload to the async handle, in order."""
        with self._lock:
            batch = list(self._queue)
            self._queue.clear()
            self._scheduled = False
        for payload, fut in batch:
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                pending = self._h.append(payload)
            except BaseException as e:  # noqa: BLE001 - delivered to the caller's future
                fut.set_exception(e)
                continue
            pending.add_done_callback(functools.partial(_transfer, fut))

    def force(self) -> int:
        """DEFERRED_SYNC ledgers: make every confirmed entry durable; returns the new LAC."""
        return self._lt.run(self._h.force())

    def close(self) -> None:
        self._lt.run(self._h.close())

    def __enter__(self) -> SyncLedgerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _transfer(target: concurrent.futures.Future[int], source: asyncio.Future[int]) -> None:
    if source.cancelled():
        target.cancel()
    elif (e := source.exception()) is not None:
        target.set_exception(e)
    else:
        target.set_result(source.result())


class BookKeeper:
    """The synchronous client: ``with zbk.BookKeeper(uri) as bk: ...``."""

    def __init__(self, metadata_uri: str, *, config: ClientConfig | None = None, **kw: Any) -> None:
        """``kw``: any ClientConfig field by name (``add_timeout_ms=2000``), over those of
        ``config`` (see AsyncBookKeeper)."""
        # Settings first: a bad one raises before the loop thread exists.
        self._abk = AsyncBookKeeper(metadata_uri, config=config, **kw)
        self._lt = _LoopThread()
        try:
            self._lt.run(self._abk.start())
        except BaseException:
            self._lt.stop()
            raise

    @property
    def async_client(self) -> AsyncBookKeeper:
        return self._abk

    def create_ledger(self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2, *,
                      password: bytes = b"", digest: str = "crc32c",
                      custom_metadata: dict[str, bytes] | None = None,
                      deferred_sync: bool = False) -> SyncLedgerHandle:
        h = self._lt.run(self._abk.create_ledger(ensemble, write_quorum, ack_quorum, password=password, digest=digest,
                                                 custom_metadata=custom_metadata, deferred_sync=deferred_sync))
        return SyncLedgerHandle(self._lt, h)

    def open_ledger(self, ledger_id: int, *, password: bytes = b"", recovery: bool = True) -> SyncReadHandle:
        return SyncReadHandle(self._lt, self._lt.run(self._abk.open_ledger(ledger_id, password=password,
                                                                           recovery=recovery)))

    def delete_ledger(self, ledger_id: int) -> None:
        self._lt.run(self._abk.delete_ledger(ledger_id))

    def list_ledgers(self) -> Iterator[int]:
        return iter(self._lt.run(self._abk.list_ledgers()))

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        return self._lt.run(self._abk.ledger_metadata(ledger_id))

    def close(self) -> None:
        try:
            self._lt.run(self._abk.close())
        finally:
            self._lt.stop()

    def __enter__(self) -> BookKeeper:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _collect(agen: AsyncIterator[LedgerEntry]) -> list[LedgerEntry]:
    return [e async for e in agen]


async def _anext(agen: AsyncIterator[LedgerEntry]) -> LedgerEntry:
    return await agen.__anext__()


