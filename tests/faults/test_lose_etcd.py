"""A bookie cut off from etcd only (``lose_etcd``), with etcd, three bookies and a client each
in a host of their own.

The bookie can no longer refresh its registration lease, so etcd lets the lease expire and
the bookie is no longer registered; clients still reach it. What zbk does about it
(zbk/actors/bookie.py, zbk/metadata/coordination.py): the bookie keeps serving, and its
lease keeper, which treats a store that does not answer as no answer at all, keeps
retrying; the first answer after healing says the lease expired, and the bookie registers
again on a new lease. Clients: a ledger whose ensemble holds the bookie keeps writing
through it (nothing fails, so nothing changes its ensemble); new ledgers are placed on
registered bookies only. No acknowledged entry is lost.
"""

from __future__ import annotations

import time

from faults.conftest import ClusterFactory, NetworkFactory
from faults.netcluster import BOOKIE_SETTINGS
from faults.partcheck import PARTCLIENT, acked, check_closed_ledger, command

BEFORE = 50
BATCH = 100  # appends per phase
TTL_S = int(str(BOOKIE_SETTINGS["registration_ttl_s"]))
# The cut lasts past the etcd client's own deadline of a call (10 s) and its gRPC keep-alive
# (10 s, 5 s to answer), so that the bookie's connection to etcd is given up and made anew.
CUT_S = 16.0


def test_a_bookie_cut_from_etcd_keeps_serving_and_registers_again(
        network: NetworkFactory, netcluster: ClusterFactory) -> None:
    net = network(["etcd", "b1", "b2", "b3", "client"])
    cluster = netcluster(net, etcd_hosts=["etcd"], bookie_hosts=["b1", "b2", "b3"])
    ids = sorted(cluster.bookie_id(h) for h in cluster.bookie_hosts)
    assert sorted(cluster.wait_ready("client")) == ids
    registry = cluster.session("client", "registry", script=PARTCLIENT)
    assert sorted(registry.read(timeout_s=60)["registered"]) == ids
    # No bookie here is silent to clients, so no add should time out: a generous timeout
    # keeps a loaded machine from failing one (with two registered bookies, an E3 ledger
    # could not replace a third).
    writer = cluster.session("client", "--add-timeout-ms", "10000", "writer", "--ensemble", "3", "--wq", "3",
                             "--aq", "2", "--before", str(BEFORE), script=PARTCLIENT)
    ready = writer.read(timeout_s=60)
    lid, ensemble = ready["ledger_id"], ready["ensemble"]
    target_id = ensemble[0]
    target = cluster.host_of(target_id)
    others = [b for b in ids if b != target_id]
    churn = cluster.session("client", "--add-timeout-ms", "10000", "churn", "--ensemble", "2", "--wq", "2", "--aq", "2", script=PARTCLIENT)
    assert churn.read(timeout_s=60)["event"] == "started"

    t_cut = time.monotonic()
    net.faults.lose_etcd(target, ["etcd"])
    # Writes through the bookie go on while its lease runs out.
    during = command(writer, f"append {BATCH}")
    assert during["new"] == {"acked": BATCH, "failed": 0, "pending": 0, "sent": BATCH}, during["failed"][:3]
    gone = command(registry, f"gone {target_id} 20")
    assert gone["after_s"] is not None, f"{target_id} still registered 20 s after losing etcd: {gone}"
    gone_s = time.monotonic() - t_cut
    # Unregistered, it still serves: the writer's adds are acknowledged through it, with no
    # ensemble change; new ledgers go to the registered bookies only.
    unregistered = command(writer, f"append {BATCH}")
    assert unregistered["new"] == {"acked": BATCH, "failed": 0, "pending": 0, "sent": BATCH}, \
        unregistered["failed"][:3]
    assert unregistered["fragments"] == [[0, ensemble]], unregistered["fragments"]
    created = command(churn, "create 3 20")
    assert created["create_errors"] == [], created["create_errors"]
    for led in created["ledgers"].values():
        assert sorted(led["fragments"][0][1]) == others, led["fragments"]
        assert len(led["acked"]) == 20 and not led["failed"] and not led["pending"], led
    time.sleep(max(0.0, t_cut + CUT_S - time.monotonic()))
    late = command(writer, f"append {BATCH}")
    assert late["new"] == {"acked": BATCH, "failed": 0, "pending": 0, "sent": BATCH}, late["failed"][:3]
    assert cluster.procs[target].poll() is None, f"{target} exited:\n{cluster.logs()}"
    assert target_id not in command(registry, f"gone {target_id} 1")["registered"]

    net.faults.heal()
    t_heal = time.monotonic()
    back = command(registry, f"back {target_id} 30")
    assert back["after_s"] is not None, f"{target_id} not registered again 30 s after healing: {back}"
    back_s = time.monotonic() - t_heal
    after = command(writer, f"append {BATCH}")
    assert after["new"] == {"acked": BATCH, "failed": 0, "pending": 0, "sent": BATCH}, after["failed"][:3]
    closed = command(writer, "close")
    assert closed["close_error"] is None and closed["fragments"] == [[0, ensemble]], closed
    acks = acked(ready, during, unregistered, late, after)
    assert sorted(acks) == list(range(BEFORE + 4 * BATCH))
    assert closed["closed_last"] == max(acks)
    for s in (writer, churn, registry):
        s.send("exit")
        assert s.wait(30) == 0

    ledgers = [lid, *map(int, created["ledgers"])]
    reads = cluster.client("client", "readall", *map(str, ledgers), script=PARTCLIENT)["ledgers"]
    check_closed_ledger(reads[str(lid)], acks)
    for l_id, led in created["ledgers"].items():
        check_closed_ledger(reads[l_id], acked(led))
    log = (cluster.root / f"{target}.log").read_text()
    assert "registration lease lost: registering again" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    print(f"\n{target_id} cut from etcd for {t_heal - t_cut:.1f} s (TTL {TTL_S} s): unregistered {gone_s:.2f} s "
          f"after the cut, registered again {back_s:.2f} s after healing; {4 * BATCH} adds through it, none failed")
