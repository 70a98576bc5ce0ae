from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.bookie import BookieProcess, wait_registered


class Cluster:
    def __init__(self, root: Path, n: int, settings: dict[str, object] | None = None, uri: str = "") -> None:
        self.root = root
        self.uri = uri or f"sqlite:///{root}/meta.db"
        self.bookies = [BookieProcess(root, self.uri, name=f"b{i}", settings=settings) for i in range(n)]

    def start(self) -> Cluster:
        for b in self.bookies:
            b.start(wait=False)
        for b in self.bookies:
            b.wait_ready()
        self.wait_registered()
        return self

    def wait_registered(self, timeout_s: float = 30.0) -> None:
        """Until every running bookie is registered as writable: a bookie answers requests a
        moment before its registration is in the metadata, and create_ledger only counts
        registered bookies."""
        wait_registered(self.uri, [b.bookie_id for b in self.bookies if b.proc and b.proc.poll() is None],
                        timeout_s=timeout_s)

    def by_id(self, bookie_id: str) -> BookieProcess:
        return next(b for b in self.bookies if b.bookie_id == bookie_id)

    def stop(self) -> None:
        for b in self.bookies:
            if b.proc is not None and b.proc.poll() is None:
                b.proc.kill()
                b.proc.wait(10)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[object]:
    """``cluster(n, **settings)`` starts n real bookies on one embedded metadata store, or on
    the store of ``uri=`` (e.g. the ``etcd_uri`` fixture's)."""
    made: list[Cluster] = []

    def start(n: int = 3, *, uri: str = "", **settings: object) -> Cluster:
        c = Cluster(tmp_path / f"c{len(made)}", n, settings or None, uri)
        made.append(c)
        return c.start()

    try:
        yield start
    finally:
        for c in made:
            c.stop()
