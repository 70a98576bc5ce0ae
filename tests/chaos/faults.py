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
| ``bookie_isolate`` | cut the bookie's host from every other host | lift those cuts |
| ``bookie_zombie`` | cut the clients' host from the bookie's wire port (it stays registered) | lift |
| ``bookie_lose_etcd`` | cut the bookie from etcd's client port (its lease runs out; it serves on) | lift |
| ``bookie_power_cut`` | SIGKILL the bookie and drop what its disk layer held unsynced | mount what was durable, start it |
| ``clock_jump`` | a bookie's or autorecovery host's wall clock jumps by ``param`` s | it jumps back |

The last five need the cluster on hosts of their own (tests/chaos/hosts.py): network
namespaces, power-loss layers under some bookies, every zbk process under libfaketime.
``HOST_KINDS`` lists them; a plan draws only from the kinds of its settings.

The plan keeps within what the system promises to survive, so that any lost entry is a bug,
not an overload of the fault model:

* at most ``bookie_faults_max`` bookies disturbed at once (a killed bookie counts until
  ``restart_settle_s`` after its restart), each bookie at most one fault at a time;
* two journal-off bookies are never crashed (killed or power-cut) within
  ``journal_off_kill_spacing_s`` of each other: without the journal an add lives only in process memory and the page cache until
  the next checkpoint (``flush_interval_ms``), so two such crashes inside one checkpoint
  interval can lose an entry that both bookies of its ack quorum held only there — BP-46's
  accepted data loss, not a bug;
* one etcd member down at a time (the 3-member cluster keeps its quorum); one auditor kill
  at a time; one clock fault at a time (it holds no bookie slot: under etcd's leases a
  clock step must change nothing);
* every fault ends by ``fault_s``; the first faults are one of each kind (shuffled), closer
  together (``first_gap_s``) and at their shortest durations, so every run injects every
  kind, even a 45-second one. The first bookie kill hits a journal-off bookie and restarts it
  within ``short_kill_s`` — before its registration expires, so the auditor never counts
  it lost: the bookie boots with BP-46 phase one (its open ledgers fenced and in limbo) and
  the limbo repair, which recovers those ledgers under their writers, must follow. The first
  round's power cut hits a journal-on bookie, so that short kill is its only journal-off crash.

One limit is kept when the faults run, not in the plan, because it depends on the cluster's
state: a journal-off bookie is not crashed while another journal-off bookie is down, or
crashed and has not said since that it has no ledger in limbo (:meth:`chaos.cluster.ChaosCluster.crash_blocked`); the fault is
skipped and counted. BP-46's repair is modelled and promised for one bookie that may have
lost data at a time: a ledger in limbo on two bookies of its write quorum cannot be told
apart from one that lost an entry both acknowledged, so its recovery (rightly) refuses to
close it, and it waits for an operator (docs/autorecovery.md, "Two journal-off bookies of one
ledger in limbo at once").
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

LOOPBACK_KINDS = ("bookie_kill", "bookie_pause", "bookie_readonly", "etcd_kill", "auditor_kill")
HOST_KINDS = ("bookie_isolate", "bookie_zombie", "bookie_lose_etcd", "bookie_power_cut", "clock_jump")
KINDS = LOOPBACK_KINDS + HOST_KINDS
BOOKIE_KINDS = ("bookie_kill", "bookie_pause", "bookie_readonly", "bookie_isolate", "bookie_zombie",
                "bookie_lose_etcd", "bookie_power_cut")
CRASH_KINDS = ("bookie_kill", "bookie_power_cut")  # the bookie loses its memory (and the power cut its page cache)
KIND_LABELS = {
    "bookie_kill": "bookie kill -9 + restart",
    "bookie_pause": "bookie SIGSTOP/SIGCONT",
    "bookie_readonly": "bookie disk read-only (operator)",
    "etcd_kill": "etcd member kill -9 + restart",
    "auditor_kill": "auditor kill -9 + new process",
    "bookie_isolate": "bookie isolated (partition)",
    "bookie_zombie": "bookie cut from clients only",
    "bookie_lose_etcd": "bookie cut from etcd only",
    "bookie_power_cut": "bookie power cut + restart",
    "clock_jump": "clock jump of one process",
}


@dataclass(frozen=True)
class PlanSettings:
    fault_s: float = 180.0
    kinds: tuple[str, ...] = LOOPBACK_KINDS
    bookies: int = 5
    journal_off: frozenset[int] = frozenset({3, 4})
    power_loss: frozenset[int] = frozenset({1, 4})  # bookies on a power-loss layer: the power cuts' targets
    clocks: int = 7  # clock_jump targets: the bookies' hosts, then the autorecovery hosts
    etcd_members: int = 3
    gap_s: tuple[float, float] = (2.5, 7.0)  # between fault starts
    first_gap_s: tuple[float, float] = (1.0, 3.0)  # between the first faults, one of each kind
    first_at_s: tuple[float, float] = (3.0, 6.0)
    bookie_faults_max: int = 2
    restart_settle_s: float = 6.0  # a restarted bookie boots and registers meanwhile
    journal_off_kill_spacing_s: float = 15.0  # > flush_interval_ms (10 s) of the bookies
    short_kill_s: tuple[float, float] = (0.5, 2.0)  # < registration_ttl_s (3 s) of the bookies
    weights: dict[str, float] = field(default_factory=lambda: {
        "bookie_kill": 3.0, "bookie_pause": 2.5, "bookie_readonly": 1.5, "etcd_kill": 1.0, "auditor_kill": 1.0,
        "bookie_isolate": 1.5, "bookie_zombie": 1.5, "bookie_lose_etcd": 1.5, "bookie_power_cut": 1.5,
        "clock_jump": 1.0})
    durations_s: dict[str, tuple[float, float]] = field(default_factory=lambda: {
        # Kills: restarts within the registration TTL (not a loss to the auditor) and well after.
        "bookie_kill": (0.5, 12.0),
        "bookie_pause": (1.0, 8.0),  # past the client's add timeout, and past the bookie's lease
        "bookie_readonly": (4.0, 15.0),
        "etcd_kill": (2.0, 10.0),
        "auditor_kill": (1.0, 6.0),
        "bookie_isolate": (2.0, 10.0),  # past the add timeout, the heartbeat timeout and the lease
        "bookie_zombie": (2.0, 10.0),
        "bookie_lose_etcd": (4.0, 12.0),  # past the 3 s registration TTL: the lease is lost
        "bookie_power_cut": (0.5, 8.0),
        "clock_jump": (5.0, 30.0),
    })
    clock_jump_s: tuple[float, float] = (60.0, 600.0)  # its size, forward or back


@dataclass(frozen=True)
class Fault:
    at_s: float
    kind: str
    # Bookie index, etcd member index; 0 for auditor_kill (the leader at that time); for
    # clock_jump a bookie index, or ``bookies + k`` for autorecovery host k.
    target: int
    duration_s: float
    # clock_jump: the step in seconds (signed); bookie_power_cut: 1 for a torn last write.
    param: float = 0.0

    @property
    def end_s(self) -> float:
        return self.at_s + self.duration_s

    def target_name(self, bookies: int = 5) -> str:
        if self.kind == "etcd_kill":
            return f"etcd m{self.target}"
        if self.kind == "auditor_kill":
            return "leader"
        if self.kind == "clock_jump" and self.target >= bookies:
            return f"ar{self.target - bookies}"
        return f"b{self.target}"

    def describe(self) -> str:
        extra = ""
        if self.kind == "clock_jump":
            extra = f" by {self.param:+.0f}s"
        elif self.kind == "bookie_power_cut" and self.param:
            extra = " (torn)"
        return f"{self.at_s:7.1f}s {self.kind:<16} {self.target_name():<8} for {self.duration_s:4.1f}s{extra}"


def _busy_until(f: Fault, s: PlanSettings) -> float:
    return f.end_s + (s.restart_settle_s if f.kind in CRASH_KINDS else 0.0)


def _free_target(kind: str, t: float, dur: float, plan: list[Fault], s: PlanSettings,
                 rng: random.Random, *, journal_off_only: bool = False, first_round: bool = False) -> int | None:
    """A target for a fault of ``kind`` over [t, t + dur] that keeps the plan's limits, or None."""
    def overlaps(f: Fault) -> bool:
        return f.at_s < t + dur + (s.restart_settle_s if kind in CRASH_KINDS else 0.0) and t < _busy_until(f, s)

    active = [f for f in plan if overlaps(f)]
    if kind in BOOKIE_KINDS:
        busy = {f.target for f in active if f.kind in BOOKIE_KINDS}
        if len(busy) >= s.bookie_faults_max:
            return None
        candidates = [i for i in range(s.bookies) if i not in busy]
        if kind == "bookie_power_cut":
            candidates = [i for i in candidates if i in s.power_loss]
            if first_round and s.power_loss - s.journal_off:
                # The first round's one journal-off crash is its short kill (see the module).
                candidates = [i for i in candidates if i not in s.journal_off]
        if kind in CRASH_KINDS:
            recent_off = [f.at_s for f in plan if f.kind in CRASH_KINDS and f.target in s.journal_off]
            if any(abs(t - at) < s.journal_off_kill_spacing_s for at in recent_off):
                candidates = [i for i in candidates if i not in s.journal_off]
            if journal_off_only:
                candidates = [i for i in candidates if i in s.journal_off]
        return rng.choice(candidates) if candidates else None
    if any(f.kind == kind for f in active):
        return None
    if kind == "clock_jump":
        return rng.randrange(s.clocks)
    return rng.randrange(s.etcd_members) if kind == "etcd_kill" else 0


def make_plan(seed: int, s: PlanSettings) -> list[Fault]:
    """The faults of one run, in start order."""
    unknown = set(s.kinds) - set(KINDS)
    if unknown or not s.kinds:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    rng = random.Random(seed)
    first = list(s.kinds)
    rng.shuffle(first)
    kinds = [k for k in s.weights if k in s.kinds]
    weights = [s.weights[k] for k in kinds]
    plan: list[Fault] = []
    t = rng.uniform(*s.first_at_s)
    tries = 0
    while tries < 10_000:  # bounded: every iteration advances t or spends a try
        tries += 1
        kind = first[0] if first else rng.choices(kinds, weights)[0]
        short_kill = kind == "bookie_kill" and not any(f.kind == kind for f in plan)
        lo, hi = s.short_kill_s if short_kill else s.durations_s[kind]
        # The first of each kind at the short end of its durations, so that all fit early.
        dur = rng.uniform(lo, hi if short_kill or not first else lo + (hi - lo) / 4)
        if t + dur > s.fault_s:
            if first and t + lo <= s.fault_s:
                dur = lo
            else:
                break
        target = _free_target(kind, t, dur, plan, s, rng, journal_off_only=short_kill, first_round=bool(first))
        if target is None:
            t += 0.5  # wait for a slot
            continue
        param = 0.0
        if kind == "clock_jump":
            param = rng.choice((-1, 1)) * rng.uniform(*s.clock_jump_s)
        elif kind == "bookie_power_cut":
            param = float(rng.random() < 0.5)
        plan.append(Fault(round(t, 3), kind, target, round(dur, 3), round(param, 1)))
        if first:
            first.pop(0)
        t += rng.uniform(*(s.first_gap_s if first else s.gap_s))
    return plan


def plan_counts(plan: list[Fault], kinds: tuple[str, ...] = KINDS) -> dict[str, int]:
    return {k: sum(1 for f in plan if f.kind == k) for k in kinds}
