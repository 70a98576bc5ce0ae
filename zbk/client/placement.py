"""Ensemble placement: which bookies hold a new ledger or replace a failed one.

Random among writable bookies (never read-only ones). When bookies register racks, the
ensemble is ordered so that consecutive members (and so every round-robin write set, which
is WQ consecutive members) come from different racks whenever there are enough racks.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence, Set

from zbk.errors import NotEnoughBookiesError
from zbk.metadata.registry import BookieRegistration


def choose_ensemble(bookies: Sequence[BookieRegistration], size: int, *, exclude: set[str] | None = None,
                    rng: random.Random | None = None) -> list[str]:
    rng = rng or random.Random()
    pool = [b for b in bookies if b.state == "writable" and b.bookie_id not in (exclude or set())]
    if len(pool) < size:
        raise NotEnoughBookiesError(f"need {size} writable bookies, {len(pool)} available")
    racks: dict[str, list[str]] = defaultdict(list)
    for b in pool:
        racks[b.rack].append(b.bookie_id)
    if len(racks) <= 1:
        return rng.sample([b.bookie_id for b in pool], size)
    # Interleave racks: take one bookie from each rack in turn, starting with the racks that
    # have the most bookies left, so neighbours (write sets) differ in rack when possible.
    for ids in racks.values():
        rng.shuffle(ids)
    chosen: list[str] = []
    first_rack: str | None = None
    last_rack: str | None = None
    while len(chosen) < size:
        order = sorted((r for r in racks if racks[r]), key=lambda r: (-len(racks[r]), rng.random()))
        # Write sets wrap around the ensemble: the last member also neighbours the first.
        avoid = {last_rack, first_rack} if len(chosen) == size - 1 else {last_rack}
        pick = next((r for r in order if r not in avoid), None) or next((r for r in order if r != last_rack), order[0])
        chosen.append(racks[pick].pop())
        first_rack = first_rack if first_rack is not None else pick
        last_rack = pick
    return chosen


def choose_replacement(bookies: Sequence[BookieRegistration], ensemble: Sequence[str], index: int, *,
                       exclude: Set[str] | None = None, rng: random.Random | None = None) -> str:
    """A writable bookie not in ``ensemble`` to replace ``ensemble[index]``, preferring a rack
    that differs from its neighbours' racks."""
    rng = rng or random.Random()
    taken = set(ensemble) | (exclude or set())
    pool = [b for b in bookies if b.state == "writable" and b.bookie_id not in taken]
    if not pool:
        raise NotEnoughBookiesError(f"no writable bookie left to replace {ensemble[index]}")
    rack_of = {b.bookie_id: b.rack for b in bookies}
    n = len(ensemble)
    neighbours = {rack_of.get(ensemble[(index - 1) % n], ""), rack_of.get(ensemble[(index + 1) % n], "")}
    better = [b for b in pool if b.rack not in neighbours]
    return rng.choice(better or pool).bookie_id
