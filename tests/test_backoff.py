"""The one retry policy (zbk/backoff.py), driven by a fake clock and a seeded generator."""

from __future__ import annotations

import random

import pytest

from zbk.backoff import Backoff
from zbk.clock import FakeClock


class _Fixed(random.Random):
    """A generator whose random() is always ``value``: jitter at its extremes."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_delays_double_from_first_to_max() -> None:
    b = Backoff(0.5, 30.0, clock=FakeClock())
    assert [b.fail() for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert b.failures == 9 and b.delay_s == 30


def test_factor_other_than_two() -> None:
    b = Backoff(1.0, 100.0, factor=3.0, clock=FakeClock())
    assert [b.fail() for _ in range(5)] == [1, 3, 9, 27, 81]


def test_factor_one_is_a_constant_pause() -> None:
    b = Backoff(0.2, 0.2, factor=1.0, clock=FakeClock())
    assert [b.fail() for _ in range(3)] == [0.2, 0.2, 0.2]


def test_reset_starts_over() -> None:
    b = Backoff(1.0, 10.0, clock=FakeClock())
    b.fail()
    b.fail()
    b.reset()
    assert (b.failures, b.delay_s, b.until) == (0, 0.0, 0.0)
    assert b.fail() == 1.0


def test_next_delay_is_what_the_next_failure_gets_before_jitter() -> None:
    b = Backoff(1.0, 3.0, jitter=1.0, clock=FakeClock(), rng=_Fixed(0.5))
    assert b.next_delay_s() == 1.0
    b.fail()
    assert b.next_delay_s() == 2.0
    b.fail()
    assert b.next_delay_s() == 3.0


@pytest.mark.parametrize("jitter,r,expected", [
    (0.5, 0.0, 4.0),   # no luck: the whole delay
    (0.5, 0.999999, 2.000002),  # at most half is taken off
    (1.0, 0.5, 2.0),   # full jitter: anywhere in (0, delay]
    (0.0, 0.9, 4.0),   # no jitter: the generator is not even asked
])
def test_jitter_takes_at_most_its_fraction_off(jitter: float, r: float, expected: float) -> None:
    b = Backoff(4.0, 4.0, jitter=jitter, clock=FakeClock(), rng=_Fixed(r))
    assert b.fail() == pytest.approx(expected)
    assert b.delay_s == 4.0, "the nominal delay grows, not the jittered one"


def test_jittered_delays_are_reproducible_with_a_seed_and_stay_in_range() -> None:
    def run(seed: int) -> list[float]:
        b = Backoff(0.001, 0.05, jitter=1.0, clock=FakeClock(), rng=random.Random(seed))
        return [b.fail() for _ in range(12)]

    assert run(7) == run(7)
    assert run(7) != run(8)
    nominal = [min(0.05, 0.001 * 2 ** i) for i in range(12)]
    assert all(0 < d <= n for d, n in zip(run(7), nominal, strict=True))


def test_until_and_ready_follow_the_clock() -> None:
    clock = FakeClock(100.0)
    b = Backoff(2.0, 8.0, clock=clock)
    assert b.ready() and b.remaining_s() == 0.0
    b.fail()
    assert b.until == 102.0 and not b.ready() and b.remaining_s() == 2.0
    clock.advance(1.5)
    assert not b.ready() and b.remaining_s() == pytest.approx(0.5)
    clock.advance(0.5)
    assert b.ready()


def test_hold_until_waits_without_counting_a_failure() -> None:
    clock = FakeClock(10.0)
    b = Backoff(1.0, 8.0, clock=clock)
    b.hold_until(25.0)
    assert not b.ready() and b.failures == 0
    assert b.fail() == 1.0  # a failure after the hold still starts from the first delay


def test_sleep_waits_on_the_clock() -> None:
    clock = FakeClock(0.0)
    b = Backoff(0.5, 1.0, clock=clock)
    assert b.sleep() == 0.5 and clock.monotonic() == 0.5
    assert b.sleep() == 1.0 and clock.monotonic() == 1.5
    assert b.sleep() == 1.0 and clock.monotonic() == 2.5


def test_attempts_max_marks_exhaustion() -> None:
    b = Backoff(0.1, 1.0, attempts_max=3, clock=FakeClock())
    b.fail()
    b.fail()
    assert not b.exhausted
    b.fail()
    assert b.exhausted
    b.reset()
    assert not b.exhausted
    assert not Backoff(0.1, 1.0, clock=FakeClock()).exhausted  # unbounded


@pytest.mark.parametrize("kw", [dict(first_s=0.0, max_s=1.0), dict(first_s=2.0, max_s=1.0),
                                dict(first_s=1.0, max_s=2.0, jitter=1.5), dict(first_s=1.0, max_s=2.0, factor=0.5),
                                dict(first_s=1.0, max_s=2.0, attempts_max=0)])
def test_nonsense_is_refused(kw: dict[str, float]) -> None:
    with pytest.raises(AssertionError):
        Backoff(**kw)  # type: ignore[arg-type]


def test_cas_retry_backs_off_between_conflicts_and_gives_up_after_its_attempts(tmp_path) -> None:
    """A user of the policy: every compare-and-set loses (another writer bumps the key
    between our read and our write); cas_retry waits a jittered, growing pause between
    rounds on the injected clock, none after the last, and then gives up."""
    from zbk.errors import MetadataVersionError
    from zbk.metadata.coordination import cas_retry
    from zbk.metadata.sqlite import SqliteStore

    clock = FakeClock(0.0)
    with SqliteStore(str(tmp_path / "m.db")) as store:
        store.put("k", b"0")

        def update(value: bytes | None) -> bytes:
            store.put("k", b"rival")  # the race is lost every time
            return b"mine"

        with pytest.raises(MetadataVersionError, match="after 5 conflicting"):
            cas_retry(store, "k", update, attempts=5, clock=clock, rng=_Fixed(0.0))
        # Full jitter with random() == 0 waits each whole nominal delay: 1, 2, 4, 8 ms.
        assert clock.monotonic() == pytest.approx(0.015)
