"""Skewed and stepping clocks on single processes of an etcd cluster, whose leases etcd
times on its own clock.

Every process has a wall clock of its own (faults.faketime), minutes apart: bookies at
0, +5, -5 and +2 minutes, the two autorecovery processes at -3 and +3, the client at +60,
etcd at -60 (which does not reach it: see test_clock_faketime.py). Then:

1. each clock steps (bookies and autorecovery processes by 10 to 20 minutes, forward or
   back) while everything runs: nothing may notice — no lease lost, registrations stay,
   the same auditor leads;
2. the leading autorecovery process is killed (kill -9) and started again on a clock 20
   minutes ahead: the other one takes over once the dead one's lease expires, and the
   restarted one does not lead beside it;
3. a bookie is killed while the clocks of both autorecovery processes step again: its
   ledgers are re-replicated, each fragment once, by the replicators of both processes
   (one lock per ledger, held under a lease etcd times), with no repair racing another.

Throughout, never two auditors lead at once, and at the end every replica of every ledger
serves exactly what was written.
"""

from __future__ import annotations

import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.wait import wait_until

from faults.clockcluster import ClockCluster, LeaderWatch
from faults.faketime import FakeTime

MINUTE = 60.0
AUTORECOVERY = {"lease_ttl_s": 6, "lost_bookie_recovery_delay_s": 0, "open_ledger_rereplication_grace_period_s": 1,
                "auditor_periodic_check_interval_s": 3600, "replicator_workers": 2}
REPLACED = re.compile(r"ledger (\d+) fragment (\d+): (\S+) -> (\S+) \(\d+ entries copied\)")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClockCluster]:
    c = ClockCluster(tmp_path)
    try:
        yield c
    finally:
        c.stop_all()


def test_skewed_and_stepping_clocks_leave_leases_elections_and_locks_safe(
        cluster: ClockCluster, tmp_path: Path) -> None:
    seed = random.SystemRandom().randrange(1 << 30)
    print(f"\nseed {seed}")
    t_start = time.monotonic()

    def clock(name: str, minutes: float) -> FakeTime:
        return FakeTime(tmp_path / f"{name}.clock", minutes * MINUTE)

    cluster.etcd("etcd", clock("etcd", -60))
    bclocks = [clock(f"b{i}", m) for i, m in enumerate((0, +5, -5, +2))]
    bookies = [cluster.bookie(f"b{i}", c) for i, c in enumerate(bclocks)]
    aclocks = [clock("ar0", -3), clock("ar1", +3)]
    ars = [cluster.autorecovery(f"ar{i}", c, **AUTORECOVERY) for i, c in enumerate(aclocks)]
    client = cluster.session("client", clock("client", +60))
    ids = sorted(b.bookie_id for b in bookies)

    def state() -> dict[str, Any]:
        return client.call("state")

    wait_until(lambda: state()["writable"] == ids and state()["leader"], timeout_s=60, interval_s=0.3,
               message="four bookies registered and an auditor")
    cluster.wait_http(ars)
    ledgers = list(client.call(f"write 6 100 3 2 2 {seed}")["ledgers"])
    ready_s = time.monotonic() - t_start

    with LeaderWatch(ars) as watch:
        leader_id = state()["leader"]
        leader = next(a for a in ars if a.candidate_id == leader_id)
        other = next(a for a in ars if a is not leader)
        time.sleep(1.0)

        # 1. Every clock steps, by minutes, forward or back.
        for c, by in zip(bclocks + aclocks, (+10, -10, +10, -20, +15, -15), strict=True):
            c.jump(by * MINUTE)
        time.sleep(7.0)  # longer than every TTL
        s = state()
        assert s["writable"] == ids and s["leader"] == leader_id and not s["underreplicated"], (s, cluster.logs())

        # 2. The leader dies; the other takes over; the dead one comes back 20 minutes ahead.
        t_kill = time.monotonic()
        leader.stop(kill=True)
        wait_until(lambda: state()["leader"] == other.candidate_id, timeout_s=20, interval_s=0.2,
                   message=f"the other autorecovery process to lead\n{cluster.logs()}")
        takeover_s = time.monotonic() - t_kill
        leader.clock.jump(+20 * MINUTE)  # type: ignore[union-attr]
        leader.start()
        cluster.wait_http([leader])
        time.sleep(2.0)
        assert state()["leader"] == other.candidate_id

        # 3. A bookie dies while both autorecovery clocks step again.
        first = client.call(f"verify {seed} {ledgers[0]}")["ledgers"][ledgers[0]]
        victim = next(b for b in bookies if b.bookie_id in first["fragments"][0][1])
        named = [lid for lid, r in client.call(f"verify {seed} {' '.join(ledgers)}")["ledgers"].items()
                 if victim.bookie_id in r["fragments"][0][1]]
        t_victim = time.monotonic()
        victim.stop(kill=True)
        for c, by in zip(aclocks, (-30, +30), strict=True):
            c.jump(by * MINUTE)

        def repaired() -> bool:
            if state()["underreplicated"]:
                return False
            got = client.call(f"verify {seed} {' '.join(ledgers)}")["ledgers"]
            return all(victim.bookie_id not in bks for r in got.values() for _, bks in r["fragments"])
        wait_until(repaired, timeout_s=60, interval_s=1.0, message=f"the ledgers re-replicated\n{cluster.logs()}")
        repaired_s = time.monotonic() - t_victim
        time.sleep(1.0)

    final = client.call(f"verify {seed} {' '.join(ledgers)}")["ledgers"]
    for lid, r in final.items():
        assert r["closed"] and r["last_entry_id"] == 99, (lid, r)
        assert r["read"] == 100 and r["read_wrong"] == [], (lid, r)
        assert all(bad == [] for bad in r["bad_replicas"].values()), (lid, r["bad_replicas"])
    assert watch.overlaps == [], watch.overlaps
    assert watch.leaders_seen() == [leader.name, other.name], f"leadership: {watch.spans}"
    # Each fragment that named the dead bookie was replaced once, and no repair lost a race
    # to another (that would show as a fragment that "changed during copy").
    logs = {a.name: a.log_text() for a in ars}
    replaced = Counter((lid, frag) for text in logs.values() for lid, frag, old, _ in REPLACED.findall(text)
                       if old == victim.bookie_id)
    assert sorted(lid for lid, _ in replaced) == sorted(named) and set(replaced.values()) == {1}, replaced
    assert not any("changed during copy" in text for text in logs.values()), logs
    by_process = {name: sum(1 for _, _, old, _ in REPLACED.findall(text) if old == victim.bookie_id)
                  for name, text in logs.items()}
    for n in [a for a in ars if a is not leader] + [b for b in bookies if b is not victim]:
        assert n.alive, f"{n.name} exited:\n{n.log_text()[-3000:]}"
    for n in [*ars, *(b for b in bookies if b is not victim)]:
        assert "lease lost" not in n.log_text() and "lease expired" not in n.log_text(), \
            f"{n.name} lost a lease:\n{n.log_text()[-3000:]}"
    print(f"ready in {ready_s:.1f} s; {watch.samples} leader samples; takeover {takeover_s:.1f} s after the "
          f"leader's kill; {len(named)} ledgers re-replicated {repaired_s:.1f} s after a bookie's kill, "
          f"fragments replaced per process: {by_process}")

