"""Where a stuck coroutine waits: the chain of awaits below a task or an async generator."""

from __future__ import annotations

from typing import Any


def await_chain(obj: Any, limit: int | None = None) -> str:
    """``qualname:line`` of each frame from ``obj`` (a coroutine, a generator or an async
    generator) down the objects it awaits, innermost last; at most ``limit`` frames."""
    chain: list[str] = []
    while obj is not None and (limit is None or len(chain) < limit):
        frame = getattr(obj, "cr_frame", None) or getattr(obj, "ag_frame", None) or getattr(obj, "gi_frame", None)
        if frame is not None:
            chain.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
        obj = getattr(obj, "cr_await", None) or getattr(obj, "ag_await", None) or getattr(obj, "gi_yieldfrom", None)
    return " -> ".join(chain)
