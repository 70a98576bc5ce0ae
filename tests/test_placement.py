"""Placement (zbk/client/placement.py): the rules, checked on every write set of every
ensemble, and the search's choices compared with an exhaustive one on small clusters."""

import itertools
import random
import time
from collections import Counter

import pytest

from zbk.client.placement import (
    POLICY_KEY,
    PlacementPolicy,
    choose_ensemble,
    choose_replacement,
    choose_replacements,
    placement_violations,
)
from zbk.errors import BadRequestError, CorruptMetadataError, NotEnoughBookiesError
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import BookieRegistration


def regs(spec: list[tuple[str, str]], readonly: set[str] = frozenset()) -> list[BookieRegistration]:  # type: ignore[assignment]
    return [BookieRegistration(bookie_id=b, rack=r, state="readonly" if b in readonly else "writable") for b, r in spec]


def reg(bid: str, rack: str = "", zone: str = "", group: str = "", state: str = "writable") -> BookieRegistration:
    return BookieRegistration(bookie_id=bid, rack=rack, zone=zone, isolation_group=group, state=state)  # type: ignore[arg-type]


def write_sets(ens: list[str], wq: int) -> list[list[str]]:
    n = len(ens)
    return [[ens[(s + k) % n] for k in range(wq)] for s in range(n)]


def racks_per_set(ens: list[str], wq: int, pool: list[BookieRegistration]) -> list[int]:
    loc = {b.bookie_id: (b.zone, b.rack) for b in pool}
    return [len({loc[b] for b in ws}) for ws in write_sets(ens, wq)]


def test_random_and_never_read_only():
    pool = regs([(f"h{i}:1", "") for i in range(6)], readonly={"h0:1", "h1:1"})
    seen = set()
    for seed in range(50):
        ens = choose_ensemble(pool, 3, write_quorum=2, rng=random.Random(seed))
        assert len(set(ens)) == 3 and not {"h0:1", "h1:1"} & set(ens)
        seen.update(ens)
    assert seen == {"h2:1", "h3:1", "h4:1", "h5:1"}  # random: every writable bookie gets used


def test_not_enough_bookies():
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(regs([("a:1", ""), ("b:1", "")]), 3, write_quorum=2)
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(regs([("a:1", ""), ("b:1", ""), ("c:1", "")], readonly={"c:1"}), 3, write_quorum=2)


def test_bad_quorums_are_bad_requests():
    pool = regs([(f"h{i}:1", "") for i in range(4)])
    for size, wq in ((3, 4), (3, 0), (0, 0), (65, 2)):
        with pytest.raises(BadRequestError):
            choose_ensemble(pool, size, write_quorum=wq)


@pytest.mark.parametrize("seed", range(30))
def test_rack_aware_write_sets_span_racks(seed):
    pool = regs([(f"{r}{i}:1", r) for r in "xyz" for i in range(3)])
    rack = {b.bookie_id: b.rack for b in pool}
    ens = choose_ensemble(pool, 6, write_quorum=2, rng=random.Random(seed))
    n = len(ens)
    for e in range(n):  # WQ=2 round-robin write sets: neighbours must differ in rack
        assert rack[ens[e]] != rack[ens[(e + 1) % n]] or len({rack[b] for b in ens}) == 1, ens


def test_replacement_prefers_a_rack_unlike_its_neighbours():
    pool = regs([("a1:1", "a"), ("b1:1", "b"), ("c1:1", "c"), ("a2:1", "a"), ("c2:1", "c"), ("c3:1", "c")])
    for seed in range(20):
        # WQ=2: b1's write sets are (a1, b1) and (b1, c1); a replacement from rack a or c
        # leaves one of them in one rack, unless the minimum is 1.
        new = choose_replacement(pool, ["a1:1", "b1:1", "c1:1"], 1, write_quorum=2, rng=random.Random(seed))
        assert new in {"a2:1", "c2:1", "c3:1"}
    with pytest.raises(NotEnoughBookiesError):  # a bookie already in the ensemble never is a spare
        choose_replacement(regs([("a:1", ""), ("b:1", "")]), ["a:1", "b:1"], 0, write_quorum=2)
    # E=4, WQ=3, three racks per write set: b1's three write sets hold a1, c1 and d1, so
    # only x1 (rack x) will do, though rack a has more spares.
    pool = regs([("a1:1", "a"), ("b1:1", "b"), ("c1:1", "c"), ("d1:1", "d"), ("a2:1", "a"), ("a3:1", "a"),
                 ("c2:1", "c"), ("x1:1", "x")])
    ens = ["a1:1", "b1:1", "c1:1", "d1:1"]
    for seed in range(20):
        new = choose_replacement(pool, ens, 1, write_quorum=3, policy=PlacementPolicy(min_racks=3),
                                 rng=random.Random(seed))
        assert new == "x1:1"


def test_wrap_around_write_sets_count():
    """The last write sets wrap to the ensemble's start: (e3, e0, e1) for E=4, WQ=3."""
    pool = [reg("a1:1", "a"), reg("a2:1", "a"), reg("b1:1", "b"), reg("b2:1", "b")]
    for seed in range(40):
        ens = choose_ensemble(pool, 4, write_quorum=3, policy=PlacementPolicy(2, True), rng=random.Random(seed))
        assert min(racks_per_set(ens, 3, pool)) == 2, ens
    # With WQ=2 there is one way up to rotation: a, b, a, b.
    for seed in range(40):
        ens = choose_ensemble(pool, 4, write_quorum=2, policy=PlacementPolicy(2, True), rng=random.Random(seed))
        assert min(racks_per_set(ens, 2, pool)) == 2, ens


def test_enforced_minimum_fails_rather_than_place_short():
    one_rack = [reg(f"a{i}:1", "a") for i in range(5)]
    with pytest.raises(NotEnoughBookiesError, match="racks"):
        choose_ensemble(one_rack, 3, write_quorum=2, policy=PlacementPolicy(2, True))
    # Not enforced: placed anyway, on the one rack there is.
    assert len(choose_ensemble(one_rack, 3, write_quorum=2, policy=PlacementPolicy(2, False))) == 3
    # Two racks, min 3 of WQ 3: short by one rack.
    two = one_rack + [reg("b1:1", "b"), reg("b2:1", "b")]
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(two, 3, write_quorum=3, policy=PlacementPolicy(3, True))
    ens = choose_ensemble(two, 3, write_quorum=3, policy=PlacementPolicy(3, False))
    assert set(racks_per_set(ens, 3, two)) == {2}  # the most it can
    # min_racks above WQ asks for WQ racks (BookKeeper's min(WQ, minNumRacksPerWriteQuorum)).
    ens = choose_ensemble(two, 4, write_quorum=2, policy=PlacementPolicy(5, True), rng=random.Random(1))
    assert min(racks_per_set(ens, 2, two)) == 2
    # Two racks cannot alternate around an odd ensemble: E=3, WQ=2 has a write set in one.
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(two, 3, write_quorum=2, policy=PlacementPolicy(2, True))
    # 6 of a and 1 of b cannot alternate on E=4, WQ=2.
    skew = one_rack + [reg("a5:1", "a"), reg("b1:1", "b")]
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(skew, 4, write_quorum=2, policy=PlacementPolicy(2, True))


def test_enforced_minimum_leaves_out_bookies_without_a_rack():
    pool = [reg("a1:1", "a"), reg("b1:1", "b"), reg("n1:1", ""), reg("n2:1", "")]
    for seed in range(20):
        with pytest.raises(NotEnoughBookiesError, match="with a rack"):
            choose_ensemble(pool, 3, write_quorum=2, policy=PlacementPolicy(2, True), rng=random.Random(seed))
        assert set(choose_ensemble(pool, 2, write_quorum=2, policy=PlacementPolicy(2, True),
                                   rng=random.Random(seed))) == {"a1:1", "b1:1"}
    # Not enforced, "" is a rack like any other.
    assert len(choose_ensemble(pool, 4, write_quorum=2, policy=PlacementPolicy(2, False))) == 4


def test_zones_spread_where_they_can():
    # Three zones of two racks of two bookies: every write set of 3 spans all three zones.
    pool = [reg(f"{z}{r}{i}:1", rack=r, zone=z) for z in "XYZ" for r in "pq" for i in range(2)]
    zone = {b.bookie_id: b.zone for b in pool}
    for seed in range(30):
        ens = choose_ensemble(pool, 6, write_quorum=3, rng=random.Random(seed))
        assert all(len({zone[b] for b in ws}) == 3 for ws in write_sets(ens, 3)), ens
    # A zone with most of the bookies: spread as far as it goes, never failing.
    pool = [reg(f"X{i}:1", rack=f"r{i}", zone="X") for i in range(6)] + [reg("Y0:1", rack="r0", zone="Y")]
    zone = {b.bookie_id: b.zone for b in pool}
    for seed in range(30):
        ens = choose_ensemble(pool, 5, write_quorum=2, policy=PlacementPolicy(2, True), rng=random.Random(seed))
        assert "Y0:1" in ens and min(racks_per_set(ens, 2, pool)) == 2
    # Racks of the same name in two zones are two racks.
    pool = [reg("X1:1", rack="r", zone="X"), reg("Y1:1", rack="r", zone="Y")]
    assert len(choose_ensemble(pool, 2, write_quorum=2, policy=PlacementPolicy(2, True))) == 2


def test_isolation_groups_restrict_the_clients_that_name_them():
    pool = [reg(f"g{i}:1", rack=f"r{i % 2}", group="gold") for i in range(3)] + \
           [reg(f"s{i}:1", rack=f"r{i % 2}", group="silver") for i in range(2)] + \
           [reg(f"n{i}:1", rack=f"r{i % 2}") for i in range(3)]
    gold = PlacementPolicy(isolation_groups=("gold",))
    seen_default: Counter[str] = Counter()
    for seed in range(50):
        assert all(b.startswith("g") for b in choose_ensemble(pool, 3, write_quorum=2, policy=gold,
                                                              rng=random.Random(seed)))
        both = choose_ensemble(pool, 5, write_quorum=2, policy=PlacementPolicy(isolation_groups=("gold", "silver")),
                               rng=random.Random(seed))
        assert all(b[0] in "gs" for b in both)
        seen_default.update(b[0] for b in choose_ensemble(pool, 3, write_quorum=2, rng=random.Random(seed)))
    # A client naming no group uses every bookie, grouped or not (BookKeeper's semantics).
    assert set(seen_default) == {"g", "s", "n"}
    with pytest.raises(NotEnoughBookiesError, match="isolation groups"):
        choose_ensemble(pool, 4, write_quorum=2, policy=gold)
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(pool, 1, write_quorum=1, policy=PlacementPolicy(isolation_groups=("nosuch",)))
    # Replacements stay in the group, or there are none.
    ens = ["g0:1", "g1:1", "g2:1"]
    with pytest.raises(NotEnoughBookiesError):
        choose_replacement(pool, ens, 0, write_quorum=2, policy=gold)
    more = pool + [reg("g3:1", rack="r1", group="gold")]
    assert choose_replacement(more, ens, 0, write_quorum=2, policy=gold) == "g3:1"


def test_replacements_keep_the_others_and_are_chosen_together():
    pool = [reg(f"{r}{i}:1", r) for r in "abc" for i in range(3)]
    ens = ["a0:1", "b0:1", "c0:1", "a1:1", "b1:1", "c1:1"]
    for seed in range(30):
        new = choose_replacements(pool, ens, [1, 2], write_quorum=3, policy=PlacementPolicy(3, True),
                                  exclude={"b0:1", "c0:1"}, rng=random.Random(seed))
        assert [new[i] for i in (0, 3, 4, 5)] == [ens[i] for i in (0, 3, 4, 5)]
        assert not {new[1], new[2]} & set(ens)
        assert min(racks_per_set(new, 3, pool)) == 3, new
    # Members outside the write sets that change do not count against a replacement:
    # E=6, WQ=2, with (a0, a1) already in one rack, replacing position 4 still succeeds.
    bad = ["a0:1", "a1:1", "b0:1", "c0:1", "b1:1", "c1:1"]
    got = choose_replacement(pool, bad, 4, write_quorum=2, policy=PlacementPolicy(2, True))
    assert got in {"a2:1", "b2:1"}
    # A member whose registration is unknown (dead too) counts as a rack of its own.
    partial = [b for b in pool if b.bookie_id != "b1:1"]
    got = choose_replacement(partial, ens, 3, write_quorum=3, policy=PlacementPolicy(3, True), exclude={"b1:1"})
    assert got.startswith("a")


def _brute(n, wq, fixed, pools, open_positions):
    """Every (min racks, min zones) over the constrained write sets that some placement of
    ``pools`` (location -> count) into ``open_positions`` reaches."""
    windows = [[(s + k) % n for k in range(wq)] for s in range(n if wq < n else 1)]
    windows = [w for w in windows if set(w) & set(open_positions)]
    reach = set()
    locs = sorted(pools)
    for combo in itertools.product(locs, repeat=len(open_positions)):
        if any(combo.count(loc) > pools[loc] for loc in set(combo)):
            continue
        at = dict(fixed)
        at.update(zip(open_positions, combo, strict=True))
        rmin = min(len({at[p] for p in w}) for w in windows)
        zmin = min(len({at[p][0] for p in w}) for w in windows)
        reach.add((rmin, zmin))
    return reach


@pytest.mark.parametrize("seed", range(400))
def test_search_matches_an_exhaustive_one(seed):
    """On small random clusters the search reaches the best racks per write set (capped
    at min(min_racks, WQ)), then the most zones; enforced, it fails exactly when no
    placement reaches the minimum."""
    rng = random.Random(seed)
    pool = []
    for i in range(rng.randint(3, 8)):
        pool.append(reg(f"h{i}:1", rack=rng.choice("ab" if seed % 3 else "abc"), zone=rng.choice("XY" if seed % 2 else "X")))
    n = rng.randint(2, min(6, len(pool)))
    # Mostly targets above one rack: with one, any placement will do.
    trivial = seed % 8 == 0
    wq = rng.randint(1, n) if trivial else rng.randint(2, n)
    policy = PlacementPolicy(rng.randint(1, 3) if trivial else rng.randint(2, 3), rng.random() < 0.5)
    replacing = seed % 3 == 0 and n < len(pool)
    base = choose_ensemble(pool, n, write_quorum=wq, rng=random.Random(seed)) if replacing else None
    positions = sorted(rng.sample(range(n), rng.randint(1, min(2, len(pool) - n)))) if replacing else list(range(n))
    usable = [b for b in pool if (not policy.enforce_min_racks or b.rack) and (base is None or b.bookie_id not in base)]
    loc_of = {b.bookie_id: (b.zone, b.rack) for b in pool}
    pools = Counter(loc_of[b.bookie_id] for b in usable)
    fixed = {i: loc_of[b] for i, b in enumerate(base or []) if i not in positions}
    reach = _brute(n, min(wq, n), fixed, pools, positions) if len(usable) >= len(positions) else set()
    r_hi = min(policy.min_racks, wq)
    zones = {loc[0] for loc in pools} | {loc[0] for loc in fixed.values()}
    z_hi = min(wq, len(zones))
    best_r = max((min(r, r_hi) for r, _ in reach), default=0)
    best_z = max((min(z, z_hi) for r, z in reach if min(r, r_hi) == best_r), default=0)
    try:
        if replacing:
            got = choose_replacements(pool, base, positions, write_quorum=wq, policy=policy, rng=random.Random(seed))
        else:
            got = choose_ensemble(pool, n, write_quorum=wq, policy=policy, rng=random.Random(seed))
    except NotEnoughBookiesError:
        assert not reach or (policy.enforce_min_racks and best_r < r_hi), (reach, r_hi)
        return
    assert reach and (not policy.enforce_min_racks or best_r == r_hi)
    assert len(set(got)) == n and all(b in {p.bookie_id for p in usable} or (base and b in base) for b in got)
    windows = [[(s + k) % n for k in range(wq)] for s in range(n if wq < n else 1)]
    windows = [w for w in windows if set(w) & set(positions)]
    rmin = min(len({loc_of[got[p]] for p in w}) for w in windows)
    zmin = min(len({loc_of[got[p]][0] for p in w}) for w in windows)
    assert (min(rmin, r_hi), min(zmin, z_hi)) == (best_r, best_z), (got, reach)


def test_an_unsatisfiable_target_costs_bounded_time(monkeypatch):
    # 60 bookies of rack a and four others cannot give 64 alternating racks: counting says
    # so at once. Enforced it fails; not enforced it places with the most racks it can.
    pool = [reg(f"a{i}:1", "a") for i in range(60)] + [reg(f"{r}:1", r) for r in "bcde"]
    t0 = time.monotonic()
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(pool, 64, write_quorum=2, policy=PlacementPolicy(2, True))
    ens = choose_ensemble(pool, 64, write_quorum=2)
    assert len(set(ens)) == 64
    # WQ=3 with min 3 over only three racks needs each rack at every third position:
    # 9 + 8 + 7 bookies cannot fill 24 that way.
    pool = [reg(f"a{i}:1", "a") for i in range(9)] + [reg(f"b{i}:1", "b") for i in range(8)] + \
           [reg(f"c{i}:1", "c") for i in range(7)]
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(pool, 24, write_quorum=3, policy=PlacementPolicy(3, True))
    assert time.monotonic() - t0 < 20
    # The budget: with too few steps to find the placement that exists, an enforced call
    # gives up with NotEnoughBookies, and one not enforced still places (the last,
    # weakest target is never cut short).
    pool = [reg(f"{r}{i}:1", r) for r in "abc" for i in range(8)]
    assert choose_ensemble(pool, 24, write_quorum=3, policy=PlacementPolicy(3, True))
    monkeypatch.setattr("zbk.limits.placement_search_steps_max", 5)
    with pytest.raises(NotEnoughBookiesError):
        choose_ensemble(pool, 24, write_quorum=3, policy=PlacementPolicy(3, True))
    assert len(set(choose_ensemble(pool, 24, write_quorum=3, policy=PlacementPolicy(3, False)))) == 24


def test_a_wide_ensemble_over_many_racks_is_placed_fast():
    pool = [reg(f"{z}{r}{i}:1", rack=f"r{r}", zone=z) for z in "XYZ" for r in range(8) for i in range(4)]
    t0 = time.monotonic()
    for seed in range(5):
        ens = choose_ensemble(pool, 64, write_quorum=5, policy=PlacementPolicy(4, True), rng=random.Random(seed))
        assert min(racks_per_set(ens, 5, pool)) >= 4
        zone = {b.bookie_id: b.zone for b in pool}
        assert all(len({zone[b] for b in ws}) == 3 for ws in write_sets(ens, 5))
    assert time.monotonic() - t0 < 10


def test_policy_record_in_ledger_metadata():
    default = PlacementPolicy()
    assert default.record({"app": b"x"}) == {"app": b"x"}  # the default is not recorded
    policy = PlacementPolicy(3, True, ("gold", "silver"))
    custom = policy.record({"app": b"x"})
    assert set(custom) == {"app", POLICY_KEY} and PlacementPolicy.decode(custom[POLICY_KEY]) == policy
    md = LedgerMetadata(ledger_id=7, ensemble_size=1, write_quorum=1, ack_quorum=1, fragments=((0, ("a:1",)),),
                        custom_metadata=custom)
    assert PlacementPolicy.of_ledger(LedgerMetadata.decode(md.encode())) == policy
    assert PlacementPolicy.of_ledger(LedgerMetadata(ledger_id=7, ensemble_size=1, write_quorum=1, ack_quorum=1,
                                                    fragments=((0, ("a:1",)),))) == default
    with pytest.raises(BadRequestError, match="reserved"):
        policy.record({POLICY_KEY: b"mine"})
    for junk in (b"\xff", b"\x01", PlacementPolicy(3, True).encode()[:-1],
                 __import__("cbor2").dumps({"fv": 1, "mr": 0, "em": False, "ig": []}),
                 __import__("cbor2").dumps({"fv": 1, "mr": 2, "em": 1, "ig": []}),
                 __import__("cbor2").dumps({"fv": 2, "mr": 2, "em": False, "ig": []})):
        with pytest.raises(CorruptMetadataError):
            PlacementPolicy.decode(junk, ledger_id=7)


def test_violations_the_auditor_counts():
    regs_ = {b.bookie_id: b for b in [reg("a1:1", "a", group="g"), reg("a2:1", "a", group="g"),
                                      reg("b1:1", "b", group="g"), reg("n1:1", "", group="h")]}
    ok = placement_violations(["a1:1", "b1:1", "a2:1", "b1:1"][:3], 3, PlacementPolicy(), regs_)
    assert ok == []
    # WQ=2: (a1, a2) spans one rack; the write set that wraps, (b1, a1), does not.
    assert len(placement_violations(["b1:1", "a1:1", "a2:1"], 2, PlacementPolicy(), regs_)) == 1
    assert placement_violations(["b1:1", "a1:1", "a2:1"], 2, PlacementPolicy(min_racks=1), regs_) == []
    # Wrap-around: E=3, WQ=2, sets (a1,b1), (b1,a2), (a2,a1): the last one is short.
    assert placement_violations(["a1:1", "b1:1", "a2:1"], 2, PlacementPolicy(), regs_) != []
    assert any("isolation" in v for v in placement_violations(["a1:1", "n1:1"], 2,
                                                              PlacementPolicy(isolation_groups=("g",)), regs_))
    assert any("without a rack" in v for v in placement_violations(["a1:1", "n1:1"], 2, PlacementPolicy(2, True),
                                                                   regs_))
    # Unregistered members are the lost-bookie audit's business, not a violation.
    assert placement_violations(["a1:1", "gone:1"], 2, PlacementPolicy(), regs_) == []
    # No rack or zone anywhere: nothing to hold a ledger to.
    flat = {b: reg(b) for b in ("x:1", "y:1")}
    assert placement_violations(["x:1", "y:1"], 2, PlacementPolicy(), flat) == []
    # Several zones: a write set within one zone is reported.
    zoned = {"p:1": reg("p:1", "r1", "X"), "q:1": reg("q:1", "r2", "X"), "s:1": reg("s:1", "r3", "Y")}
    assert any("zone" in v for v in placement_violations(["p:1", "q:1"], 2, PlacementPolicy(), zoned))
    assert placement_violations(["p:1", "s:1"], 2, PlacementPolicy(), zoned) == []
