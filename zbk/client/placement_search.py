"""The search behind :mod:`zbk.client.placement`: fill the open positions of an ensemble
so that every write set that holds an open position spans at least ``r`` locations
(racks) and ``z`` zones.

Positions are filled in order, each with a location (a rack), the bookie a random spare
one of that rack. A choice that leaves some write set unable to reach its targets (its
distinct racks so far plus its open positions fall short) is undone at once, and the
search backtracks. Which rack is tried first is the spreading rule: one whose zone, then
one whose rack, no neighbour (a member sharing a write set) has yet; then the rack with
the most spare bookies; then chance. Racks, not bookies, are the choices, so an ensemble
over a few racks has few branches to search.

The targets start at the strongest the caller asks for (racks: min(min_racks, WQ); zones:
as many as WQ and the cluster allow) and weaken one step at a time while no placement
meets them: zones first, then racks unless they are enforced. ``r`` = ``z`` = 1 always
succeeds, with no backtracking, when there are enough bookies. Every search but that one
shares a budget of ``placement_search_steps_max`` assignments, so a target no placement
can meet (which counting alone does not always reveal) costs bounded time.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence

from zbk import limits

Location = tuple[str, str]  # (zone, rack)
Slots = list[str | None]  # an ensemble with its open positions None


class _OutOfSteps(Exception):
    pass


class _Budget:
    def __init__(self, steps: int | None) -> None:
        self.left = steps

    def take(self) -> None:
        if self.left is not None:
            self.left -= 1
            if self.left < 0:
                raise _OutOfSteps


def place(slots: Slots, fixed: Mapping[int, Location], pool: Sequence[tuple[str, Location]], *,
          write_quorum: int, min_racks: int, enforce: bool, rng: random.Random) -> list[str] | None:
    """``slots`` with every None replaced by a bookie of ``pool`` ((id, location) pairs,
    all usable), or None if ``enforce`` and no placement gives ``min_racks`` racks per
    write set (the caller has checked that ``pool`` has enough bookies).
    ``fixed`` is the location of each member that stays."""
    n = len(slots)
    wq = min(write_quorum, n)
    pools: dict[Location, list[str]] = {}
    for bookie_id, loc in pool:
        pools.setdefault(loc, []).append(bookie_id)
    for ids in pools.values():
        rng.shuffle(ids)
    zones = {loc[0] for loc in pools} | {loc[0] for loc in fixed.values()}
    racks_max = min(min_racks, wq)
    budget = _Budget(limits.placement_search_steps_max)
    for r in ([racks_max] if enforce else range(racks_max, 0, -1)):
        for z in range(min(wq, len(zones)), 0, -1):
            search = _Search(slots, fixed, pools, wq, r, z, rng,
                             _Budget(None) if r == z == 1 else budget)
            try:
                if search.feasible() and search.run():
                    return [s for s in search.chosen if s is not None]
            except _OutOfSteps:
                pass
            finally:
                search.give_back()
    return None


class _Search:
    def __init__(self, slots: Slots, fixed: Mapping[int, Location], pools: dict[Location, list[str]], wq: int,
                 r: int, z: int, rng: random.Random, budget: _Budget) -> None:
        n = len(slots)
        self.n, self.r, self.z, self.rng, self.budget = n, r, z, rng, budget
        self.pools = pools
        self.chosen: Slots = list(slots)
        self.taken: list[tuple[int, Location]] = []  # what this search holds of ``pools``
        self.loc: list[Location | None] = [fixed.get(i) for i in range(n)]
        self.open = [i for i in range(n) if slots[i] is None]
        windows = [[(s + k) % n for k in range(wq)] for s in range(n if wq < n else 1)]
        # Only the write sets an open position changes are held to the targets: the others
        # stay as they are whatever is chosen.
        open_set = set(self.open)
        self.windows = [w for w in windows if open_set.intersection(w)]
        self.windows_of: list[list[int]] = [[] for _ in range(n)]
        for wi, w in enumerate(self.windows):
            for p in w:
                self.windows_of[p].append(wi)
        self.neighbours: list[set[int]] = [set() for _ in range(n)]
        for w in windows:
            for p in w:
                self.neighbours[p].update(q for q in w if q != p)
        self.w_locs: list[Counter[Location]] = [Counter() for _ in self.windows]
        self.w_zones: list[Counter[str]] = [Counter() for _ in self.windows]
        self.w_open = [0] * len(self.windows)
        for wi, w in enumerate(self.windows):
            for p in w:
                loc = self.loc[p]
                if loc is None:
                    self.w_open[wi] += 1
                else:
                    self.w_locs[wi][loc] += 1
                    self.w_zones[wi][loc[0]] += 1
        # A whole new ensemble: in every write set of WQ a rack holds at most WQ - r + 1
        # members, and each position is in WQ write sets, so a rack holds at most
        # n * (WQ - r + 1) / WQ members in all (likewise a zone). With members that stay,
        # only some write sets are held to the targets and the bound does not apply.
        self.rack_cap = n * (wq - r + 1) // wq if not fixed else n
        self.zone_cap = n * (wq - z + 1) // wq if not fixed else n
        self.rack_total: Counter[Location] = Counter()
        self.zone_total: Counter[str] = Counter()

    def feasible(self) -> bool:
        """What counting alone can tell: enough racks and zones for the targets, enough
        bookies within the caps, and no write set already out of reach."""
        locs = set(self.pools) | {loc for loc in self.loc if loc is not None}
        if len(locs) < self.r or len({loc[0] for loc in locs}) < self.z:
            return False
        if not all(self._window_ok(wi) for wi in range(len(self.windows))):
            return False
        if self.rack_cap < self.n or self.zone_cap < self.n:
            by_zone: Counter[str] = Counter()
            for loc, ids in self.pools.items():
                by_zone[loc[0]] += len(ids)
            room = sum(min(len(ids), self.rack_cap) for ids in self.pools.values())
            zone_room = sum(min(k, self.zone_cap) for k in by_zone.values())
            if room < len(self.open) or zone_room < len(self.open):
                return False
        return True

    def run(self) -> bool:
        return self._fill(0)

    def give_back(self) -> None:
        """Return every bookie this search holds to the shared pools."""
        while self.taken:
            pos, loc = self.taken.pop()
            bookie = self.chosen[pos]
            assert bookie is not None
            self.pools[loc].append(bookie)
            self.chosen[pos] = None

    def _window_ok(self, wi: int) -> bool:
        left = self.w_open[wi]
        return len(self.w_locs[wi]) + left >= self.r and len(self.w_zones[wi]) + left >= self.z

    def _fill(self, k: int) -> bool:
        if k == len(self.open):
            return True
        pos = self.open[k]
        for loc in self._order(pos):
            self.budget.take()
            if self._assign(pos, loc):
                if self._fill(k + 1):
                    return True
                self._unassign(pos, loc)
        return False

    def _order(self, pos: int) -> list[Location]:
        near = [loc for q in self.neighbours[pos] if (loc := self.loc[q]) is not None]
        near_locs, near_zones = set(near), {loc[0] for loc in near}
        return sorted((loc for loc, ids in self.pools.items() if ids),
                      key=lambda loc: (loc[0] in near_zones, loc in near_locs, -len(self.pools[loc]),
                                       self.rng.random()))

    def _assign(self, pos: int, loc: Location) -> bool:
        self.rack_total[loc] += 1
        self.zone_total[loc[0]] += 1
        self.loc[pos] = loc
        for wi in self.windows_of[pos]:
            self.w_open[wi] -= 1
            self.w_locs[wi][loc] += 1
            self.w_zones[wi][loc[0]] += 1
        ok = (self.rack_total[loc] <= self.rack_cap and self.zone_total[loc[0]] <= self.zone_cap
              and all(self._window_ok(wi) for wi in self.windows_of[pos]))
        if not ok:
            self._count_out(pos, loc)
            return False
        self.chosen[pos] = self.pools[loc].pop()
        self.taken.append((pos, loc))
        return True

    def _unassign(self, pos: int, loc: Location) -> None:
        taken = self.taken.pop()
        assert taken == (pos, loc), (taken, pos, loc)
        bookie = self.chosen[pos]
        assert bookie is not None
        self.pools[loc].append(bookie)
        self.chosen[pos] = None
        self._count_out(pos, loc)

    def _count_out(self, pos: int, loc: Location) -> None:
        self.rack_total[loc] -= 1
        self.zone_total[loc[0]] -= 1
        self.loc[pos] = None
        for wi in self.windows_of[pos]:
            self.w_open[wi] += 1
            # Zero counts are deleted: len() counts the distinct racks (zones) present.
            locs, zones = self.w_locs[wi], self.w_zones[wi]
            locs[loc] -= 1
            if not locs[loc]:
                del locs[loc]
            zones[loc[0]] -= 1
            if not zones[loc[0]]:
                del zones[loc[0]]
