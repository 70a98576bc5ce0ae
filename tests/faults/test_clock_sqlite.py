"""Steps of the whole host's wall clock under the embedded (sqlite) metadata store.

Every process that opens the store — four bookies, two autorecovery processes and the
client — runs on one fake clock (faults.faketime), so a step moves them all at once, as
NTP or ``date -s`` moves a host. The test process never opens the store.

1. A step forward of 10 minutes, longer than every lease's TTL, while everything runs.
   Nothing may notice: no lease lost, no process exits, registrations stay, the auditor
   keeps its leadership, and new ledgers are written.
2. A bookie is killed (kill -9) and the clock at once steps back 15 minutes. Its
   registration must still go within its TTL, so that the auditor marks its ledgers and
   the replicators replace it.

Throughout, at most one autorecovery process leads, and at the end every replica of every
ledger serves exactly what was written.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.wait import wait_until

from faults.clockcluster import ClockCluster, LeaderWatch
from faults.faketime import FakeTime

AUTORECOVERY = {"lease_ttl_s": 6, "lost_bookie_recovery_delay_s": 0, "open_ledger_rereplication_grace_period_s": 1,
                "auditor_periodic_check_interval_s": 3600}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClockCluster]:
    c = ClockCluster(tmp_path, f"sqlite://{tmp_path}/meta.db")
    try:
        yield c
    finally:
        c.stop_all()


def test_a_step_of_the_host_clock_changes_nothing(cluster: ClockCluster, tmp_path: Path) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    print(f"\nseed {seed}")
    t_start = time.monotonic()
    host = FakeTime(tmp_path / "host.clock")
    bookies = [cluster.bookie(f"b{i}", host) for i in range(4)]
    ars = [cluster.autorecovery(f"ar{i}", host, **AUTORECOVERY) for i in range(2)]
    client = cluster.session("client", host)
    ids = sorted(b.bookie_id for b in bookies)

    def state() -> dict[str, Any]:
        return client.call("state")

    wait_until(lambda: state()["writable"] == ids and state()["leader"], timeout_s=60, interval_s=0.3,
               message="four bookies registered and an auditor")
    cluster.wait_http(ars)
    ledgers = list(client.call(f"write 4 100 3 2 2 {seed}")["ledgers"])
    ready_s = time.monotonic() - t_start
    with LeaderWatch(ars) as watch:
        leader = state()["leader"]
        time.sleep(1.0)

        host.jump(+600)  # 1. forward, beyond every TTL (4 s bookies, 6 s autorecovery)
        time.sleep(7.0)  # longer than every TTL
        after = state()
        assert after["writable"] == ids and after["leader"] == leader, (after, cluster.logs())
        assert not after["underreplicated"], after
        ledgers += list(client.call(f"write 2 100 3 2 2 {seed}")["ledgers"])

        # 2. A bookie dies, and the clock steps back 15 minutes at once: its lease must
        # still run out within its TTL.
        first = client.call(f"verify {seed} {ledgers[0]}")["ledgers"][ledgers[0]]
        victim = next(b for b in bookies if b.bookie_id in first["fragments"][0][1])
        victim.stop(kill=True)
        host.set(-300)
        t_kill = time.monotonic()
        wait_until(lambda: victim.bookie_id not in state()["writable"], timeout_s=15, interval_s=0.2,
                   message=f"the killed bookie's registration to expire\n{cluster.logs()}")
        gone_s = time.monotonic() - t_kill

        def repaired() -> bool:
            s = state()
            if s["underreplicated"]:
                return False
            got = client.call(f"verify {seed} {' '.join(ledgers)}")["ledgers"]
            return all(victim.bookie_id not in bks for r in got.values() for _, bks in r["fragments"])
        wait_until(repaired, timeout_s=60, interval_s=1.0, message=f"the ledgers re-replicated\n{cluster.logs()}")
        repaired_s = time.monotonic() - t_kill
        time.sleep(1.0)

    final = client.call(f"verify {seed} {' '.join(ledgers)}")["ledgers"]
    for lid, r in final.items():
        assert r["closed"] and r["last_entry_id"] == 99, (lid, r)
        assert r["read"] == 100 and r["read_wrong"] == [], (lid, r)
        assert all(bad == [] for bad in r["bad_replicas"].values()), (lid, r["bad_replicas"])
    assert watch.overlaps == [], watch.overlaps
    assert len(watch.leaders_seen()) == 1, f"leadership changed: {watch.spans}"
    for n in [*ars, *(b for b in bookies if b is not victim)]:
        assert n.alive, f"{n.name} exited:\n{n.log_text()[-3000:]}"
        assert "lease lost" not in n.log_text() and "lease expired" not in n.log_text(), \
            f"{n.name} lost a lease:\n{n.log_text()[-3000:]}"
    print(f"ready in {ready_s:.1f} s; {watch.samples} leader samples; killed bookie unregistered "
          f"{gone_s:.1f} s after the kill and a 15-minute step back, {len(ledgers)} ledgers whole "
          f"{repaired_s:.1f} s after it")
