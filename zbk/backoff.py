"""One retry policy for every retry loop of zbk: exponential backoff with jitter.

The loops that retry (a lost compare-and-set, an unreachable etcd member, a re-registration,
a ledger whose repair failed, a sandbox child that crashed, a recovery read, the auditor's
campaign) differ only in their bounds, which live in zbk/limits.py. The policy is here, once,
with its clock and its random generator passed in, so that tests drive it without waiting.
"""

from __future__ import annotations

import random

from zbk.clock import SYSTEM_CLOCK, Clock

# The default generator of jitter: one for the process (random.Random is safe to share
# between threads), seeded from the OS, so that processes retrying together spread out.
_RNG = random.Random()


class Backoff:
    """Delays between the attempts at one thing that keeps failing.

    The n-th failure in a row waits ``first_s * factor ** (n - 1)``, at most ``max_s``.
    ``jitter`` (0 to 1) takes a random part of up to that fraction off each delay, so that
    parties that failed together do not retry together: 0.5 waits between half the delay
    and all of it, 1 anywhere up to it ("full jitter"). ``reset()`` after a success starts
    over. ``attempts_max`` (None: unbounded) only counts: :attr:`exhausted` tells a loop
    when to give up.

    Two ways to wait: :meth:`sleep` blocks on the clock; or :meth:`fail` returns the delay
    and remembers the time before which the next attempt should not start (:attr:`until`,
    :meth:`ready`), for a loop that has other work meanwhile or waits on an event of its own.
    """

    def __init__(self, first_s: float, max_s: float, *, factor: float = 2.0, jitter: float = 0.0,
                 attempts_max: int | None = None, clock: Clock = SYSTEM_CLOCK,
                 rng: random.Random | None = None) -> None:
        assert 0 < first_s <= max_s, (first_s, max_s)
        assert factor >= 1 and 0 <= jitter <= 1, (factor, jitter)
        assert attempts_max is None or attempts_max >= 1, attempts_max
        self.first_s = first_s
        self.max_s = max_s
        self.factor = factor
        self.jitter = jitter
        self.attempts_max = attempts_max
        self.clock = clock
        self.rng = rng if rng is not None else _RNG
        self.failures = 0  # in a row, since the start or the last reset()
        self.delay_s = 0.0  # the last failure's delay before jitter (0: none yet)
        self.until = 0.0  # clock time (monotonic) before which the next attempt should not start

    @property
    def exhausted(self) -> bool:
        """True once ``attempts_max`` attempts have failed."""
        return self.attempts_max is not None and self.failures >= self.attempts_max

    def next_delay_s(self) -> float:
        """The delay the next failure will get, before jitter."""
        if self.failures == 0:
            return self.first_s
        return min(self.max_s, self.delay_s * self.factor)

    def fail(self) -> float:
        """Count a failure; returns how long to wait before the next attempt (jittered)."""
        self.delay_s = self.next_delay_s()
        self.failures += 1
        delay = self.delay_s
        if self.jitter:
            delay -= delay * self.jitter * self.rng.random()
        self.until = self.clock.monotonic() + delay
        return delay

    def sleep(self) -> float:
        """Count a failure and wait its delay on the clock; returns the delay."""
        delay = self.fail()
        self.clock.sleep(delay)
        return delay

    def hold_until(self, until: float) -> None:
        """Let no attempt start before ``until`` (clock time) without counting a failure:
        a wait that is not a failure's (a grace period)."""
        self.until = until

    def ready(self) -> bool:
        """May the next attempt start now?"""
        return self.clock.monotonic() >= self.until

    def remaining_s(self) -> float:
        """Seconds until the next attempt may start (0: now)."""
        return max(0.0, self.until - self.clock.monotonic())

    def reset(self) -> None:
        """A success: the next failure waits ``first_s`` again."""
        self.failures = 0
        self.delay_s = 0.0
        self.until = 0.0
