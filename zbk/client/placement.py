"""Ensemble placement: which bookies hold a new ledger or replace failed ones.

Each entry goes to a *write set*: WQ consecutive members of the ensemble, starting at
position ``entry % E`` and wrapping around (the round-robin striping of BookKeeper). So an
ensemble has E write sets (one when E == WQ), and placement is judged write set by write
set, never by the ensemble as a whole: an ensemble over three racks can still put every
copy of some entries in one rack.

A bookie's *location* is its (zone, rack): a rack lies in one zone, and two zones' racks
of the same name are two racks. The rules, strongest first:

1. Only writable bookies, never an excluded one or one already in the ensemble.
2. Isolation: a policy with ``isolation_groups`` uses only bookies of those groups. One
   without uses any bookie, grouped or not: as in BookKeeper's isolation policy (Pulsar's
   IsolatedBookieEnsemblePlacementPolicy), groups restrict the clients that name them and
   do not fence off their bookies from the others.
3. Racks: each write set spans at least min(``min_racks``, WQ) racks (BookKeeper's
   minNumRacksPerWriteQuorum). Enforced (enforceMinNumRacksPerWriteQuorum), bookies
   without a rack are not used, and when no placement meets the minimum the call raises
   NotEnoughBookiesError; it never places the ledger short of it. Not enforced, it places
   with as many racks per write set as it can.
4. Zones: each write set spans as many zones as it can, up to WQ (a soft rule, as the
   zone-aware policy's desired zones are).
5. Among equal choices: bookies of the racks with the most spare bookies first (so that
   no rack runs dry while others idle), at random within a rack.

The policy a ledger was created with is part of its custom metadata (``POLICY_KEY``),
as BookKeeper's isolation policy keeps its groups, when it differs from the default: the
writer's ensemble changes, the replicators' replacements and the auditor's check read it
from there, so each holds the ledger to its own policy whatever their configuration.

The search itself is in :mod:`zbk.client.placement_search`.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

import cbor2

from zbk import limits
from zbk.client.placement_search import Location, Slots, place
from zbk.config import ClientConfig
from zbk.errors import BadRequestError, CorruptMetadataError, NotEnoughBookiesError
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import BookieRegistration

POLICY_KEY = "zbk.placement"  # the ledger's custom metadata key of its placement policy
POLICY_FORMAT = 1


@dataclass(frozen=True)
class PlacementPolicy:
    min_racks: int = limits.client_min_racks_per_write_quorum_default
    enforce_min_racks: bool = False
    isolation_groups: tuple[str, ...] = ()

    @classmethod
    def of_config(cls, cfg: ClientConfig) -> PlacementPolicy:
        return cls(cfg.min_racks_per_write_quorum, cfg.enforce_min_racks_per_write_quorum,
                   tuple(sorted(set(cfg.isolation_groups))))

    @classmethod
    def of_ledger(cls, md: LedgerMetadata) -> PlacementPolicy:
        """The policy ``md`` was created with (the default if it records none).
        CorruptMetadataError if its record does not decode."""
        raw = md.custom_metadata.get(POLICY_KEY)
        return cls() if raw is None else cls.decode(raw, ledger_id=md.ledger_id)

    @property
    def is_default(self) -> bool:
        return self == PlacementPolicy()

    def encode(self) -> bytes:
        """CBOR map: fv (format, 1), mr (min racks), em (enforced), ig (groups, list of text)."""
        return cbor2.dumps({"fv": POLICY_FORMAT, "mr": self.min_racks, "em": self.enforce_min_racks,
                            "ig": list(self.isolation_groups)})

    @classmethod
    def decode(cls, data: bytes, *, ledger_id: int | None = None) -> PlacementPolicy:
        what = f"ledger {ledger_id}: placement policy" if ledger_id is not None else "placement policy"
        try:
            raw = cbor2.loads(data)
        except Exception as e:  # cbor2 raises several types for garbage input
            raise CorruptMetadataError(f"{what}: not valid CBOR ({e})") from None
        if not isinstance(raw, dict) or raw.get("fv") != POLICY_FORMAT:
            raise CorruptMetadataError(f"{what}: not a placement policy of format {POLICY_FORMAT}")
        mr, em, ig = raw.get("mr"), raw.get("em"), raw.get("ig")
        if (not isinstance(mr, int) or isinstance(mr, bool) or not 1 <= mr <= limits.ledger_ensemble_size_max
                or not isinstance(em, bool) or not isinstance(ig, list)
                or not all(isinstance(g, str) and g for g in ig)):
            raise CorruptMetadataError(f"{what}: malformed ({raw!r})")
        return cls(mr, em, tuple(ig))

    def record(self, custom_metadata: Mapping[str, bytes]) -> dict[str, bytes]:
        """A new ledger's custom metadata: the user's, plus this policy unless it is the
        default. The key is reserved: a user's value for it is a BadRequestError."""
        if POLICY_KEY in custom_metadata:
            raise BadRequestError(f"custom metadata key {POLICY_KEY!r} is reserved for the placement policy")
        out = dict(custom_metadata)
        if not self.is_default:
            out[POLICY_KEY] = self.encode()
        return out


def location_of(reg: BookieRegistration) -> Location:
    return (reg.zone, reg.rack)


def choose_ensemble(bookies: Sequence[BookieRegistration], size: int, *, write_quorum: int,
                    policy: PlacementPolicy = PlacementPolicy(), exclude: Set[str] = frozenset(),
                    rng: random.Random | None = None) -> list[str]:
    """A new ensemble of ``size`` bookies for write sets of ``write_quorum``."""
    return _fill([None] * size, bookies, write_quorum, policy, exclude, rng)


def choose_replacements(bookies: Sequence[BookieRegistration], ensemble: Sequence[str], positions: Iterable[int], *,
                        write_quorum: int, policy: PlacementPolicy = PlacementPolicy(),
                        exclude: Set[str] = frozenset(), rng: random.Random | None = None) -> list[str]:
    """``ensemble`` with new bookies at ``positions``, chosen together: the members that
    stay are kept where they are, and the rules apply to the write sets that change."""
    slots: Slots = list(ensemble)
    for i in positions:
        slots[i] = None
    return _fill(slots, bookies, write_quorum, policy, frozenset(exclude) | set(ensemble), rng)


def choose_replacement(bookies: Sequence[BookieRegistration], ensemble: Sequence[str], index: int, *,
                       write_quorum: int, policy: PlacementPolicy = PlacementPolicy(),
                       exclude: Set[str] = frozenset(), rng: random.Random | None = None) -> str:
    """A bookie to replace ``ensemble[index]``."""
    return choose_replacements(bookies, ensemble, (index,), write_quorum=write_quorum, policy=policy,
                               exclude=exclude, rng=rng)[index]


def _fill(slots: Slots, bookies: Sequence[BookieRegistration], write_quorum: int, policy: PlacementPolicy,
          exclude: Set[str], rng: random.Random | None) -> list[str]:
    if not 1 <= write_quorum <= len(slots) <= limits.ledger_ensemble_size_max:
        raise BadRequestError(f"need {limits.ledger_ensemble_size_max} >= E >= WQ >= 1, "
                              f"got E={len(slots)} WQ={write_quorum}")
    rng = rng or random.Random()
    need = sum(1 for s in slots if s is None)
    groups = set(policy.isolation_groups)
    pool = [b for b in bookies if b.state == "writable" and b.bookie_id not in exclude
            and (not groups or b.isolation_group in groups)]
    where = f" in isolation groups {sorted(groups)}" if groups else ""
    if len(pool) < need:
        raise NotEnoughBookiesError(f"need {need} writable bookies{where}, {len(pool)} available")
    if policy.enforce_min_racks:
        # BookKeeper leaves out the bookies of its default rack when the minimum is
        # enforced: a bookie whose rack is unknown could stand in any rack.
        pool = [b for b in pool if b.rack]
        if len(pool) < need:
            raise NotEnoughBookiesError(f"need {need} writable bookies{where} with a rack "
                                        f"(enforce_min_racks_per_write_quorum), {len(pool)} available")
    known = {b.bookie_id: location_of(b) for b in bookies}
    fixed = {i: known.get(b, _unknown(b)) for i, b in enumerate(slots) if b is not None}
    placed = place(slots, fixed, [(b.bookie_id, location_of(b)) for b in pool], write_quorum=write_quorum,
                   min_racks=policy.min_racks, enforce=policy.enforce_min_racks, rng=rng)
    if placed is None:
        wq = min(write_quorum, len(slots))
        racks = len({location_of(b) for b in pool} | set(fixed.values()))
        raise NotEnoughBookiesError(
            f"cannot place {need} of {len(slots)} bookies{where} with {min(policy.min_racks, wq)} racks in every "
            f"write set of {wq} (enforce_min_racks_per_write_quorum; {racks} racks available)")
    return placed


def _unknown(bookie_id: str) -> Location:
    # A member whose registration is unknown (dead, or read-only and not listed) counts as
    # a location of its own: it is about to be replaced too, or still holds its copies.
    # Counting it as no location would make an enforced replacement impossible whenever
    # two bookies of one write set fail together.
    return ("?", bookie_id)


def placement_violations(ensemble: Sequence[str], write_quorum: int, policy: PlacementPolicy,
                         registered: Mapping[str, BookieRegistration]) -> list[str]:
    """How ``ensemble`` breaks ``policy`` (empty: it does not), for the auditor's check.

    * a member outside the policy's isolation groups;
    * with racks in use (some registered bookie names a rack or a zone): a write set on
      fewer than min(min_racks, WQ) racks, or, enforced, with a member without a rack;
    * with several zones among the registered bookies: a write set within one zone.

    Unregistered members are left out (the lost-bookie audit handles them)."""
    out: list[str] = []
    groups = set(policy.isolation_groups)
    if groups:
        outside = [b for b in ensemble if b in registered and registered[b].isolation_group not in groups]
        if outside:
            out.append(f"{outside} outside isolation groups {sorted(groups)}")
    racks_in_use = any(r.rack or r.zone for r in registered.values())
    zones = {r.zone for r in registered.values()}
    n = len(ensemble)
    wq = min(write_quorum, n)
    want_racks = min(policy.min_racks, wq)
    for start in range(n if wq < n else 1):
        ws = [ensemble[(start + k) % n] for k in range(wq)]
        regs = [registered[b] for b in ws if b in registered]
        locs = {location_of(r) for r in regs} | {_unknown(b) for b in ws if b not in registered}
        if racks_in_use and len(locs) < want_racks:
            out.append(f"write set {ws} spans {len(locs)} racks, fewer than {want_racks}")
        elif racks_in_use and policy.enforce_min_racks and any(not r.rack for r in regs):
            out.append(f"write set {ws} has a bookie without a rack (enforced minimum)")
        elif len(zones) > 1 and wq > 1 and len(regs) == wq and len({r.zone for r in regs}) == 1:
            out.append(f"write set {ws} lies within zone {regs[0].zone!r} of {len(zones)}")
    return out
