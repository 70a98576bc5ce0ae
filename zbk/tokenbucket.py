"""One token bucket for every rate in zbk: GC compaction pacing (zbk/actors/gc.py) and the
re-replication copy rate (zbk/recovery/copier.py).

Pure: the caller passes the time (``now``, seconds on a monotonic clock) to every call
that depends on it, so the bucket is driven by a virtual clock in tests and by the actor's
own clock in the GC, and never reads a clock itself.
"""

from __future__ import annotations


class TokenBucket:
    """Tokens (bytes, usually) refilled at ``rate_per_s`` up to ``capacity``.

    :meth:`take` may overdraw: work whose cost is known only once done (a compaction chunk
    scans what it scans; a copy is let through whole, never split) is charged in full, and
    the debt delays what comes next. With ``capacity`` 0 nothing accumulates while idle:
    each piece of work waits for the debt of the ones before it, no burst is ever allowed.
    """

    def __init__(self, rate_per_s: float, capacity: float, *, tokens: float = 0.0, now: float = 0.0) -> None:
        assert rate_per_s > 0 and capacity >= 0, (rate_per_s, capacity)
        assert tokens <= capacity, (tokens, capacity)
        self.rate_per_s = rate_per_s
        self.capacity = capacity
        self.tokens = tokens
        self.at = now  # when tokens was last brought up to date

    def reset(self, tokens: float, now: float) -> None:
        """Hold ``tokens`` at ``now`` (a new start: a compaction job's first chunk)."""
        assert tokens <= self.capacity, (tokens, self.capacity)
        self.tokens = tokens
        self.at = now

    def refill(self, now: float) -> float:
        """The tokens at ``now``: those held plus what the rate added since, up to capacity.
        A ``now`` before the last one adds nothing (time never runs backwards here)."""
        if now > self.at:
            self.tokens = min(self.capacity, self.tokens + self.rate_per_s * (now - self.at))
            self.at = now
        return self.tokens

    def take(self, n: float) -> None:
        """Spend ``n`` tokens; below zero is a debt the refill pays off first."""
        assert n >= 0, n
        self.tokens -= n

    def wait_s(self, need: float, now: float) -> float:
        """Seconds from ``now`` until ``need`` tokens are held (0: now). ``need`` beyond the
        capacity can never be held: that is a caller's bug."""
        assert need <= self.capacity, (need, self.capacity)
        return max(0.0, need - self.refill(now)) / self.rate_per_s
