"""Placement against real bookie processes: a ledger restricted to an isolation group never
has an entry outside it (not after an ensemble change, not after re-replication, not when
the group runs out of bookies); an enforced minimum of racks fails ledger creation rather
than place short, and a ledger placed short without enforcement is reported by the
auditor's check (zbk_auditor_check_placement_violations)."""

from __future__ import annotations

import hashlib

import pytest
from helpers.wait import wait_until

import zbk
from zbk.client.placement import POLICY_KEY, PlacementPolicy
from zbk.config import ClientConfig
from zbk.errors import NotEnoughBookiesError
from zbk.metadata.registry import LedgerStore, list_bookies
from zbk.metadata.uri import open_store
from zbk.recovery.underreplication import UnderReplicationRegistry
from zbk.wire import messages as w
from zbk.wire.status import Status

PW = b"placement"
FAST = ClientConfig(add_timeout_ms=2000, read_timeout_ms=1500, speculative_read_ms=300)


def data(lid: int, i: int) -> bytes:
    return hashlib.sha256(f"{lid}/{i}".encode()).digest() * 8


def append(lh: zbk.SyncLedgerHandle, first: int, n: int) -> None:
    futs = [lh.append_async(data(lh.ledger_id, i)) for i in range(first, first + n)]
    assert [f.result(60) for f in futs] == list(range(first, first + n))


def knows_ledger(bookie, lid: int) -> bool:
    with bookie.connect(timeout_s=5) as c:
        resp = c.call(w.ListEntriesRequest(rid=c.next_rid(), ledger_id=lid))
    assert resp.status in (Status.EOK, Status.ENOLEDGER), resp.status
    return resp.status == Status.EOK


def test_isolated_ledgers_never_leave_their_group(rcluster) -> None:
    # Racks make the test sharp: a placement that ignored the group would prefer the
    # bookies of rack o, which give the gold ones' write sets a second rack.
    # Leases of 5 s, not the helpers' 2 s: the group's spare must be registered when the
    # ensemble change looks for it. In a full CI run the change once found no writable spare
    # and failed with NotEnoughBookies (what a client must then do); a 2 s lease lapses when
    # its keep-alives wait that long, on a loaded machine with seven processes on one sqlite
    # store. The dead bookie's registration still goes in time for the steps below.
    leases = {"registration_ttl_s": 5}
    gold = rcluster.start_bookies(4, {"isolation_group": "gold", "rack": "g", **leases})
    others = rcluster.start_bookies(2, {"rack": "o", **leases})
    gold_ids = {b.bookie_id for b in gold}
    store = open_store(rcluster.uri)
    ledgers = LedgerStore(store)
    bk = zbk.BookKeeper(rcluster.uri, config=FAST, isolation_groups=("gold",))
    try:
        # An ensemble change when a bookie of the group dies: the replacement is the
        # group's spare, though two bookies outside it are writable.
        lh = bk.create_ledger(3, 2, 2, password=PW)
        append(lh, 0, 40)
        first = ledgers.read(lh.ledger_id)[0]
        assert PlacementPolicy.of_ledger(first) == PlacementPolicy(isolation_groups=("gold",))
        assert POLICY_KEY in first.custom_metadata
        victim = rcluster.by_id(first.last_ensemble[0])
        victim.kill9()
        append(lh, 40, 40)
        md = ledgers.read(lh.ledger_id)[0]
        assert len(md.fragments) == 2 and md.all_bookies() == gold_ids, md.fragments
        lh.close()

        # Re-replication of the dead bookie's copies: the auditor and replicator hold the
        # ledger to its recorded groups (the autorecovery process has none of its own).
        rcluster.start_autorecovery(lost_bookie_recovery_delay_s=0, auditor_periodic_check_interval_s=3600,
                                    lease_ttl_s=3)

        def rereplicated() -> bool:
            return victim.bookie_id not in ledgers.read(lh.ledger_id)[0].all_bookies() \
                and not UnderReplicationRegistry(store, "t").list()
        wait_until(rereplicated, timeout_s=60, interval_s=0.3, message="the dead bookie's copies re-replicated")
        md = ledgers.read(lh.ledger_id)[0]
        assert md.all_bookies() <= gold_ids, md.fragments
        rh = bk.open_ledger(lh.ledger_id, password=PW)
        assert [e.payload for e in rh.read(0, 79)] == [data(lh.ledger_id, i) for i in range(80)]

        # The group down to three bookies: a ledger on all three, then one more dies. Its
        # writer has nowhere in the group to go and fails with NotEnoughBookies; it never
        # falls back to the bookies outside the group.
        lh2 = bk.create_ledger(3, 2, 2, password=PW)
        append(lh2, 0, 20)
        second = rcluster.by_id(ledgers.read(lh2.ledger_id)[0].last_ensemble[1])
        second.kill9()
        with pytest.raises(NotEnoughBookiesError):
            append(lh2, 20, 20)
        assert ledgers.read(lh2.ledger_id)[0].all_bookies() <= gold_ids
        wait_until(lambda: second.bookie_id not in {r.bookie_id for r in list_bookies(store)}, timeout_s=20,
                   message="the dead bookie's registration to expire")
        with pytest.raises(NotEnoughBookiesError, match="isolation groups"):
            bk.create_ledger(3, 2, 2, password=PW)

        # Nothing of either ledger ever reached a bookie outside the group.
        for b in others:
            assert not knows_ledger(b, lh.ledger_id) and not knows_ledger(b, lh2.ledger_id), b.bookie_id
    finally:
        bk.close()
        store.close()


def test_enforced_racks_fail_creation_and_the_auditor_reports_a_short_ledger(rcluster) -> None:
    for rack in ("a", "a", "a", "b"):
        rcluster.start_bookies(1, {"rack": rack})
    store = open_store(rcluster.uri)
    ledgers = LedgerStore(store)
    strict = zbk.BookKeeper(rcluster.uri, config=FAST, min_racks_per_write_quorum=3,
                            enforce_min_racks_per_write_quorum=True)
    lax = zbk.BookKeeper(rcluster.uri, config=FAST, min_racks_per_write_quorum=3)
    try:
        # Three racks per write set of three, over two racks: refused, and no ledger made.
        with pytest.raises(NotEnoughBookiesError, match="racks"):
            strict.create_ledger(3, 3, 2, password=PW)
        assert list(strict.list_ledgers()) == []
        # Two racks per write set fit (min(3, WQ=2) = 2 on an ensemble a, b).
        good = strict.create_ledger(2, 2, 2, password=PW)
        append(good, 0, 10)
        good.close()
        # Not enforced, the same request succeeds on the two racks there are.
        short = lax.create_ledger(3, 3, 2, password=PW)
        append(short, 0, 10)
        short.close()
        assert PlacementPolicy.of_ledger(ledgers.read(short.ledger_id)[0]) == PlacementPolicy(3, False)

        ar = rcluster.start_autorecovery(lost_bookie_recovery_delay_s=60, auditor_periodic_check_interval_s=3600,
                                         lease_ttl_s=3)
        wait_until(lambda: ar.metric("zbk_auditor_last_check_timestamp_seconds") > 0, timeout_s=30,
                   message="the first periodic check")
        # The short ledger's one fragment, and not the well-placed one.
        assert ar.metric("zbk_auditor_check_placement_violations") == 1
        assert ar.stop() == 0
    finally:
        strict.close()
        lax.close()
        store.close()
