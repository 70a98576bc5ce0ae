"""Fixtures of the fault tests.

``network(["a", "b"])`` builds hosts in network namespaces (faults.netns.Network); each
network is torn down by a finalizer, even when the test or the build fails, and a teardown
that leaves anything behind fails the test.

``netcluster(net, etcd_hosts=..., bookie_hosts=...)`` starts etcd and bookies on a network's
hosts (faults.netcluster.NetCluster) and stops them at teardown, bookies first while etcd
still answers their goodbye; the network's own teardown then removes what is left."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from faults.netcluster import NetCluster
from faults.netns import Network

NetworkFactory = Callable[[Sequence[str]], Network]
ClusterFactory = Callable[..., NetCluster]


@pytest.fixture
def network(request: pytest.FixtureRequest) -> NetworkFactory:
    def make(names: Sequence[str]) -> Network:
        net = Network(names)
        request.addfinalizer(net.close)  # before create: a half-built network is removed too
        return net.create()

    return make


@pytest.fixture
def netcluster(request: pytest.FixtureRequest, tmp_path: Path, network: NetworkFactory) -> ClusterFactory:
    # Depends on ``network`` so that it is torn down first: the bookies stop before the
    # network's teardown stops everything at once.
    def make(net: Network, *, etcd_hosts: Sequence[str], bookie_hosts: Sequence[str]) -> NetCluster:
        cluster = NetCluster(net, tmp_path, etcd_hosts=etcd_hosts, bookie_hosts=bookie_hosts)
        request.addfinalizer(cluster.stop)
        return cluster.start()

    return make
