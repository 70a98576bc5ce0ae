"""The MetadataStore contract: one suite, run against the in-process store (memory://),
the embedded store and a real etcd (``store`` is parametrized over the drivers in
tests/metadata/conftest.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from helpers.spawn import run_racing
from helpers.wait import wait_until

from zbk.errors import (
    CorruptMetadataError,
    KeyExistsError,
    LeaseExpiredError,
    MetadataVersionError,
    NoSuchLedgerError,
    WatchCompactedError,
)
from zbk.metadata import layout
from zbk.metadata.coordination import (
    LeaderElection,
    LeaseKeeper,
    LeaseLock,
    allocate_ledger_id,
    cas_retry,
    current_leader,
)
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import (
    BookieEvent,
    BookieRegistration,
    Cookie,
    LedgerStore,
    delete_cookie,
    get_or_create_instance_id,
    list_bookies,
    read_cookie,
    register_bookie,
    unregister_bookie,
    watch_bookies,
    write_cookie,
)
from zbk.metadata.store import MetadataStore, iter_prefix

from .conftest import Recorder
from .workers import allocate_ids, cas_increments

Opener = Callable[..., MetadataStore]
LEASE_GONE_S = 6.0  # TTL 1 s + the store's expiry granularity (etcd checks every 0.5 s), with margin


def _md(ledger_id: int = 0, **kw: object) -> LedgerMetadata:
    args: dict[str, object] = dict(ledger_id=ledger_id, ensemble_size=3, write_quorum=2, ack_quorum=2,
                                   password=b"pw", fragments=((0, ("b1:1", "b2:1", "b3:1")),))
    args.update(kw)
    return LedgerMetadata(**args)  # type: ignore[arg-type]


# -- keys and values --------------------------------------------------------------------------
def test_get_absent_is_none(store: MetadataStore) -> None:
    assert store.get("nope") is None


def test_put_get_roundtrip_and_versions(store: MetadataStore) -> None:
    v1 = store.put("k", b"one")
    kv = store.get("k")
    assert kv is not None
    assert (kv.key, kv.value, kv.version, kv.create_revision, kv.lease) == ("k", b"one", v1, v1, None)
    v2 = store.put("k", b"")
    kv = store.get("k")
    assert kv is not None and v2 > v1
    assert (kv.value, kv.version, kv.create_revision) == (b"", v2, v1), "put keeps the create revision"


def test_binary_values_survive(store: MetadataStore) -> None:
    blob = bytes(range(256)) * 40
    store.put("bin", blob)
    kv = store.get("bin")
    assert kv is not None and kv.value == blob


def test_create_only_if_absent(store: MetadataStore) -> None:
    v = store.create("c", b"first")
    with pytest.raises(KeyExistsError):
        store.create("c", b"second")
    with pytest.raises(MetadataVersionError):  # KeyExistsError is a version conflict
        store.create("c", b"third")
    kv = store.get("c")
    assert kv is not None and (kv.value, kv.version) == (b"first", v)


def test_cas(store: MetadataStore) -> None:
    v1 = store.create("x", b"1")
    v2 = store.cas("x", b"2", v1)
    assert v2 > v1
    with pytest.raises(MetadataVersionError):
        store.cas("x", b"stale", v1)
    kv = store.get("x")
    assert kv is not None and (kv.value, kv.version) == (b"2", v2)


def test_cas_on_missing_key_fails(store: MetadataStore) -> None:
    for version in (0, 1, store.revision() + 5):
        with pytest.raises(MetadataVersionError):
            store.cas("missing", b"v", version)
    assert store.get("missing") is None


def test_failed_writes_do_not_change_revision(store: MetadataStore) -> None:
    v = store.create("f", b"1")
    before = store.revision()
    with pytest.raises(MetadataVersionError):
        store.cas("f", b"2", v + 100)
    with pytest.raises(KeyExistsError):
        store.create("f", b"3")
    assert store.revision() == before


def test_delete(store: MetadataStore) -> None:
    assert store.delete("gone") is False
    with pytest.raises(MetadataVersionError):
        store.delete("gone", version=1)
    v = store.put("d", b"1")
    with pytest.raises(MetadataVersionError):
        store.delete("d", version=v + 1)
    assert store.get("d") is not None, "a failed delete-if-version keeps the key"
    assert store.delete("d", version=v) is True
    assert store.get("d") is None
    store.put("d", b"again")
    assert store.delete("d") is True
    assert store.get("d") is None


def test_revision_is_monotonic_and_versions_come_from_it(store: MetadataStore) -> None:
    seen = [store.revision()]
    for i in range(5):
        seen.append(store.put(f"r/{i}", b"x"))
        assert store.revision() >= seen[-1]
    seen.append(store.cas("r/0", b"y", seen[1]))
    store.delete("r/1")
    seen.append(store.revision())
    assert seen == sorted(seen) and len(set(seen)) == len(seen), seen


def test_scopes_are_isolated(store: MetadataStore, store_uri: str) -> None:
    from zbk.metadata.uri import open_store

    other_uri = store_uri.replace("scope=", "scope=other") if "scope=" in store_uri else store_uri + "other"
    other = open_store(other_uri)
    try:
        store.put("shared", b"mine")
        assert other.get("shared") is None
        assert other.list("") == []
        other.put("shared", b"theirs")
        kv = store.get("shared")
        assert kv is not None and kv.value == b"mine"
    finally:
        other.close()


# -- listing ------------------------------------------------------------------------------------
def test_list_is_sorted_and_bounded_by_prefix(store: MetadataStore) -> None:
    for key in ["p/b", "p/a", "p/c/d", "p", "p0", "o/z", "p/\u00e9", "p/z"]:
        store.put(key, key.encode())
    keys = [kv.key for kv in store.list("p/")]
    # byte order of UTF-8, as etcd sorts: "é" (0xC3 0xA9) sorts after "z"
    assert keys == ["p/a", "p/b", "p/c/d", "p/z", "p/\u00e9"]
    assert all(kv.value == kv.key.encode() for kv in store.list("p/"))
    assert [kv.key for kv in store.list("p")] == ["p", "p/a", "p/b", "p/c/d", "p/z", "p/\u00e9", "p0"]
    assert store.list("q/") == []


def test_list_pagination(store: MetadataStore) -> None:
    names = [f"pg/{i:03d}" for i in range(25)]
    for name in reversed(names):
        store.put(name, b"v")
    store.put("pg0", b"outside")
    assert [kv.key for kv in store.list("pg/", limit=10)] == names[:10]
    assert [kv.key for kv in store.list("pg/", start_after="pg/009", limit=10)] == names[10:20]
    assert [kv.key for kv in store.list("pg/", start_after="pg/0095", limit=100)] == names[10:]
    assert store.list("pg/", start_after="pg/024") == []
    assert [kv.key for kv in store.list("pg/", start_after="a", limit=2)] == names[:2], "start_after below prefix"
    assert [kv.key for kv in iter_prefix(store, "pg/", page=7)] == names


# -- watches ------------------------------------------------------------------------------------
def test_watch_sees_puts_and_deletes_in_order(store: MetadataStore, recorder: Recorder) -> None:
    store.put("w/before", b"0")
    w = store.watch("w/", recorder)
    try:
        r1 = store.put("w/a", b"1")
        store.put("other", b"x")
        r2 = store.put("w/a", b"2")
        r3 = store.put("w/b", b"3")
        store.delete("w/a")
        events = recorder.wait_for(4)
        time.sleep(0.2)  # nothing else may arrive
        events = recorder.snapshot()
        assert [(e.kind, e.key, e.value) for e in events] == [
            ("put", "w/a", b"1"), ("put", "w/a", b"2"), ("put", "w/b", b"3"), ("delete", "w/a", None)]
        assert [e.revision for e in events[:3]] == [r1, r2, r3]
        assert events[3].revision > r3
        assert w.last_revision == events[3].revision
    finally:
        w.cancel()


def test_watch_from_revision_replays_then_follows(store: MetadataStore, recorder: Recorder) -> None:
    revs = [store.put(f"h/{i}", str(i).encode()) for i in range(5)]
    w = store.watch("h/", recorder, start_revision=revs[2])
    try:
        # start_revision - 1 until the first event is delivered; a store that delivers on its
        # own thread (memory://) may already have delivered part of the replay by now.
        assert w.last_revision in (revs[2] - 1, *revs[2:]), w.last_revision
        recorder.wait_for(3)
        assert w.last_revision >= revs[4]
        later = store.put("h/5", b"5")
        events = recorder.wait_for(4)
        assert [e.revision for e in events] == [revs[2], revs[3], revs[4], later]
        assert [e.key for e in events] == ["h/2", "h/3", "h/4", "h/5"]
    finally:
        w.cancel()


def test_watch_resume_after_cancel_is_exactly_once(store: MetadataStore) -> None:
    """Resuming at last_revision + 1 loses nothing and repeats nothing."""
    first, second = Recorder(), Recorder()
    start = store.revision() + 1
    w = store.watch("e/", first, start_revision=start)
    for i in range(10):
        store.put(f"e/{i}", b"x")
    first.wait_for(10)
    w.cancel()
    for i in range(10, 15):
        store.put(f"e/{i}", b"x")
    w2 = store.watch("e/", second, start_revision=w.last_revision + 1)
    try:
        second.wait_for(5)
        time.sleep(0.2)
        keys = [e.key for e in first.snapshot() + second.snapshot()]
        assert keys == [f"e/{i}" for i in range(15)]
    finally:
        w2.cancel()


def test_watch_under_concurrent_writers_exactly_once(store: MetadataStore, opener: Opener,
                                                    recorder: Recorder) -> None:
    w = store.watch("c/", recorder)
    writers = [opener() for _ in range(3)]
    revisions: list[int] = []
    lock = threading.Lock()

    def write(s: MetadataStore, n: int) -> None:
        for i in range(40):
            r = s.put(f"c/{n}/{i}", b"v")
            with lock:
                revisions.append(r)

    threads = [threading.Thread(target=write, args=(s, n)) for n, s in enumerate(writers)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        events = recorder.wait_for(120, timeout_s=20)
        time.sleep(0.2)
        events = recorder.snapshot()
        assert [e.revision for e in events] == sorted(revisions), "each write once, in revision order"
    finally:
        w.cancel()


def test_watch_cancel_stops_delivery(store: MetadataStore, recorder: Recorder) -> None:
    w = store.watch("s/", recorder)
    store.put("s/1", b"1")
    recorder.wait_for(1)
    w.cancel()
    store.put("s/2", b"2")
    time.sleep(0.3)
    assert recorder.keys() == [("put", "s/1")]


def test_watch_callback_may_cancel_and_failures_do_not_stop_it(store: MetadataStore) -> None:
    got: list[str] = []
    holder: dict[str, object] = {}

    def callback(ev: object) -> None:
        key = ev.key  # type: ignore[attr-defined]
        got.append(key)
        if key == "cb/boom":
            raise RuntimeError("a buggy callback")
        if key == "cb/stop":
            holder["w"].cancel()  # type: ignore[attr-defined]

    holder["w"] = store.watch("cb/", callback)
    for key in ("cb/boom", "cb/after", "cb/stop", "cb/never"):
        store.put(key, b"")
    wait_until(lambda: len(got) >= 3, message="three callbacks")
    time.sleep(0.3)
    assert got == ["cb/boom", "cb/after", "cb/stop"]


def test_watch_below_compaction_raises(store: MetadataStore, recorder: Recorder) -> None:
    start = store.put("cp/a", b"1")
    for i in range(3):
        store.put("cp/a", str(i).encode())
    top = store.revision()
    store.compact(top)  # type: ignore[attr-defined]  # both drivers offer compact()
    for too_old in (start, top - 1):
        with pytest.raises(WatchCompactedError):
            store.watch("cp/", recorder, start_revision=too_old)
    w = store.watch("cp/", recorder, start_revision=top)
    try:
        store.put("cp/b", b"ok")
        assert [(e.key, e.value) for e in recorder.wait_for(2)] == [("cp/a", b"2"), ("cp/b", b"ok")]
    finally:
        w.cancel()


# -- leases -------------------------------------------------------------------------------------
def test_lease_keys_vanish_after_expiry(store: MetadataStore, recorder: Recorder) -> None:
    lease = store.grant_lease(1)
    store.put("l/a", b"1", lease=lease)
    store.create("l/b", b"2", lease=lease)
    store.put("l/free", b"3")
    kv = store.get("l/a")
    assert kv is not None and kv.lease == lease
    w = store.watch("l/", recorder)
    try:
        wait_until(lambda: store.get("l/a") is None, timeout_s=LEASE_GONE_S, message="lease expiry")
        assert store.get("l/b") is None
        assert [kv.key for kv in store.list("l/")] == ["l/free"]
        events = recorder.wait_for(2, timeout_s=LEASE_GONE_S)
        assert sorted((e.kind, e.key) for e in events) == [("delete", "l/a"), ("delete", "l/b")]
        with pytest.raises(LeaseExpiredError):
            store.keepalive(lease)
        with pytest.raises(LeaseExpiredError):
            store.put("l/c", b"late", lease=lease)
    finally:
        w.cancel()


def test_keepalive_extends_lease(store: MetadataStore) -> None:
    lease = store.grant_lease(1)
    store.put("ka", b"1", lease=lease)
    until = time.monotonic() + 2.5
    while time.monotonic() < until:
        store.keepalive(lease)
        assert store.get("ka") is not None
        time.sleep(0.2)
    assert store.get("ka") is not None, "kept alive past its TTL"
    store.revoke_lease(lease)


def test_revoke_deletes_keys_and_is_idempotent(store: MetadataStore) -> None:
    lease = store.grant_lease(30)
    store.put("rv/1", b"1", lease=lease)
    store.put("rv/2", b"2", lease=lease)
    store.revoke_lease(lease)
    assert store.get("rv/1") is None and store.list("rv/") == []
    store.revoke_lease(lease)  # absent: ignored
    with pytest.raises(LeaseExpiredError):
        store.keepalive(lease)
    with pytest.raises(LeaseExpiredError):
        store.create("rv/3", b"3", lease=lease)


def test_put_without_lease_detaches_key(store: MetadataStore) -> None:
    lease = store.grant_lease(30)
    store.put("dt", b"1", lease=lease)
    store.put("dt", b"2")
    store.revoke_lease(lease)
    kv = store.get("dt")
    assert kv is not None and kv.value == b"2" and kv.lease is None


def test_lease_ids_are_unique_across_store_objects(store: MetadataStore, opener: Opener) -> None:
    other = opener()
    ids = [store.grant_lease(5) for _ in range(5)] + [other.grant_lease(5) for _ in range(5)]
    assert len(set(ids)) == 10 and all(i > 0 for i in ids)
    for i in ids:
        store.revoke_lease(i)


def test_lease_keeper_keeps_and_revokes(store: MetadataStore) -> None:
    lost: list[bool] = []
    keeper = LeaseKeeper(store, ttl_s=2, on_lost=lambda: lost.append(True))
    lease = keeper.start()
    store.put("kp", b"1", lease=lease)
    time.sleep(3)
    assert store.get("kp") is not None and not keeper.lost
    keeper.stop()
    assert store.get("kp") is None, "stop() revokes"
    assert lost == []


def test_lease_keeper_reports_loss(store: MetadataStore) -> None:
    lost = threading.Event()
    keeper = LeaseKeeper(store, ttl_s=1, on_lost=lost.set)
    lease = keeper.start()
    try:
        store.revoke_lease(lease)  # as if it had expired
        assert lost.wait(5), "on_lost was called"
        assert keeper.lost
    finally:
        keeper.stop()


# -- locks and election ----------------------------------------------------------------------------
def test_lease_lock(store: MetadataStore, opener: Opener) -> None:
    other_store = opener()
    keeper = LeaseKeeper(other_store, ttl_s=1)
    l1, l2 = store.grant_lease(30), keeper.start()
    a, b = LeaseLock(store, "replicator-a"), LeaseLock(other_store, "replicator-b")
    key = layout.underreplicated_lock_key(7)
    assert a.try_acquire(key, l1)
    assert a.try_acquire(key, l1), "re-acquiring our own lock is fine"
    assert not b.try_acquire(key, l2)
    assert a.holder(key) == b.holder(key) == "replicator-a"
    assert a.release(key) and not a.release(key)
    assert b.try_acquire(key, l2) and b.holds(key)
    # b dies: its lease expires and the lock frees itself
    keeper.stop(revoke=False)
    wait_until(lambda: a.holder(key) is None, timeout_s=LEASE_GONE_S, message="lock to expire")
    assert a.try_acquire(key, l1)
    assert not b.release(key), "b's lock was taken over; release must not delete a's"
    assert a.holder(key) == "replicator-a"
    store.revoke_lease(l1)


def test_election_one_leader_and_takeover(store: MetadataStore, opener: Opener) -> None:
    s2 = opener()
    keeper = LeaseKeeper(s2, ttl_s=1)
    lease1, lease2 = store.grant_lease(30), keeper.start()
    lost = threading.Event()
    e1 = LeaderElection(store, "auditor-1", lease1)
    e2 = LeaderElection(s2, "auditor-2", lease2, on_lost=lost.set)
    try:
        assert e2.campaign(timeout_s=5)
        assert not e1.campaign(timeout_s=0.3), "exactly one leader"
        assert e2.is_leader() and not e1.is_leader()
        assert e1.leader() == e2.leader() == current_leader(store) == "auditor-2"
        # the leader dies (its lease expires); the other takes over
        keeper.stop(revoke=False)
        result: list[bool] = []
        t = threading.Thread(target=lambda: result.append(e1.campaign(timeout_s=LEASE_GONE_S + 4)))
        t.start()
        t.join()
        assert result == [True] and e1.is_leader() and e1.leader() == "auditor-1"
        assert lost.wait(5) and not e2.is_leader(), "the old leader learns it lost"
        # resign hands over at once
        lease3 = s2.grant_lease(30)
        e3 = LeaderElection(s2, "auditor-3", lease3)
        waiter = threading.Thread(target=lambda: result.append(e3.campaign(timeout_s=10)))
        waiter.start()
        time.sleep(0.2)
        e1.resign()
        waiter.join()
        assert result == [True, True] and e3.leader() == "auditor-3" and not e1.is_leader()
        e3.close()
        assert current_leader(store) is None
    finally:
        keeper.stop()
        e1.close()
        e2.close()


# -- allocation and CAS races ---------------------------------------------------------------------
def test_allocate_ledger_id_counts_from_one(store: MetadataStore) -> None:
    assert [allocate_ledger_id(store) for _ in range(3)] == [1, 2, 3]
    kv = store.get(layout.IDGEN_LEDGER)
    assert kv is not None and kv.value == b"3"


def test_allocate_ledger_id_rejects_garbage_counter(store: MetadataStore) -> None:
    store.put(layout.IDGEN_LEDGER, b"\xffnot a number")
    with pytest.raises(CorruptMetadataError):
        allocate_ledger_id(store)


def test_cas_retry_threads_lose_no_update(store: MetadataStore, opener: Opener) -> None:
    stores = [opener() for _ in range(4)]

    def bump(s: MetadataStore) -> None:
        for _ in range(25):
            cas_retry(s, "ctr", lambda v: str(int(v or b"0") + 1).encode())

    threads = [threading.Thread(target=bump, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    kv = store.get("ctr")
    assert kv is not None and kv.value == b"100"


def _skip_in_process_store(store_uri: str) -> None:
    if store_uri.startswith("memory://"):
        pytest.skip("a memory:// store lives in one process: other processes cannot open it")


@pytest.mark.slow
def test_processes_racing_cas_lose_no_update(store: MetadataStore, store_uri: str) -> None:
    _skip_in_process_store(store_uri)
    store.create("race", b"0")
    procs, per = 4, 100
    conflicts = run_racing(cas_increments, [(store_uri, "race", per)] * procs)
    kv = store.get("race")
    assert kv is not None and int(kv.value) == procs * per, f"lost updates (conflicts seen: {conflicts})"


@pytest.mark.slow
def test_two_processes_allocate_distinct_ledger_ids(store: MetadataStore, store_uri: str) -> None:
    _skip_in_process_store(store_uri)
    a, b = run_racing(allocate_ids, [(store_uri, 1000)] * 2)
    assert len(a) == len(b) == 1000
    assert a == sorted(a) and b == sorted(b), "each process sees increasing ids"
    assert set(a) | set(b) == set(range(1, 2001)), "2,000 distinct ids, none skipped"


# -- ledger metadata --------------------------------------------------------------------------
def test_ledger_store_roundtrip_and_cas(store: MetadataStore) -> None:
    ledgers = LedgerStore(store)
    md, v = ledgers.create(_md(custom_metadata={"app": b"orders"}))
    assert md.ledger_id >= 1 and md.creator_token and md.ctime_ms > 0
    read, rv = ledgers.read(md.ledger_id)
    assert (read, rv) == (md, v)
    closed = md.closed(last_entry_id=9, length=100)
    v2 = ledgers.write(closed, v)
    with pytest.raises(MetadataVersionError):
        ledgers.write(md.with_state("IN_RECOVERY"), v)  # a stale writer loses
    assert ledgers.read(md.ledger_id) == (closed, v2)
    md2, _ = ledgers.create(_md())
    assert md2.ledger_id > md.ledger_id
    assert list(ledgers.list_ids()) == [md.ledger_id, md2.ledger_id]
    assert list(ledgers.list_ids(start_after=md.ledger_id)) == [md2.ledger_id]
    with pytest.raises(MetadataVersionError):
        ledgers.delete(md.ledger_id, version=v)
    ledgers.delete(md.ledger_id, version=v2)
    with pytest.raises(NoSuchLedgerError, match=str(md.ledger_id)):
        ledgers.read(md.ledger_id)
    with pytest.raises(NoSuchLedgerError):
        ledgers.write(closed, v2)
    with pytest.raises(NoSuchLedgerError):
        ledgers.delete(md.ledger_id)
    assert list(ledgers.list_ids()) == [md2.ledger_id]


def test_ledger_create_recognizes_its_own_retried_create(store: MetadataStore) -> None:
    ledgers = LedgerStore(store)
    md, v = ledgers.create(_md(ledger_id=4242, creator_token=b"me"), allocate_id=False)
    assert ledgers.create(md, allocate_id=False) == (md, v), "a retry after a lost reply is a success"
    with pytest.raises(KeyExistsError):
        ledgers.create(_md(ledger_id=4242, creator_token=b"someone else"), allocate_id=False)


def test_ledger_create_skips_ids_taken_outside_the_allocator(store: MetadataStore) -> None:
    ledgers = LedgerStore(store)
    ledgers.create(_md(ledger_id=1, creator_token=b"manual"), allocate_id=False)
    md, _ = ledgers.create(_md())
    assert md.ledger_id == 2


def test_ledger_watch(store: MetadataStore) -> None:
    ledgers = LedgerStore(store)
    md, v = ledgers.create(_md())
    one: list[tuple[LedgerMetadata | None, int]] = []
    every: list[tuple[int, LedgerMetadata | None]] = []
    w1 = ledgers.watch(md.ledger_id, lambda m, r: one.append((m, r)))
    w2 = ledgers.watch_all(lambda lid, m, r: every.append((lid, m)))
    try:
        other, _ = ledgers.create(_md())
        closed = md.closed(last_entry_id=-1, length=0)
        v2 = ledgers.write(closed, v)
        store.put(layout.ledger_key(99), b"garbage")  # logged and skipped, never a crash
        ledgers.delete(md.ledger_id)
        wait_until(lambda: len(one) >= 2 and len(every) >= 3, message="ledger events")
        time.sleep(0.2)
        assert one == [(closed, v2), (None, one[1][1])]
        assert every == [(other.ledger_id, other), (md.ledger_id, closed), (md.ledger_id, None)]
    finally:
        w1.cancel()
        w2.cancel()


# -- bookies, cookies, instance id ----------------------------------------------------------------
def test_bookie_registration_lifecycle(store: MetadataStore, opener: Opener) -> None:
    events: list[BookieEvent] = []
    w = watch_bookies(store, events.append)
    lease = store.grant_lease(1)
    reg = BookieRegistration("127.0.0.1:3181", rack="/r1", http_url="http://127.0.0.1:8000")
    try:
        register_bookie(store, reg, lease)
        register_bookie(store, BookieRegistration("127.0.0.1:3182"), lease)
        assert [b.bookie_id for b in list_bookies(store)] == ["127.0.0.1:3181", "127.0.0.1:3182"]
        assert list_bookies(store)[0] == reg
        # same id, another live process: refused
        other = opener()
        other_lease = other.grant_lease(30)
        with pytest.raises(KeyExistsError, match="already registered"):
            register_bookie(other, reg, other_lease)
        other.revoke_lease(other_lease)
        # writable -> readonly moves the key
        ro = BookieRegistration("127.0.0.1:3181", rack="/r1", state="readonly")
        register_bookie(store, ro, lease)
        assert [b.bookie_id for b in list_bookies(store)] == ["127.0.0.1:3182"]
        assert list_bookies(store, readonly=True) == [ro]
        unregister_bookie(store, "127.0.0.1:3181")
        assert list_bookies(store, readonly=True) == []
        # the last bookie dies: its lease expires and the watch says so
        wait_until(lambda: list_bookies(store) == [], timeout_s=LEASE_GONE_S, message="registration expiry")
        wait_until(lambda: len(events) >= 6, timeout_s=LEASE_GONE_S, message="bookie events")
        time.sleep(0.2)
        assert [(e.kind, e.bookie_id, e.readonly) for e in events] == [
            ("registered", "127.0.0.1:3181", False), ("registered", "127.0.0.1:3182", False),
            ("registered", "127.0.0.1:3181", True), ("unregistered", "127.0.0.1:3181", False),
            ("unregistered", "127.0.0.1:3181", True), ("unregistered", "127.0.0.1:3182", False),
        ]
        assert events[0].registration == reg and events[2].registration == ro
        assert events[3].registration is None
    finally:
        w.cancel()


def test_cookies(store: MetadataStore) -> None:
    instance = get_or_create_instance_id(store)
    cookie = Cookie.new("127.0.0.1:3181", instance, journal_dirs=["/j"], ledger_dirs=["/l1", "/l2"],
                        index_dirs=["/l1", "/l2"])
    assert read_cookie(store, cookie.bookie_id) is None
    v = write_cookie(store, cookie)
    assert read_cookie(store, cookie.bookie_id) == (cookie, v)
    with pytest.raises(KeyExistsError):
        write_cookie(store, cookie)
    moved = Cookie(cookie.bookie_id, instance, ("/j",), ("/l1",), ("/l1",), cookie.incarnation)
    assert cookie.differences(moved) == ["ledger_dirs: ('/l1', '/l2') != ('/l1',)",
                                         "index_dirs: ('/l1', '/l2') != ('/l1',)"]
    v2 = write_cookie(store, moved, version=v)
    with pytest.raises(MetadataVersionError):
        write_cookie(store, cookie, version=v)
    assert read_cookie(store, cookie.bookie_id) == (moved, v2)
    store.put(layout.cookie_key("bad"), b"\x00garbage")
    with pytest.raises(CorruptMetadataError, match="bookie bad"):
        read_cookie(store, "bad")
    assert delete_cookie(store, cookie.bookie_id, version=v2)


def test_instance_id_is_made_once(store: MetadataStore, opener: Opener) -> None:
    first = get_or_create_instance_id(store)
    assert len(first) == 32
    assert get_or_create_instance_id(opener()) == first
