"""The Auditor thread against the embedded store (no bookie processes): registrations
come and go by lease, ledgers are plain metadata; marks appear (or must not) in time."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from helpers.wait import wait_until

from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import BookieRegistration, LedgerStore, register_bookie
from zbk.metadata.store import MetadataStore
from zbk.metadata.uri import open_store
from zbk.recovery import metrics as rm
from zbk.recovery.auditor import Auditor
from zbk.recovery.underreplication import UnderReplicationRegistry, set_recovery_delay

BOOKIES = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4"]
QUIET_S = 1.5  # how long "nothing is marked" is watched: more than the auditor's 1 s poll


class World:
    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.leases = {b: store.grant_lease(30) for b in BOOKIES}
        for b in BOOKIES:
            register_bookie(store, BookieRegistration(b), self.leases[b])
        ledgers = LedgerStore(store)
        # ledger A on bookies 1,2,3; ledger B on 2,3,4 (two fragments, 1 only in the first)
        self.a, _ = ledgers.create(LedgerMetadata(ledger_id=0, ensemble_size=3, write_quorum=2, ack_quorum=2,
                                                  fragments=((0, tuple(BOOKIES[:3])),)))
        self.b, _ = ledgers.create(LedgerMetadata(ledger_id=0, ensemble_size=3, write_quorum=2, ack_quorum=2,
                                                  fragments=((0, tuple(BOOKIES[1:])),)))
        self.registry = UnderReplicationRegistry(store, "test")

    def kill(self, bookie: str) -> None:
        self.store.revoke_lease(self.leases[bookie])

    def restart(self, bookie: str) -> None:
        self.leases[bookie] = self.store.grant_lease(30)
        register_bookie(self.store, BookieRegistration(bookie), self.leases[bookie])

    def marks(self) -> dict[int, tuple[str, ...]]:
        return {m.ledger_id: m.missing_bookies for m in self.registry.list()}


@pytest.fixture
def world(sqlite_uri: str) -> Iterator[World]:
    store = open_store(sqlite_uri)
    try:
        yield World(store)
    finally:
        store.close()


@pytest.fixture
def auditor(world: World) -> Iterator[Auditor]:
    lease = world.store.grant_lease(30)
    a = Auditor(world.store, UnderReplicationRegistry(world.store, "auditor"), lease, "auditor-1")
    a.start()
    try:
        wait_until(a.is_leader, timeout_s=5, message="the auditor to lead")
        yield a
    finally:
        a.stop()


def assert_quiet(world: World) -> None:
    deadline = time.monotonic() + QUIET_S
    while time.monotonic() < deadline:
        assert world.marks() == {}
        time.sleep(0.05)


def test_lost_bookie_marks_its_ledgers(world: World, auditor: Auditor) -> None:
    assert rm.AUDITOR_IS_LEADER._value.get() == 1
    world.kill(BOOKIES[0])
    wait_until(world.marks, timeout_s=5, message="a mark")
    time.sleep(0.2)
    assert world.marks() == {world.a.ledger_id: (BOOKIES[0],)}
    world.kill(BOOKIES[2])
    wait_until(lambda: len(world.marks()) == 2, timeout_s=5, message="both ledgers marked")
    assert world.marks() == {world.a.ledger_id: (BOOKIES[0], BOOKIES[2]), world.b.ledger_id: (BOOKIES[2],)}


def test_read_only_bookie_is_not_lost(world: World, auditor: Auditor) -> None:
    # register_bookie writes the readonly key before deleting the writable one.
    register_bookie(world.store, BookieRegistration(BOOKIES[1], state="readonly"), world.leases[BOOKIES[1]])
    assert_quiet(world)


def test_delay_return_and_reschedule(world: World, auditor: Auditor) -> None:
    set_recovery_delay(world.store, 60)
    world.kill(BOOKIES[3])  # stays gone
    world.kill(BOOKIES[0])
    time.sleep(0.5)
    world.restart(BOOKIES[0])  # back within the delay: never audited
    assert_quiet(world)
    set_recovery_delay(world.store, 0.5)  # the pending audit of bookie 4 is due now
    wait_until(world.marks, timeout_s=5, message="the rescheduled audit")
    assert world.marks() == {world.b.ledger_id: (BOOKIES[3],)}


def test_new_leader_audits_bookies_that_died_before_it(world: World) -> None:
    world.kill(BOOKIES[0])  # no auditor running
    lease = world.store.grant_lease(30)
    a = Auditor(world.store, UnderReplicationRegistry(world.store, "auditor"), lease, "auditor-2")
    a.start()
    try:
        wait_until(world.marks, timeout_s=5, message="a mark from the new leader")
        assert world.marks() == {world.a.ledger_id: (BOOKIES[0],)}
    finally:
        a.stop()
    assert rm.AUDITOR_IS_LEADER._value.get() == 0


def test_periodic_check_finds_a_loss_no_event_reported(world: World) -> None:
    """A bookie that ledgers name but that was never registered while the auditor watched
    (e.g. its delete event was missed) is found by the periodic check."""
    lease = world.store.grant_lease(30)
    a = Auditor(world.store, UnderReplicationRegistry(world.store, "auditor"), lease, "auditor-3",
                check_interval_s=0.5)
    a.start()
    try:
        wait_until(a.is_leader, timeout_s=5, message="the auditor to lead")
        time.sleep(0.3)  # past the first check
        ledgers = LedgerStore(world.store)
        md, version = ledgers.read(world.b.ledger_id)
        ghost = "127.0.0.1:77"
        ledgers.write(md.with_replaced_bookie(0, BOOKIES[3], ghost), version)  # never registered
        wait_until(world.marks, timeout_s=5, message="the periodic check's mark")
        assert world.marks() == {world.b.ledger_id: (ghost,)}
    finally:
        a.stop()
