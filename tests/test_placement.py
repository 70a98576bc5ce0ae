import random

import pytest

from zbk.client.placement import choose_ensemble, choose_replacement
from zbk.errors import NotEnoughBookiesError
from zbk.metadata.registry import BookieRegistration


def regs(spec: list[tuple[str, str]], readonly: set[str] = frozenset()) -> list[BookieRegistration]:  # type: ignore[assignment]
    return [BookieRegistration(bookie_id=b, rack=r, state="readonly" if b in readonly else "writable") for b, r in spec]


def test_random_and_never_read_only():
    pool = regs([(f"h{i}:1", "") for i in range(6)], readonly={"h0:1", "h1:1"})
    seen = set()
    for seed in range(50):
        ens = choose_ensemble(pool, 3, rng=random.Random(seed))
        assert len(set(ens)) == 3 and not {"h0:1", "h1:1"} & set(ens)
        seen.update(ens)
    assert seen == {"h2:1", "h3:1", "h4:1", "h5:1"}  # random: every writable bookie gets used


def test_not_enough_bookies():
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(regs([("a:1", ""), ("b:1", "")]), 3)
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(regs([("a:1", ""), ("b:1", ""), ("c:1", "")], readonly={"c:1"}), 3)


@pytest.mark.parametrize("seed", range(30))
def test_rack_aware_write_sets_span_racks(seed):
    pool = regs([(f"{r}{i}:1", r) for r in "xyz" for i in range(3)])
    rack = {b.bookie_id: b.rack for b in pool}
    ens = choose_ensemble(pool, 6, rng=random.Random(seed))
    n = len(ens)
    for e in range(n):  # WQ=2 round-robin write sets: neighbours must differ in rack
        assert rack[ens[e]] != rack[ens[(e + 1) % n]] or len({rack[b] for b in ens}) == 1, ens


def test_replacement_prefers_a_rack_unlike_its_neighbours():
    pool = regs([("a1:1", "a"), ("b1:1", "b"), ("c1:1", "c"), ("a2:1", "a"), ("c2:1", "c")])
    for seed in range(20):
        new = choose_replacement(pool, ["a1:1", "b1:1", "c1:1"], 1, rng=random.Random(seed))
        assert new == "a2:1" or new == "c2:1"
    # b1 failed; neighbours are racks a and c -> a bookie of neither is best; none exists here,
    # so any spare is acceptable, but a bookie already in the ensemble never is.
    with pytest.raises(NotEnoughBookiesError):
        choose_replacement(regs([("a:1", ""), ("b:1", "")]), ["a:1", "b:1"], 0)
