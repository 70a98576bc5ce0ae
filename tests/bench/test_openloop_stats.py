"""The arithmetic of bench/openloop.py (bench/_openloop_stats.py): the fixed-rate schedule,
latency with coordinated omission corrected, the "holds" judgement and the rate ladder.
Pure functions: no process, no clock."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _openloop_stats import (  # noqa: E402
    FAILED,
    NOT_DONE,
    NS_PER_S,
    burst_spacing_ms,
    combine_e2e_rounds,
    combine_rounds,
    due_count,
    highest_held,
    intended_ns,
    judge,
    ladder_rates,
    late_bursts,
    naive_latencies_ns,
    run_ladder,
    window_stats,
)

MS = 1_000_000


# -- the schedule -------------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [1, 3, 1_000, 7_000, 33_333, 250_000])
def test_due_count_agrees_with_intended_times(rate: int) -> None:
    """due_count(now) is exactly the number of entries whose intended time is <= now, also
    at the nanosecond of an intended time and the one before it, for rates that do not
    divide a second evenly."""
    t0 = 5_000_000_000
    for i in range(0, 400, 7):
        t = intended_ns(t0, i, rate)
        assert due_count(t0, t, rate) == i + 1
        assert due_count(t0, t - 1, rate) == i
    assert due_count(t0, t0 - 1, rate) == 0


def test_intended_times_follow_the_rate() -> None:
    assert intended_ns(0, 0, 1_000) == 0
    assert intended_ns(0, 1_000, 1_000) == NS_PER_S
    assert intended_ns(100, 3, 2_000) == 100 + 1_500_000


def test_ladder_rates() -> None:
    assert ladder_rates(30_000) == [1_000, 2_000, 5_000, 10_000, 15_000, 20_000, 25_000, 30_000]
    assert ladder_rates(2_000) == [1_000, 2_000]
    assert ladder_rates(12_345) == [1_000, 2_000, 5_000, 10_000]


# -- coordinated omission ---------------------------------------------------------------------
def stalled_run(rate: int = 1_000, n: int = 1_000, stall_at: int = 500, stall_ms: int = 100,
                service_ns: int = MS // 2) -> tuple[int, list[int], list[int]]:
    """A closed-loop-like sender: it sends entry i when the previous one is confirmed (never
    before its intended time), the system takes ``service_ns`` per entry (half the interval
    between entries: it keeps up, and catches up after a stall at twice the rate), and once
    it stalls for ``stall_ms`` (entry ``stall_at``). Returns t0, the actual send times and
    the confirmation times."""
    t0 = 1_000_000_000
    sent, done = [], []
    free = t0
    for i in range(n):
        s = max(intended_ns(t0, i, rate), free)
        d = s + service_ns + (stall_ms * MS if i == stall_at else 0)
        sent.append(s)
        done.append(d)
        free = d
    return t0, sent, done


def test_latency_counts_from_the_intended_send_time() -> None:
    """A 100 ms stall at 1,000 entries/s delays the ~200 entries behind it (the backlog
    drains at 1,000/s): counted from the intended send time, entry k after the stall waited
    100.5 - k / 2 ms, so ~100 entries (10 %) are over 50 ms; counted from the actual send
    (the naive figure) only the stalled entry is slow."""
    t0, sent, done = stalled_run()
    st = window_stats(t0, 1_000, done, 0, 1_000, grace_ns=20 * MS, end_ns=done[-1])
    corrected = sorted(st.latencies_ns)
    naive = sorted(naive_latencies_ns(sent, done, 0, 1_000))
    assert len(corrected) == 1_000 and st.completed == 1_000 and st.censored == 0
    assert sum(1 for x in naive if x > 50 * MS) == 1
    assert 90 <= sum(1 for x in corrected if x > 50 * MS) <= 110
    assert corrected[989] > 10 * MS  # the corrected p99 sees the stall, the naive one does not
    assert naive[989] == MS // 2
    assert max(corrected) == 100 * MS + MS // 2  # the stalled entry itself: service + stall


def test_exact_latencies_of_a_late_schedule() -> None:
    """Entries confirmed at fixed times: each latency is confirmation minus intended time."""
    t0, rate = 0, 1_000  # intended 0, 1, 2, 3 ms
    done = [5 * MS, 5 * MS, 5 * MS, 5 * MS]
    st = window_stats(t0, rate, done, 0, 4, grace_ns=20 * MS, end_ns=10 * MS)
    assert st.latencies_ns == [5 * MS, 4 * MS, 3 * MS, 2 * MS]


def test_unconfirmed_entries_count_with_the_time_waited() -> None:
    """Entries never confirmed are not left out: their latency is at least the time the run
    waited (a lower bound), and they do not count as completed."""
    rate = 1_000
    done = [1 * MS, 2 * MS, NOT_DONE, NOT_DONE, FAILED]
    st = window_stats(0, rate, done, 0, 5, grace_ns=20 * MS, end_ns=1_000 * MS)
    assert st.completed == 2 and st.completed_in_time == 2 and st.censored == 2 and st.failed == 1
    assert sorted(st.latencies_ns) == [1 * MS, 1 * MS, 997 * MS, 998 * MS]  # the failed entry has none


def test_window_leaves_out_warmup_and_cooldown() -> None:
    rate = 1_000
    # Warm-up entries 0-9 (slow), window 10-19, cool-down 20-24 (slow).
    done = [intended_ns(0, i, rate) + (500 * MS if i < 10 or i >= 20 else 1 * MS) for i in range(25)]
    st = window_stats(0, rate, done, 10, 20, grace_ns=20 * MS, end_ns=10**12)
    assert st.offered == 10 and st.latencies_ns == [1 * MS] * 10


def test_completed_in_time_and_achieved_rate() -> None:
    """Completed in time: confirmed by the window's end plus the grace. Achieved rate:
    confirmations inside the window, per second of window."""
    rate = 1_000  # window entries 0..99: 0.1 s, ends at 100 ms
    done = [intended_ns(0, i, rate) + 2 * MS for i in range(90)]
    done += [115 * MS] * 5  # after the end, within the 20 ms grace
    done += [125 * MS] * 5  # after the grace
    st = window_stats(0, rate, done, 0, 100, grace_ns=20 * MS, end_ns=200 * MS)
    assert st.completed == 100
    assert st.completed_in_time == 95
    # Confirmed inside [0, 100 ms]: entries 0..89 are confirmed at i + 2 ms <= 91 ms.
    assert st.achieved_per_s == pytest.approx(90 / 0.1)


def test_window_bounds_checked() -> None:
    with pytest.raises(ValueError):
        window_stats(0, 1_000, [1, 2, 3], 2, 5, grace_ns=0, end_ns=0)


# -- holds --------------------------------------------------------------------------------------
def test_judge_holds_at_the_bounds() -> None:
    assert judge(10_000, 9_900, 20.0).holds  # exactly 99 % and exactly 20 ms
    v = judge(10_000, 9_899, 20.0)
    assert not v.holds and "99" in v.why
    v = judge(10_000, 10_000, 20.001)
    assert not v.holds and "p99" in v.why
    v = judge(10_000, 5_000, 300.0)
    assert not v.holds and "p99" in v.why and "completed" in v.why
    with pytest.raises(ValueError):
        judge(0, 0, 1.0)


def test_stalled_run_is_not_held_though_the_naive_figure_would_hold() -> None:
    """The corrected p99 of the stalled run is over the bound: the run does not hold, though
    every entry completed and the naive p99 is 1 ms."""
    t0, sent, done = stalled_run(stall_ms=300)
    st = window_stats(t0, 1_000, done, 0, 1_000, grace_ns=20 * MS, end_ns=done[-1])
    p99 = sorted(st.latencies_ns)[989] / MS
    assert not judge(st.offered, st.completed, p99).holds
    naive_p99 = sorted(naive_latencies_ns(sent, done, 0, 1_000))[989] / MS
    assert judge(st.offered, st.completed, naive_p99).holds


# -- the ladder ---------------------------------------------------------------------------------
def test_ladder_stops_each_system_at_its_first_failure() -> None:
    limits = {"a": 5_000, "b": 15_000}  # the highest rate each holds
    calls: list[tuple[str, int]] = []

    def measure(system: str, rate: int) -> dict[str, Any]:
        calls.append((system, rate))
        return {"rate": rate, "holds": rate <= limits[system]}

    runs = run_ladder(["a", "b"], ladder_rates(40_000), measure)
    assert [r["rate"] for r in runs["a"]] == [1_000, 2_000, 5_000, 10_000]
    assert [r["rate"] for r in runs["b"]] == [1_000, 2_000, 5_000, 10_000, 15_000, 20_000]
    assert highest_held(runs["a"]) == 5_000 and highest_held(runs["b"]) == 15_000
    # Alternation, the order flipped at each rate; b climbs alone after a's failure.
    assert calls[:8] == [("a", 1_000), ("b", 1_000), ("b", 2_000), ("a", 2_000), ("a", 5_000), ("b", 5_000),
                         ("b", 10_000), ("a", 10_000)]
    assert calls[8:] == [("b", 15_000), ("b", 20_000)]


def test_ladder_that_never_fails_ends_at_the_last_rate_and_one_that_never_holds() -> None:
    runs = run_ladder(["a", "b"], [1_000, 2_000], lambda s, r: {"rate": r, "holds": s == "a"})
    assert [r["rate"] for r in runs["a"]] == [1_000, 2_000]
    assert [r["rate"] for r in runs["b"]] == [1_000]
    assert highest_held(runs["b"]) is None


def _run(rate: int, p99: float, *, holds: bool | None = None, **more: Any) -> dict[str, Any]:
    held = p99 <= 20.0 if holds is None else holds
    return {"system": "a", "rate": rate, "p50_ms": p99 / 4, "p99_ms": p99, "p999_ms": 2 * p99, "max_ms": 3 * p99,
            "achieved_per_s": rate, "server_cpu_us_per_entry": 10.0, "client_cpu_us_per_entry": None,
            "send_lag_p99_ms": 0.1, "naive_p99_ms": p99, "other_cores": 0.0, "holds": held,
            "why": "" if held else f"p99 {p99} ms > 20 ms", **more}


def test_rounds_hold_by_majority_with_median_figures() -> None:
    c = combine_rounds([_run(1_000, 6.0), _run(1_000, 161.0), _run(1_000, 7.0)])
    assert c["holds"] and c["held_rounds"] == 2
    assert c["p99_ms"] == 7.0 and c["p999_ms"] == 14.0 and c["p50_ms"] == 1.75
    assert c["client_cpu_us_per_entry"] is None  # no round has it
    assert c["p99_ms_rounds"] == [6.0, 161.0, 7.0] and len(c["rounds"]) == 3
    # Each percentile is its own median, not the figures of one round.
    c = combine_rounds([_run(1_000, 5.0, p999_ms=30.0), _run(1_000, 6.0, p999_ms=8.0), _run(1_000, 7.0, p999_ms=9.0)])
    assert (c["p99_ms"], c["p999_ms"]) == (6.0, 9.0)


def test_rounds_half_held_is_not_held_and_a_broken_round_counts_as_a_miss() -> None:
    c = combine_rounds([_run(2_000, 6.0), _run(2_000, 30.0)])
    assert not c["holds"] and c["why"].startswith("held 1 of 2 rounds") and "p99 30.0" in c["why"]
    assert c["p99_ms"] == 18.0  # the median of two
    broken = {"system": "a", "rate": 2_000, "holds": False, "why": "run failed", "error": "worker died"}
    c = combine_rounds([_run(2_000, 6.0), broken, _run(2_000, 7.0)])
    assert c["holds"] and c["p99_ms"] == 6.5  # the broken round has no figures
    c = combine_rounds([_run(2_000, 6.0), broken, dict(broken)])
    assert not c["holds"]
    c = combine_rounds([broken, dict(broken)])
    assert not c["holds"] and c["why"] == "every round failed" and c["error"] == "worker died"


def test_e2e_rounds_take_the_readers_medians_and_sum_what_they_received() -> None:
    def e2e(p99: float, received: int) -> dict[str, Any]:
        return {"p50_ms": p99 / 3, "p99_ms": p99, "p999_ms": 2 * p99, "max_ms": 3 * p99,
                "reader_cpu_us_per_entry": 250.0, "received": received, "expected": 5_000}

    broken = {"system": "a", "rate": 500, "holds": False, "why": "run failed", "error": "reader died"}
    c = combine_e2e_rounds([_run(500, 4.0, e2e=e2e(9.0, 5_000)), broken, _run(500, 5.0, e2e=e2e(36.0, 4_990)),
                            _run(500, 4.5, e2e=e2e(11.0, 5_000))])
    assert c["holds"] and c["p99_ms"] == 4.5  # 3 of 4 rounds held; the broken one has no figures
    assert c["e2e"]["p99_ms"] == 11.0 and c["e2e"]["p50_ms"] == 11.0 / 3 and c["e2e"]["max_ms"] == 33.0
    assert (c["e2e"]["received"], c["e2e"]["expected"]) == (14_990, 15_000)
    assert c["e2e"]["p99_ms_rounds"] == [9.0, 36.0, 11.0]
    assert "e2e" not in combine_e2e_rounds([broken, dict(broken)])


def test_ladder_rounds_interleave_the_systems_and_combine_each_rate() -> None:
    calls: list[tuple[str, int]] = []
    p99s = {("a", 1_000): [6.0, 40.0, 7.0], ("b", 1_000): [30.0, 8.0, 50.0], ("a", 2_000): [9.0, 9.0, 9.0]}

    def measure(system: str, rate: int) -> dict[str, Any]:
        calls.append((system, rate))
        return _run(rate, p99s[(system, rate)][sum(1 for c in calls if c == (system, rate)) - 1], system=system)

    runs = run_ladder(["a", "b"], [1_000, 2_000], measure, rounds=3)
    assert calls == [("a", 1_000), ("b", 1_000), ("b", 1_000), ("a", 1_000), ("a", 1_000), ("b", 1_000),
                     ("a", 2_000), ("a", 2_000), ("a", 2_000)]
    assert [r["holds"] for r in runs["a"]] == [True, True] and [r["p99_ms"] for r in runs["a"]] == [7.0, 9.0]
    assert [r["holds"] for r in runs["b"]] == [False] and runs["b"][0]["p99_ms"] == 30.0
    assert highest_held(runs["a"]) == 2_000 and highest_held(runs["b"]) is None


# -- HdrHistogram -------------------------------------------------------------------------------
def test_latency_summary_percentiles() -> None:
    pytest.importorskip("hdrh", reason="the bench extra (hdrhistogram) is not installed")
    from _openloop_stats import latency_summary

    values = [i * MS // 10 for i in range(1, 1001)]  # 0.1 .. 100 ms
    s = latency_summary(values)
    assert s["count"] == 1000
    assert s["p50_ms"] == pytest.approx(50.0, rel=0.002)
    assert s["p99_ms"] == pytest.approx(99.0, rel=0.002)
    assert s["p999_ms"] == pytest.approx(99.9, rel=0.002)
    assert s["max_ms"] == pytest.approx(100.0, rel=0.002)
    assert latency_summary([])["count"] == 0


# -- the generator loop -------------------------------------------------------------------------
class _HeldTarget:
    """Appends whose confirmations wait until release(): the system under test has stalled."""

    def __init__(self) -> None:
        self.futures: list[Any] = []

    async def send(self, payload: bytes) -> Any:
        import asyncio

        fut = asyncio.get_running_loop().create_future()
        self.futures.append((fut, payload))
        return fut

    def release(self) -> None:
        for fut, _ in self.futures:
            fut.set_result(None)


def test_generator_keeps_its_schedule_while_nothing_is_confirmed() -> None:
    """Open loop: the generator sends every entry at (never before) its intended time even
    though no append has been confirmed, each entry carrying its intended time and index;
    confirmations arriving later are recorded after the send."""
    import asyncio
    import time
    from array import array

    from _openloop_workers import drive, run_async

    rate, n = 2_000, 200
    target = _HeldTarget()
    done, sent = array("q", bytes(8 * n)), array("q", bytes(8 * n))
    marked: list[int] = []

    async def main() -> tuple[int, int]:
        t0 = time.monotonic_ns() + 5 * MS
        errors = await drive(target, rate, t0, n, 64, done, sent, {50: lambda: marked.append(time.monotonic_ns())})
        assert all(d == NOT_DONE for d in done)  # nothing confirmed, yet all sent
        target.release()
        await asyncio.sleep(0)  # the done-callbacks run
        return t0, errors

    t0, errors = run_async(main())
    assert errors == 0 and len(target.futures) == n
    for i, (_, payload) in enumerate(target.futures):
        assert sent[i] >= intended_ns(t0, i, rate)
        assert int.from_bytes(payload[:8], "little") == intended_ns(t0, i, rate)
        assert int.from_bytes(payload[8:16], "little") == i and len(payload) == 64
        assert done[i] >= sent[i]
    assert len(marked) == 1 and intended_ns(t0, 50, rate) <= marked[0] <= sent[50]


# -- where the late entries came ------------------------------------------------------------------
def test_late_entries_group_into_bursts_with_the_generators_share() -> None:
    rate, t0, n = 1_000, 10 * NS_PER_S, 1_000  # one entry per ms
    sent = [intended_ns(t0, i, rate) for i in range(n)]
    done = [intended_ns(t0, i, rate) + 2 * MS for i in range(n)]
    for i in range(300, 310):  # a stall of the servers: confirmations 30 ms late
        done[i] = intended_ns(t0, 310, rate) + 25 * MS
    for i in range(600, 605):  # the generator itself 40 ms late
        sent[i] = intended_ns(t0, i, rate) + 40 * MS
        done[i] = sent[i] + 2 * MS
    done[700] = FAILED  # failures are counted elsewhere, not as late
    done[900] = NOT_DONE  # never confirmed: late until the end of the wait
    bursts = late_bursts(t0, rate, sent, done, 100, n, over_ns=20 * MS, gap_ns=50 * MS,
                         end_ns=intended_ns(t0, n, rate) + 10 * NS_PER_S)
    assert [(b["entries"], round(b["start_s"], 3), round(b["end_s"], 3)) for b in bursts] == \
        [(10, 0.2, 0.209), (5, 0.5, 0.504), (1, 0.8, 0.8)]
    assert bursts[0]["max_ms"] == pytest.approx(35.0) and bursts[0]["send_lag_ms"] == 0.0
    assert bursts[1]["max_ms"] == pytest.approx(42.0) and bursts[1]["send_lag_ms"] == pytest.approx(40.0)
    assert bursts[2]["max_ms"] > 10_000
    assert burst_spacing_ms(bursts) == 300.0


def test_late_entries_closer_than_the_gap_are_one_burst_and_none_is_none() -> None:
    rate, t0 = 1_000, 0
    sent = [intended_ns(t0, i, rate) for i in range(200)]
    done = [s + 1 * MS for s in sent]
    assert late_bursts(t0, rate, sent, done, 0, 200, over_ns=20 * MS, gap_ns=50 * MS, end_ns=10**12) == []
    assert burst_spacing_ms([]) is None
    for i in (10, 50, 99):  # 40 and 49 ms apart: one burst
        done[i] = sent[i] + 30 * MS
    bursts = late_bursts(t0, rate, sent, done, 0, 200, over_ns=20 * MS, gap_ns=50 * MS, end_ns=10**12)
    assert len(bursts) == 1 and bursts[0]["entries"] == 3 and burst_spacing_ms(bursts) is None
