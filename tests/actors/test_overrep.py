"""The over-replicated ledger GC (zbk/actors/overrep.py), without sockets or metadata store.

1. The pure verdict: every reason to keep a copy, and the one way to delete it.
2. OverrepTracker over a fake source: the grace period counts from the first time the
   ledger was seen not naming the bookie and restarts when it names it again; a lock, an
   open ledger or a pending cookie-fix audit keeps everything; each candidate is read again
   right before deletion; a source error propagates.
3. Wired into GcCore (the Driver of test_gc.py, message by message): over-replicated
   ledgers join the run's DeleteLedgers, the scan runs on its own interval or on a trigger,
   and a metadata error during the scan deletes nothing.
"""

from __future__ import annotations

import pytest
from helpers.actorsim import T0

from zbk.actors.gc import GcTrigger
from zbk.actors.messages import DeleteLedgers, LocalLedgers, LocalLedgersRequest, LogStats, LogStatsRequest
from zbk.actors.overrep import (
    DELETE,
    KEEP_GRACE,
    KEEP_NAMED,
    KEEP_OPEN,
    KEEP_REPLICATING,
    LedgerView,
    OverrepTracker,
    scan_interval_s,
    verdict,
)

from .test_gc import Driver

GONE = LedgerView(closed=True, names_self=False, replicating=False)
NAMED = LedgerView(closed=True, names_self=True, replicating=False)
OPEN = LedgerView(closed=False, names_self=False, replicating=False)
LOCKED = LedgerView(closed=True, names_self=False, replicating=True)


class FakeSource:
    """Metadata as a dict of views; ``script`` replaces a view after its n-th read."""

    def __init__(self, views: dict[int, LedgerView | None], *, pending: bool = False) -> None:
        self.views = views
        self.pending = pending
        self.reads: list[int] = []
        self.after_reads: dict[int, tuple[int, LedgerView | None]] = {}
        self.error: Exception | None = None
        self.others: set[int] = set()  # ledgers whose replication lock another process holds
        self.mine: set[int] = set()  # locks taken through this source and not released
        self.log: list[tuple[str, int]] = []  # lock / view / unlock, in order
        self.fail_under_lock = False  # reading a ledger this source holds locked raises

    def lock(self, ledger_id: int) -> bool:
        if ledger_id in self.others or ledger_id in self.mine:
            return False
        self.mine.add(ledger_id)
        self.log.append(("lock", ledger_id))
        return True

    def unlock(self, ledger_id: int) -> None:
        assert ledger_id in self.mine, f"unlock of {ledger_id}, which this source did not lock"
        self.mine.discard(ledger_id)
        self.log.append(("unlock", ledger_id))

    def view(self, ledger_id: int) -> LedgerView | None:
        if self.error is not None:
            raise self.error
        if self.fail_under_lock and ledger_id in self.mine:
            raise ConnectionError("etcd unreachable")
        self.reads.append(ledger_id)
        self.log.append(("view", ledger_id))
        change = self.after_reads.get(ledger_id)
        if change is not None and self.reads.count(ledger_id) > change[0]:
            self.views[ledger_id] = change[1]
        return self.views.get(ledger_id)

    def audit_pending(self) -> bool:
        return self.pending


# -- 1. the verdict ----------------------------------------------------------------------------

def test_verdict_keeps_a_copy_for_every_reason_and_deletes_only_past_the_grace() -> None:
    assert verdict(NAMED, T0, T0 + 100, 10) == KEEP_NAMED
    assert verdict(LedgerView(closed=False, names_self=True, replicating=True), T0, T0 + 100, 10) == KEEP_NAMED
    assert verdict(OPEN, T0, T0 + 100, 10) == KEEP_OPEN
    assert verdict(LOCKED, T0, T0 + 100, 10) == KEEP_REPLICATING
    assert verdict(GONE, None, T0 + 100, 10) == KEEP_GRACE
    assert verdict(GONE, T0, T0 + 9.99, 10) == KEEP_GRACE
    assert verdict(GONE, T0, T0 + 10, 10) == DELETE


def test_scan_interval_is_half_the_grace_and_at_most_an_hour() -> None:
    assert scan_interval_s(10.0) == 5.0
    assert scan_interval_s(86_400.0) == 3600.0


# -- 2. the tracker ----------------------------------------------------------------------------

def test_grace_counts_from_the_first_absence_seen_and_restarts_when_named_again() -> None:
    src = FakeSource({1: GONE, 2: NAMED})
    t = OverrepTracker(10.0, src)
    assert t.scan({1, 2}, T0) == set()  # first seen absent now: the grace starts
    assert t.absent_since == {1: T0}
    assert t.scan({1, 2}, T0 + 9) == set()
    src.views[1] = NAMED  # named again (e.g. a replicator chose this bookie)
    assert t.scan({1, 2}, T0 + 11) == set()
    assert 1 not in t.absent_since
    src.views[1] = GONE
    assert t.scan({1, 2}, T0 + 12) == set()
    assert t.scan({1, 2}, T0 + 21.9) == set()
    assert t.scan({1, 2}, T0 + 22) == {1}  # 10 s after it was seen absent again
    assert t.scan({2}, T0 + 23) == set() and t.absent_since == {}  # a ledger no longer local is forgotten


def test_locked_open_or_audit_pending_ledgers_are_kept_however_long() -> None:
    src = FakeSource({1: LOCKED, 2: OPEN, 3: GONE})
    t = OverrepTracker(1.0, src)
    t.scan({1, 2, 3}, T0)
    assert t.scan({1, 2, 3}, T0 + 100) == {3}
    src.pending = True
    src.views[4] = GONE
    t.scan({1, 2, 4}, T0 + 100)
    src.reads.clear()
    assert t.scan({1, 2, 4}, T0 + 1000) == set()
    assert src.reads == [], "metadata read although a cookie fix awaits its audit"
    src.pending = False
    assert t.scan({1, 2, 4}, T0 + 1000) == set()  # first seen absent now: nothing was read while pending
    assert t.scan({1, 2, 4}, T0 + 1001) == {4}
    src.views[1] = GONE  # the replicator released the lock and left the ledger elsewhere
    assert t.scan({1, 2}, T0 + 1001) == {1}  # a lock does not stop the clock: absent since T0


def test_each_candidate_is_read_again_right_before_deletion() -> None:
    src = FakeSource({1: GONE, 2: GONE, 3: GONE})
    t = OverrepTracker(0.0, src)
    # Between the scan's read and the re-read, 2 is locked for replication and 3 names us again.
    src.after_reads = {2: (1, LOCKED), 3: (1, NAMED)}
    assert t.scan({1, 2, 3}, T0) == {1}
    assert src.reads == [1, 2, 3, 1, 2, 3]


def test_the_last_read_is_made_under_the_replication_lock_held_until_release() -> None:
    src = FakeSource({1: GONE, 2: GONE, 3: GONE})
    t = OverrepTracker(0.0, src)
    src.others = {2}  # a replicator holds 2: kept, though metadata does not name us
    src.after_reads = {3: (1, NAMED)}  # 3 names us again by the time its lock is taken
    assert t.scan({1, 2, 3}, T0) == {1}
    assert src.log[3:] == [("lock", 1), ("view", 1), ("lock", 3), ("view", 3), ("unlock", 3)]
    assert src.mine == {1} and t.held == {1}, "the lock of a doomed ledger is held until the deletion is done"
    t.release()
    assert src.mine == set() and t.held == set()


def test_a_source_error_under_the_lock_releases_every_lock() -> None:
    src = FakeSource({1: GONE, 2: GONE})
    t = OverrepTracker(0.0, src)
    src.fail_under_lock = True
    with pytest.raises(ConnectionError):
        t.scan({1, 2}, T0)
    assert src.mine == set() and t.held == set()


def test_a_source_error_propagates() -> None:
    src = FakeSource({1: GONE})
    src.error = ConnectionError("etcd unreachable")
    with pytest.raises(ConnectionError):
        OverrepTracker(0.0, src).scan({1}, T0)


# -- 3. in GcCore --------------------------------------------------------------------------------

def test_gc_deletes_over_replicated_ledgers_with_the_deleted_ones() -> None:
    src = FakeSource({1: GONE, 2: NAMED, 3: OPEN})
    d = Driver(metadata={1, 2, 3}, gc_wait_s=1.0)
    d.core.overrep = OverrepTracker(4.0, src)  # scans every 2 s
    d.run(local={1, 2, 3, 9}, usage={})  # 9: deleted in metadata
    assert d.one("server", DeleteLedgers).ledger_ids == [9]
    assert d.core.overrep.absent_since == {1: d.now}
    first = d.now
    while d.now < first + 4.0:
        assert d.take("server", DeleteLedgers) == []
        d.run(local={1, 2, 3}, usage={})
    assert d.one("server", DeleteLedgers).ledger_ids == [1]


def test_gc_holds_the_replication_lock_until_the_server_has_dropped_the_ledger() -> None:
    src = FakeSource({1: GONE})
    d = Driver(metadata={1}, gc_wait_s=1.0)
    d.core.overrep = OverrepTracker(0.0, src)
    d.at(d.now + d.core.s.gc_wait_s)
    d.send(LocalLedgers(d.one("server", LocalLedgersRequest).ctx, [1]))
    assert d.one("server", DeleteLedgers).ledger_ids == [1]
    assert src.mine == {1}, "the lock went before the Server dropped the ledger"
    stats = d.one("entrylogger", LogStatsRequest)
    d.send(LogStats(stats.ctx, {}, [], 500))
    assert src.mine == {1}
    # The Server answers this request after it handled the DeleteLedgers (one FIFO pipe).
    d.send(LocalLedgers(d.one("server", LocalLedgersRequest).ctx, []))
    assert src.mine == set()


def test_the_scan_runs_on_its_interval_or_when_triggered() -> None:
    src = FakeSource({1: NAMED})
    d = Driver(metadata={1}, gc_wait_s=1.0)
    d.core.overrep = OverrepTracker(20.0, src)  # scans every 10 s
    d.run(local={1}, usage={})
    assert src.reads == [1]
    for _ in range(5):
        d.run(local={1}, usage={})
    assert src.reads == [1], "scanned before its interval"
    d.run(local={1}, usage={}, trigger=GcTrigger())
    assert src.reads == [1, 1], "a triggered run did not scan"


def test_a_metadata_error_in_the_scan_deletes_nothing() -> None:
    src = FakeSource({1: GONE})
    d = Driver(metadata={1}, gc_wait_s=1.0)
    d.core.overrep = OverrepTracker(0.0, src)
    src.error = TimeoutError("metadata store timed out")
    d.run(local={1, 7}, usage={})  # 7 is deleted in metadata, yet nothing is deleted
    assert d.take("server", DeleteLedgers) == [] and d.take("entrylogger", LogStatsRequest) == []
    assert d.core.run is None
    src.error = None
    d.run(local={1, 7}, usage={}, trigger=GcTrigger())
    assert d.one("server", DeleteLedgers).ledger_ids == [1, 7]
