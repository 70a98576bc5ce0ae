"""Linux process controls through ``prctl(2)``: the calling thread's kernel name, and the
signal a child gets when its parent thread ends (zbk/cli/children.py).

Python 3.11 leaves every thread's kernel name as the process's ("python"), so ``top -H``,
``ps -L``, ``perf`` and ``strace -f`` cannot tell a bookie's journal from its Server. The
actor threads name themselves (``zbk-journal``, ``zbk-server``, ...) with
:func:`name_current_thread`. Elsewhere than Linux both are no-ops.
"""

from __future__ import annotations

import ctypes
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
