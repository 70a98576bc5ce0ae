"""AsyncBookKeeper: the asyncio core of the client (API.md "Python client").

    async with zbk.AsyncBookKeeper("sqlite:///var/zbk/meta.db") as bk:
        lh = await bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")
        await lh.append(b"x")

Metadata calls are blocking driver calls; they run in a worker thread so the event loop
keeps pipelining adds meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping, Sequence, Set
from typing import Any

from zbk import limits
from zbk.client import placement
from zbk.client.bookies import WritableBookies
from zbk.client.digest import Digest, make_digest, master_key
from zbk.client.explicitlac import ExplicitLac
from zbk.client.handles import AddDispatcher, LedgerHandle, ReadHandle
from zbk.client.recovery import check_password, recover
from zbk.client.transport import Transport, ZmqTransport
from zbk.config import ClientConfig, with_settings
from zbk.errors import BadRequestError, NoSuchLedgerError, NotEnoughBookiesError, ZbkError
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import BookieRegistration, LedgerStore, list_bookies
from zbk.metadata.resolver import BookieResolver
from zbk.metadata.store import MetadataStore
from zbk.metadata.uri import open_store
from zbk.wire import messages as w
from zbk.wire.curve import CurveClient
from zbk.wire.status import Status

log = logging.getLogger(__name__)


class _Placement:
    def __init__(self, rng: random.Random, policy: placement.PlacementPolicy) -> None:
        self.rng = rng
        self.policy = policy  # this client's, for the ledgers it creates

    def choose_ensemble(self, bookies: list[BookieRegistration], size: int, write_quorum: int) -> list[str]:
        return placement.choose_ensemble(bookies, size, write_quorum=write_quorum, policy=self.policy, rng=self.rng)

    def replace(self, bookies: list[BookieRegistration], md: LedgerMetadata, ensemble: list[str],
                positions: Sequence[int], *, exclude: Set[str]) -> list[str]:
        # The ledger's own policy, not this client's: a reader recovering another client's
        # ledger keeps it where its creator put it.
        return placement.choose_replacements(bookies, ensemble, positions, write_quorum=md.write_quorum,
                                             policy=placement.PlacementPolicy.of_ledger(md), exclude=exclude,
                                             rng=self.rng)


class ClientContext:
    """What handles share: transport, metadata, configuration, placement."""

    def __init__(self, store: MetadataStore, transport: Transport, config: ClientConfig, rng: random.Random, *,
                 resolver: BookieResolver | None = None) -> None:
        self.store = store
        self.ledgers = LedgerStore(store)
        self.transport = transport
        # Bookie id -> address; the ZmqTransport of over_zmq shares it, and listings of the
        # bookies keep it fresh (writable_bookies).
        self.resolver = resolver or BookieResolver(store)
        self.config = config
        self.placement = _Placement(rng, placement.PlacementPolicy.of_config(config))
        self.add_timeout_s = config.add_timeout_ms / 1000
        self.read_timeout_s = config.read_timeout_ms / 1000
        self.speculative_read_s = config.speculative_read_ms / 1000
        self._digests: dict[tuple[str, bytes], Digest] = {}
        # One master key object per password, shared by every handle opened with it: a
        # MULTI_ADD packs a key per part, and 10,000 handles' own copies would be 10,000
        # more objects to reach per round of appends.
        self._master_keys: dict[bytes, bytes] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self.bookies = WritableBookies(store)  # started by follow_bookies
        self._following = False
        self.adds = AddDispatcher(self)  # sends the adds of all this client's ledger handles
        lac_ms = config.explicit_lac_interval_ms
        self.explicit_lac = ExplicitLac(self, lac_ms) if lac_ms > 0 else None

    @classmethod
    def over_zmq(cls, store: MetadataStore, config: ClientConfig, rng: random.Random | None = None) -> ClientContext:
        """A context on a real ZmqTransport, with the config's CURVE keys when it has them."""
        resolver = BookieResolver(store)
        transport = ZmqTransport(curve=CurveClient.from_config(config), bookie_heartbeat_timeout_ms=config.bookie_heartbeat_timeout_ms,
                                 resolver=resolver)
        return cls(store, transport, config, rng or random.Random(), resolver=resolver)

    def digest_for(self, kind: str, password: bytes) -> Digest:
        key = (kind, password)
        d = self._digests.get(key)
        if d is None:
            d = self._digests[key] = make_digest(kind, password)
        return d

    def master_key_for(self, password: bytes) -> bytes:
        key = self._master_keys.get(password)
        if key is None:
            if len(self._master_keys) >= limits.client_master_keys_cached_max:
                self._master_keys.clear()
            key = self._master_keys[password] = master_key(password)
        return key

    async def read_metadata(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        return await asyncio.to_thread(self.ledgers.read, ledger_id)

    async def write_metadata(self, md: LedgerMetadata, version: int) -> int:
        return await asyncio.to_thread(self.ledgers.write, md, version)

    async def writable_bookies(self) -> list[BookieRegistration]:
        bookies = await asyncio.to_thread(list_bookies, self.store)
        self.resolver.learn(bookies)
        return bookies

    def follow_bookies(self) -> None:
        """Start the watched list of writable bookies (zbk.client.bookies) in the background,
        once: from the first ledger this client creates, so that a client that only reads
        sets up no watch."""
        if not self._following:
            self._following = True
            self.spawn(asyncio.to_thread(self.bookies.start))

    async def replacements(self, md: LedgerMetadata, ensemble: list[str], positions: Sequence[int], *,
                           exclude: Set[str], first_attempt: bool) -> list[str]:
        """``ensemble`` with new bookies at ``positions``: on a change's first attempt from the
        watched list when it can place them, otherwise from the store (zbk.client.bookies)."""
        if first_attempt and self.bookies.live:
            try:
                return self.placement.replace(self.bookies.snapshot(), md, ensemble, positions, exclude=exclude)
            except NotEnoughBookiesError:
                pass  # perhaps a bookie the watch has not delivered yet: the store knows
        return self.placement.replace(await self.writable_bookies(), md, ensemble, positions, exclude=exclude)

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background; close() gives it a moment to finish."""
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def send_write_close(self, md: LedgerMetadata, key: bytes) -> None:
        """BP-32 advisory WRITE_CLOSE to the last ensemble; never waited for, failures logged."""

        async def one(bookie: str) -> None:
            try:
                resp = await self.transport.request(
                    bookie, w.WriteCloseRequest(rid=self.transport.next_rid(), ledger_id=md.ledger_id, master_key=key),
                    self.read_timeout_s)
                if resp.status != Status.EOK:
                    log.info("write-close of ledger %d on %s: %s", md.ledger_id, bookie, resp.status.name)
            except ZbkError as e:
                log.info("write-close of ledger %d on %s failed: %s", md.ledger_id, bookie, e)

        for b in md.last_ensemble:
            task = asyncio.ensure_future(one(b))
            self._background.add(task)
            task.add_done_callback(self._background.discard)


class AsyncBookKeeper:
    """The asyncio client: ``async with zbk.AsyncBookKeeper(uri) as bk: ...``.

    It creates, opens and deletes ledgers; the handles it returns append and read. Nothing
    is connected until `start()` (or ``async with``): a call before raises `ZbkError`.
    Every handle it returned stops working when it is closed. Use one client per process
    and event loop: its handles share its connections, and the appends of all of them to
    one bookie go out together.
    """

    def __init__(self, metadata_uri: str | None = None, *, config: ClientConfig | None = None,
                 store: MetadataStore | None = None, transport: Transport | None = None,
                 rng: random.Random | None = None, **settings: Any) -> None:
        """Make a client; `start()` connects it.

        Args:
            metadata_uri: The cluster's metadata store: ``sqlite:///abs/path/meta.db`` or
                ``etcd://host:port[,host:port...]/scope``.
            config: The client's settings; ``ClientConfig()`` (every default) if omitted.
            store: An open metadata store to use instead of ``metadata_uri`` (tests, or a
                process that shares one); the client then does not close it.
            transport: The way to reach bookies; a ZeroMQ one by default (tests pass a
                simulated one).
            rng: The random source of placement; a fresh one by default.
            **settings: Any ``ClientConfig`` field by name (``add_timeout_ms=2000``), over
                those of ``config``.

        Raises:
            ConfigError: An unknown setting (the message names the nearest field), a value
                of the wrong type, or settings that are invalid together.
            BadRequestError: Neither ``metadata_uri`` nor ``store`` was given.
        """
        if store is None and metadata_uri is None:
            raise BadRequestError("AsyncBookKeeper needs a metadata URI (or a store)")
        self.metadata_uri = metadata_uri
        self.config = with_settings(config or ClientConfig(), settings, source="BookKeeper").validate()
        self._store = store
        self._owns_store = store is None
        self._transport = transport
        self._rng = rng or random.Random()
        self.ctx: ClientContext | None = None

    async def start(self) -> AsyncBookKeeper:
        """Open the metadata store and the connections to bookies (once; again is a no-op).

        Returns:
            This client.

        Raises:
            ConfigError: The metadata URI is malformed or names a sqlite file in a directory
                that does not exist, or CURVE keys are missing.
            MetadataUnavailableError: The metadata store cannot be opened or reached.
            MetadataError: The metadata store failed.
        """
        if self.ctx is None:
            store = self._store
            if store is None:
                store = await asyncio.to_thread(open_store, self.metadata_uri or "")
            if self._transport is not None:
                self.ctx = ClientContext(store, self._transport, self.config, self._rng)
            else:
                self.ctx = ClientContext.over_zmq(store, self.config, self._rng)
        return self

    async def close(self) -> None:
        """Close the connections and the metadata store; a no-op if not started.

        Open writers are not closed: their ledgers stay open until someone recovers them
        (close each writer first). Appends still pending fail with
        `BookieUnavailableError`.
        """
        if self.ctx is None:
            return
        ctx, self.ctx = self.ctx, None
        if ctx.explicit_lac is not None:
            ctx.explicit_lac.stop()
        await asyncio.to_thread(ctx.bookies.close)
        if ctx._background:
            await asyncio.wait(list(ctx._background), timeout=1.0)
        await ctx.transport.close()
        if self._owns_store:
            await asyncio.to_thread(ctx.store.close)

    async def __aenter__(self) -> AsyncBookKeeper:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _ctx(self) -> ClientContext:
        if self.ctx is None:
            raise ZbkError("the client is not started (use `async with` or await start())")
        return self.ctx

    # -- ledgers ------------------------------------------------------------------------------
    async def create_ledger(self, ensemble: int = 3, write_quorum: int = 2, ack_quorum: int = 2, *,
                            password: bytes = b"", digest: str = "crc32c",
                            custom_metadata: dict[str, bytes] | None = None,
                            deferred_sync: bool = False) -> LedgerHandle:
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
        ctx = self._ctx()
        password = _as_bytes("password", password)
        if custom_metadata is not None and not isinstance(custom_metadata, Mapping):
            raise BadRequestError(f"custom_metadata must be a mapping of str to bytes, not "
                                  f"{type(custom_metadata).__name__}")
        # The policy goes into the ledger's custom metadata (placement.POLICY_KEY), so that
        # whoever replaces its bookies later holds it to the same rules.
        custom = ctx.placement.policy.record({_as_text_key(k): _as_bytes(f"custom metadata {k!r}", v)
                                              for k, v in (custom_metadata or {}).items()})
        bookies = await ctx.writable_bookies()
        chosen = ctx.placement.choose_ensemble(bookies, ensemble, write_quorum)
        md = LedgerMetadata(ledger_id=0, ensemble_size=ensemble, write_quorum=write_quorum, ack_quorum=ack_quorum,
                            digest=digest, password=password, fragments=((0, tuple(chosen)),),
                            custom_metadata=custom, ctime_ms=int(time.time() * 1000)).validate()
        md, version = await asyncio.to_thread(ctx.ledgers.create, md)
        ctx.follow_bookies()  # its ensemble changes place replacements from the watched list
        return LedgerHandle(ctx, md, version, password, deferred_sync=deferred_sync)

    async def open_ledger(self, ledger_id: int, *, password: bytes = b"", recovery: bool = True) -> ReadHandle:
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
        ctx = self._ctx()
        password = _as_bytes("password", password)
        if recovery:
            md, version = await recover(ctx, ledger_id, password)
            return ReadHandle(ctx, md, version, password)
        md, version = await ctx.read_metadata(ledger_id)
        check_password(md, password)
        handle = ReadHandle(ctx, md, version, password)
        if not md.is_closed:
            try:
                await handle.read_last_add_confirmed()
            except ZbkError as e:  # readable later; the LAC is only a hint at open
                log.info("ledger %d: LAC unknown at open: %s", ledger_id, e)
        return handle

    async def delete_ledger(self, ledger_id: int) -> None:
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
        ctx = self._ctx()
        await asyncio.to_thread(ctx.ledgers.delete, ledger_id)

    async def list_ledgers(self) -> list[int]:
        """Every ledger id, in increasing order.

        Returns:
            The ids of the ledgers whose metadata exists, open or closed.

        Raises:
            MetadataError: The metadata store failed or cannot be reached.
        """
        ctx = self._ctx()
        return await asyncio.to_thread(lambda: list(ctx.ledgers.list_ids()))

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
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
        md, _ = await self._ctx().read_metadata(ledger_id)
        return md

    async def ledger_exists(self, ledger_id: int) -> bool:
        """Whether a ledger has this id.

        Args:
            ledger_id: The ledger's id.

        Returns:
            True if its metadata exists.

        Raises:
            BadRequestError: A ledger id out of range.
            MetadataError: The metadata store failed or cannot be reached.
        """
        try:
            await self.ledger_metadata(ledger_id)
            return True
        except NoSuchLedgerError:
            return False


def _as_bytes(what: str, value: object) -> bytes:
    """``value`` as bytes; BadRequestError for anything else. ``bytes()`` itself would take a
    str only with an encoding (TypeError) and an int as a count of zero bytes."""
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise BadRequestError(f"{what} must be bytes, not {type(value).__name__}")
    return bytes(value)


def _as_text_key(key: object) -> str:
    if not isinstance(key, str):
        raise BadRequestError(f"custom metadata keys must be str, not {type(key).__name__} ({key!r})")
    return key
