"""BP-46 end to end, with real processes: bookies running without the journal, a kill -9
that loses a bookie's unflushed entries, phase one at its restart (fenced + limbo, EUNKNOWN
for what it lost), and phase two by `zbk autorecovery` (recover, refill, clear limbo)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time

import pytest
from helpers.wait import wait_until

import zbk
from zbk.client.raw import BookieConnection
from zbk.config import ClientConfig
from zbk.errors import LedgerFencedError
from zbk.metadata.registry import LedgerStore
from zbk.metadata.uri import open_store
from zbk.recovery.underreplication import UnderReplicationRegistry
from zbk.wire import messages as w
from zbk.wire.status import Status

from .replicas import unreadable_on

PW = b"bp46"
FAST = ClientConfig(add_timeout_ms=2000, read_timeout_ms=1500, speculative_read_ms=300)
# No journal, a write buffer larger than everything written and no periodic flush: a kill -9
# loses every entry the bookie acknowledged since it started (BP-46's data loss).
NO_JOURNAL = {"journal_write_data": False, "entry_log_write_buffer_bytes": 16 * 1024 * 1024,
              "flush_interval_ms": 600_000}
ENTRIES = 300
OPEN_LEDGERS = 3


def data(lid: int, i: int) -> bytes:
    return hashlib.sha256(f"{lid}/{i}".encode()).digest() * 8


def nothing_in_flight(bk: zbk.BookKeeper, bookie: str) -> bool:
    """The client has no request to ``bookie`` waiting for its answer (its transport's state,
    read from the test's thread: a snapshot is enough for a wait)."""
    peer = bk._abk.ctx.transport.peers.get(bookie)  # type: ignore[union-attr]
    return peer is None or not (peer.calls or peer.waiting or peer.backlog)


def info(bookie: str) -> w.BookieInfoResponse:
    with BookieConnection(bookie, timeout_s=5) as c:
        resp = c.call(w.BookieInfoRequest(rid=c.next_rid()))
    assert isinstance(resp, w.BookieInfoResponse)
    return resp


def test_journal_off_kill9_limbo_is_repaired_by_autorecovery(rcluster) -> None:
    bookies = rcluster.start_bookies(3, settings=NO_JOURNAL)
    store = open_store(rcluster.uri)
    ledgers = LedgerStore(store)
    bk = zbk.BookKeeper(rcluster.uri, config=FAST)
    try:
        writers = [bk.create_ledger(3, 3, 2, password=PW) for _ in range(OPEN_LEDGERS)]
        acked: dict[int, int] = {}
        for lh in writers:
            futs = [lh.append_async(data(lh.ledger_id, i)) for i in range(ENTRIES)]
            acked[lh.ledger_id] = max(f.result(30) for f in futs)
        victim = bookies[1]
        # An entry is acknowledged by AQ = 2 bookies; the third's answer may still be on its
        # way, and a kill then fails that add to it, so the writer changes its ensemble (and,
        # with no spare bookie, fails with NotEnoughBookiesError) before it ever meets the
        # fence below. The kill comes once the victim has answered everything.
        wait_until(lambda: nothing_in_flight(bk, victim.bookie_id), timeout_s=30, interval_s=0.05,
                   message="the victim to answer every add")
        victim.kill9()
        victim.start()

        # Phase one: every open ledger is fenced and in limbo on the victim, which lost
        # what it had acknowledged: a read of a lost entry is EUNKNOWN, never ENOENTRY.
        assert info(victim.bookie_id).limbo_ledgers == OPEN_LEDGERS
        with BookieConnection(victim.bookie_id, timeout_s=5) as c:
            for lid in acked:
                r = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=lid, first_entry_id=ENTRIES // 2))
                assert r.status == Status.EUNKNOWN, f"ledger {lid}: {r.status!r}"
        marks = UnderReplicationRegistry(store, "test").list_repairs()
        assert {(m.ledger_id, m.bookie_id, m.why) for m in marks} == \
            {(lid, victim.bookie_id, "limbo") for lid in acked}
        listed = subprocess.run([sys.executable, "-m", "zbk.cli.main", "shell", "--metadata", rcluster.uri, "--json",
                                 "listunderreplicated", "--repairs"], capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert {(r["ledger_id"], r["bookie"], r["why"]) for r in json.loads(listed.stdout)} == \
            {(lid, victim.bookie_id, "limbo") for lid in acked}

        # The writers are fenced: the restarted bookie answers their adds EFENCED, which
        # fails the handle. An add whose two other acks came first is acknowledged (it is on
        # AQ bookies) and counts; the one after it fails.
        for lh in writers:
            with pytest.raises(LedgerFencedError):
                for i in range(ENTRIES, ENTRIES + 50):
                    acked[lh.ledger_id] = lh.append(data(lh.ledger_id, i))
                    time.sleep(0.05)

        t0 = time.monotonic()
        ar = rcluster.start_autorecovery(lost_bookie_recovery_delay_s=60, lease_ttl_s=3)

        def healed() -> bool:
            return not UnderReplicationRegistry(store, "test").list_repairs() \
                and info(victim.bookie_id).limbo_ledgers == 0
        wait_until(healed, timeout_s=60, interval_s=0.3, message="phase two to repair every limbo ledger")
        took = time.monotonic() - t0

        for lid, last_acked in acked.items():
            md, _ = ledgers.read(lid)
            assert md.is_closed and md.last_entry_id >= last_acked, \
                f"ledger {lid} closed at {md.last_entry_id}, acked up to {last_acked}"
            assert victim.bookie_id in md.all_bookies(), "repaired in place, not replaced"
            # The victim alone serves every entry its fragments assign to it.
            assert unreadable_on(victim.bookie_id, md) == []
            rh = bk.open_ledger(lid, password=PW)
            got = [e.payload for e in rh.read(0, md.last_entry_id)]
            assert got[:last_acked + 1] == [data(lid, i) for i in range(last_acked + 1)]
        assert info(victim.bookie_id).limbo_ledgers == 0
        assert ar.metric("zbk_replicator_limbo_ledgers_repaired_total") == OPEN_LEDGERS
        assert ar.metric("zbk_replicator_ledgers_replicated_total") == 0, "nothing was re-replicated elsewhere"

        # Limbo stays cleared across a restart (CLEAR_LIMBO is journaled).
        victim.kill9()
        victim.start()
        assert info(victim.bookie_id).limbo_ledgers == 0
        print(f"phase two repaired {OPEN_LEDGERS} limbo ledgers in {took:.1f} s")
        assert ar.stop() == 0
    finally:
        bk.close()
        store.close()


CLOSED_LEDGERS = 3


def test_journal_off_kill9_closed_ledgers_lacking_entries_are_refilled(rcluster) -> None:
    """BP-46 phase two checks every ledger, closed ones too: a journal-off bookie killed -9
    after its ledgers closed lost their unflushed entries; at restart it marks each closed
    ledger lacking entries ("unclean", no limbo), and autorecovery copies them back in place
    without waiting for the periodic check."""
    bookies = rcluster.start_bookies(3, settings=NO_JOURNAL)
    store = open_store(rcluster.uri)
    ledgers = LedgerStore(store)
    bk = zbk.BookKeeper(rcluster.uri, config=FAST)
    try:
        closed = []
        for _ in range(CLOSED_LEDGERS):
            lh = bk.create_ledger(3, 2, 2, password=PW)  # striped: each bookie holds 2/3
            [f.result(30) for f in [lh.append_async(data(lh.ledger_id, i)) for i in range(ENTRIES)]]
            lh.close()
            closed.append(lh.ledger_id)
        victim = bookies[2]
        victim.kill9()
        victim.start()

        registry = UnderReplicationRegistry(store, "test")
        marks = registry.list_repairs()
        assert {(m.ledger_id, m.bookie_id, m.why) for m in marks} == \
            {(lid, victim.bookie_id, "unclean") for lid in closed}
        assert info(victim.bookie_id).limbo_ledgers == 0, "closed ledgers are not put in limbo"
        for lid in closed:
            md, _ = ledgers.read(lid)
            lost = unreadable_on(victim.bookie_id, md)
            assert len(lost) == 2 * ENTRIES // 3, f"ledger {lid}: the victim still has {lost[:5]}..."
        assert "closed_ledgers_lacking=3" in victim.log.read_text()

        ar = rcluster.start_autorecovery(lost_bookie_recovery_delay_s=60, lease_ttl_s=3)
        wait_until(lambda: not UnderReplicationRegistry(store, "test").list_repairs(), timeout_s=60,
                   interval_s=0.3, message="the unclean repair marks to be worked")
        for lid in closed:
            md, _ = ledgers.read(lid)
            assert victim.bookie_id in md.all_bookies(), "repaired in place, not replaced"
            assert unreadable_on(victim.bookie_id, md) == []
        assert ar.metric("zbk_replicator_ledgers_replicated_total") == 0
        assert ar.metric("zbk_replicator_limbo_ledgers_repaired_total") == 0

        # A clean restart finds nothing to do; so does an unclean one now that the victim's
        # entries are back and checkpointed.
        victim.stop()
        victim.start()
        victim.kill9()
        victim.start()
        assert registry.list_repairs() == []
        assert ar.stop() == 0
    finally:
        bk.close()
        store.close()
