"""The event loop zbk's own programs run the asyncio client on.

uvloop (libuv's event loop) when it is installed, as it is with zbk on Linux and macOS;
asyncio's own selector loop otherwise. On uvloop a client spends less CPU per append (its
futures' done callbacks, timers and readers are C code): docs/performance.md, "Client cost".

The client library runs on whatever loop its caller runs: ``AsyncBookKeeper`` needs nothing
of uvloop, and an application that runs ``asyncio.run(main())`` gets asyncio's loop. This
module is for what zbk itself starts: the blocking ``BookKeeper``'s thread, ``zbk bench``,
the auto-recovery process and ``zbk shell``'s recovery commands.

``ZBK_EVENT_LOOP=asyncio`` in the environment keeps those on asyncio's loop (to rule the
loop out when chasing a problem, or to compare the two); ``uvloop`` insists on uvloop and
fails at the first loop if it is not installed; unset (or ``auto``) takes uvloop when it
can be imported.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from zbk.errors import ConfigError

T = TypeVar("T")

ENV = "ZBK_EVENT_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")


def loop_factory(choice: str | None = None) -> Callable[[], asyncio.AbstractEventLoop]:
    """The function that makes a new loop: uvloop's or asyncio's, by ``choice`` (default: the
    ``ZBK_EVENT_LOOP`` environment variable, else ``auto``)."""
    if choice is None:
        choice = os.environ.get(ENV, "") or "auto"
    if choice not in CHOICES:
        raise ConfigError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    if choice == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError as e:
        if choice == "uvloop":
            raise ConfigError(f"{ENV}=uvloop, but uvloop is not installed (pip install uvloop)") from e
        return asyncio.new_event_loop
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def chosen_name(choice: str | None = None) -> str:
    """``uvloop`` or ``asyncio``: the loop :func:`loop_factory` would make, for reports."""
    return "asyncio" if loop_factory(choice) is asyncio.new_event_loop else "uvloop"


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop of the kind :func:`loop_factory` chooses (not set as the thread's current
    loop)."""
    return loop_factory()()


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: what a loop is, for reports."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)`` on a loop of the kind :func:`loop_factory` chooses."""
    try:
        factory = loop_factory()
    except ConfigError:
        coro.close()  # never run: no "coroutine was never awaited" warning on top of the error
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)
