"""Auto-recovery inside bookies (``autorecovery.enabled``) through a stall past its lease:
the bookie stays up, registers again and campaigns again on a new lease."""

from __future__ import annotations

import json
import time
import urllib.request

from helpers.bookie import pause, resume
from helpers.wait import wait_until

from zbk.metadata.registry import list_bookies
from zbk.metadata.uri import open_store


def _auditor_seen_by(http_port: int) -> object:
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/api/v1/autorecovery/who_is_auditor",
                                timeout=5) as resp:
        return json.loads(resp.read())["auditor"]


def test_a_bookie_stalled_past_its_lease_keeps_serving_and_campaigns_again(rcluster) -> None:
    ttl_s = 2
    # A long recovery delay: the stalled bookie's registration lapses too, and nothing here
    # is about replicating its ledgers.
    settings = {"autorecovery_enabled": True, "registration_ttl_s": ttl_s, "lost_bookie_recovery_delay_s": 3600}
    bookies = rcluster.start_bookies(3, settings=settings)
    store = open_store(rcluster.uri)
    try:
        leader = wait_until(lambda: _auditor_seen_by(bookies[0].http_port), timeout_s=20, interval_s=0.2,
                            message="an auditor")
        victim = next(b for b in bookies if f"127.0.0.1:{b.http_port}" == leader)
        others = [b for b in bookies if b is not victim]

        pause(victim)
        time.sleep(ttl_s * 2.5)  # its leases expire: another candidate leads
        wait_until(lambda: _auditor_seen_by(others[0].http_port) not in (None, leader), timeout_s=20,
                   interval_s=0.2, message="another bookie to lead")
        resume(victim)

        wait_until(lambda: victim.bookie_id in {r.bookie_id for r in list_bookies(store)}, timeout_s=20,
                   message="the stalled bookie registered again")
        wait_until(lambda: "running again" in victim.log.read_text(), timeout_s=20,
                   message="its auto-recovery started again")
        assert victim.proc.poll() is None, victim.log.read_text()
        assert "lease lost" in victim.log.read_text()

        # Its candidate campaigns on the new lease: with the others stopped (they resign), it leads.
        for b in others:
            assert b.stop() == 0
        wait_until(lambda: _auditor_seen_by(victim.http_port) == leader, timeout_s=20, interval_s=0.2,
                   message="the stalled bookie to lead again")
        assert victim.stop() == 0
    finally:
        store.close()
