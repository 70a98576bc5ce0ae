"""What zbk keeps in its metadata store besides raw keys: bookie registrations, cookies,
the instance id, and ledger metadata (through :class:`LedgerStore`).

Bookie registration (``bookies/writable/<id>`` or ``bookies/readonly/<id>``, bound to the
bookie's lease), CBOR map, format version 1::

    fv int   format version (1)
    id text  bookie id: host:port, or a name (a stable id, BP-41; zbk/bookieid.py)
    ad text  wire address host:port clients connect to; optional, absent in registrations
             of older bookies, whose id is their address (zbk/metadata/resolver.py)
    rk text  rack ("" if unknown)
    zn text  zone ("" if unknown); optional, absent in registrations of older bookies
    ig text  isolation group ("" if none); optional, as ``zn``
    hu text  URL of its HTTP endpoint ("" if none)
    st text  writable | readonly (must match the key's directory)
    zv text  zbk version of the bookie
    pv int   wire protocol version it speaks

Cookie (``cookies/<id>``), CBOR map, format version 1 — byte for byte the body of the
bookie's local COOKIE file (zbk/storage/cookie.py), so either side decodes the other::

    fv  int    format version (1)
    bid text   bookie id
    iid text   cluster instance id (``instanceid``)
    jd  [text] journal directories      ld [text] ledger directories
    xd  [text] index directories
    inc text   incarnation: a uuid made when the bookie formats its disks, so that wiped
               disks (a fresh cookie) are told apart from the bookie's old self

A value that does not decode, or carries an unknown format version, raises
CorruptMetadataError naming what it belongs to; it never crashes the reader.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import cbor2

from zbk import __version__, limits
from zbk.errors import (
    BadRequestError,
    CorruptMetadataError,
    KeyExistsError,
    MetadataVersionError,
    NoSuchLedgerError,
)
from zbk.metadata import layout
from zbk.metadata.coordination import allocate_ledger_id
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.store import MetadataStore, Watch, WatchEvent, iter_prefix

log = logging.getLogger(__name__)

REGISTRATION_FORMAT = 1
COOKIE_FORMAT = 1
BookieState = Literal["writable", "readonly"]


def _decode_map(data: bytes, what: str, fmt: int) -> dict[str, Any]:
    try:
        raw = cbor2.loads(data)
    except Exception as e:  # cbor2 raises several types for garbage input
        raise CorruptMetadataError(f"{what}: not valid CBOR ({e})") from None
    if not isinstance(raw, dict):
        raise CorruptMetadataError(f"{what}: not a CBOR map")
    if raw.get("fv") != fmt:
        raise CorruptMetadataError(f"{what}: unknown format version {raw.get('fv')!r} (this zbk reads {fmt})")
    return raw


def _text(raw: dict[str, Any], name: str) -> str:
    v = raw[name]
    if not isinstance(v, str):
        raise TypeError(f"{name}: expected text, got {type(v).__name__}")
    return v


def _texts(raw: dict[str, Any], name: str) -> tuple[str, ...]:
    v = raw[name]
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise TypeError(f"{name}: expected a list of text")
    return tuple(v)


# -- bookie registrations -------------------------------------------------------------------
@dataclass(frozen=True)
class BookieRegistration:
    bookie_id: str
    rack: str = ""
    http_url: str = ""
    state: BookieState = "writable"
    zone: str = ""
    isolation_group: str = ""
    zbk_version: str = __version__
    protocol_version: int = limits.PROTOCOL_VERSION
    # Where the bookie's wire socket is now (host:port); "" in an older bookie's
    # registration: its id is its address (wire_address).
    address: str = ""

    @property
    def wire_address(self) -> str:
        """The host:port the registration says to connect to (not checked here: see
        zbk/metadata/resolver.py)."""
        return self.address or self.bookie_id

    @property
    def key(self) -> str:
        return layout.readonly_key(self.bookie_id) if self.state == "readonly" else layout.writable_key(self.bookie_id)

    def encode(self) -> bytes:
        assert self.state in ("writable", "readonly"), self.state
        raw: dict[str, Any] = {"fv": REGISTRATION_FORMAT, "id": self.bookie_id, "rk": self.rack, "hu": self.http_url,
                               "st": self.state, "zv": self.zbk_version, "pv": self.protocol_version}
        # Written only when set, so that a registration without them is byte for byte what
        # older bookies write; readers take an absent key as "".
        if self.zone:
            raw["zn"] = self.zone
        if self.isolation_group:
            raw["ig"] = self.isolation_group
        if self.address:
            raw["ad"] = self.address
        return cbor2.dumps(raw)

    @classmethod
    def decode(cls, data: bytes, *, bookie_id: str | None = None) -> BookieRegistration:
        what = f"registration of bookie {bookie_id}" if bookie_id else "bookie registration"
        raw = _decode_map(data, what, REGISTRATION_FORMAT)
        try:
            state = _text(raw, "st")
            if state not in ("writable", "readonly"):
                raise ValueError(f"unknown state {state!r}")
            pv = raw["pv"]
            if not isinstance(pv, int):
                raise TypeError("pv: expected int")
            reg = cls(bookie_id=_text(raw, "id"), rack=_text(raw, "rk"), http_url=_text(raw, "hu"),
                      state="readonly" if state == "readonly" else "writable",
                      zbk_version=_text(raw, "zv"), protocol_version=pv,
                      zone=_text(raw, "zn") if "zn" in raw else "",
                      isolation_group=_text(raw, "ig") if "ig" in raw else "",
                      address=_text(raw, "ad") if "ad" in raw else "")
        except (KeyError, TypeError, ValueError) as e:
            raise CorruptMetadataError(f"{what}: malformed ({e})") from None
        if bookie_id is not None and reg.bookie_id != bookie_id:
            raise CorruptMetadataError(f"{what}: value names bookie {reg.bookie_id}")
        return reg


def register_bookie(store: MetadataStore, reg: BookieRegistration, lease: int) -> int:
    """Publish ``reg`` under its state's directory, bound to ``lease``; returns the version.

    Moving between writable and readonly writes the new key first, then deletes the old
    one, so a live bookie is never absent from both lists (briefly it is in both).
    Raises KeyExistsError if a different lease (another live process claiming the same
    bookie id) holds the registration; it frees itself when that lease expires."""
    value = reg.encode()
    try:
        version = store.create(reg.key, value, lease=lease)
    except KeyExistsError:
        kv = store.get(reg.key)
        if kv is not None and kv.lease != lease:
            raise KeyExistsError(f"bookie {reg.bookie_id} is already registered by another process "
                                 f"(lease {kv.lease}); a dead one's registration expires with its lease") from None
        version = store.put(reg.key, value, lease=lease)
    other = dataclasses.replace(reg, state="writable" if reg.state == "readonly" else "readonly").key
    store.delete(other)
    return version


def unregister_bookie(store: MetadataStore, bookie_id: str) -> None:
    """Remove both registrations of a bookie (clean shutdown)."""
    store.delete(layout.writable_key(bookie_id))
    store.delete(layout.readonly_key(bookie_id))


def read_registration(store: MetadataStore, bookie_id: str) -> BookieRegistration | None:
    """The registration of ``bookie_id`` (writable or, failing that, read-only), or None
    if it is not registered. CorruptMetadataError if it does not decode."""
    for key in (layout.writable_key(bookie_id), layout.readonly_key(bookie_id)):
        kv = store.get(key)
        if kv is not None:
            return BookieRegistration.decode(kv.value, bookie_id=bookie_id)
    return None


def list_bookies(store: MetadataStore, *, readonly: bool = False) -> list[BookieRegistration]:
    """The registered writable (or readonly) bookies, sorted by id."""
    prefix = layout.BOOKIES_READONLY if readonly else layout.BOOKIES_WRITABLE
    return [BookieRegistration.decode(kv.value, bookie_id=kv.key[len(prefix):])
            for kv in iter_prefix(store, prefix)]


@dataclass(frozen=True)
class BookieEvent:
    kind: Literal["registered", "unregistered"]
    bookie_id: str
    readonly: bool
    registration: BookieRegistration | None  # None when unregistered
    revision: int


def watch_bookies(store: MetadataStore, callback: Callable[[BookieEvent], None], *,
                  start_revision: int | None = None) -> Watch:
    """Bookies appearing in and vanishing from either list (a lease expiring included).
    A registration that does not decode is logged and skipped."""

    def on_event(ev: WatchEvent) -> None:
        if ev.key.startswith(layout.BOOKIES_WRITABLE):
            readonly, bookie_id = False, ev.key[len(layout.BOOKIES_WRITABLE):]
        elif ev.key.startswith(layout.BOOKIES_READONLY):
            readonly, bookie_id = True, ev.key[len(layout.BOOKIES_READONLY):]
        else:
            return
        if ev.kind == "delete":
            callback(BookieEvent("unregistered", bookie_id, readonly, None, ev.revision))
            return
        assert ev.value is not None
        try:
            reg = BookieRegistration.decode(ev.value, bookie_id=bookie_id)
        except CorruptMetadataError as e:
            log.error("ignoring bookie registration: %s", e)
            return
        callback(BookieEvent("registered", bookie_id, readonly, reg, ev.revision))

    return store.watch("bookies/", on_event, start_revision=start_revision)


# -- cookies and the instance id ------------------------------------------------------------
@dataclass(frozen=True)
class Cookie:
    bookie_id: str
    instance_id: str
    journal_dirs: tuple[str, ...]
    ledger_dirs: tuple[str, ...]
    index_dirs: tuple[str, ...]
    incarnation: str

    @classmethod
    def new(cls, bookie_id: str, instance_id: str, *, journal_dirs: list[str] | tuple[str, ...],
            ledger_dirs: list[str] | tuple[str, ...], index_dirs: list[str] | tuple[str, ...]) -> Cookie:
        """A cookie for freshly formatted directories (a new incarnation)."""
        return cls(bookie_id, instance_id, tuple(journal_dirs), tuple(ledger_dirs), tuple(index_dirs),
                   uuid.uuid4().hex)

    def encode(self) -> bytes:
        return cbor2.dumps({"fv": COOKIE_FORMAT, "bid": self.bookie_id, "iid": self.instance_id,
                            "jd": list(self.journal_dirs), "ld": list(self.ledger_dirs),
                            "xd": list(self.index_dirs), "inc": self.incarnation})

    @classmethod
    def decode(cls, data: bytes, *, source: str = "cookie") -> Cookie:
        """``source`` names where the bytes came from, for the error message."""
        raw = _decode_map(data, source, COOKIE_FORMAT)
        try:
            return cls(bookie_id=_text(raw, "bid"), instance_id=_text(raw, "iid"), journal_dirs=_texts(raw, "jd"),
                       ledger_dirs=_texts(raw, "ld"), index_dirs=_texts(raw, "xd"), incarnation=_text(raw, "inc"))
        except (KeyError, TypeError) as e:
            raise CorruptMetadataError(f"{source}: malformed ({e})") from None

    def differences(self, other: Cookie) -> list[str]:
        """Human-readable list of the fields in which ``other`` differs (empty: they match)."""
        return [f"{f.name}: {getattr(self, f.name)!r} != {getattr(other, f.name)!r}"
                for f in dataclasses.fields(self) if getattr(self, f.name) != getattr(other, f.name)]


def read_cookie(store: MetadataStore, bookie_id: str) -> tuple[Cookie, int] | None:
    """The cookie stored for ``bookie_id`` and its version, or None."""
    kv = store.get(layout.cookie_key(bookie_id))
    if kv is None:
        return None
    return Cookie.decode(kv.value, source=f"cookie of bookie {bookie_id} in metadata"), kv.version


def write_cookie(store: MetadataStore, cookie: Cookie, version: int | None = None) -> int:
    """Create the cookie (``version`` None; KeyExistsError if one exists) or replace the
    one at ``version`` (MetadataVersionError if it changed). Returns the new version."""
    key = layout.cookie_key(cookie.bookie_id)
    if version is None:
        return store.create(key, cookie.encode())
    return store.cas(key, cookie.encode(), version)


def delete_cookie(store: MetadataStore, bookie_id: str, version: int | None = None) -> bool:
    return store.delete(layout.cookie_key(bookie_id), version=version)


def get_or_create_instance_id(store: MetadataStore) -> str:
    """The cluster's instance id, made (a random uuid) by whoever asks first."""
    kv = store.get(layout.INSTANCE_ID)
    if kv is None:
        try:
            store.create(layout.INSTANCE_ID, uuid.uuid4().hex.encode())
        except KeyExistsError:
            pass  # a concurrent first caller won; use theirs
        kv = store.get(layout.INSTANCE_ID)
        assert kv is not None, "instance id vanished right after creation"
    try:
        return kv.value.decode("ascii")
    except UnicodeDecodeError:
        raise CorruptMetadataError(f"{layout.INSTANCE_ID}: not ASCII text") from None


# -- ledger metadata --------------------------------------------------------------------------
LedgerCallback = Callable[[int, LedgerMetadata | None, int], None]  # (ledger id, md or None if deleted, revision)


class LedgerStore:
    """Ledger metadata at ``ledgers/<20-digit id>``: versioned CBOR, written by CAS."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    def create(self, md: LedgerMetadata, *, allocate_id: bool = True) -> tuple[LedgerMetadata, int]:
        """Store a new ledger; returns (metadata as stored, version).

        With ``allocate_id`` the ledger gets a fresh id (``md.ledger_id`` is ignored);
        otherwise ``md.ledger_id`` is used and KeyExistsError means it is taken. A creation
        time and creator token are filled in when missing; the token lets a create that was
        retried after a lost reply recognize its own ledger."""
        md = dataclasses.replace(md, ctime_ms=md.ctime_ms or int(time.time() * 1000),
                                 creator_token=md.creator_token or os.urandom(16))
        for _ in range(limits.metadata_retry_attempts_max):
            if allocate_id:
                md = dataclasses.replace(md, ledger_id=allocate_ledger_id(self.store))
            data = md.encode()  # validates
            try:
                return md, self.store.create(layout.ledger_key(md.ledger_id), data)
            except KeyExistsError:
                kv = self.store.get(layout.ledger_key(md.ledger_id))
                if kv is not None and _token(kv.value) == md.creator_token:
                    return md, kv.version
                if not allocate_id:
                    raise KeyExistsError(f"ledger {md.ledger_id} already exists") from None
                log.warning("ledger id %d was taken outside the allocator; allocating another", md.ledger_id)
        raise MetadataVersionError(f"could not create a ledger in {limits.metadata_retry_attempts_max} attempts")

    def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        """(metadata, version); NoSuchLedgerError if absent, CorruptMetadataError if unreadable."""
        kv = self.store.get(layout.ledger_key(_checked(ledger_id)))
        if kv is None:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")
        return LedgerMetadata.decode(kv.value, ledger_id=ledger_id), kv.version

    def write(self, md: LedgerMetadata, version: int) -> int:
        """Replace the ledger's metadata if it is still at ``version``; returns the new
        version. MetadataVersionError if it changed, NoSuchLedgerError if it was deleted."""
        key = layout.ledger_key(_checked(md.ledger_id))
        data = md.encode()
        try:
            return self.store.cas(key, data, version)
        except MetadataVersionError:
            if self.store.get(key) is None:
                raise NoSuchLedgerError(f"ledger {md.ledger_id} does not exist") from None
            raise

    def delete(self, ledger_id: int, version: int | None = None) -> None:
        """Delete (only at ``version`` if given). NoSuchLedgerError if absent."""
        try:
            deleted = self.store.delete(layout.ledger_key(_checked(ledger_id)), version=version)
        except MetadataVersionError:
            if not self.exists(ledger_id):
                raise NoSuchLedgerError(f"ledger {ledger_id} does not exist") from None
            raise
        if not deleted:
            raise NoSuchLedgerError(f"ledger {ledger_id} does not exist")

    def exists(self, ledger_id: int) -> bool:
        return self.store.get(layout.ledger_key(_checked(ledger_id))) is not None

    def list_ids(self, *, start_after: int | None = None) -> Iterator[int]:
        """Every ledger id in increasing order (page by page, not one snapshot)."""
        after = None if start_after is None else layout.ledger_key(start_after)
        while True:
            page = self.store.list(layout.LEDGERS, start_after=after)
            for kv in page:
                ledger_id = _id_of(kv.key)
                if ledger_id is not None:
                    yield ledger_id
            if len(page) < limits.metadata_list_page_keys:
                return
            after = page[-1].key

    def watch(self, ledger_id: int, callback: Callable[[LedgerMetadata | None, int], None], *,
              start_revision: int | None = None) -> Watch:
        """Changes of one ledger: ``callback(metadata or None when deleted, revision)``."""
        key = layout.ledger_key(_checked(ledger_id))

        def on_event(lid: int, md: LedgerMetadata | None, revision: int) -> None:
            callback(md, revision)

        return self.store.watch(key, _ledger_events(on_event, exact=key), start_revision=start_revision)

    def watch_all(self, callback: LedgerCallback, *, start_revision: int | None = None) -> Watch:
        """Changes of every ledger: ``callback(ledger id, metadata or None, revision)``."""
        return self.store.watch(layout.LEDGERS, _ledger_events(callback), start_revision=start_revision)


def _ledger_events(callback: LedgerCallback, exact: str | None = None) -> Callable[[WatchEvent], None]:
    """Watch events -> decoded ledger metadata; undecodable values are logged and skipped."""

    def on_event(ev: WatchEvent) -> None:
        if exact is not None and ev.key != exact:
            return
        ledger_id = _id_of(ev.key)
        if ledger_id is None:
            return
        if ev.kind == "delete":
            callback(ledger_id, None, ev.revision)
            return
        assert ev.value is not None
        try:
            md = LedgerMetadata.decode(ev.value, ledger_id=ledger_id)
        except CorruptMetadataError as e:
            log.error("ignoring a metadata change: %s", e)
            return
        callback(ledger_id, md, ev.revision)

    return on_event


def _checked(ledger_id: int) -> int:
    if not isinstance(ledger_id, int) or not 0 <= ledger_id <= limits.ledger_id_max:
        raise BadRequestError(f"ledger id out of range: {ledger_id!r}")
    return ledger_id


def _id_of(key: str) -> int | None:
    suffix = key[len(layout.LEDGERS):]
    if len(suffix) != 20 or not (suffix.isascii() and suffix.isdigit()):
        log.warning("ignoring a key that is not a ledger id: %r", key)
        return None
    return int(suffix)


def _token(data: bytes) -> bytes | None:
    """The creator token of stored ledger metadata, or None if it does not decode."""
    try:
        raw = cbor2.loads(data)
    except Exception:
        return None
    token = raw.get("tok") if isinstance(raw, dict) else None
    return token if isinstance(token, bytes) else None
