"""Stable bookie ids (BP-41) against real bookie processes: a bookie with a name id that
comes back on another port keeps serving its ledgers to the clients that had it open and to
new ones, the shell finds it by name, and a bad bookie_id never starts a bookie. Every
process is stopped by PID at teardown, failures included."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.bookie import BookieProcess, wait_registered
from helpers.procs import free_port
from helpers.shell import refused, shell, shell_json

import zbk
from zbk.config import ClientConfig
from zbk.errors import EXIT_USAGE
from zbk.metadata.registry import Cookie, read_cookie, read_registration
from zbk.metadata.uri import open_store

PW = b"pw"
FAST = ClientConfig(add_timeout_ms=3000, read_timeout_ms=3000, speculative_read_ms=300)
ENTRIES = 30


def payload(lid: int, i: int) -> bytes:
    return b"%d/%d " % (lid, i) * 8


def wait_address(uri: str, bookie_id: str, address: str, timeout_s: float = 60.0) -> None:
    """Until ``bookie_id``'s registration records ``address`` (a restarted bookie waits for
    its previous process's registration lease to expire before it registers)."""
    store = open_store(uri)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            reg = read_registration(store, bookie_id)
            if reg is not None and reg.wire_address == address:
                return
            assert time.monotonic() < deadline, f"{bookie_id} not registered at {address}: {reg}"
            time.sleep(0.1)
    finally:
        store.close()


def cookie_of(uri: str, bookie_id: str) -> tuple[Cookie, int]:
    store = open_store(uri)
    try:
        got = read_cookie(store, bookie_id)
        assert got is not None, bookie_id
        return got
    finally:
        store.close()


@pytest.fixture
def named(tmp_path: Path) -> Iterator[list[BookieProcess]]:
    """Three bookies with name ids, started; all stopped by PID at the end."""
    uri = f"sqlite:///{tmp_path}/meta.db"
    bookies = [BookieProcess(tmp_path, uri, name=f"b{i}", bookie_id=f"bookie-{c}") for i, c in enumerate("abc")]
    try:
        for b in bookies:
            b.start(wait=False)
        for b in bookies:
            b.wait_ready()
        wait_registered(uri, [b.bookie_id for b in bookies])
        yield bookies
    finally:
        for b in bookies:
            if b.proc is not None and b.proc.poll() is None:
                b.proc.kill()
                b.proc.wait(10)


def test_a_bookie_back_on_a_new_port_serves_existing_and_new_clients(named: list[BookieProcess]) -> None:
    a, b, c = named
    uri = a.metadata_uri
    wait_address(uri, "bookie-a", a.address)
    existing = zbk.BookKeeper(uri, config=FAST)
    try:
        lh = existing.create_ledger(3, 3, 3, password=PW)
        assert sorted(lh.metadata.ensembles[0]) == ["bookie-a", "bookie-b", "bookie-c"]
        for i in range(ENTRIES):
            lh.append(payload(lh.ledger_id, i))
        lh.close()
        lid = lh.ledger_id
        # The existing client reads it once: it has a connection to every bookie, bookie-a's
        # at its first port (each bookie leads the write sets of a third of the entries).
        rh = existing.open_ledger(lid, password=PW, recovery=False)
        assert [e.payload for e in rh.read(0, ENTRIES - 1)] == [payload(lid, i) for i in range(ENTRIES)]

        # kill -9, then the same bookie (same id, same disks) on another port.
        cookie_before = cookie_of(uri, "bookie-a")
        old = a.address
        a.kill9()
        a.port = free_port()
        assert a.address != old
        a.start()
        wait_address(uri, "bookie-a", a.address)
        # Only bookie-a is left to serve the ledger.
        assert b.stop() == 0 and c.stop() == 0

        assert [e.payload for e in rh.read(0, ENTRIES - 1)] == [payload(lid, i) for i in range(ENTRIES)]
        # The existing client writes to it too: a new ledger can only go to bookie-a.
        lh2 = existing.create_ledger(1, 1, 1, password=PW)
        assert lh2.metadata.ensembles[0] == ["bookie-a"]
        for i in range(5):
            lh2.append(payload(lh2.ledger_id, i))
        lh2.close()
    finally:
        existing.close()

    with zbk.BookKeeper(uri, config=FAST) as fresh:
        rh = fresh.open_ledger(lid, password=PW, recovery=False)
        assert [e.payload for e in rh.read(0, ENTRIES - 1)] == [payload(lid, i) for i in range(ENTRIES)]
        rh2 = fresh.open_ledger(lh2.ledger_id, password=PW)
        assert [e.payload for e in rh2.read(0, 4)] == [payload(lh2.ledger_id, i) for i in range(5)]

    # The shell finds the bookie by its name through the metadata, and says so without it.
    got = shell_json("--metadata", uri, "readentry", "--bookie", "bookie-a", str(lid), "7")
    assert got["status"] == "EOK"
    held = shell_json("--metadata", uri, "ledgerentries", "--bookie", "bookie-a", str(lid))
    assert held["ranges"] == [[0, ENTRIES - 1]]
    info = shell_json("--metadata", uri, "bookieinfo", "bookie-a")
    assert info["state"] == "writable"
    listed = shell_json("--metadata", uri, "listbookies")
    assert [(x["id"], x["address"]) for x in listed] == [("bookie-a", a.address)]
    refused(shell("readentry", "--bookie", "bookie-a", str(lid), "7"), EXIT_USAGE, "--metadata")
    # The cookie names the id, not the address: the restart on the new port left it as it was.
    assert cookie_of(uri, "bookie-a") == cookie_before
    assert a.stop() == 0


def test_a_bad_bookie_id_is_refused_before_anything_is_touched(tmp_path: Path) -> None:
    for bad in ("a/b", "two words", "x" * 200):
        data = tmp_path / "data"
        r = subprocess.run([sys.executable, "-m", "zbk.cli.main", "bookie", "--metadata", f"sqlite:///{tmp_path}/m.db",
                            "--data-dir", str(data), "--port", str(free_port()), "--http-port", str(free_port()),
                            "--set", f"bookie_id={bad}"], capture_output=True, text=True, timeout=60)
        assert r.returncode == EXIT_USAGE, (bad, r.returncode, r.stderr[-1000:])
        assert "bookie_id" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert not data.exists(), "a refused configuration touches no directory"
