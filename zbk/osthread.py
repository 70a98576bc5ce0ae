"""Linux thread controls: the calling thread's kernel name and the signal a child gets when
its parent thread ends (``prctl(2)``, zbk/cli/children.py), and the CPUs a thread may run on
(``sched_setaffinity(2)``, the bookie's ``actor_cpus``).

Python 3.11 leaves every thread's kernel name as the process's ("python"), so ``top -H``,
``ps -L``, ``perf`` and ``strace -f`` cannot tell a bookie's journal from its Server. The
actor threads name themselves (``zbk-journal``, ``zbk-server``, ...) with
:func:`name_current_thread`. Elsewhere than Linux naming is a no-op, and confining
threads to CPUs is refused (:func:`can_pin`).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
_NAME_BYTES_MAX = 15  # the kernel keeps 16 bytes with the terminating NUL


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


PRCTL = _load_prctl()


def name_current_thread(name: str) -> bool:
    """Set the kernel's name of the calling thread (cut to 15 bytes); False where it cannot."""
    if PRCTL is None:
        return False
    raw = name.encode("utf-8", "replace")[:_NAME_BYTES_MAX]
    return PRCTL(PR_SET_NAME, ctypes.c_char_p(raw), 0, 0, 0) == 0


def parse_cpu_list(text: str) -> frozenset[int]:
    """A CPU list as ``taskset -c`` and /sys take it: ``"2"``, ``"0,2"``, ``"0-3,6"``.
    Empty text: the empty set. ValueError on anything else, and on CPU numbers of
    ``CPU_MAX`` or more (Linux builds for at most 8,192)."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = _CPU_RANGE.fullmatch(part)
        if m is None:
            raise ValueError(f"not a CPU list: {text!r} (e.g. 2, 0,2 or 0-3)")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        if last < first:
            raise ValueError(f"not a CPU list: {text!r} ({part}: the range runs backwards)")
        if last >= CPU_MAX:
            raise ValueError(f"not a CPU list: {text!r} (CPU numbers go up to {CPU_MAX - 1})")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


CPU_MAX = 8192
_CPU_RANGE = re.compile(r"(\d{1,5})\s*(?:-\s*(\d{1,5}))?", re.ASCII)


def can_pin() -> bool:
    """Whether this platform can confine a thread to CPUs (Linux can)."""
    return hasattr(os, "sched_setaffinity")


def allowed_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on; None where the platform cannot tell."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def pin_current_thread(cpus: frozenset[int]) -> None:
    """Confine the calling thread (not the process: Linux applies pid 0 to the caller) to
    ``cpus``. Nothing for the empty set."""
    if cpus:
        os.sched_setaffinity(0, cpus)
