"""The MetadataStore protocol: what every part of zbk needs from its metadata service.

Three drivers implement it and pass one contract suite (tests/metadata/test_contract.py):
etcd through python-etcd3 (``etcd://h1:p1,h2:p2/scope``), an embedded store on stdlib
sqlite3 (``sqlite:///path/meta.db``), safe for many processes on one host, and a store in
one process's memory (``memory://name``, zbk/metadata/memory.py) for tests and simulations
(the suite's cases that need two processes excepted).

Model (etcd's): a flat, sorted key space below the store's scope; every change bumps one
store-wide revision; a key's ``version`` is the revision of its last change (etcd's
mod_revision), and compare-and-set compares that. Keys may be bound to a lease; when the
lease expires or is revoked its keys are deleted (and watchers see the deletes).

Keys passed to a store are relative to its scope ("ledgers/00000000000000000042"); the
driver adds and strips the scope prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from zbk import limits


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: bytes
    version: int  # revision of the key's last change: the CAS token
    create_revision: int
    lease: int | None = None


@dataclass(frozen=True, slots=True)
class WatchEvent:
    kind: Literal["put", "delete"]
    key: str
    value: bytes | None  # None for deletes
    revision: int


@runtime_checkable
class Watch(Protocol):
    def cancel(self) -> None:
        """Stop delivering events; returns once the callback will not be called again."""

    @property
    def last_revision(self) -> int:
        """Revision of the last event delivered (or start_revision - 1 before any)."""


WatchCallback = Callable[[WatchEvent], None]


@runtime_checkable
class MetadataStore(Protocol):
    uri: str

    def get(self, key: str) -> KeyValue | None:
        """The key's current value and version, or None."""

    def put(self, key: str, value: bytes, *, lease: int | None = None) -> int:
        """Unconditional write; returns the new version."""

    def create(self, key: str, value: bytes, *, lease: int | None = None) -> int:
        """Write only if absent; returns the version. Raises KeyExistsError if present."""

    def cas(self, key: str, value: bytes, version: int, *, lease: int | None = None) -> int:
        """Write only if the key's current version is ``version``; returns the new version.
        Raises MetadataVersionError if the key is missing or its version differs."""

    def delete(self, key: str, *, version: int | None = None) -> bool:
        """Delete; with ``version``, only if it matches (else MetadataVersionError).
        Returns False if the key was absent (and no version was given)."""

    def list(self, prefix: str, *, start_after: str | None = None,
             limit: int = limits.metadata_list_page_keys) -> list[KeyValue]:
        """Up to ``limit`` keys starting with ``prefix``, sorted, strictly after ``start_after``."""

    def revision(self) -> int:
        """The store's current revision."""

    def watch(self, prefix: str, callback: WatchCallback, *, start_revision: int | None = None) -> Watch:
        """Deliver every change to keys under ``prefix`` with revision >= ``start_revision``
        (None: changes after now), in revision order, each exactly once, on a store thread,
        surviving reconnects of the underlying service. Raises WatchCompactedError if the
        start revision is no longer available."""

    def grant_lease(self, ttl_s: int) -> int:
        """A new lease id that expires ``ttl_s`` seconds after its last keep-alive."""

    def keepalive(self, lease: int, *, timeout_s: float | None = None) -> None:
        """Refresh the lease. Raises LeaseExpiredError if it is already gone, and
        MetadataUnavailableError if no answer came within ``timeout_s`` (None: the store's
        own call deadline)."""

    def revoke_lease(self, lease: int) -> None:
        """Revoke the lease now, deleting its keys. Absent leases are ignored."""

    def close(self) -> None:
        """Release connections and threads (does not revoke leases)."""


def iter_prefix(store: MetadataStore, prefix: str, *,
                page: int = limits.metadata_list_page_keys) -> Iterator[KeyValue]:
    """Every key under ``prefix``, page by page (each page a separate consistent read)."""
    after: str | None = None
    while True:
        batch = store.list(prefix, start_after=after, limit=page)
        yield from batch
        if len(batch) < page:
            return
        after = batch[-1].key
