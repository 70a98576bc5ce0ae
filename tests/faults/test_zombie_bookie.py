"""A zombie bookie over a real partition: etcd, three bookies and a client, each in a host
of its own; clients lose a bookie of their ensemble while it keeps its lease in etcd."""

from __future__ import annotations

from faults.conftest import ClusterFactory, NetworkFactory
from faults.netcluster import BOOKIE_PORT

BEFORE = 50  # entries acknowledged before the cut
AFTER = 200  # entries appended across it


def test_writer_replaces_a_zombie_bookie_and_loses_nothing(network: NetworkFactory,
                                                           netcluster: ClusterFactory) -> None:
    net = network(["etcd", "b1", "b2", "b3", "client"])
    cluster = netcluster(net, etcd_hosts=["etcd"], bookie_hosts=["b1", "b2", "b3"])
    ids = sorted(cluster.bookie_id(h) for h in cluster.bookie_hosts)
    assert ids == ["127.77.0.2:3181", "127.77.0.3:3181", "127.77.0.4:3181"]
    assert sorted(cluster.wait_ready("client")) == ids

    writer = cluster.session("client", "zombie-writer", "--before", str(BEFORE), "--after", str(AFTER))
    ready = writer.read(timeout_s=120)
    zombie_id = ready["ensemble"][0]
    zombie = cluster.host_of(zombie_id)
    net.faults.zombie(zombie, ["client"], port=BOOKIE_PORT)
    writer.send()
    done = writer.read(timeout_s=240)
    assert writer.wait() == 0

    # A zombie, not a dead bookie: it runs and, still talking to etcd, stays registered.
    assert cluster.procs[zombie].poll() is None
    assert zombie_id in done["registered"], done["registered"]
    assert zombie_id in cluster.client("client", "registered")["registered"]
    # The writer changed its ensemble away from it, and every add was acknowledged.
    fragments = done["fragments"]
    assert zombie_id in fragments[0][1] and len(fragments) >= 2, fragments
    assert zombie_id not in fragments[-1][1], fragments
    assert done["failed"] == [], done["failed"][:5]
    acked = {int(e): d for e, d in done["acked"].items()}
    assert sorted(acked) == list(range(BEFORE + AFTER))
    assert done["closed_last_entry_id"] >= max(acked)

    # Every acknowledged entry reads back with its payload: first with the zombie still cut
    # off (reads fail over to the other replica), then after healing.
    read = {int(e): d for e, d in done["read"].items()}
    assert {e: read.get(e) for e in acked} == acked
    net.faults.heal()
    healed = cluster.client("client", "read", str(done["ledger_id"]))
    assert {e: healed["entries"].get(str(e)) for e in acked} == acked
    assert healed["last_entry_id"] == done["closed_last_entry_id"]
