"""Which event loop zbk's own programs run the asyncio client on (zbk/eventloop.py)."""

from __future__ import annotations

import asyncio
import sys

import pytest

from zbk import eventloop
from zbk.errors import ConfigError


async def _kind() -> str:
    await asyncio.sleep(0)
    return eventloop.loop_name(asyncio.get_running_loop())


def test_uvloop_by_default_where_zbk_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(eventloop.ENV, raising=False)
    assert sys.platform != "win32", "uvloop is a dependency everywhere but Windows"
    assert eventloop.run(_kind()) == "uvloop"
    monkeypatch.setenv(eventloop.ENV, "auto")
    assert eventloop.run(_kind()) == "uvloop"
    loop = eventloop.new_event_loop()
    try:
        assert eventloop.loop_name(loop) == "uvloop"
    finally:
        loop.close()


def test_the_environment_keeps_zbk_on_asyncios_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV, "asyncio")
    assert eventloop.run(_kind()) == "asyncio"
    loop = eventloop.loop_factory("uvloop")()  # an explicit choice wins over the environment
    try:
        assert eventloop.loop_name(loop) == "uvloop"
    finally:
        loop.close()


def test_without_uvloop_auto_falls_back_and_uvloop_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError
    monkeypatch.delenv(eventloop.ENV, raising=False)
    assert eventloop.run(_kind()) == "asyncio"
    monkeypatch.setenv(eventloop.ENV, "uvloop")
    with pytest.raises(ConfigError, match="uvloop is not installed"):
        eventloop.new_event_loop()


def test_an_unknown_choice_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(eventloop.ENV, "trio")
    with pytest.raises(ConfigError, match="ZBK_EVENT_LOOP='trio'"):
        eventloop.run(_kind())


def test_run_returns_the_result_and_raises_the_error() -> None:
    async def fail() -> None:
        raise KeyError("x")

    assert eventloop.run(_kind()) in ("uvloop", "asyncio")
    with pytest.raises(KeyError):
        eventloop.run(fail())
