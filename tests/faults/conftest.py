"""The ``network`` fixture: ``network(["a", "b"])`` builds hosts in network namespaces
(faults.netns.Network); each network is torn down by a finalizer, even when the test or the
build fails, and a teardown that leaves anything behind fails the test."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from faults.netns import Network

NetworkFactory = Callable[[Sequence[str]], Network]


@pytest.fixture
def network(request: pytest.FixtureRequest) -> NetworkFactory:
    def make(names: Sequence[str]) -> Network:
        net = Network(names)
        request.addfinalizer(net.close)  # before create: a half-built network is removed too
        return net.create()

    return make
