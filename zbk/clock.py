"""An injectable clock, so that logic can be driven by tests instead of by wall time."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back and that steps of the wall clock do not
        move (for timeouts, intervals, and the embedded store's lease expiries, which its
        processes share: on Linux it is CLOCK_MONOTONIC, one clock for the whole host)."""

    def time(self) -> float:
        """Seconds since the epoch, as people read them (creation times, marks); it may
        step forward or back at any time."""

    def sleep(self, seconds: float) -> None:
        """Block the caller for ``seconds``."""


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class FakeClock:
    """A clock moved only by :meth:`advance`; ``sleep`` advances it instead of blocking."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def time(self) -> float:
        return self.monotonic()

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "time does not go back"
        with self._lock:
            self._now += seconds


SYSTEM_CLOCK: Clock = SystemClock()
