"""The etcd driver against etcd failures: a restart under an active watch, losing the
member the client talks to, and an unreachable cluster. Real etcd processes, killed and
restarted by PID."""

from __future__ import annotations

import threading
import time

import pytest
from helpers.etcd import EtcdCluster
from helpers.procs import free_port
from helpers.wait import wait_until

from zbk.errors import ConfigError, MetadataUnavailableError
from zbk.metadata.coordination import LeaseKeeper
from zbk.metadata.etcd import EtcdStore
from zbk.metadata.uri import open_store

from .conftest import Recorder

pytestmark = pytest.mark.etcd


def _revisions_strictly_increase(events: list) -> bool:  # type: ignore[type-arg]
    revs = [e.revision for e in events]
    return all(a < b for a, b in zip(revs, revs[1:], strict=False))


def test_restart_under_watch_delivers_each_event_once(etcd_cluster_factory, unique_scope: str) -> None:  # type: ignore[no-untyped-def]
    cluster: EtcdCluster = etcd_cluster_factory(1)
    member = cluster.members[0]
    store = EtcdStore(cluster.endpoints, scope=unique_scope, deadline_s=30)
    recorder = Recorder()
    watch = store.watch("r/", recorder)
    try:
        store.put("r/before", b"1")
        recorder.wait_for(1)

        member.kill()
        # A call made while etcd is down waits and succeeds once it is back.
        outcome: list[object] = []
        during = threading.Thread(target=lambda: outcome.append(store.put("r/during-outage", b"2")))
        during.start()
        time.sleep(0.5)
        member.start()
        member.wait_healthy()
        # Written through another client at once, while our watch is still reconnecting.
        with EtcdStore(cluster.endpoints, scope=unique_scope) as other:
            other.put("r/reconnect-window", b"3")
        during.join(30)
        assert not during.is_alive() and isinstance(outcome[0], int), "the put made during the outage succeeded"

        store.put("r/after", b"4")
        events = recorder.wait_for(4, timeout_s=20)
        time.sleep(0.3)  # a duplicate would arrive now
        events = recorder.snapshot()
        assert sorted(e.key for e in events) == ["r/after", "r/before", "r/during-outage", "r/reconnect-window"]
        assert _revisions_strictly_increase(events), [(e.key, e.revision) for e in events]
        assert events[-1].key == "r/after"
        assert watch.last_revision == events[-1].revision

        # every kind of call works again on the same store object
        kv = store.get("r/after")
        assert kv is not None and kv.value == b"4"
        store.cas("r/after", b"5", kv.version)
        assert [kv.key for kv in store.list("r/")][:1] == ["r/after"]
        lease = store.grant_lease(5)
        store.keepalive(lease)
        store.revoke_lease(lease)
    finally:
        watch.cancel()
        store.close()


def test_watch_and_lease_survive_restart_with_keeper(etcd_cluster_factory, unique_scope: str) -> None:  # type: ignore[no-untyped-def]
    """A lease kept alive across a short outage keeps its key; the watch carries on."""
    cluster: EtcdCluster = etcd_cluster_factory(1)
    member = cluster.members[0]
    store = EtcdStore(cluster.endpoints, scope=unique_scope, deadline_s=30)
    lost = threading.Event()
    keeper = LeaseKeeper(store, ttl_s=5, on_lost=lost.set)
    try:
        store.put("bk/1", b"up", lease=keeper.start())
        member.kill()
        time.sleep(0.5)
        member.start()
        member.wait_healthy()
        time.sleep(2)  # several keep-alive rounds after the restart
        assert store.get("bk/1") is not None and not lost.is_set()
    finally:
        keeper.stop()
        store.close()


def test_an_outage_longer_than_the_ttl_is_not_a_lost_lease(etcd_cluster_factory, unique_scope: str) -> None:  # type: ignore[no-untyped-def]
    """etcd down for twice the lease's TTL: keep-alives get no answer, which is not the
    answer "expired". A restarted etcd extends every lease when its leader takes over, so
    the first answer after the outage says the lease lives, and the keeper keeps it."""
    cluster: EtcdCluster = etcd_cluster_factory(1)
    member = cluster.members[0]
    store = EtcdStore(cluster.endpoints, scope=unique_scope, deadline_s=1)  # each call gives up after 1 s
    lost = threading.Event()
    keeper = LeaseKeeper(store, ttl_s=2, on_lost=lost.set)
    try:
        store.put("out/1", b"up", lease=keeper.start())
        member.kill()
        time.sleep(4)  # twice the TTL without a single answer
        assert not lost.is_set(), "no answer is not an expiry"
        member.start()
        member.wait_healthy()
        time.sleep(2)  # keep-alive rounds after the restart
        assert not lost.is_set() and not keeper.lost
        kv = store.get("out/1")
        assert kv is not None and kv.value == b"up", "the lease and its key outlived the outage"
    finally:
        keeper.stop()
        store.close()


def test_losing_the_connected_member_of_a_cluster(etcd_cluster_factory, unique_scope: str) -> None:  # type: ignore[no-untyped-def]
    cluster: EtcdCluster = etcd_cluster_factory(3)
    store = open_store(cluster.uri(unique_scope), deadline_s=30)
    assert isinstance(store, EtcdStore)
    recorder = Recorder()
    watch = store.watch("f/", recorder)
    try:
        v = store.put("f/0", b"0")
        recorder.wait_for(1)
        victim = cluster.member(store.current_endpoint)
        victim.kill()

        for i in range(1, 6):
            store.put(f"f/{i}", str(i).encode())
        v = store.cas("f/0", b"changed", v)
        kv = store.get("f/0")
        assert kv is not None and kv.version == v
        assert len(store.list("f/")) == 6
        assert store.current_endpoint != victim.endpoint

        events = recorder.wait_for(7, timeout_s=20)
        time.sleep(0.3)
        events = recorder.snapshot()
        assert [e.key for e in events] == ["f/0", "f/1", "f/2", "f/3", "f/4", "f/5", "f/0"]
        assert _revisions_strictly_increase(events)
    finally:
        watch.cancel()
        store.close()


def test_unreachable_etcd_is_metadata_unavailable() -> None:
    start = time.monotonic()
    with pytest.raises(MetadataUnavailableError, match="127.0.0.1"):
        open_store(f"etcd://127.0.0.1:{free_port()}/zbk", deadline_s=1.0)
    assert time.monotonic() - start < 5


def test_bad_etcd_uri_is_config_error() -> None:
    with pytest.raises(ConfigError):
        open_store("etcd:///zbk")


def test_watch_keeps_trying_through_a_long_outage(etcd_cluster_factory, unique_scope: str) -> None:  # type: ignore[no-untyped-def]
    """An outage longer than the call deadline does not end a watch."""
    cluster: EtcdCluster = etcd_cluster_factory(1)
    member = cluster.members[0]
    store = EtcdStore(cluster.endpoints, scope=unique_scope, deadline_s=1.0)
    recorder = Recorder()
    watch = store.watch("lo/", recorder)
    try:
        member.kill()
        time.sleep(2.5)  # more than two whole deadlines
        member.start()
        member.wait_healthy()
        revision = wait_until(lambda: _put(store), timeout_s=10, message="etcd back")
        wait_until(lambda: revision in [e.revision for e in recorder.snapshot()], timeout_s=15,
                   message="the watch to deliver the put made after the outage")
    finally:
        watch.cancel()
        store.close()


def _put(store: EtcdStore) -> int | None:
    try:
        return store.put("lo/x", b"x")
    except MetadataUnavailableError:
        return None
