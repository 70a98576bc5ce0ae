"""The one token bucket (zbk/tokenbucket.py): pure, so driven here by plain numbers."""

from __future__ import annotations

import asyncio

import pytest

from zbk.clock import FakeClock
from zbk.recovery.copier import RateLimiter
from zbk.tokenbucket import TokenBucket


def test_refills_at_its_rate_up_to_capacity() -> None:
    b = TokenBucket(100.0, 250.0, now=10.0)
    assert b.refill(10.0) == 0.0
    assert b.refill(11.0) == 100.0
    assert b.refill(11.5) == 150.0
    assert b.refill(20.0) == 250.0  # full: the rest of the time is lost


def test_time_never_runs_backwards() -> None:
    b = TokenBucket(100.0, 1000.0, now=10.0)
    assert b.refill(12.0) == 200.0
    assert b.refill(11.0) == 200.0  # an earlier now adds nothing and takes nothing
    assert b.refill(13.0) == 300.0


def test_take_may_overdraw_and_the_debt_is_paid_first() -> None:
    b = TokenBucket(100.0, 500.0, tokens=100.0, now=0.0)
    b.take(300.0)
    assert b.tokens == -200.0
    assert b.wait_s(0.0, 0.0) == 2.0
    assert b.wait_s(50.0, 1.0) == 1.5  # -100 at t=1: 150 more to go
    assert b.refill(3.0) == 100.0


def test_take_charges_without_refilling() -> None:
    """A charge for work already done does not first top the bucket up to capacity (that
    would forgive the time the work took): the refill from the last time counts after it."""
    b = TokenBucket(100.0, 100.0, tokens=100.0, now=0.0)
    b.take(100.0)
    assert b.refill(0.5) == 50.0


def test_wait_for_what_is_already_there_is_zero() -> None:
    b = TokenBucket(10.0, 100.0, tokens=40.0, now=5.0)
    assert b.wait_s(40.0, 5.0) == 0.0
    assert b.wait_s(60.0, 5.0) == 2.0


def test_capacity_zero_saves_nothing_up() -> None:
    b = TokenBucket(100.0, 0.0, now=0.0)
    assert b.wait_s(0.0, 0.0) == 0.0
    b.take(300.0)
    assert b.wait_s(0.0, 1.0) == 2.0
    assert b.refill(100.0) == 0.0  # a long idle time: still nothing banked
    b.take(50.0)
    assert b.wait_s(0.0, 100.0) == 0.5


def test_reset_starts_over() -> None:
    b = TokenBucket(100.0, 1000.0, now=0.0)
    b.take(500.0)
    b.reset(200.0, 7.0)
    assert (b.tokens, b.at) == (200.0, 7.0)
    assert b.refill(8.0) == 300.0


@pytest.mark.parametrize("kw", [dict(rate_per_s=0.0, capacity=1.0), dict(rate_per_s=1.0, capacity=-1.0),
                                dict(rate_per_s=1.0, capacity=1.0, tokens=2.0)])
def test_nonsense_is_refused(kw: dict[str, float]) -> None:
    with pytest.raises(AssertionError):
        TokenBucket(**kw)


def test_need_beyond_capacity_is_a_bug() -> None:
    with pytest.raises(AssertionError):
        TokenBucket(1.0, 10.0).wait_s(11.0, 0.0)


def test_rate_limiter_queues_concurrent_copies_behind_each_others_debt(monkeypatch: pytest.MonkeyPatch) -> None:
    """The copier's limiter on the bucket: the first copy goes at once, each next one waits
    for the bytes before it, and the waits are decided when asked (on a fake clock here)."""
    clock = FakeClock(0.0)
    waits: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", fake_sleep)
    limiter = RateLimiter(1000.0, clock=clock)

    async def three() -> None:
        await limiter.acquire(500)  # at once
        await limiter.acquire(1000)  # behind 500 B: 0.5 s
        clock.advance(0.25)
        await limiter.acquire(10)  # behind 1,500 B, 0.25 s later: 1.25 s

    asyncio.run(three())
    assert waits == [pytest.approx(0.5), pytest.approx(1.25)]
