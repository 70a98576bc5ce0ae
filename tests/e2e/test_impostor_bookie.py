"""Another bookie on a dead bookie's port is never taken for it (zbk/wire/identity.py), with
real bookie processes.

bookie-a (a name id, a long registration lease) is killed -9 and bookie-x is started on its
port while bookie-a's registration still names that address. bookie-x has never held the
ledger: everything it would answer about it is an explicit negative (ENOLEDGER, ENOENTRY),
or a fence of an empty ledger (LAC -1). A client that had the ledger open must fail over to
the other replicas, and its recovery must not close the ledger short: while the real
replicas hold their answers back (SIGSTOP for a moment), bookie-x's answers come first, and
taking them would fence at LAC -1 and close the ledger empty. Every process is stopped by
PID at teardown, failures included."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.bookie import BookieProcess, pause, resume, wait_registered
from helpers.shell import refused, shell

import zbk
from zbk.config import ClientConfig
from zbk.errors import EXIT_UNREACHABLE
from zbk.metadata.registry import read_registration
from zbk.metadata.uri import open_store

PW = b"pw"
ENTRIES = 30
# Reads and fences wait for the paused replicas (up to read_timeout_ms), and their
# connections outlive the pause (bookie_heartbeat_timeout_ms).
PATIENT = ClientConfig(add_timeout_ms=5000, read_timeout_ms=5000, speculative_read_ms=300,
                       bookie_heartbeat_timeout_ms=10_000)
HELD_BACK_S = 1.5  # how long the real replicas hold their answers back


def payload(lid: int, i: int) -> bytes:
    return b"%d/%d " % (lid, i) * 8


def registered_at(uri: str, bookie_id: str) -> str | None:
    store = open_store(uri)
    try:
        reg = read_registration(store, bookie_id)
        return reg.wire_address if reg is not None else None
    finally:
        store.close()


@pytest.fixture
def procs() -> Iterator[list[BookieProcess]]:
    """Bookies a test starts (append them); all killed by PID at the end, paused ones too."""
    started: list[BookieProcess] = []
    try:
        yield started
    finally:
        for b in started:
            if b.proc is not None and b.proc.poll() is None:
                b.proc.kill()
                b.proc.wait(10)


def test_a_bookie_on_a_dead_bookies_port_is_not_taken_for_it(tmp_path: Path, procs: list[BookieProcess],
                                                             caplog: pytest.LogCaptureFixture) -> None:
    uri = f"sqlite:///{tmp_path}/meta.db"
    # bookie-a's registration outlives its kill -9 by far; b and c keep theirs through the pause.
    a = BookieProcess(tmp_path, uri, name="a", bookie_id="bookie-a", settings={"registration_ttl_s": 120})
    b = BookieProcess(tmp_path, uri, name="b", bookie_id="bookie-b", settings={"registration_ttl_s": 20})
    c = BookieProcess(tmp_path, uri, name="c", bookie_id="bookie-c", settings={"registration_ttl_s": 20})
    procs += [a, b, c]
    for p in procs:
        p.start(wait=False)
    for p in procs:
        p.wait_ready()
    wait_registered(uri, ["bookie-a", "bookie-b", "bookie-c"])
    caplog.set_level(logging.WARNING, logger="zbk.client.transport")

    # A writer appends and goes away without closing: the ledger needs recovery. E3 WQ3 AQ3:
    # one explicit negative (QC = WQ - AQ + 1) would be enough to end the ledger before an
    # entry, and one fence answer (EC = E - AQ + 1) enough to fence.
    with zbk.BookKeeper(uri, config=PATIENT) as writer:
        lh = writer.create_ledger(3, 3, 3, password=PW)
        assert sorted(lh.metadata.ensembles[0]) == ["bookie-a", "bookie-b", "bookie-c"]
        lid = lh.ledger_id
        for i in range(ENTRIES):
            lh.append(payload(lid, i))
    expected = [payload(lid, i) for i in range(ENTRIES)]

    reader = zbk.BookKeeper(uri, config=PATIENT)
    try:
        rh = reader.open_ledger(lid, password=PW, recovery=False)
        lac = rh.last_add_confirmed
        assert lac >= 0
        # Each bookie leads the write sets of a third of the entries: the reader has a
        # connection to each, bookie-a's at its address.
        assert [e.payload for e in rh.read(0, lac)] == expected[:lac + 1]

        old = a.address
        a.kill9()
        x = BookieProcess(tmp_path, uri, name="x", bookie_id="bookie-x", port=a.port,
                          settings={"registration_ttl_s": 20})
        procs.append(x)
        x.start()
        wait_registered(uri, ["bookie-x"])
        assert x.address == old
        assert registered_at(uri, "bookie-a") == old, "bookie-a's registration still names the address"

        # Reads fail over to the real replicas.
        assert [e.payload for e in rh.read(0, lac)] == expected[:lac + 1]

        # Recovery by the same client, bookie-x answering first.
        pause(b)
        pause(c)
        held = threading.Timer(HELD_BACK_S, lambda: (resume(b), resume(c)))
        held.start()
        try:
            recovered = reader.open_ledger(lid, password=PW, recovery=True)
        finally:
            held.join()
            resume(b)
            resume(c)
        assert recovered.last_add_confirmed == ENTRIES - 1, "every acknowledged entry survives the recovery"
        assert recovered.metadata.state == "CLOSED"
        assert [e.payload for e in recovered.read(0, ENTRIES - 1)] == expected
    finally:
        reader.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("bookie-a" in m and "bookie-x" in m and old in m for m in warnings), warnings

    # The shell, sent to bookie-a's registered address, says who answers there instead.
    refused(shell("--metadata", uri, "bookieinfo", "bookie-a"), EXIT_UNREACHABLE,
            "bookie-a", "bookie-x")
    assert registered_at(uri, "bookie-a") == old, "all of it ran while bookie-a's registration lived"
    for p in (b, c, x):
        assert p.stop() == 0
