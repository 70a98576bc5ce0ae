"""Explicit LAC, reads past the LAC and tailing at one READ per entry and bookie polled,
against real bookie processes (tests/client/test_explicit_lac.py and test_reads_past_lac.py
have the simulated, exactly timed versions)."""

from __future__ import annotations

import threading
import time
import urllib.request

import pytest

import zbk
from zbk.config import ClientConfig
from zbk.errors import NoSuchEntryError

PW = b"pw"
FAST = ClientConfig(add_timeout_ms=2000, read_timeout_ms=2000, speculative_read_ms=300)
INTERVAL_MS = 200
SEEN_WITHIN_S = 5.0  # loose: the interval is 0.2 s, but two cores are shared by many processes


def read_requests(c: object) -> float:
    """READ_ENTRY requests the cluster's bookies answered so far (zbk_bookie_requests_total)."""
    total = 0.0
    for b in c.bookies:  # type: ignore[attr-defined]
        with urllib.request.urlopen(f"http://127.0.0.1:{b.http_port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if line.startswith('zbk_bookie_requests_total{op="read"'):
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_tailing_reader_sees_the_last_entry_of_an_idle_open_ledger(cluster):
    c = cluster(3)
    with zbk.BookKeeper(c.uri, config=FAST, explicit_lac_interval_ms=INTERVAL_MS) as writer, \
            zbk.BookKeeper(c.uri, config=FAST) as reader:
        lh = writer.create_ledger(3, 2, 2, password=PW)
        for i in range(5):
            lh.append(b"e%d" % i)
        acked = time.monotonic()
        rh = reader.open_ledger(lh.ledger_id, password=PW, recovery=False)
        seen: dict[int, float] = {}
        stop = threading.Event()

        def follow() -> None:
            for e in rh.tail(0):
                seen[e.entry_id] = time.monotonic()
                if stop.is_set():
                    return

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        deadline = acked + SEEN_WITHIN_S
        while 4 not in seen and time.monotonic() < deadline:
            time.sleep(0.02)
        assert 4 in seen, f"the idle writer's last entry was not seen within {SEEN_WITHIN_S} s: {sorted(seen)}"
        assert sorted(seen) == [0, 1, 2, 3, 4]
        # Another reader asking for the LAC gets the last entry too, the ledger still open.
        other = reader.open_ledger(lh.ledger_id, password=PW, recovery=False)
        assert other.read_last_add_confirmed() == 4
        assert writer.ledger_metadata(lh.ledger_id).state == "OPEN"
        stop.set()
        lh.append(b"e5")  # ends the reader's poll, then its loop
        lh.close()
        t.join(30)
        assert not t.is_alive()


def test_without_explicit_lac_the_last_entry_of_an_idle_ledger_stays_unseen(cluster):
    """The control: the bookies learn the writer's last LAC only from its next add."""
    c = cluster(3)
    with zbk.BookKeeper(c.uri, config=FAST) as writer, zbk.BookKeeper(c.uri, config=FAST) as reader:
        lh = writer.create_ledger(3, 2, 2, password=PW)
        for i in range(5):
            lh.append(b"e%d" % i)
        time.sleep(4 * INTERVAL_MS / 1000)
        rh = reader.open_ledger(lh.ledger_id, password=PW, recovery=False)
        assert rh.read_last_add_confirmed() == 3
        lh.close()


@pytest.mark.parametrize("polls", [1, 2])
def test_tailing_reader_sends_one_read_per_entry_and_polled_bookie(cluster, polls):
    c = cluster(3)
    n = 30
    with zbk.BookKeeper(c.uri, config=FAST) as writer, \
            zbk.BookKeeper(c.uri, config=FAST, tail_long_polls=polls) as reader:
        lh = writer.create_ledger(3, 3, 2, password=PW)
        lh.append(b"e0")  # the bookies know the ledger before the reader polls them
        rh = reader.open_ledger(lh.ledger_id, password=PW, recovery=False)
        before = read_requests(c)
        seen: list[int] = []

        def follow() -> None:
            for e in rh.tail(0):
                seen.append(e.entry_id)

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        for i in range(1, n):
            time.sleep(0.05)  # the reader keeps up: each poll waits for the next LAC
            lh.append(b"e%d" % i)
        lh.close()
        t.join(30)
        assert not t.is_alive()
        assert seen == list(range(n))
        reads = read_requests(c) - before
        # Per bookie polled: a poll per entry 0..n-2 (entry i brings LAC i-1 and its answer
        # carries entry i-1), the last poll ending at its timeout; a read of the last entry
        # once the close is seen; a little slack for a poll that a busy machine lets time
        # out. Dropping the polled entries and reading them again took two requests per entry.
        assert reads <= polls * (n + 2) + 2, reads


def test_read_unconfirmed_returns_entries_beyond_the_lac(cluster):
    c = cluster(3)
    with zbk.BookKeeper(c.uri, config=FAST) as writer, zbk.BookKeeper(c.uri, config=FAST) as reader:
        lh = writer.create_ledger(3, 2, 2, password=PW)
        for i in range(10):
            lh.append(b"e%d" % i)
        rh = reader.open_ledger(lh.ledger_id, password=PW, recovery=False)
        assert rh.last_add_confirmed == 8  # entry 9 carried LAC 8
        with pytest.raises(NoSuchEntryError):
            list(rh.read(0, 9))
        assert [e.payload for e in rh.read_unconfirmed(0, 9)] == [b"e%d" % i for i in range(10)]
        assert [e.entry_id for e in rh.read_unconfirmed(7, 50)] == [7, 8, 9]  # ends at what the bookies have
        assert list(rh.read_unconfirmed(10, 20)) == []
        assert writer.ledger_metadata(lh.ledger_id).state == "OPEN"  # nothing fenced or recovered
        lh.append(b"e10")
        lh.close()
        closed = reader.open_ledger(lh.ledger_id, password=PW, recovery=False)
        assert [e.entry_id for e in closed.read_unconfirmed(9, 50)] == [9, 10]
