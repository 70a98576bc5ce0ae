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
from zbk.errors import ZbkError
from zbk.eventloop import new_event_loop
from zbk.metadata.ledger import LedgerMetadata

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self.loop = new_event_loop()  # uvloop's when installed (zbk/eventloop.py)
        self.thread = threading.Thread(target=self.loop.run_forever, name="zbk-client", daemon=True)
        self.thread.start()
        # Set by stop(): a call on a closed client is a typed error, not asyncio's
        # RuntimeError from the closed loop (or, for append_async, a future never completed).
        self.closed = False

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.submit(coro).result()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        if self.closed:
            coro.close()
            raise ZbkError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self) -> None:
        self.closed = True
        # Cancel what is still running (a tail's long poll, an advisory write-close) so that
        # nothing is destroyed pending when the loop goes away.
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


class SyncReadHandle:
    """Reads a ledger (blocking); ``BookKeeper.open_ledger`` returns one.

    The blocking face of `ReadHandle`: each call runs on the client's event-loop thread
    and waits for it. Opened with recovery the ledger is closed; opened without, the
    handle reads up to the last add confirmed (LAC) and can follow the writer with
    `tail()`.
    """

    def __init__(self, lt: _LoopThread, handle: ReadHandle) -> None:
        """Wrap an asyncio handle; `BookKeeper` makes handles, applications do not.

        Args:
            lt: The client's event-loop thread, where the handle's calls run.
            handle: The asyncio handle.
        """
        self._lt = lt
        self._h = handle

    @property
    def ledger_id(self) -> int:
        """The ledger's id."""
        return self._h.ledger_id

    @property
    def last_add_confirmed(self) -> int:
        """The last add confirmed (LAC) this handle knows, -1 before the first entry.

        Entries ``0..last_add_confirmed`` are readable; of a closed ledger it is the last
        entry. It does not ask the bookies: `read_last_add_confirmed()` does.
        """
        return self._h.last_add_confirmed

    @property
    def is_closed(self) -> bool:
        """Whether the ledger was closed, as far as this handle's metadata knows."""
        return self._h.is_closed

    @property
    def metadata(self) -> LedgerMetadata:
        """The ledger's metadata as this handle last read (or, for a writer, wrote) it."""
        return self._h.metadata

    def read_last_add_confirmed(self) -> int:
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
        return self._lt.run(self._h.read_last_add_confirmed())

    def read(self, first: int, last: int) -> Iterator[LedgerEntry]:
        """Read entries ``first..last`` inclusive, in order, fetched in chunks.

        Only confirmed entries are returned: when ``last`` is beyond the LAC this handle
        knows, the bookies are asked for theirs first.

        Args:
            first: The first entry id (>= 0).
            last: The last entry id (>= ``first``).

        Returns:
            An iterator over the entries, each digest-checked. Errors are raised by the
            iteration, at the chunk they concern.

        Raises:
            NoSuchEntryError: A bad range, ``last`` beyond the LAC (or the last entry of a
                closed ledger), or an entry that no replica has.
            UnknownLedgerStateError: A replica in limbo (BP-46) may have lost an entry.
            BookieUnavailableError: No replica of an entry answered with it.
            UnauthorizedError: A bookie refused the password.
        """
        nxt = first
        while nxt <= last:
            end = min(last, nxt + limits.client_sync_read_entries_max - 1)
            chunk = self._lt.run(_collect(self._h.read(nxt, end)))
            yield from chunk
            nxt = end + 1

    def read_unconfirmed(self, first: int, last: int) -> Iterator[LedgerEntry]:
        """Entries ``first..last`` inclusive, also those beyond the LAC, without recovery
        (BookKeeper's readUnconfirmedEntries), fetched in chunks.

        Args:
            first: The first entry id wanted (>= 0).
            last: The last entry id wanted (>= ``first``); of a closed ledger, nothing past
                its last entry is returned.

        Returns:
            An iterator over the entries from ``first`` that the bookies hold, in order; it
            ends early at the first entry beyond the LAC that no replica has (possibly
            before yielding anything). Entries beyond the LAC may never have been
            acknowledged to the writer, and recovery may yet cut the ledger before them.

        Raises:
            NoSuchEntryError: A bad range, or an entry up to the LAC that no replica has.
            BookieUnavailableError: Replicas did not answer, so an entry's existence is
                unknown.
            UnknownLedgerStateError: A replica in limbo (BP-46) may have lost an entry.
            UnauthorizedError: A bookie refused the password.
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
        """Follow the ledger: yield every entry from ``start`` as it becomes confirmed, and
        stop after the last entry once the ledger is closed.

        Each ``next()`` blocks until the next entry is confirmed (long polls to the
        bookies; the metadata is read again at most once a second to notice a close). The
        bookies learn the LAC from the writer's next add or its close, so an idle writer's
        last entry shows up only then, unless its client sends explicit LACs
        (``explicit_lac_interval_ms``). Closing the iterator stops the polling.

        Args:
            start: The first entry id to yield.

        Returns:
            An iterator over the entries from ``start``, in order, each once.

        Raises:
            NoSuchEntryError: An entry up to the LAC that no replica has.
            UnknownLedgerStateError: A replica in limbo (BP-46) may have lost an entry.
            BookieUnavailableError: No replica of an entry up to the LAC answered with it.
            UnauthorizedError: A bookie refused the password.
            NoSuchLedgerError: The ledger was deleted while being followed.
            MetadataError: The metadata store failed or cannot be reached.
        """
        agen: AsyncGenerator[LedgerEntry, None] = self._h.tail(start)  # type: ignore[assignment]
        try:
            while True:
                try:
                    yield self._lt.run(_anext(agen))
                except StopAsyncIteration:
                    return
        finally:
            if not self._lt.closed:  # a closed client cancelled the generator's work already
                self._lt.run(agen.aclose())


class SyncLedgerHandle(SyncReadHandle):
    """The single writer of a ledger (blocking); ``BookKeeper.create_ledger`` returns one.

    The blocking face of `LedgerHandle`, also usable as a context manager that closes
    the ledger. It can read entries up to its own LAC. `append()` waits for each entry;
    `append_async()` pipelines. A handle that failed (fenced, no bookie to replace a
    failed one) stays failed: every later append fails with the same error.
    """

    _h: LedgerHandle

    def __init__(self, lt: _LoopThread, handle: LedgerHandle) -> None:
        """Wrap an asyncio handle; `BookKeeper` makes handles, applications do not.

        Args:
            lt: The client's event-loop thread, where the handle's calls run.
            handle: The asyncio handle.
        """
        super().__init__(lt, handle)
        # Appends cross to the loop thread in batches: one wake-up of the loop carries every
        # append queued since the last one (a wake-up per call costs a syscall and a Task).
        self._queue: deque[tuple[bytes, concurrent.futures.Future[int]]] = deque()
        self._lock = threading.Lock()
        self._scheduled = False

    def append(self, payload: bytes) -> int:
        """Append ``payload`` as the ledger's next entry and wait until it is confirmed.

        Args:
            payload: The entry's bytes.

        Returns:
            The entry's id, once AQ bookies of its write set have it (on disk, unless the
            ledger is ``deferred_sync``).

        Raises:
            LedgerFencedError: Another client opened the ledger with recovery.
            LedgerClosedError: The handle was closed, or the ledger is full.
            NotEnoughBookiesError: A failed bookie could not be replaced.
            TooManyRequestsError: ``pending_adds_max`` appends are already unconfirmed.
            UnauthorizedError: A bookie refused the password (or the client's CURVE key).
            MetadataError: An ensemble change could not be recorded.
            NoSuchLedgerError: The ledger was deleted.
            BookieUnavailableError: The client was closed while the append was pending.
            ZbkError: The client was closed before the call.
        """
        return self.append_async(payload).result()

    def append_async(self, payload: bytes) -> concurrent.futures.Future[int]:
        """Append ``payload`` without waiting: pipelining.

        Calls from one thread get entry ids in call order, and their futures complete in
        entry order. It never raises: every failure comes through the future.

        Args:
            payload: The entry's bytes.

        Returns:
            A future of the entry's id; ``result()`` raises what `append()` raises. A
            failed future leaves it unknown whether the entry is stored: open the ledger
            with recovery to know.
        """
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        if self._lt.closed:
            fut.set_exception(ZbkError("the client is closed"))
            return fut
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
        """Make every entry confirmed so far durable and advance the LAC to it.

        For ledgers created with ``deferred_sync=True``; a no-op for others, whose entries
        are durable when confirmed.

        Returns:
            The LAC after the call.

        Raises:
            BookieUnavailableError: A bookie did not make them durable; the LAC stays.
        """
        return self._lt.run(self._h.force())

    def close(self) -> None:
        """Wait for the pending appends, then close the ledger at its LAC.

        Readers then see the ledger's final length. Closing a closed handle does nothing.

        Raises:
            LedgerFencedError: Another client fenced the ledger (it closes it itself).
            ZbkError: The handle failed earlier: the error it failed with.
            BookieUnavailableError: ``force()`` of a ``deferred_sync`` ledger failed.
            MetadataError: The metadata store failed or cannot be reached.
        """
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
    """The synchronous client: ``with zbk.BookKeeper(uri) as bk: ...``.

    It runs an `AsyncBookKeeper` on a background thread of its own; every call waits for
    its result there, and may be made from any thread. Use one client per process: its
    handles share its connections. Once it is closed, every call on it or on its handles
    raises `ZbkError` ("the client is closed").
    """

    def __init__(self, metadata_uri: str, *, config: ClientConfig | None = None, **kw: Any) -> None:
        """Connect to a cluster.

        Args:
            metadata_uri: The cluster's metadata store: ``sqlite:///abs/path/meta.db`` or
                ``etcd://host:port[,host:port...]/scope``.
            config: The client's settings; ``ClientConfig()`` (every default) if omitted.
            **kw: Any ``ClientConfig`` field by name (``add_timeout_ms=2000``), over those
                of ``config``.

        Raises:
            ConfigError: An unknown setting (the message names the nearest field), a value
                of the wrong type, settings that are invalid together, a malformed URI, or
                a sqlite file in a directory that does not exist.
            MetadataUnavailableError: The metadata store cannot be opened or reached.
            MetadataError: The metadata store failed.
        """
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
        """The `AsyncBookKeeper` this client runs (its settings are ``async_client.config``)."""
        return self._abk

    def create_ledger(self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2, *,
                      password: bytes = b"", digest: str = "crc32c",
                      custom_metadata: dict[str, bytes] | None = None,
                      deferred_sync: bool = False) -> SyncLedgerHandle:
        """Create a ledger on ``ensemble`` writable bookies and return its writer.

        Args:
            ensemble: E, the number of bookies the ledger's entries are spread over.
            write_quorum: WQ, the number of bookies each entry is written to (<= E).
            ack_quorum: AQ, the number of them that must acknowledge an entry before its
                append completes (<= WQ).
            password: The ledger's password: readers must give the same one. It keys the
                digest when ``digest`` is ``"hmac"``.
            digest: How each entry is checked: ``"crc32c"`` (default), ``"crc32"``,
                ``"hmac"`` (HMAC-SHA256 keyed by the password: a forged entry fails too) or
                ``"dummy"`` (no check).
            custom_metadata: Names to bytes, stored with the ledger's metadata (64 KiB at
                most; the key ``zbk.placement`` is reserved).
            deferred_sync: Appends complete once AQ bookies have the entry, before it is on
                disk; readers see it only after ``force()``.

        Returns:
            The writer of the new, open ledger.

        Raises:
            BadRequestError: Not ``64 >= E >= WQ >= AQ >= 1``, an unknown digest, a
                password that is not bytes or is over 1 KiB, custom metadata that is not
                str to bytes, is too large, or uses a reserved key.
            NotEnoughBookiesError: Fewer than E writable bookies meet the placement policy.
            MetadataError: The metadata store failed or cannot be reached.
        """
        h = self._lt.run(self._abk.create_ledger(ensemble, write_quorum, ack_quorum, password=password, digest=digest,
                                                 custom_metadata=custom_metadata, deferred_sync=deferred_sync))
        return SyncLedgerHandle(self._lt, h)

    def open_ledger(self, ledger_id: int, *, password: bytes = b"", recovery: bool = True) -> SyncReadHandle:
        """Open a ledger to read it.

        With recovery (the default) the ledger is fenced, so that its writer can add no
        more entries, its last entry is settled from what the bookies hold, and it is
        closed. Without recovery nothing changes for the writer: the handle reads up to
        the last add confirmed and can follow the writer with ``tail()``.

        Args:
            ledger_id: The ledger's id.
            password: The password the ledger was created with.
            recovery: Fence and close the ledger (True), or only read it (False).

        Returns:
            A read handle; with recovery, of a closed ledger.

        Raises:
            NoSuchLedgerError: No ledger has this id.
            UnauthorizedError: The password is not the ledger's (checked before anything
                is sent: a wrong password fences nothing).
            BookieUnavailableError: With recovery: fencing or a recovery read reached too
                few bookies. The ledger may be left IN_RECOVERY; open it again later.
            UnknownLedgerStateError: With recovery: whether an entry exists cannot be told
                (a bookie in limbo); the ledger is not truncated on doubt.
            NotEnoughBookiesError: With recovery: an entry could not be written back to
                enough bookies.
            BadRequestError: A ledger id out of range, or a password that is not bytes.
            MetadataError: The metadata store failed or cannot be reached.
        """
        return SyncReadHandle(self._lt, self._lt.run(self._abk.open_ledger(ledger_id, password=password,
                                                                           recovery=recovery)))

    def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger's metadata; bookies reclaim its entries by garbage collection.

        No password is asked. A writer of the ledger fails at its next ensemble change or
        close (`NoSuchLedgerError`).

        Args:
            ledger_id: The ledger's id.

        Raises:
            NoSuchLedgerError: No ledger has this id.
            BadRequestError: A ledger id out of range.
            MetadataError: The metadata store failed or cannot be reached.
        """
        self._lt.run(self._abk.delete_ledger(ledger_id))

    def list_ledgers(self) -> Iterator[int]:
        """Every ledger id, in increasing order.

        Returns:
            An iterator over the ids of the ledgers whose metadata exists, open or closed.

        Raises:
            MetadataError: The metadata store failed or cannot be reached.
        """
        return iter(self._lt.run(self._abk.list_ledgers()))

    def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        """A ledger's metadata, read from the store (no password asked).

        Args:
            ledger_id: The ledger's id.

        Returns:
            Its metadata: quorums, state, last entry, length, fragments, custom metadata.

        Raises:
            NoSuchLedgerError: No ledger has this id.
            CorruptMetadataError: The stored metadata does not decode.
            BadRequestError: A ledger id out of range.
            MetadataError: The metadata store failed or cannot be reached.
        """
        return self._lt.run(self._abk.ledger_metadata(ledger_id))

    def ledger_exists(self, ledger_id: int) -> bool:
        """Whether a ledger has this id.

        Args:
            ledger_id: The ledger's id.

        Returns:
            True if its metadata exists.

        Raises:
            BadRequestError: A ledger id out of range.
            MetadataError: The metadata store failed or cannot be reached.
        """
        return self._lt.run(self._abk.ledger_exists(ledger_id))

    def close(self) -> None:
        """Close the connections and the metadata store, and stop the client's thread.

        Open writers are not closed: their ledgers stay open until someone recovers them
        (close each writer first). Appends still pending fail with
        `BookieUnavailableError`. Closing a closed client does nothing; any other call on
        it, or on its handles, raises `ZbkError`.
        """
        if self._lt.closed:
            return
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


