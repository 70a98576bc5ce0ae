"""Run a function in several fresh Python processes (spawn) that start working together.

A barrier releases the workers only once all of them are up, so that they really race
(process start-up takes long enough for a fast worker to finish before the next begins).
Each worker's result (or exception) comes back through a queue; every worker is stopped
by PID at the end, even if the test fails or a worker hangs.
"""

from __future__ import annotations

import multiprocessing
import queue
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from helpers.procs import stop_pid

BARRIER_TIMEOUT_S = 60.0


def _entry(index: int, fn: Callable[..., Any], args: tuple[Any, ...], barrier: Any, results: Any) -> None:
    try:
        barrier.wait(BARRIER_TIMEOUT_S)
        results.put((index, True, fn(*args)))
    except BaseException:
        results.put((index, False, traceback.format_exc()))


def run_racing(fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], *, timeout_s: float = 60.0) -> list[Any]:
    """``[fn(*a) for a in args]``, each call in its own spawned process, all started together.
    ``fn`` must be importable by name (a module-level function)."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(args))
    results = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(i, fn, a, barrier, results), daemon=True) for i, a in enumerate(args)]
    out: dict[int, Any] = {}
    try:
        for p in procs:
            p.start()
        for _ in procs:
            try:
                index, ok, value = results.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(f"a worker did not finish within {timeout_s} s") from None
            if not ok:
                raise AssertionError(f"worker {index} failed:\n{value}")
            out[index] = value
        for p in procs:
            p.join(timeout_s)
    finally:
        for p in procs:
            if p.pid is not None and p.is_alive():
                stop_pid(p.pid)
            p.join(1)
        results.close()
    return [out[i] for i in range(len(args))]
