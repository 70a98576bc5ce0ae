"""A read-only state an operator set lasts (BookKeeper's persistBookieStatusEnabled), against
a real bookie: after a clean restart and after a kill -9 it comes back read-only (refusing
adds, registered read-only, never for a moment writable), until an operator switches it back;
`zbk bookie --readonly` starts a bookie in that state."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.bookie import BookieProcess
from helpers.procs import stop_process
from helpers.wait import wait_until

from zbk.metadata import layout
from zbk.metadata.registry import list_bookies
from zbk.metadata.store import MetadataStore, WatchEvent
from zbk.metadata.uri import open_store
from zbk.wire.status import Status

from .util import add


def http(b: BookieProcess, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{b.http_port}{path}", data=data, method=method)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def registered_as(store: MetadataStore, b: BookieProcess) -> str | None:
    if b.bookie_id in {r.bookie_id for r in list_bookies(store, readonly=True)}:
        return "readonly"
    if b.bookie_id in {r.bookie_id for r in list_bookies(store)}:
        return "writable"
    return None


@pytest.fixture
def bookie(tmp_path: Path) -> Iterator[tuple[BookieProcess, MetadataStore]]:
    uri = f"sqlite:///{tmp_path}/meta.db"
    b = BookieProcess(tmp_path, uri)
    store = open_store(uri)
    try:
        yield b, store
    finally:
        store.close()
        if b.proc is not None:
            stop_process(b.proc, kill=True)


def restart(b: BookieProcess, store: MetadataStore, *, kill: bool = False) -> list[str]:
    """Stop (cleanly, or kill -9) and start again; returns the registrations' puts seen
    meanwhile ("writable" / "readonly"), in order."""
    puts: list[str] = []

    def seen(ev: WatchEvent) -> None:
        if ev.kind == "put" and ev.key.endswith("/" + b.bookie_id):
            puts.append("readonly" if ev.key.startswith(layout.BOOKIES_READONLY) else "writable")

    watch = store.watch("bookies/", seen)
    try:
        if kill:
            b.kill9()
        else:
            assert b.stop() == 0
        b.start()
        wait_until(lambda: registered_as(store, b) and puts, timeout_s=30, message="the registration")
    finally:
        watch.cancel()
    return puts


def assert_state(b: BookieProcess, store: MetadataStore, state: str) -> None:
    assert http(b, "GET", "/api/v1/bookie/state") == {"state": state}
    wait_until(lambda: registered_as(store, b) == state, timeout_s=10, message=f"registered {state}")
    with b.connect() as c:
        resp = add(c, 77, [0])
    assert resp.status == (Status.EREADONLY if state == "readonly" else Status.EOK), resp
    # Reuse of ledger 77 entry 0 on a writable bookie is harmless; read-only refuses it.


def test_an_operators_read_only_state_lasts_until_switched_back(bookie: tuple[BookieProcess, MetadataStore]) -> None:
    b, store = bookie
    b.start()
    assert_state(b, store, "writable")
    assert http(b, "PUT", "/api/v1/bookie/state", {"state": "readonly"}) == {"state": "readonly"}
    assert_state(b, store, "readonly")
    assert restart(b, store) == ["readonly"], "a clean restart registers read-only at once"
    assert_state(b, store, "readonly")
    assert restart(b, store, kill=True) == ["readonly"], "so does a kill -9 one"
    assert_state(b, store, "readonly")
    assert http(b, "PUT", "/api/v1/bookie/state", {"state": "writable"}) == {"state": "writable"}
    assert_state(b, store, "writable")
    assert restart(b, store, kill=True) == ["writable"]
    assert_state(b, store, "writable")


def test_zbk_bookie_readonly_starts_it_read_only(bookie: tuple[BookieProcess, MetadataStore]) -> None:
    b, store = bookie
    b.extra_argv = ["--readonly"]
    b.start()
    assert_state(b, store, "readonly")
    assert http(b, "GET", "/api/v1/config/server_config")["start_read_only"] is True
    assert http(b, "PUT", "/api/v1/bookie/state", {"state": "writable"}) == {"state": "writable"}
    assert_state(b, store, "writable")
    b.extra_argv = []
    assert restart(b, store) == ["writable"], "switched back by an operator: writable without the flag"
    assert_state(b, store, "writable")
    b.extra_argv = ["--readonly"]
    assert restart(b, store) == ["readonly"]
    b.extra_argv = []
    assert restart(b, store) == ["readonly"], "the state --readonly set lasts without the flag"
    assert_state(b, store, "readonly")
