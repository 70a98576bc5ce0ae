"""Fixtures for the reliability tests: real bookie processes on one embedded metadata store,
every one stopped by PID at teardown (even when the test failed)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.bookie import BookieProcess


@pytest.fixture
def bookies(tmp_path: Path) -> Iterator[Callable[..., BookieProcess]]:
    made: list[BookieProcess] = []
    uri = f"sqlite:///{tmp_path}/meta.db"

    def factory(name: str = "bookie", **kw: object) -> BookieProcess:
        b = BookieProcess(tmp_path, uri, name=name, **kw)  # type: ignore[arg-type]
        made.append(b)
        return b

    factory.metadata_uri = uri  # type: ignore[attr-defined]
    try:
        yield factory
    finally:
        for b in made:
            if b.proc is not None and b.proc.poll() is None:
                b.proc.kill()
                b.proc.wait(10)
