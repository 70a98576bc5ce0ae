"""Loaded (as ``sitecustomize``) only by Python processes that the clock-fault tests run under
libfaketime: :mod:`faults.faketime` puts this directory first on their PYTHONPATH.

The tests fake the wall clock alone (``FAKETIME_DONT_FAKE_MONOTONIC=1``), as a real clock
step does: CLOCK_MONOTONIC and CLOCK_BOOTTIME keep running. libfaketime 0.9.10 (Debian 12)
then breaks ``time.sleep``: Python sleeps with ``clock_nanosleep(CLOCK_MONOTONIC,
TIMER_ABSTIME, deadline)``, and that version's wrapper converts every absolute deadline as
if it were on the faked wall clock, so the kernel gets a negative time and the sleep fails
with EINVAL (later versions leave CLOCK_MONOTONIC deadlines alone). A real host never
fails a sleep because its wall clock moved, so this puts back a sleep with the same
meaning that waits in ``select`` (relative timeouts, which libfaketime passes through).
"""

from __future__ import annotations

import select
import time

_monotonic = time.monotonic


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = _monotonic() + seconds
    while True:
        left = deadline - _monotonic()
        if left <= 0:
            return
        select.select([], [], [], left)


time.sleep = _sleep
