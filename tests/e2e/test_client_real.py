"""The client against real bookie processes: writes through a bookie kill, the seeds'
fencing example, BP-46 quorum shapes, hung bookies, passwords, concurrent recoverers."""

from __future__ import annotations

import concurrent.futures
import hashlib
import threading
import time

import pytest
from helpers.bookie import pause, resume

import zbk
from zbk.client.digest import make_digest, master_key
from zbk.client.raw import BookieConnection
from zbk.config import ClientConfig
from zbk.errors import BookieUnavailableError, LedgerFencedError, UnauthorizedError, ZbkError
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import LedgerStore
from zbk.metadata.uri import open_store
from zbk.wire import messages as w
from zbk.wire.entry import build_entry

PW = b"pw"
FAST = ClientConfig(add_timeout_ms=1500, read_timeout_ms=1500, speculative_read_ms=300)


def data(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * 8


def read_all(bk: zbk.BookKeeper, lid: int) -> list[bytes]:
    rh = bk.open_ledger(lid, password=PW)
    if rh.last_add_confirmed < 0:
        return []
    return [e.payload for e in rh.read(0, rh.last_add_confirmed)]


def test_write_through_a_bookie_kill(cluster):
    c = cluster(4)
    with zbk.BookKeeper(c.uri, config=FAST) as bk:
        lh = bk.create_ledger(3, 3, 2, password=PW)
        futs = [lh.append_async(data(i)) for i in range(10_000)]
        assert [f.result(60) for f in futs] == list(range(10_000))
        victim = lh.metadata.ensembles[0][1]
        c.by_id(victim).kill9()
        futs = [lh.append_async(data(i)) for i in range(10_000, 20_000)]
        assert [f.result(60) for f in futs] == list(range(10_000, 20_000))
        # Entries reach AQ on the two live bookies before the dead one is declared failed, so
        # the ensemble change may land just after the last future completes: wait for it.
        deadline = time.monotonic() + 15
        while len(lh.metadata.fragments) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # and give a (wrong) second change the chance to show up
        md = lh.metadata
        assert len(md.fragments) == 2, f"expected exactly one ensemble change: {md.ensembles}"
        assert victim not in md.fragments[1][1]
        lh.close()
        got = read_all(bk, lh.ledger_id)
        assert len(got) == 20_000 and all(got[i] == data(i) for i in range(20_000))


def test_seeds_example_writer_of_12_is_fenced(cluster):
    """E=3 WQ=2 AQ=2; 0..11 acknowledged; 12 reaches one bookie only; a reader recovers."""
    c = cluster(4)
    # The writer learns it was fenced when it finds the paused bookie failed (its add of 12
    # times out, or the heartbeats find the bookie silent) and its ensemble change finds the
    # ledger in recovery: both must take longer than the reader needs to mark the ledger in
    # recovery, or (on a loaded machine) the writer replaces the paused bookie first and
    # entry 12 is legitimately confirmed.
    writer = zbk.BookKeeper(c.uri, config=ClientConfig(add_timeout_ms=15_000, read_timeout_ms=4000,
                                                       bookie_heartbeat_timeout_ms=15_000))
    try:
        lh = writer.create_ledger(3, 2, 2, password=PW)
        for i in range(12):
            assert lh.append(data(i)) == i
        ws12 = lh.metadata.ensembles[0][12 % 3], lh.metadata.ensembles[0][13 % 3]
        slow = c.by_id(ws12[1])
        pause(slow)  # entry 12 reaches ws12[0] only
        try:
            fut12 = lh.append_async(data(12))
            time.sleep(0.5)
            with zbk.BookKeeper(c.uri, config=FAST) as reader:
                rh = reader.open_ledger(lh.ledger_id, password=PW)
                last = rh.metadata.last_entry_id
                assert rh.is_closed and last in (11, 12), last
                assert [e.payload for e in rh.read(0, last)] == [data(i) for i in range(last + 1)]
            with pytest.raises(LedgerFencedError):
                fut12.result(60)
            with pytest.raises(LedgerFencedError):
                lh.append(data(13))
        finally:
            resume(slow)
    finally:
        writer.close()


def _raw_ledger(uri: str, ensemble: list[str], e: int, wq: int, aq: int, holders: list[str], n: int) -> int:
    """A ledger whose entries 0..n-1 were stored on ``holders`` only (written raw)."""
    store = open_store(uri)
    try:
        md, _ = LedgerStore(store).create(LedgerMetadata(ledger_id=0, ensemble_size=e, write_quorum=wq, ack_quorum=aq,
                                                         password=PW, fragments=((0, tuple(ensemble)),)))
    finally:
        store.close()
    dg, mk = make_digest("crc32c", PW), master_key(PW)
    total = 0
    blobs = []
    for i in range(n):
        total += len(data(i))
        blobs.append(build_entry(md.ledger_id, i, i - 1, data(i), dg, ledger_length=total))
    for b in holders:
        with BookieConnection(b) as conn:
            r = conn.call(w.AddRequest(rid=conn.next_rid(), ledger_id=md.ledger_id, master_key=mk, flags=w.AddFlag(0),
                                       entries=blobs))
            assert r.status == 0
    return md.ledger_id


def test_332_ok_noledger_unavailable_recovers(cluster):
    c = cluster(3)
    a, b, dead = (x.bookie_id for x in c.bookies)
    lid = _raw_ledger(c.uri, [a, b, dead], 3, 3, 2, holders=[a, dead], n=10)
    c.by_id(dead).kill9()
    with zbk.BookKeeper(c.uri, config=FAST) as bk:
        rh = bk.open_ledger(lid, password=PW)
        assert rh.is_closed and rh.metadata.last_entry_id == 9
        assert rh.metadata.length == sum(len(data(i)) for i in range(10))
        assert [e.payload for e in rh.read(0, 9)] == [data(i) for i in range(10)]


def test_332_ok_unavailable_unavailable_cannot_finish_and_does_not_truncate(cluster):
    c = cluster(3)
    a, d1, d2 = (x.bookie_id for x in c.bookies)
    lid = _raw_ledger(c.uri, [a, d1, d2], 3, 3, 2, holders=[a, d1, d2], n=10)
    c.by_id(d1).kill9()
    c.by_id(d2).kill9()
    with zbk.BookKeeper(c.uri, config=FAST) as bk:
        with pytest.raises(BookieUnavailableError):
            bk.open_ledger(lid, password=PW)
        assert bk.ledger_metadata(lid).state != "CLOSED"


def test_222_ok_unavailable_recovers(cluster):
    c = cluster(3)
    a, dead, spare = (x.bookie_id for x in c.bookies)
    lid = _raw_ledger(c.uri, [a, dead], 2, 2, 2, holders=[a, dead], n=10)
    c.by_id(dead).kill9()
    with zbk.BookKeeper(c.uri, config=FAST) as bk:
        rh = bk.open_ledger(lid, password=PW)
        assert rh.is_closed and rh.metadata.last_entry_id == 9
        assert spare in rh.metadata.fragments[-1][1]  # the write-back replaced the dead bookie
        assert [e.payload for e in rh.read(0, 9)] == [data(i) for i in range(10)]


def test_hung_bookie_during_fencing_recovery_completes(cluster):
    c = cluster(4)
    with zbk.BookKeeper(c.uri, config=FAST) as writer:
        lh = writer.create_ledger(3, 2, 2, password=PW)
        for i in range(20):
            lh.append(data(i))
        hung = c.by_id(lh.metadata.ensembles[0][2])
        pause(hung)
        try:
            with zbk.BookKeeper(c.uri, config=FAST) as reader:
                rh = reader.open_ledger(lh.ledger_id, password=PW)
                assert rh.is_closed and rh.metadata.last_entry_id >= 19
                assert [e.payload for e in rh.read(0, 19)] == [data(i) for i in range(20)]
        finally:
            resume(hung)


def test_wrong_password_opens_and_fences_nothing_and_no_recovery_open_does_not_fence(cluster):
    c = cluster(3)
    with zbk.BookKeeper(c.uri, config=FAST) as writer, zbk.BookKeeper(c.uri, config=FAST) as reader:
        lh = writer.create_ledger(3, 2, 2, password=PW)
        for i in range(10):
            lh.append(data(i))
        with pytest.raises(UnauthorizedError):
            reader.open_ledger(lh.ledger_id, password=b"wrong")
        with pytest.raises(UnauthorizedError):
            reader.open_ledger(lh.ledger_id, password=b"wrong", recovery=False)
        assert lh.append(data(10)) == 10  # nothing was fenced
        rh = reader.open_ledger(lh.ledger_id, password=PW, recovery=False)
        assert not rh.is_closed and rh.last_add_confirmed >= 9
        assert [e.payload for e in rh.read(0, 9)] == [data(i) for i in range(10)]
        assert lh.append(data(11)) == 11  # a no-recovery open does not fence
        assert writer.ledger_metadata(lh.ledger_id).state == "OPEN"
        lh.close()


def test_settings_given_as_keywords_override_the_config(cluster):
    """``zbk.BookKeeper(uri, config=..., add_timeout_ms=...)``: the keyword wins over the
    config's field, the config's other fields stay. An add to a hung bookie fails after the
    keyword's half second, not the config's minute."""
    c = cluster(1)
    patient = ClientConfig(add_timeout_ms=60_000, read_timeout_ms=60_000, speculative_read_ms=300)
    with zbk.BookKeeper(c.uri, config=patient, add_timeout_ms=500, ensemble_change_attempts_max=1) as bk:
        assert bk.async_client.config.read_timeout_ms == 60_000
        lh = bk.create_ledger(1, 1, 1, password=PW)
        assert lh.append(data(0)) == 0
        hung = c.by_id(lh.metadata.ensembles[0][0])
        pause(hung)
        try:
            t0 = time.monotonic()
            with pytest.raises(ZbkError):
                lh.append(data(1))
            assert time.monotonic() - t0 < 30
        finally:
            resume(hung)


# Two recoverers fence, read and write back the same 500 entries at once: three times the
# bookies' work of one. No bookie fails here, so a timeout is not what the test is about;
# FAST's 1.5 s let one run under a loaded full suite end in NotEnoughBookiesError (every
# read of one entry timed out at once: the host stalled).
PATIENT = ClientConfig(add_timeout_ms=10_000, read_timeout_ms=10_000, speculative_read_ms=300)


def test_two_concurrent_recoverers_agree(cluster):
    c = cluster(3)
    with zbk.BookKeeper(c.uri, config=FAST) as writer:
        lh = writer.create_ledger(3, 3, 2, password=PW)
        futs = [lh.append_async(data(i)) for i in range(500)]
        [f.result(30) for f in futs]
        start = threading.Barrier(2)

        def recover() -> tuple[int, int]:
            with zbk.BookKeeper(c.uri, config=PATIENT) as bk:
                start.wait()
                md = bk.open_ledger(lh.ledger_id, password=PW).metadata
                return md.last_entry_id, md.length

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = [f.result(120) for f in [pool.submit(recover), pool.submit(recover)]]
        assert results[0] == results[1], results
        assert results[0][0] >= 499
        assert writer.ledger_metadata(lh.ledger_id).last_entry_id == results[0][0]


def test_deferred_sync_force_makes_entries_durable_and_advances_the_lac(cluster):
    c = cluster(3, flush_interval_ms=600_000)  # no checkpoints: durability comes from the journal
    with zbk.BookKeeper(c.uri, config=FAST) as bk:
        lh = bk.create_ledger(3, 3, 2, password=PW, deferred_sync=True)
        futs = [lh.append_async(data(i)) for i in range(300)]
        assert [f.result(30) for f in futs] == list(range(300))
        assert lh.last_add_confirmed == -1, "deferred entries are not confirmed to readers before force()"
        assert lh.force() == 299
        assert lh.last_add_confirmed == 299
        lid = lh.ledger_id
        for b in c.bookies:  # every forced entry survives kill -9 of every bookie
            b.kill9()
        for b in c.bookies:
            b.start(wait=False)
        for b in c.bookies:
            b.wait_ready()
        c.wait_registered()
        rh = bk.open_ledger(lid, password=PW)
        assert rh.metadata.last_entry_id >= 299
        assert [e.payload for e in rh.read(0, 299)] == [data(i) for i in range(300)]
        with pytest.raises(LedgerFencedError):
            lh.append(data(300))
