"""Waiting for a condition with a deadline, instead of sleeping a guessed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], *, timeout_s: float = 10.0, interval_s: float = 0.02,
               message: str = "condition") -> T:
    """Poll ``predicate`` until it returns something truthy, and return that; AssertionError
    with ``message`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {message}")
        time.sleep(interval_s)
