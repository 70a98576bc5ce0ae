"""Auto-recovery switched off and on again with `zbk shell autorecovery`, against real
bookies and a real `zbk autorecovery` process: while it is off, a kill -9'd bookie's ledgers
are neither marked by the auditor nor repaired, and a ledger marked meanwhile stays marked
and unrepaired; once it is on, the auditor marks them and the replicators repair them all,
which `zbk shell queryautorecoverystatus` shows as it happens (which ledger, which worker)."""

from __future__ import annotations

import time

from helpers.shell import refused, shell, shell_json
from helpers.wait import wait_until

import zbk
from zbk.metadata.registry import LedgerStore
from zbk.metadata.uri import open_store
from zbk.recovery.underreplication import UnderReplicationRegistry

from .test_autorecovery_e2e import FAST, assert_fully_replicated

LEDGERS = 6
ENTRIES = 30
ENTRY_BYTES = 1024
OFF_WATCH_S = 6.0  # registration TTL (2 s) + audits and replicator passes many times over


def test_switched_off_nothing_is_marked_or_repaired_and_on_again_everything_is(rcluster) -> None:
    bookies = rcluster.start_bookies(4)
    uri = rcluster.uri
    # A slow copy (about a second a ledger), so that a repair in progress can be seen.
    ar = rcluster.start_autorecovery(lost_bookie_recovery_delay_s=0, replication_rate_bytes=24_000)
    wait_until(lambda: ar.get("/api/v1/autorecovery/who_is_auditor")["auditor"], timeout_s=15, message="a leader")
    assert ar.metric("zbk_autorecovery_enabled") == 1

    off = shell_json("autorecovery", "--disable", "--metadata", uri)
    assert off["enabled"] is False and off["disabled_by"].startswith("zbk shell")
    assert shell_json("autorecovery", "--status", "--metadata", uri) == off
    assert "auto-recovery is OFF" in shell("autorecovery", "--metadata", uri).stdout
    wait_until(lambda: ar.metric("zbk_autorecovery_enabled") == 0, timeout_s=10, message="the gauge to show it off")

    store = open_store(uri)
    ledgers = LedgerStore(store)
    try:
        with zbk.BookKeeper(uri, config=FAST) as bk:
            ids = []
            for _ in range(LEDGERS):
                lh = bk.create_ledger(2, 2, 2, password=b"pw")
                for f in [lh.append_async(bytes([lh.ledger_id % 256]) * ENTRY_BYTES) for _ in range(ENTRIES)]:
                    f.result(30)
                lh.close()
                ids.append(lh.ledger_id)
        victim = max((b.bookie_id for b in bookies),
                     key=lambda b: sum(b in ledgers.read(lid)[0].all_bookies() for lid in ids))
        on_victim = [lid for lid in ids if victim in ledgers.read(lid)[0].all_bookies()]
        assert on_victim
        rcluster.by_id(victim).kill9()
        registry = UnderReplicationRegistry(store, "test")
        # A ledger marked while it is off (as the auditor would mark it): it waits too.
        registry.mark(on_victim[0], [victim])
        deadline = time.monotonic() + OFF_WATCH_S
        while time.monotonic() < deadline:
            assert [m.ledger_id for m in registry.list()] == [on_victim[0]], "nothing else is marked"
            time.sleep(0.1)
        for lid in on_victim:
            assert victim in ledgers.read(lid)[0].all_bookies(), f"ledger {lid} was repaired while switched off"
        status = shell_json("queryautorecoverystatus", "--verbose", "--metadata", uri)
        assert status["enabled"] is False and status["in_progress"] == []
        assert status["waiting"] == {"under_replicated": 1, "in_place_repairs": 0, "ledgers": [on_victim[0]]}

        on = shell_json("autorecovery", "--enable", "--metadata", uri)
        assert on == {"enabled": True}
        seen: dict[int, str] = {}

        def repaired() -> bool:
            for row in shell_json("queryautorecoverystatus", "--metadata", uri)["in_progress"]:
                seen[row["ledger_id"]] = row["worker"]
                # (on a starved machine another bookie's 2 s registration may lapse too, and be marked)
                assert victim in row["missing_bookies"], row
            return not registry.list() and all(victim not in ledgers.read(lid)[0].all_bookies() for lid in on_victim)

        wait_until(repaired, timeout_s=120, interval_s=0.2, message="every ledger of the lost bookie repaired")
        assert seen and set(seen.values()) == {ar.candidate_id}, f"the repairs in progress and their worker: {seen}"
        assert set(seen) <= set(on_victim)
        for lid in ids:
            assert_fully_replicated(ledgers.read(lid)[0])
        assert ar.metric("zbk_autorecovery_enabled") == 1
        assert shell("queryautorecoverystatus", "--metadata", uri).stdout.splitlines()[:2] == [
            "auto-recovery is on", "(no ledger is being repaired now)"]
    finally:
        store.close()
    refused(shell("autorecovery", "--enable", "--disable", "--metadata", uri), 2, "not allowed with")
    refused(shell("autorecovery", "--metadata", "sqlite:///no/such/dir/meta.db"), 2, "does not exist")
