"""The under-replication registry on the embedded store: marks merge, clear only at the
version read, locks are lease-bound, the recovery delay round-trips."""

from __future__ import annotations

import pytest

from zbk.errors import BadRequestError, CorruptMetadataError
from zbk.metadata import layout
from zbk.metadata.uri import open_store
from zbk.recovery.underreplication import (
    UnderReplicationRegistry,
    get_recovery_delay,
    init_recovery_delay,
    set_recovery_delay,
)


@pytest.fixture
def store(sqlite_uri: str):
    s = open_store(sqlite_uri)
    try:
        yield s
    finally:
        s.close()


def test_mark_merges_and_lists(store) -> None:
    reg = UnderReplicationRegistry(store, "w1")
    reg.mark(7, ["b:1"])
    reg.mark(7, ["a:1", "b:1"])
    reg.mark(3, ["c:1"])
    marks = reg.list()
    assert [m.ledger_id for m in marks] == [3, 7]
    assert marks[1].missing_bookies == ("a:1", "b:1")
    got = reg.get(7)
    assert got is not None and got.missing_bookies == ("a:1", "b:1")
    assert reg.get(8) is None and reg.count() == 2


def test_clear_only_at_the_version_read(store) -> None:
    reg = UnderReplicationRegistry(store, "w1")
    seen = reg.mark(7, ["b:1"])
    reg.mark(7, ["c:1"])  # a new loss while a worker repaired b
    assert not reg.clear(seen)
    current = reg.get(7)
    assert current is not None and current.missing_bookies == ("b:1", "c:1")
    assert reg.clear(current)
    assert reg.get(7) is None
    assert not reg.clear(current)


def test_lock_is_exclusive_and_dies_with_the_lease(store) -> None:
    w1, w2 = UnderReplicationRegistry(store, "w1"), UnderReplicationRegistry(store, "w2")
    l1, l2 = store.grant_lease(5), store.grant_lease(5)
    assert w1.try_lock(7, l1)
    assert not w2.try_lock(7, l2)
    assert w2.lock_holder(7) == "w1"
    store.revoke_lease(l1)  # w1 died
    assert w2.try_lock(7, l2)
    assert w2.unlock(7) and w2.lock_holder(7) is None


def test_recovery_delay(store) -> None:
    assert get_recovery_delay(store, 12.0) == 12.0
    init_recovery_delay(store, 5)
    init_recovery_delay(store, 9)  # the cluster's value wins over a later process's config
    assert get_recovery_delay(store) == 5.0
    set_recovery_delay(store, 0)
    assert get_recovery_delay(store, 12.0) == 0.0
    with pytest.raises(BadRequestError):
        set_recovery_delay(store, -1)
    store.put(layout.LOST_BOOKIE_RECOVERY_DELAY, b"soon")
    with pytest.raises(CorruptMetadataError):
        get_recovery_delay(store)


def test_corrupt_mark_is_reported(store) -> None:
    store.put(layout.underreplicated_key(5), b"\xff\x00")
    with pytest.raises(CorruptMetadataError):
        UnderReplicationRegistry(store, "w").list()
