"""The chaos run's fault plan: a pure function of the seed, drawn before the run starts.

A plan is a list of :class:`Fault` (start time, kind, target, duration). The same seed and
settings give the same plan, so a failing run replays its faults exactly (the workload's
timing around them is not deterministic: real processes on a shared machine).

Kinds and what each injects (docs/chaos.md):

| kind | start | end (after ``duration_s``) |
| --- | --- | --- |
| ``bookie_kill`` | SIGKILL the bookie | start it again on the same data dir and port |
| ``bookie_pause`` | SIGSTOP | SIGCONT |
| ``bookie_readonly`` | PUT /api/v1/bookie/state readonly | PUT writable |
| ``etcd_kill`` | SIGKILL one etcd member | start it again on the same data dir and ports |
| ``auditor_kill`` | SIGKILL the autorecovery process that leads | start a new autorecovery process |

The plan keeps within what the system promises to survive, so that any lost entry is a bug,
not an overload of the fault model:

* at most ``bookie_faults_max`` bookies disturbed at once (a killed bookie counts until
  ``restart_settle_s`` after its restart), each bookie at most one fault at a time;
* two journal-off bookies are never killed within ``journal_off_kill_spacing_s`` of each
  other: without the journal an add lives only in process memory and the page cache until
  the next checkpoint (``flush_interval_ms``), so two such crashes inside one checkpoint
  interval can lose an entry that both bookies of its ack quorum held only there — BP-46's
  accepted data loss, not a bug;
* one etcd member down at a time (the 3-member cluster keeps its quorum); one auditor kill
  at a time;
* every fault ends by ``fault_s``; the first faults are one of each kind (shuffled), so every
  run injects every kind. The first bookie kill hits a journal-off bookie and restarts it
  within ``short_kill_s`` — before its registration expires, so the auditor never counts
  it lost: the bookie boots with BP-46 phase one (its open ledgers fenced and in limbo) and
  the limbo repair, which recovers those ledgers under their writers, must follow.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

KINDS = ("bookie_kill", "bookie_pause", "bookie_readonly", "etcd_kill", "auditor_kill")
BOOKIE_KINDS = ("bookie_kill", "bookie_pause", "bookie_readonly")
KIND_LABELS = {
    "bookie_kill": "bookie kill -9 + restart",
    "bookie_pause": "bookie SIGSTOP/SIGCONT",
    "bookie_readonly": "bookie disk read-only (operator)",
    "etcd_kill": "etcd member kill -9 + restart",
    "auditor_kill": "auditor kill -9 + new process",
}


@dataclass(frozen=True)
class PlanSettings:
    fault_s: float = 180.0
    bookies: int = 5
    journal_off: frozenset[int] = frozenset({3, 4})
    etcd_members: int = 3
    gap_s: tuple[float, float] = (2.5, 7.0)  # between fault starts
    first_at_s: tuple[float, float] = (3.0, 6.0)
    bookie_faults_max: int = 2
    restart_settle_s: float = 6.0  # a restarted bookie boots and registers meanwhile
    journal_off_kill_spacing_s: float = 15.0  # > flush_interval_ms (10 s) of the bookies
    short_kill_s: tuple[float, float] = (0.5, 2.0)  # < registration_ttl_s (3 s) of the bookies
    weights: dict[str, float] = field(default_factory=lambda: {
        "bookie_kill": 3.0, "bookie_pause": 2.5, "bookie_readonly": 1.5, "etcd_kill": 1.0, "auditor_kill": 1.0})
    durations_s: dict[str, tuple[float, float]] = field(default_factory=lambda: {
        # Kills: restarts within the registration TTL (not a loss to the auditor) and well after.
        "bookie_kill": (0.5, 12.0),
        "bookie_pause": (1.0, 8.0),  # past the client's add timeout, and past the bookie's lease
        "bookie_readonly": (4.0, 15.0),
        "etcd_kill": (2.0, 10.0),
        "auditor_kill": (1.0, 6.0),
    })


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    target: int  # bookie index, etcd member index; 0 for auditor_kill (the leader at that time)
    duration_s: float

    @property
    def end_s(self) -> float:
        return self.at_s + self.duration_s

    def describe(self) -> str:
        what = {"bookie_kill": "b", "bookie_pause": "b", "bookie_readonly": "b", "etcd_kill": "etcd m"}
        target = f"{what[self.kind]}{self.target}" if self.kind in what else "leader"
        return f"{self.at_s:7.1f}s {self.kind:<16} {target:<8} for {self.duration_s:4.1f}s"


def _busy_until(f: Fault, s: PlanSettings) -> float:
    return f.end_s + (s.restart_settle_s if f.kind == "bookie_kill" else 0.0)


def _free_target(kind: str, t: float, dur: float, plan: list[Fault], s: PlanSettings,
                 rng: random.Random, *, journal_off_only: bool = False) -> int | None:
    """A target for a fault of ``kind`` over [t, t + dur] that keeps the plan's limits, or None."""
    def overlaps(f: Fault) -> bool:
        return f.at_s < t + dur + (s.restart_settle_s if kind == "bookie_kill" else 0.0) and t < _busy_until(f, s)

    active = [f for f in plan if overlaps(f)]
    if kind in BOOKIE_KINDS:
        busy = {f.target for f in active if f.kind in BOOKIE_KINDS}
        if len(busy) >= s.bookie_faults_max:
            return None
        candidates = [i for i in range(s.bookies) if i not in busy]
        if kind == "bookie_kill":
            recent_off = [f.at_s for f in plan if f.kind == "bookie_kill" and f.target in s.journal_off]
            if any(abs(t - at) < s.journal_off_kill_spacing_s for at in recent_off):
                candidates = [i for i in candidates if i not in s.journal_off]
            if journal_off_only:
                candidates = [i for i in candidates if i in s.journal_off]
        return rng.choice(candidates) if candidates else None
    if any(f.kind == kind for f in active):
        return None
    return rng.randrange(s.etcd_members) if kind == "etcd_kill" else 0


def make_plan(seed: int, s: PlanSettings) -> list[Fault]:
    """The faults of one run, in start order."""
    rng = random.Random(seed)
    first = list(KINDS)
    rng.shuffle(first)
    kinds, weights = list(s.weights), [s.weights[k] for k in s.weights]
    plan: list[Fault] = []
    t = rng.uniform(*s.first_at_s)
    tries = 0
    while tries < 10_000:  # bounded: every iteration advances t or spends a try
        tries += 1
        kind = first[0] if first else rng.choices(kinds, weights)[0]
        short_kill = kind == "bookie_kill" and not any(f.kind == kind for f in plan)
        lo, hi = s.short_kill_s if short_kill else s.durations_s[kind]
        dur = rng.uniform(lo, hi)
        if t + dur > s.fault_s:
            if first and t + lo <= s.fault_s:
                dur = lo
            else:
                break
        target = _free_target(kind, t, dur, plan, s, rng, journal_off_only=short_kill)
        if target is None:
            t += 0.5  # wait for a slot
            continue
        plan.append(Fault(round(t, 3), kind, target, round(dur, 3)))
        if first:
            first.pop(0)
        t += rng.uniform(*s.gap_s)
    return plan


def plan_counts(plan: list[Fault]) -> dict[str, int]:
    return {k: sum(1 for f in plan if f.kind == k) for k in KINDS}
