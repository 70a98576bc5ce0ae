"""The cluster's auto-recovery switch: kept in metadata (sqlite and etcd), obeyed by the
auditor (no marks while off, the pending audit runs once on) and by replicator workers
(no repair while off), and exported as zbk_autorecovery_enabled."""

from __future__ import annotations

import asyncio
import time

import pytest
from helpers.wait import wait_until

from zbk.metadata import layout
from zbk.metadata.uri import open_store
from zbk.recovery import metrics as rm
from zbk.recovery.auditor import Auditor
from zbk.recovery.switch import is_enabled, read_switch, set_enabled
from zbk.recovery.underreplication import UnderReplicationRegistry

from .test_auditor import BOOKIES, QUIET_S, World
from .test_replicator import Env


@pytest.mark.parametrize("backend", ["sqlite", "etcd"])
def test_the_switch_lives_in_metadata(backend: str, request: pytest.FixtureRequest) -> None:
    uri = request.getfixturevalue(f"{backend}_uri")
    store = open_store(uri)
    try:
        assert read_switch(store).as_json() == {"enabled": True}  # a new cluster: on
        off = set_enabled(store, False, by="ops")
        assert not off.enabled and off.disabled_by == "ops" and off.disabled_ms > 0
        assert set_enabled(store, False, by="someone else") == off  # off again: who and when stay
    finally:
        store.close()
    store = open_store(uri)  # another process, later: still off
    try:
        assert not is_enabled(store)
        store.put(layout.AUTORECOVERY_DISABLED, b"\xff not cbor")  # only presence decides
        assert read_switch(store).as_json() == {"enabled": False, "disabled_by": "", "disabled_ms": 0}
        assert set_enabled(store, True, by="ops").enabled
        assert set_enabled(store, True, by="ops").enabled  # idempotent
        assert store.get(layout.AUTORECOVERY_DISABLED) is None
    finally:
        store.close()


def test_replicators_repair_nothing_while_it_is_off(sqlite_uri: str) -> None:
    store = open_store(sqlite_uri)
    try:
        env = Env(store)
        set_enabled(store, False, by="test")
        assert not asyncio.run(env.replicator.run_once())
        assert rm.AUTORECOVERY_ENABLED._value.get() == 0
        assert [m.ledger_id for m in env.registry.list()] == [env.md.ledger_id], "the mark waits"
        assert env.t.requests == 0, "no bookie was asked anything"
        set_enabled(store, True, by="test")
        assert asyncio.run(env.replicator.run_once())
        assert rm.AUTORECOVERY_ENABLED._value.get() == 1
        assert env.registry.list() == []
    finally:
        store.close()


def test_the_auditor_marks_nothing_while_it_is_off_and_audits_once_on(sqlite_uri: str) -> None:
    store = open_store(sqlite_uri)
    world = World(store)
    a = Auditor(store, UnderReplicationRegistry(store, "auditor"), store.grant_lease(30), "auditor-1")
    a.start()
    try:
        wait_until(a.is_leader, timeout_s=5, message="the auditor to lead")
        set_enabled(store, False, by="test")
        wait_until(lambda: rm.AUTORECOVERY_ENABLED._value.get() == 0, timeout_s=5, message="the gauge to show it")
        world.kill(BOOKIES[0])
        deadline = time.monotonic() + QUIET_S + 1
        while time.monotonic() < deadline:
            assert world.marks() == {}, "the auditor marked a ledger while auto-recovery was off"
            time.sleep(0.05)
        set_enabled(store, True, by="test")
        wait_until(world.marks, timeout_s=5, message="the audit that waited for the switch")
        assert world.marks() == {world.a.ledger_id: (BOOKIES[0],)}
        assert rm.AUTORECOVERY_ENABLED._value.get() == 1
    finally:
        a.stop()
        store.close()
