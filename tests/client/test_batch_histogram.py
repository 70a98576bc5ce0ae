"""zbk_client_add_entry_seconds is a BatchHistogram: exported exactly as prometheus_client's
Histogram of the same buckets would export the same observations."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from zbk.client.metrics import BatchHistogram
from zbk.limits import LATENCY_BUCKETS


def _samples(registry: CollectorRegistry) -> list[tuple[str, float]]:
    out = []
    for line in generate_latest(registry).decode().splitlines():
        if not line.startswith("#") and "_created" not in line:
            name, value = line.rsplit(" ", 1)
            out.append((name.split("_seconds", 1)[1], float(value)))
    return out


def test_batch_histogram_exports_what_a_histogram_would() -> None:
    rng = random.Random(7)
    values = [0.0001, 0.00025, 10.0, 11.0, 0.0] + [rng.expovariate(20) for _ in range(500)]
    mine, ref = CollectorRegistry(), CollectorRegistry()
    ours = BatchHistogram("mine_seconds", "mine", LATENCY_BUCKETS, registry=mine)
    theirs = Histogram("ref_seconds", "ref", buckets=LATENCY_BUCKETS, registry=ref)
    ours.observe_many(values[:100])
    for v in values[100:]:
        ours.observe(v)
    for v in values:
        theirs.observe(v)
    got, want = _samples(mine), _samples(ref)
    assert [s for s in got if s[0] != "_sum"] == [s for s in want if s[0] != "_sum"]
    assert abs(dict(got)["_sum"] - sum(values)) < 1e-9
