"""An in-process metadata store, ``memory://name``: the MetadataStore contract on dicts.

For tests and simulations, zbk's own and users': a client, a bookie's boot code or a
replicator runs on it unchanged, with no server to start and nothing left on disk. It
passes the contract suite of the other drivers (tests/metadata/test_contract.py) except
what needs two processes: its data lives in the process that made it.

Model (etcd's, as zbk/metadata/store.py describes): one store-wide revision, bumped by
every change; a key's ``version`` is the revision of its last change and compare-and-set
compares it; keys may be bound to a lease and go with it.

* Names. Store objects opened on one name (``open_store("memory://orders")`` twice, or
  ``MemoryMetadataStore("orders")``) share one key space, as two clients of one etcd do,
  for as long as one of them is open: closing the last one drops the data. An unnamed
  ``MemoryMetadataStore()`` gets a key space of its own (its ``uri`` names it, so that
  another object can still join it).
* Time. A lease expires ``ttl_s`` seconds after its last keep-alive on the store's clock,
  ``clock`` (a :class:`zbk.clock.Clock`; the system clock by default, a simulation passes
  its virtual one). Expiry is looked at on every call, so a key of an expired lease is
  gone for every reader from the first call after its expiry; the store thread also looks
  while it waits for events, so that watchers hear of it without any call.
* Watches are delivered in revision order, each event once, on a store thread (one per key
  space, started with its first watch), as the protocol asks. With ``inline_watches`` they
  are delivered in the calling thread instead, before the call that made the change
  returns (a callback that itself changes keys gets those events after it returns): for a
  single-threaded simulation, where a thread would race its virtual clock. A callback that
  raises is logged; the watch goes on.
* History. The last ``limits.watch_changelog_revisions_kept`` changes are kept for watches
  that start at an older revision; :meth:`MemoryMetadataStore.compact` drops history as
  etcd's compaction does, and a watch below it raises WatchCompactedError.
"""

from __future__ import annotations

import builtins
import itertools
import logging
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field

from zbk import limits
from zbk.clock import SYSTEM_CLOCK, Clock
from zbk.errors import (
    KeyExistsError,
    LeaseExpiredError,
    MetadataError,
    MetadataVersionError,
    WatchCompactedError,
)
from zbk.metadata.store import KeyValue, WatchCallback, WatchEvent

log = logging.getLogger(__name__)

_spaces: dict[str, _Space] = {}  # named key spaces with at least one open store object
_spaces_lock = threading.Lock()


@dataclass(slots=True)
class _Lease:
    ttl_s: float
    expires_at: float
    keys: set[str] = field(default_factory=set)


class _Space:
    """One key space: the data, its history, leases and watches, under one lock."""

    def __init__(self, name: str, clock: Clock, inline: bool) -> None:
        self.name = name
        self.clock = clock
        self.inline = inline
        self.lock = threading.RLock()
        self.wake = threading.Condition(self.lock)
        self.thread: threading.Thread | None = None
        self.closed = False
        self.data: dict[str, KeyValue] = {}
        self.revision = 0
        self.history: deque[WatchEvent] = deque()
        self.compacted = 0  # revisions up to this one are gone from the history
        self.leases: dict[int, _Lease] = {}
        self.lease_ids = itertools.count(1)
        self.watches: list[MemoryWatch] = []
        self.undelivered: deque[tuple[MemoryWatch, WatchEvent]] = deque()
        self.delivery = threading.RLock()  # held around each callback
        self.local = threading.local()  # .delivering: this thread is inside a callback (inline)
        self.open_stores = 0

    # -- changes (the caller holds self.lock) ----------------------------------------------
    def expire(self) -> None:
        now = self.clock.monotonic()
        for lease_id in [i for i, lease in self.leases.items() if lease.expires_at <= now]:
            self.drop_lease(lease_id)

    def drop_lease(self, lease_id: int) -> None:
        lease = self.leases.pop(lease_id, None)
        if lease is not None:
            for key in sorted(lease.keys):
                self.remove(key)

    def changed(self, event: WatchEvent) -> None:
        self.history.append(event)
        while len(self.history) > limits.watch_changelog_revisions_kept:
            self.compacted = self.history.popleft().revision
        for watch in self.watches:
            if event.key.startswith(watch.prefix):
                self.undelivered.append((watch, event))

    def write(self, key: str, value: bytes, lease: int | None) -> int:
        if lease is not None and lease not in self.leases:
            raise LeaseExpiredError(f"lease {lease} has expired or was revoked")
        old = self.data.get(key)
        self.revision += 1
        if old is not None and old.lease is not None and old.lease in self.leases:
            self.leases[old.lease].keys.discard(key)
        if lease is not None:
            self.leases[lease].keys.add(key)
        created = old.create_revision if old is not None else self.revision
        self.data[key] = KeyValue(key, bytes(value), self.revision, created, lease)
        self.changed(WatchEvent("put", key, bytes(value), self.revision))
        return self.revision

    def remove(self, key: str) -> None:
        old = self.data.pop(key)
        if old.lease is not None and old.lease in self.leases:
            self.leases[old.lease].keys.discard(key)
        self.revision += 1
        self.changed(WatchEvent("delete", key, None, self.revision))

    # -- watches ----------------------------------------------------------------------------
    def deliver(self) -> None:
        """Called after every change: hand the new events to their watches."""
        if self.inline:
            self.deliver_inline()
            return
        with self.lock:
            self.wake.notify()

    def start_thread(self) -> None:
        """The delivery thread, started with the first watch (the caller holds self.lock)."""
        if not self.inline and self.thread is None:
            self.thread = threading.Thread(target=self.deliver_forever, name=f"zbk-memory-watch:{self.name}",
                                           daemon=True)
            self.thread.start()

    def deliver_inline(self) -> None:
        if getattr(self.local, "delivering", False):
            return  # a callback changed something: the delivery under way picks it up
        with self.delivery:
            self.local.delivering = True
            try:
                while self.deliver_one(wait=False):
                    pass
            finally:
                self.local.delivering = False

    def deliver_forever(self) -> None:
        """The delivery thread: events in revision order, and lease expiry while idle (so
        that watchers hear of it even when no call comes)."""
        while self.deliver_one(wait=True):
            pass

    def deliver_one(self, *, wait: bool) -> bool:
        """Deliver one event; False when there is none (inline) or the space closed."""
        with self.lock:
            while True:
                if self.closed:
                    return False
                if self.undelivered:
                    watch, event = self.undelivered.popleft()
                    if not watch.cancelled:
                        break
                    continue
                if not wait:
                    return False
                self.wake.wait(self.idle_wait_s())
                self.expire()
            watch.last = event.revision
        with self.delivery:
            if not watch.cancelled:
                try:
                    watch.callback(event)
                except Exception:  # noqa: BLE001 - a buggy watcher must not stop the others or the writer
                    log.exception("memory metadata %s: watch callback on %r failed", self.name, watch.prefix)
        return True

    def idle_wait_s(self) -> float:
        """How long the delivery thread may sleep: until the next lease expires, at most 1 s."""
        if not self.leases:
            return 1.0
        soonest = min(lease.expires_at for lease in self.leases.values())
        return min(1.0, max(0.01, soonest - self.clock.monotonic()))


class MemoryWatch:
    """A watch on a MemoryMetadataStore (see the module doc for when events arrive)."""

    def __init__(self, space: _Space, prefix: str, callback: WatchCallback, last: int) -> None:
        self._space = space
        self.prefix = prefix
        self.callback = callback
        self.last = last
        self.cancelled = False

    def cancel(self) -> None:
        space = self._space
        with space.lock:
            self.cancelled = True
            if self in space.watches:
                space.watches.remove(self)
        with space.delivery:  # a callback running in another thread finishes first
            pass

    @property
    def last_revision(self) -> int:
        return self.last


class MemoryMetadataStore:
    """The MetadataStore protocol in this process's memory; see the module doc.

    ``name``: the key space to join (created if no open store object has it), or None for
    a new one. ``clock``: what leases expire by; ``inline_watches``: deliver watch events
    in the thread that made the change instead of on a store thread (both used when the key
    space is created).
    """

    def __init__(self, name: str | None = None, *, clock: Clock = SYSTEM_CLOCK, inline_watches: bool = False) -> None:
        if name is None:
            name = f"anonymous-{uuid.uuid4().hex}"  # a URI that nobody else will open by chance
        with _spaces_lock:
            space = _spaces.get(name)
            if space is None:
                space = _spaces[name] = _Space(name, clock, inline_watches)
            with space.lock:
                space.open_stores += 1
        self._space = space
        self.uri = f"memory://{self._space.name}"
        self._watches: list[MemoryWatch] = []
        self._closed = False

    def _space_open(self) -> _Space:
        if self._closed:
            raise MetadataError(f"metadata store {self.uri} is closed")
        return self._space

    # -- keys -----------------------------------------------------------------------------
    def get(self, key: str) -> KeyValue | None:
        space = self._space_open()
        with space.lock:
            space.expire()
            kv = space.data.get(key)
        space.deliver()
        return kv

    def put(self, key: str, value: bytes, *, lease: int | None = None) -> int:
        space = self._space_open()
        try:
            with space.lock:
                space.expire()
                return space.write(key, value, lease)
        finally:
            space.deliver()

    def create(self, key: str, value: bytes, *, lease: int | None = None) -> int:
        space = self._space_open()
        try:
            with space.lock:
                space.expire()
                if key in space.data:
                    raise KeyExistsError(f"{key} exists")
                return space.write(key, value, lease)
        finally:
            space.deliver()

    def cas(self, key: str, value: bytes, version: int, *, lease: int | None = None) -> int:
        space = self._space_open()
        try:
            with space.lock:
                space.expire()
                kv = space.data.get(key)
                if kv is None or kv.version != version:
                    raise MetadataVersionError(f"{key}: version {version} is not current")
                return space.write(key, value, lease)
        finally:
            space.deliver()

    def delete(self, key: str, *, version: int | None = None) -> bool:
        space = self._space_open()
        try:
            with space.lock:
                space.expire()
                kv = space.data.get(key)
                if kv is None:
                    if version is not None:
                        raise MetadataVersionError(f"{key} is absent")
                    return False
                if version is not None and kv.version != version:
                    raise MetadataVersionError(f"{key}: version {version} is not current")
                space.remove(key)
                return True
        finally:
            space.deliver()

    def list(self, prefix: str, *, start_after: str | None = None,
             limit: int = limits.metadata_list_page_keys) -> builtins.list[KeyValue]:
        space = self._space_open()
        with space.lock:
            space.expire()
            # Python orders str by code point, which is the byte order of their UTF-8 (etcd's).
            keys = sorted(k for k in space.data if k.startswith(prefix) and (start_after is None or k > start_after))
            found = [space.data[k] for k in keys[:limit]]
        space.deliver()
        return found

    def revision(self) -> int:
        space = self._space_open()
        with space.lock:
            space.expire()
            rev = space.revision
        space.deliver()
        return rev

    # -- watches --------------------------------------------------------------------------
    def watch(self, prefix: str, callback: WatchCallback, *, start_revision: int | None = None) -> MemoryWatch:
        space = self._space_open()
        with space.lock:
            space.expire()
            start = space.revision + 1 if start_revision is None else start_revision
            if start <= space.compacted:
                raise WatchCompactedError(f"watch on {prefix!r}: revision {start} is compacted "
                                          f"(history starts at {space.compacted + 1})")
            watch = MemoryWatch(space, prefix, callback, start - 1)
            space.undelivered.extend((watch, ev) for ev in space.history
                                     if ev.revision >= start and ev.key.startswith(prefix))
            space.watches.append(watch)
            self._watches.append(watch)
            space.start_thread()
        space.deliver()
        return watch

    def compact(self, revision: int) -> None:
        """Drop the history before ``revision``, as etcd's compaction does: watches may
        start at ``revision`` or later."""
        space = self._space_open()
        with space.lock:
            while space.history and space.history[0].revision < revision:
                space.history.popleft()
            space.compacted = max(space.compacted, min(revision, space.revision + 1) - 1)

    # -- leases ---------------------------------------------------------------------------
    def grant_lease(self, ttl_s: int) -> int:
        space = self._space_open()
        with space.lock:
            space.expire()
            lease = next(space.lease_ids)
            space.leases[lease] = _Lease(ttl_s, space.clock.monotonic() + ttl_s)
        space.deliver()
        return lease

    def keepalive(self, lease: int, *, timeout_s: float | None = None) -> None:
        # timeout_s is not used: memory answers at once.
        space = self._space_open()
        try:
            with space.lock:
                space.expire()
                held = space.leases.get(lease)
                if held is None:
                    raise LeaseExpiredError(f"lease {lease} has expired or was revoked")
                held.expires_at = space.clock.monotonic() + held.ttl_s
        finally:
            space.deliver()

    def revoke_lease(self, lease: int) -> None:
        space = self._space_open()
        with space.lock:
            space.expire()
            space.drop_lease(lease)
        space.deliver()

    def close(self) -> None:
        """Cancel this object's watches; the last open object on a name drops its data."""
        if self._closed:
            return
        self._closed = True
        for watch in self._watches:
            watch.cancel()
        self._watches.clear()
        space = self._space
        with _spaces_lock, space.lock:
            space.open_stores -= 1
            if space.open_stores == 0:
                if _spaces.get(space.name) is space:
                    del _spaces[space.name]
                space.closed = True
                space.wake.notify()
                thread = space.thread
            else:
                thread = None
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def __enter__(self) -> MemoryMetadataStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
