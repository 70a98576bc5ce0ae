"""Fixtures of the metadata tests: every contract test runs once per driver."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from helpers.wait import wait_until

from zbk.metadata.store import MetadataStore, WatchEvent
from zbk.metadata.uri import open_store


@pytest.fixture(params=["memory", "sqlite", pytest.param("etcd", marks=pytest.mark.etcd)])
def store_uri(request: pytest.FixtureRequest, unique_scope: str) -> str:
    """A fresh metadata URI, once for the in-process store, once for the embedded store
    and once for etcd."""
    if request.param == "memory":
        return f"memory://{unique_scope}"
    return str(request.getfixturevalue("sqlite_uri" if request.param == "sqlite" else "etcd_uri"))


@pytest.fixture
def opener(store_uri: str) -> Iterator[Callable[..., MetadataStore]]:
    """Open more store objects on the same URI (another 'process' in-process); all closed
    at teardown."""
    opened: list[MetadataStore] = []

    def open_(**options: Any) -> MetadataStore:
        s = open_store(store_uri, **options)
        opened.append(s)
        return s

    try:
        yield open_
    finally:
        for s in reversed(opened):
            s.close()


@pytest.fixture
def store(opener: Callable[..., MetadataStore]) -> MetadataStore:
    return opener()


class Recorder:
    """A watch callback that keeps every event, for assertions."""

    def __init__(self) -> None:
        self.events: list[WatchEvent] = []
        self._lock = threading.Lock()

    def __call__(self, ev: WatchEvent) -> None:
        with self._lock:
            self.events.append(ev)

    def snapshot(self) -> list[WatchEvent]:
        with self._lock:
            return list(self.events)

    def keys(self) -> list[tuple[str, str]]:
        return [(e.kind, e.key) for e in self.snapshot()]

    def wait_for(self, n: int, timeout_s: float = 10.0) -> list[WatchEvent]:
        wait_until(lambda: len(self.snapshot()) >= n, timeout_s=timeout_s, message=f"{n} watch events")
        return self.snapshot()


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()
