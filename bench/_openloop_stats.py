"""The arithmetic of bench/openloop.py, kept free of processes and I/O so that it can be
unit-tested (tests/bench/test_openloop_stats.py): the fixed-rate schedule, latency with
coordinated omission corrected, the "holds" judgement, the rate ladder and the summary of
a latency sample by HdrHistogram.

Times are integer nanoseconds of CLOCK_MONOTONIC (``time.monotonic_ns()`` on Linux), a
clock shared by every process of the machine, so that a reader in another process can
take an entry's latency from the intended send time written into it.

Coordinated omission: a closed-loop or a late generator sends the next entry only when it
can, so a stall of the system under test delays the sends and hides the wait of every
entry that should have gone out meanwhile. Here entry ``i`` of a run at ``rate`` entries/s
has the intended send time ``t0 + i / rate``, and its latency counts from that time, not
from the moment it was actually sent.
"""

from __future__ import annotations

import functools
import itertools
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

NS_PER_S = 1_000_000_000

# A system holds a rate when it completes at least this share of the appends offered in
# the measured time and its p99 latency (from the intended send times) stays at or below
# this bound.
HOLD_COMPLETED_FRACTION = 0.99
HOLD_P99_MS = 20.0

# The rate ladder: these first, then steps of LADDER_STEP.
LADDER_FIRST = (1_000, 2_000, 5_000)
LADDER_STEP = 5_000

# done_ns values besides a completion time (monotonic_ns() is never 0 or negative on Linux).
NOT_DONE = 0
FAILED = -1


def intended_ns(t0_ns: int, i: int, rate: int) -> int:
    """The intended send time of entry ``i`` (from 0) of a schedule of ``rate`` entries/s
    starting at ``t0_ns``: ``t0 + i / rate``, rounded down to the nanosecond."""
    return t0_ns + i * NS_PER_S // rate


def due_count(t0_ns: int, now_ns: int, rate: int) -> int:
    """How many entries of the schedule are due at ``now_ns``: the number of ``i >= 0``
    with ``intended_ns(t0_ns, i, rate) <= now_ns`` (0 before ``t0_ns``).

    intended(i) <= now  <=>  i * 1e9 // rate <= now - t0  <=>  i * 1e9 < (now - t0 + 1) * rate,
    so the count is the ceiling of (now - t0 + 1) * rate / 1e9."""
    if now_ns < t0_ns:
        return 0
    return -(-(now_ns - t0_ns + 1) * rate // NS_PER_S)


def ladder_rates(max_rate: int, first: Sequence[int] = LADDER_FIRST, step: int = LADDER_STEP) -> list[int]:
    """The offered rates in order: ``first``, then ``step`` after step, up to ``max_rate``."""
    rates = [r for r in first if r <= max_rate]
    r = (max(first) // step + 1) * step
    while r <= max_rate:
        rates.append(r)
        r += step
    return rates


@dataclass
class WindowStats:
    """What one run's measured window gave."""

    offered: int  # entries whose intended send time lies in the window
    completed_in_time: int  # of those, confirmed by the window's end plus the grace
    completed: int  # of those, confirmed at all before the run stopped waiting
    failed: int  # of those, failed (an error instead of a confirmation)
    achieved_per_s: float  # confirmations (of any entry) inside the window, per second
    latencies_ns: list[int]  # one per offered entry that did not fail, from its intended send time
    censored: int  # entries never confirmed: their latency is a lower bound (end of wait - intended)


def entry_latency_ns(done_ns: int, intended: int, end_ns: int) -> int | None:
    """An entry's latency from its intended send time ``intended``: None if it failed; if it
    was never confirmed (NOT_DONE), until ``end_ns``, when the run stopped waiting (a lower
    bound, so that a system that drops behind cannot look fast by leaving its slowest
    entries out)."""
    if done_ns == FAILED:
        return None
    return max(0, (end_ns if done_ns == NOT_DONE else done_ns) - intended)


def window_stats(t0_ns: int, rate: int, done_ns: Sequence[int], w0: int, w1: int, *, grace_ns: int,
                 end_ns: int) -> WindowStats:
    """The measured window of a run: entries ``w0 <= i < w1`` of the schedule (``t0_ns``,
    ``rate``); ``done_ns[i]`` is entry i's confirmation time, NOT_DONE or FAILED, for every
    entry sent (the warm-up before ``w0`` and the cool-down after ``w1`` included).

    An entry counts as completed in time when it was confirmed no later than ``grace_ns``
    after the window's end (the intended send time of ``w1``): an entry offered just before
    the end cannot be confirmed before it, and the latency bound is the delay it may take.
    An entry that was never confirmed (the run stopped waiting at ``end_ns``) enters the
    latencies with a lower bound of its real latency (:func:`entry_latency_ns`).
    """
    if not 0 <= w0 < w1 <= len(done_ns):
        raise ValueError(f"bad window {w0}..{w1} of {len(done_ns)} entries")
    start, stop = intended_ns(t0_ns, w0, rate), intended_ns(t0_ns, w1, rate)
    deadline = stop + grace_ns
    lat: list[int] = []
    in_time = completed = failed = censored = 0
    for i in range(w0, w1):
        d = done_ns[i]
        latency = entry_latency_ns(d, intended_ns(t0_ns, i, rate), end_ns)
        if latency is None:
            failed += 1
            continue
        lat.append(latency)
        if d == NOT_DONE:
            censored += 1
        else:
            completed += 1
            if d <= deadline:
                in_time += 1
    inside = sum(1 for d in done_ns if start <= d <= stop)
    seconds = (stop - start) / NS_PER_S
    return WindowStats(offered=w1 - w0, completed_in_time=in_time, completed=completed, failed=failed,
                       achieved_per_s=inside / seconds, latencies_ns=lat, censored=censored)


def naive_latencies_ns(sent_ns: Sequence[int], done_ns: Sequence[int], w0: int, w1: int) -> list[int]:
    """Latency from the actual send (what a closed-loop bench reports; coordinated omission
    NOT corrected): only to show, beside the corrected figure, what the correction adds."""
    return [done_ns[i] - sent_ns[i] for i in range(w0, w1) if done_ns[i] > 0 and sent_ns[i] > 0]


def late_bursts(t0_ns: int, rate: int, sent_ns: Sequence[int], done_ns: Sequence[int], w0: int, w1: int, *,
                over_ns: int, gap_ns: int, end_ns: int) -> list[dict[str, Any]]:
    """When the window's late entries came: those whose latency (from the intended send
    time; never confirmed: until ``end_ns``) is over ``over_ns``, grouped into bursts whose
    intended send times lie less than ``gap_ns`` apart. Each burst: ``start_s`` and
    ``end_s`` (intended times from the window's start), ``entries``, ``max_ms``, and
    ``send_lag_ms``, the generator's own largest lateness among them: a burst it explains
    is the client's, one it does not is the servers' (or the network's)."""
    start = intended_ns(t0_ns, w0, rate)
    bursts: list[dict[str, Any]] = []
    last = -gap_ns
    for i in range(w0, w1):
        sched = intended_ns(t0_ns, i, rate)
        lat = entry_latency_ns(done_ns[i], sched, end_ns)
        if lat is None or lat <= over_ns:
            continue
        lag = max(0, sent_ns[i] - sched) if sent_ns[i] else 0
        at = sched - start
        if not bursts or at - last >= gap_ns:
            bursts.append({"start_s": at / NS_PER_S, "end_s": at / NS_PER_S, "entries": 0, "max_ms": 0.0,
                           "send_lag_ms": 0.0})
        b = bursts[-1]
        b["end_s"] = at / NS_PER_S
        b["entries"] += 1
        b["max_ms"] = max(b["max_ms"], lat / 1e6)
        b["send_lag_ms"] = max(b["send_lag_ms"], lag / 1e6)
        last = at
    return bursts


def burst_spacing_ms(bursts: Sequence[dict[str, Any]]) -> float | None:
    """The median time between the starts of consecutive bursts (None below two): a steady
    figure points at something periodic (a flush every so many bytes, a timer)."""
    if len(bursts) < 2:
        return None
    return round(statistics.median(b["start_s"] - a["start_s"] for a, b in itertools.pairwise(bursts)) * 1e3, 1)


def rank_ms(sorted_ns: Sequence[int], p: float) -> float:
    """The p-quantile (0..1) of an ascending list of nanoseconds, nearest rank below, in ms
    (for the side figures; the latency percentiles come from HdrHistogram)."""
    if not sorted_ns:
        return 0.0
    return round(sorted_ns[min(len(sorted_ns) - 1, int(p * len(sorted_ns)))] / 1e6, 3)


@dataclass
class Verdict:
    holds: bool
    why: str


def judge(offered: int, completed_in_time: int, p99_ms: float, *,
          fraction: float = HOLD_COMPLETED_FRACTION, p99_bound_ms: float = HOLD_P99_MS) -> Verdict:
    """Whether a run holds its rate: at least ``fraction`` of the ``offered`` appends
    completed in the measured time, and p99 at or below ``p99_bound_ms``."""
    if offered <= 0:
        raise ValueError("a run that offered nothing cannot be judged")
    reasons = []
    share = completed_in_time / offered
    if share < fraction:
        reasons.append(f"completed {share:.2%} of the offered appends in time (< {fraction:.0%})")
    if p99_ms > p99_bound_ms:
        reasons.append(f"p99 {p99_ms:.1f} ms > {p99_bound_ms:g} ms")
    return Verdict(not reasons, "; ".join(reasons) or "holds")


def run_ladder(systems: Sequence[str], rates: Iterable[int],
               measure: Callable[[str, int], dict[str, Any]], rounds: int = 1) -> dict[str, list[dict[str, Any]]]:
    """Climb the rates with every system, in alternation at each rate (the order flipped
    from one run to the next, so that neither system always runs first). With ``rounds``
    > 1 each system runs each rate that many times, interleaved with the others, and the
    rate's result is :func:`combine_rounds` of them. A system's ladder stops at the first
    rate it does not hold (``measure`` returns a dict with ``holds``); the others go on.
    Returns each system's results in rate order."""
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    climbing = list(systems)
    for step, rate in enumerate(rates):
        if not climbing:
            break
        got = run_rounds(climbing, rounds, functools.partial(_swapped, measure, rate), combine_rounds,
                         first_round=step * rounds)
        for s in climbing:
            runs[s].append(got[s])
        climbing = [s for s in climbing if runs[s][-1]["holds"]]
    return runs


def _swapped(measure: Callable[[str, int], dict[str, Any]], rate: int, system: str) -> dict[str, Any]:
    return measure(system, rate)


def run_rounds(systems: Sequence[str], rounds: int, measure: Callable[[str], dict[str, Any]],
               combine: Callable[[Sequence[dict[str, Any]]], dict[str, Any]], *,
               first_round: int = 0) -> dict[str, dict[str, Any]]:
    """Each system measured ``rounds`` times, interleaved, the order flipped from one round
    to the next (round ``first_round`` in the given order when even); each system's result
    is its one run, or ``combine`` of its rounds."""
    got: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for k in range(first_round, first_round + rounds):
        for s in (systems if k % 2 == 0 else systems[::-1]):
            got[s].append(measure(s))
    return {s: got[s][0] if rounds == 1 else combine(got[s]) for s in systems}


# The figures of a rate run several times that are reported as the median of its rounds.
ROUND_MEDIANS = ("p50_ms", "p99_ms", "p999_ms", "max_ms", "achieved_per_s", "server_cpu_us_per_entry",
                 "client_cpu_us_per_entry", "send_lag_p99_ms", "naive_p99_ms", "other_cores")


def combine_rounds(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One rate's rounds as one result. On a shared machine a single stall (another job, the
    hypervisor) can fail one round of a rate a system holds, or pass one it does not, so
    the rate holds when more than half of the rounds held, and each figure is the median of
    the rounds' (each percentile on its own: the median p99 and the median p99.9 may come
    from different rounds). The rounds themselves are kept under ``rounds``; a round that
    broke (``error``) counts as not holding and has no figures."""
    assert runs, "no rounds"
    ok = [r for r in runs if "error" not in r]
    held = sum(1 for r in runs if r["holds"])
    out: dict[str, Any] = {"system": runs[0].get("system"), "rate": runs[0]["rate"], "rounds": list(runs)}
    if not ok:
        return {**out, "holds": False, "why": "every round failed", "error": runs[-1].get("error", "")}
    out.update(_medians(ok, ROUND_MEDIANS))
    holds = 2 * held > len(runs)
    whys = [r["why"] for r in runs if not r["holds"] and r.get("why")]
    why = "" if holds else f"held {held} of {len(runs)} rounds" + (f" (first miss: {whys[0]})" if whys else "")
    out.update(holds=holds, why=why, held_rounds=held, p99_ms_rounds=[r.get("p99_ms") for r in runs])
    return out


def _medians(results: Sequence[dict[str, Any]], keys: Iterable[str]) -> dict[str, Any]:
    """Each key's median over the results that have it (None where none has)."""
    out: dict[str, Any] = {}
    for key in keys:
        vals = [r[key] for r in results if r.get(key) is not None]
        out[key] = statistics.median(vals) if vals else None
    return out


E2E_MEDIANS = ("p50_ms", "p99_ms", "p999_ms", "max_ms", "reader_cpu_us_per_entry")


def combine_e2e_rounds(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """:func:`combine_rounds` of end-to-end runs, with the reader's figures (``e2e``) as
    medians of the rounds too and its entries received and expected summed over them. A
    round whose reader reported nothing leaves the e2e figures to the others."""
    out = combine_rounds(runs)
    with_e2e = [r["e2e"] for r in runs if "error" not in r and r.get("e2e")]
    if with_e2e:
        e = _medians(with_e2e, E2E_MEDIANS)
        e["received"] = sum(x.get("received", 0) for x in with_e2e)
        e["expected"] = sum(x.get("expected", 0) for x in with_e2e)
        e["p99_ms_rounds"] = [x.get("p99_ms") for x in with_e2e]
        out["e2e"] = e
    return out


def highest_held(runs: Sequence[dict[str, Any]]) -> int | None:
    """The highest offered rate of a ladder that held (None if none did)."""
    held = [r["rate"] for r in runs if r["holds"]]
    return max(held) if held else None


# -- HdrHistogram ------------------------------------------------------------------------------
HDR_LOWEST_NS = 1_000  # 1 us: below it, all one bucket
HDR_HIGHEST_NS = 3_600 * NS_PER_S
HDR_DIGITS = 3


def latency_summary(latencies_ns: Iterable[int]) -> dict[str, Any]:
    """p50, p99, p99.9 and max (ms) of a latency sample by HdrHistogram (3 significant
    digits), with the count and the histogram itself (base64, HdrHistogram's compressed
    encoding) so that runs can be merged or re-read later."""
    from hdrh.histogram import HdrHistogram

    h = HdrHistogram(HDR_LOWEST_NS, HDR_HIGHEST_NS, HDR_DIGITS)
    for v in latencies_ns:
        h.record_value(min(v, HDR_HIGHEST_NS))
    n = h.get_total_count()

    def ms(ns: int) -> float:
        return round(ns / 1e6, 3)

    if not n:
        return {"count": 0, "p50_ms": 0.0, "p99_ms": 0.0, "p999_ms": 0.0, "max_ms": 0.0, "hdr": ""}
    return {"count": n, "p50_ms": ms(h.get_value_at_percentile(50)), "p99_ms": ms(h.get_value_at_percentile(99)),
            "p999_ms": ms(h.get_value_at_percentile(99.9)), "max_ms": ms(h.get_max_value()),
            "hdr": h.encode().decode()}
