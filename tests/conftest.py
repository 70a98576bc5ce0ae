"""Fixtures shared by every test package: real etcd servers and metadata URIs.

* ``etcd_server`` (session): one etcd member on free loopback ports, shared by every test
  that just needs an etcd; tests isolate themselves with a unique scope (``etcd_uri``).
* ``etcd_cluster_factory``: ``factory(size=3)`` starts a private cluster (each member can be
  killed and restarted on the same ports and data dir); all are stopped by PID at teardown.
* ``unique_scope``, ``etcd_uri``, ``sqlite_uri``: fresh metadata locations per test.

Every process these start is stopped by PID in teardown, even when the test fails.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Tests fork children (bookies, etcd members) while gRPC threads serve etcd clients: gRPC's
# fork handlers must stay off (the reason is in zbk/metadata/etcd.py, which sets the same).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import hypothesis  # noqa: F401 - see below
import pytest
from helpers.etcd import ETCD_BIN, EtcdCluster

# Hypothesis is imported here, at collection, on purpose: its pytest plugin otherwise imports
# it at session end, through pytest's assertion rewriter, where CPython 3.11's ast.parse can
# raise "SystemError: AST constructor recursion depth mismatch" (python/cpython#106905) and
# turn a green run into an INTERNALERROR.

EtcdClusterFactory = Callable[..., EtcdCluster]


@pytest.fixture(autouse=True)
def _close_storage_files(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """After each test, the journals, entry logs and index caches it opened in this process
    and left open are closed, so that the suite's one process does not gather the
    descriptors of every test (simulated bookies, unit tests that drop a writer as a crash
    would). A close that fails is ignored: the test is over and its checks have spoken."""
    from zbk.storage.entrylog import EntryLogWriter
    from zbk.storage.journal import JournalWriter
    from zbk.storage.ledgercache import LedgerCache

    opened: list[Any] = []
    for cls in (JournalWriter, EntryLogWriter, LedgerCache):
        def tracked(self: Any, *args: Any, _init: Callable[..., None] = cls.__init__, **kwargs: Any) -> None:
            _init(self, *args, **kwargs)
            opened.append(self)

        monkeypatch.setattr(cls, "__init__", tracked)
    yield
    while opened:
        try:
            opened.pop().close()
        except Exception:  # noqa: BLE001, S110 - a dead simulated disk may refuse what close writes
            pass


def _require_etcd() -> None:
    if not os.access(ETCD_BIN, os.X_OK):
        pytest.fail(f"etcd not found at {ETCD_BIN}: install etcd-server (apt-get install etcd-server)")


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """A one-member etcd for the whole session (do not kill it: other tests share it)."""
    _require_etcd()
    cluster = EtcdCluster(tmp_path_factory.mktemp("etcd-shared"), size=1)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def etcd_cluster_factory(tmp_path: Path) -> Iterator[EtcdClusterFactory]:
    """Start private etcd clusters (``factory(size=3)``); each is stopped at teardown."""
    _require_etcd()
    started: list[EtcdCluster] = []

    def factory(size: int = 3) -> EtcdCluster:
        cluster = EtcdCluster(tmp_path / f"etcd-{len(started)}", size=size)
        started.append(cluster)
        return cluster.start()

    try:
        yield factory
    finally:
        for cluster in started:
            cluster.stop()


@pytest.fixture
def unique_scope() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def etcd_uri(etcd_server: EtcdCluster, unique_scope: str) -> str:
    """A metadata URI on the shared etcd, in a scope no other test uses."""
    return etcd_server.uri(unique_scope)


@pytest.fixture
def sqlite_uri(tmp_path: Path, unique_scope: str) -> str:
    return f"sqlite://{tmp_path / 'meta.db'}?scope={unique_scope}"


@pytest.fixture
def bookies(tmp_path: Path) -> Iterator[Callable[..., object]]:
    """Factory of real bookie processes (helpers.bookie.BookieProcess) on one embedded
    metadata store (``bookies.metadata_uri``); every one stopped by PID at teardown."""
    from helpers.bookie import BookieProcess

    made: list[BookieProcess] = []
    uri = f"sqlite:///{tmp_path}/meta.db"

    def factory(name: str = "bookie", **kw: object) -> BookieProcess:
        b = BookieProcess(tmp_path, str(kw.pop("metadata_uri", uri)), name=name, **kw)  # type: ignore[arg-type]
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
