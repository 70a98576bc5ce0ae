"""Coordination recipes on top of any MetadataStore (they use the protocol only).

* :func:`cas_retry` — read-modify-write of one key by compare-and-set, retried with
  jittered backoff on conflicts.
* :func:`allocate_ledger_id` — ledger ids unique across every process of a cluster:
  a CAS increment of ``idgen/ledger`` (decimal text). Ids start at 1.
* :class:`LeaseKeeper` — grants a lease and keeps it alive from a thread, every ttl/3;
  tells its owner once when the lease is lost.
* :class:`LeaseLock` — locks that are keys created with the holder's lease (the
  under-replication locks): they vanish when released or when the holder dies.
* :class:`LeaderElection` — one leader cluster-wide (the auditor): the leader is whoever
  created the election key with its lease; the others wait on a watch of that key.

The lease-based recipes share one honest limit: a holder learns that its lease is gone
only when a keep-alive fails (or its watch sees the key deleted), so for a short while
after expiry it may still believe it holds the lock. Every state change they guard is
itself a compare-and-set, so that window can waste work but cannot corrupt metadata.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

from zbk import limits
from zbk.backoff import Backoff
from zbk.clock import SYSTEM_CLOCK, Clock
from zbk.errors import (
    CorruptMetadataError,
    KeyExistsError,
    LeaseExpiredError,
    MetadataError,
    MetadataVersionError,
)
from zbk.metadata import layout
from zbk.metadata.store import MetadataStore, Watch, WatchEvent

log = logging.getLogger(__name__)


def cas_retry(store: MetadataStore, key: str, update: Callable[[bytes | None], bytes], *,
              attempts: int = limits.metadata_cas_attempts_max, clock: Clock = SYSTEM_CLOCK,
              rng: random.Random | None = None) -> tuple[bytes, int]:
    """Set ``key`` to ``update(current value or None)`` atomically; returns (value, version).

    ``update`` may run several times (once per conflict) and must be a pure function of
    its input. Raises MetadataVersionError after ``attempts`` lost races."""
    # Full jitter spreads the losers out so that one of them wins the next round.
    backoff = Backoff(limits.metadata_cas_backoff_s_min, limits.metadata_cas_backoff_s_max, jitter=1.0,
                      attempts_max=attempts, clock=clock, rng=rng)
    while True:
        kv = store.get(key)
        new = update(None if kv is None else kv.value)
        try:
            if kv is None:
                return new, store.create(key, new)
            return new, store.cas(key, new, kv.version)
        except MetadataVersionError:  # KeyExistsError included
            delay = backoff.fail()
            if backoff.exhausted:
                raise MetadataVersionError(f"key {key!r}: gave up after {attempts} conflicting updates") from None
            clock.sleep(delay)


def allocate_ledger_id(store: MetadataStore) -> int:
    """A ledger id no other caller, in any process, has been or will be given."""
    value, _ = cas_retry(store, layout.IDGEN_LEDGER, _next_ledger_id)
    return int(value)


def _next_ledger_id(current: bytes | None) -> bytes:
    if current is None:
        return b"1"
    try:
        last = int(current.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise CorruptMetadataError(f"{layout.IDGEN_LEDGER}: not a decimal number: {current[:40]!r}") from None
    if not 0 <= last < limits.ledger_id_max:
        raise CorruptMetadataError(f"{layout.IDGEN_LEDGER}: value {last} out of range")
    return str(last + 1).encode("ascii")


class LeaseKeeper:
    """A lease kept alive by a background thread.

    ``start()`` grants the lease (errors reach the caller) and returns its id. The thread
    refreshes it every ttl/3; each refresh may take until the lease would expire (at least
    ``limits.lease_refresh_timeout_s_min``), failing over between etcd members meanwhile, so that one
    slow member cannot use up the TTL. When the store answers that the lease is gone, it
    counts as lost: ``lost`` turns True, ``on_lost`` is called once (from the keeper
    thread) and the thread ends. A store that does not answer is not an answer, as a
    ZooKeeper disconnection is not a session expiry: the keeper logs it, retries every
    ttl/6, and learns the lease's fate from the first answer (etcd extends every lease
    when a new leader takes over, so a lease can outlive an outage longer than its TTL).
    ``stop()`` ends the thread and revokes the lease, deleting its keys."""

    def __init__(self, store: MetadataStore, ttl_s: int = limits.metadata_lease_ttl_s_default, *,
                 on_lost: Callable[[], None] | None = None) -> None:
        assert ttl_s >= 1, ttl_s
        self._store = store
        self.ttl_s = ttl_s
        self._on_lost = on_lost
        self._lease: int | None = None
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lease(self) -> int:
        assert self._lease is not None, "LeaseKeeper.start() first"
        return self._lease

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def start(self) -> int:
        assert self._thread is None, "a LeaseKeeper starts once"
        self._lease = self._store.grant_lease(self.ttl_s)
        self._thread = threading.Thread(target=self._run, name=f"zbk-lease-keeper:{self._lease}", daemon=True)
        self._thread.start()
        return self._lease

    def _run(self) -> None:
        assert self._lease is not None
        interval = self.ttl_s / 3
        last_ok = time.monotonic()
        while not self._stop.wait(interval):
            budget = max(limits.lease_refresh_timeout_s_min, last_ok + self.ttl_s - time.monotonic())
            try:
                self._store.keepalive(self._lease, timeout_s=budget)
            except LeaseExpiredError:
                self._mark_lost("the metadata store says it expired")
                return
            except MetadataError as e:
                interval = self.ttl_s / 6  # retry sooner while the store does not answer
                silent = time.monotonic() - last_ok
                if silent >= self.ttl_s:
                    log.warning("lease %d: no keep-alive answered for %.1f s (TTL %d s); it may have "
                                "expired, the next answer tells: %s", self._lease, silent, self.ttl_s, e)
                else:
                    log.warning("lease %d: keep-alive failed, retrying: %s", self._lease, e)
                continue
            if interval != self.ttl_s / 3:
                log.info("lease %d: keep-alive answered again after %.1f s", self._lease,
                         time.monotonic() - last_ok)
            last_ok = time.monotonic()
            interval = self.ttl_s / 3

    def _mark_lost(self, why: str) -> None:
        log.warning("lease %s lost: %s", self._lease, why)
        self._lost.set()
        if self._on_lost is not None and not self._stop.is_set():
            try:
                self._on_lost()
            except Exception:
                log.exception("lease %s: on_lost callback failed", self._lease)

    def stop(self, *, revoke: bool = True) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        if revoke and self._lease is not None:
            try:
                self._store.revoke_lease(self._lease)
            except MetadataError as e:
                log.warning("lease %d: revoke failed (it will expire): %s", self._lease, e)

    def __enter__(self) -> LeaseKeeper:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LeaseLock:
    """Locks on keys, held by ``owner`` and bound to a lease.

    A lock is the key itself, created with the holder's lease and the owner id as value:
    at most one holder at a time (create-if-absent), and a dead holder's locks vanish
    with its lease."""

    def __init__(self, store: MetadataStore, owner: str) -> None:
        self._store = store
        self.owner = owner
        self._held: dict[str, int] = {}  # key -> version of our lock key
        self._lock = threading.Lock()

    def try_acquire(self, key: str, lease: int) -> bool:
        """True if we now hold the lock on ``key``; False if someone else does.
        Raises LeaseExpiredError if ``lease`` is gone."""
        try:
            version = self._store.create(key, self.owner.encode(), lease=lease)
        except KeyExistsError:
            kv = self._store.get(key)
            # A create retried after a lost reply finds its own key: that is ours.
            if kv is None or kv.lease != lease or kv.value != self.owner.encode():
                return False
            version = kv.version
        with self._lock:
            self._held[key] = version
        return True

    def release(self, key: str) -> bool:
        """Release a lock we hold; False if we did not hold it (any more)."""
        with self._lock:
            version = self._held.pop(key, None)
        if version is None:
            return False
        try:
            return self._store.delete(key, version=version)
        except MetadataVersionError:
            return False  # our lease expired and someone else took it

    def holds(self, key: str) -> bool:
        """Whether we believe we hold ``key`` (acquired and not released)."""
        with self._lock:
            return key in self._held

    def holder(self, key: str) -> str | None:
        """The owner id holding ``key`` now, or None."""
        kv = self._store.get(key)
        return None if kv is None else kv.value.decode(errors="replace")


class LeaderElection:
    """Leader election on one key (default ``auditor/leader``).

    The leader is the candidate whose create-with-lease of the key succeeded; its id is
    the value. Others wait on a watch of the key (and re-check every
    ``limits.election_poll_interval_s`` in case a watch event is late) and try again when it is
    deleted — by ``resign()`` or by the leader's lease expiring. A leader that sees its
    key deleted or overwritten stops being leader and ``on_lost`` is called (from a store
    thread)."""

    def __init__(self, store: MetadataStore, candidate_id: str, lease: int, *,
                 key: str = layout.AUDITOR_LEADER, on_lost: Callable[[], None] | None = None) -> None:
        self._store = store
        self.candidate_id = candidate_id
        self.lease = lease
        self.key = key
        self._on_lost = on_lost
        self._lock = threading.Lock()
        self._version: int | None = None  # version of our leader key while we lead
        self._changed = threading.Event()
        self._watch: Watch | None = None

    def campaign(self, timeout_s: float | None = None) -> bool:
        """Block until we are leader (True) or ``timeout_s`` passes (False; 0 = one try).
        Raises LeaseExpiredError if our lease is gone."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._ensure_watch()
        while True:
            self._changed.clear()
            if self._try_once():
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            poll_s = limits.election_poll_interval_s
            self._changed.wait(poll_s if left is None else min(left, poll_s))

    def _ensure_watch(self) -> None:
        if self._watch is None:
            self._watch = self._store.watch(self.key, self._on_event)

    def _try_once(self) -> bool:
        me = self.candidate_id.encode()
        try:
            version = self._store.create(self.key, me, lease=self.lease)
        except KeyExistsError:
            kv = self._store.get(self.key)
            if kv is None or kv.lease != self.lease or kv.value != me:
                return False
            version = kv.version  # our own create, retried after a lost reply
        with self._lock:
            self._version = version
        log.info("%s: now leader on %s", self.candidate_id, self.key)
        return True

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.key != self.key:
            return  # another key that merely shares the prefix
        lost = False
        with self._lock:
            if self._version is not None and ev.revision > self._version:
                self._version = None
                lost = True
        self._changed.set()
        if lost:
            log.warning("%s: lost leadership on %s (%s at revision %d)", self.candidate_id, self.key,
                        ev.kind, ev.revision)
            if self._on_lost is not None:
                self._on_lost()

    def is_leader(self) -> bool:
        """Whether we lead, as far as our watch has told us."""
        with self._lock:
            return self._version is not None

    def leader(self) -> str | None:
        """The current leader's id (read from the store), or None."""
        return current_leader(self._store, self.key)

    def resign(self) -> None:
        """Stop leading (if we do): delete our key so that another candidate takes over."""
        with self._lock:
            version, self._version = self._version, None
        if version is not None:
            try:
                self._store.delete(self.key, version=version)
            except MetadataVersionError:
                pass  # already gone or taken over

    def close(self) -> None:
        self.resign()
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None


def current_leader(store: MetadataStore, key: str = layout.AUDITOR_LEADER) -> str | None:
    """Who leads the election on ``key`` now (e.g. ``zbk shell whoisauditor``), or None."""
    kv = store.get(key)
    return None if kv is None else kv.value.decode(errors="replace")
