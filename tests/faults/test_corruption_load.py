"""Corruption under load: bytes of one replica's entry logs and index files flip while
readers read, on real bookie processes.

Three bookies and one autorecovery process on the embedded store; six closed ledgers of
E3 WQ2 AQ2, so every entry has a replica on the damaged bookie or on both others. Three
reader threads read random ranges the whole time and check every payload against what was
written (payloads are a function of the seed, the ledger and the entry).

The damage, in three rounds while the readers run, all on one bookie:

* raw flips of random bytes in its entry logs: the bookie's record CRC catches them and
  answers EIO;
* silent flips: a payload byte of a record flipped and the record's CRC recomputed, as if
  the bytes had gone bad before the bookie checksummed them: the bookie serves them, and
  only the client's digest catches them;
* raw flips in its index files (slots), seen as the bookie reads pages back from disk (its
  index cache is kept small so that it does).

Then the periodic check runs (``auditor/trigger``). Required: no read ever returns wrong
bytes and no read fails (each fails over to the good replica); the damage was hit (EIO from
the bookie, digest mismatches at the clients); the check marks the replica and the
replicator repairs it in place, so that it serves every entry it should hold intact.

The damage is a function of the seed: the test prints ``ZBK_SEED=<seed>``, and
``ZBK_SEED=<seed>`` makes the same choices again (timings still vary).
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from crc32c import crc32c
from helpers.wait import wait_until

import zbk
from faults.clockcluster import AutoRecoveryNode, BookieNode, ClockCluster
from zbk.client.digest import make_digest
from zbk.client.raw import BookieConnection
from zbk.config import ClientConfig
from zbk.errors import DigestMismatchError, ZbkError
from zbk.metadata import layout
from zbk.metadata.registry import LedgerStore, list_bookies
from zbk.metadata.uri import open_store
from zbk.recovery.repair import expected_entries
from zbk.recovery.underreplication import UnderReplicationRegistry
from zbk.storage.entrylogformat import scan_file
from zbk.storage.index import HEADER_BYTES as INDEX_HEADER_BYTES
from zbk.wire import messages as w
from zbk.wire.entry import parse_entry
from zbk.wire.status import Status

PASSWORD = b"corrupt"
LEDGERS, ENTRIES, PAYLOAD_BYTES = 6, 2500, 512
READERS = 3
# Generous timeouts: on a starved machine a slow read is not a failed one.
CONFIG = ClientConfig(read_timeout_ms=10_000, speculative_read_ms=500)
BOOKIE = {"flush_interval_ms": 1000}  # entry logs and index reach the disk within a second
# 4 index pages (16 KiB each) for 6 ledgers of 3 pages: the damaged bookie reads pages back.
VICTIM = {**BOOKIE, "ledger_cache_bytes_max": 65536}
# The check reads back every entry of every replica: damage between a fragment's first and
# last entries is found only by reading it.
AUTORECOVERY = {"lease_ttl_s": 6, "lost_bookie_recovery_delay_s": 60, "auditor_periodic_check_interval_s": 3600,
                "auditor_ledger_verification_percent": 100}
ROUNDS = 3
RAW_LOG_FLIPS, SILENT_FLIPS, INDEX_FLIPS = 6, 6, 4  # per round
RECORD_HEADER_BYTES = 24  # length, crc, ledger id, entry id (zbk/storage/entrylogformat.py)


def payload(seed: int, lid: int, i: int) -> bytes:
    block = hashlib.sha256(f"{seed}/{lid}/{i}".encode()).digest()
    return (block * (PAYLOAD_BYTES // len(block) + 1))[:PAYLOAD_BYTES]


@dataclass
class ReadStats:
    reads: int = 0
    entries: int = 0
    wrong: list[tuple[int, int]] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class DigestWarnings(logging.Handler):
    """Counts the client's "bad copy from <bookie>: digest mismatch ..." warnings, by bookie."""

    PATTERN = re.compile(r"from (\S+): .*digest mismatch")

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.by_bookie: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        m = self.PATTERN.search(record.getMessage())
        if m:
            self.by_bookie[m[1]] = self.by_bookie.get(m[1], 0) + 1


def reader(uri: str, seed: int, ledgers: list[int], rng: random.Random, stop: threading.Event,
           stats: ReadStats) -> None:
    with zbk.BookKeeper(uri, config=CONFIG) as bk:
        handles = {lid: bk.open_ledger(lid, password=PASSWORD) for lid in ledgers}
        while not stop.is_set():
            lid = rng.choice(ledgers)
            first = rng.randrange(ENTRIES)
            last = min(ENTRIES - 1, first + rng.randrange(50))
            try:
                got = list(handles[lid].read(first, last))
            except ZbkError as e:
                with stats.lock:
                    stats.failed.append(f"ledger {lid} {first}..{last}: {type(e).__name__}: {e}")
                continue
            wrong = [(lid, e.entry_id) for e in got if e.payload != payload(seed, lid, e.entry_id)]
            with stats.lock:
                stats.reads += 1
                stats.entries += len(got)
                stats.wrong.extend(wrong)
                if [e.entry_id for e in got] != list(range(first, last + 1)):
                    stats.failed.append(f"ledger {lid} {first}..{last}: got {[e.entry_id for e in got][:5]}...")


def flip(path: Path, offset: int, mask: int) -> None:
    """XOR one byte in place (no truncation, no rename: the bookie keeps its descriptors)."""
    fd = os.open(path, os.O_RDWR)
    try:
        (byte,) = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte ^ mask]), offset)
    finally:
        os.close(fd)


def log_records(victim: BookieNode) -> list[tuple[Path, int, int, int, int]]:
    """Every entry log record of the victim: (file, ledger id, entry id, offset, blob bytes).
    Taken before any damage: a scan stops at the first bad record, so one taken after a
    round sees only the records before its first flip in each file."""
    logs = sorted(victim.data_dir.rglob("*.log"))
    records = [(path, lid, eid, off, len(blob)) for path in logs for lid, eid, off, blob in scan_file(str(path))]
    assert records, f"no entry log records under {victim.data_dir}"
    return records


def damage(victim: BookieNode, records: list[tuple[Path, int, int, int, int]], rng: random.Random) -> dict[str, int]:
    """One round of damage to the victim's files (``records``: log_records, taken before the
    first round); what was done, by kind."""
    done = {"raw_log": 0, "silent": 0, "index": 0}
    for _ in range(RAW_LOG_FLIPS):
        path, _, _, off, size = rng.choice(records)
        flip(path, off + rng.randrange(RECORD_HEADER_BYTES + size), 1 << rng.randrange(8))
        done["raw_log"] += 1
    for _ in range(SILENT_FLIPS):
        path, _, _, off, size = rng.choice(records)
        at = off + RECORD_HEADER_BYTES + size - 1 - rng.randrange(PAYLOAD_BYTES)  # in the payload
        flip(path, at, 1 << rng.randrange(8))
        with open(path, "rb") as f:
            f.seek(off)
            length = int.from_bytes(f.read(4), "little")
            f.seek(off + 8)
            body = f.read(length)
        fd = os.open(path, os.O_RDWR)
        try:
            os.pwrite(fd, crc32c(body).to_bytes(4, "little"), off + 4)
        finally:
            os.close(fd)
        done["silent"] += 1
    indexes = sorted(p for p in victim.data_dir.rglob("*.idx") if p.stat().st_size > INDEX_HEADER_BYTES)
    for _ in range(INDEX_FLIPS):
        path = rng.choice(indexes)
        flip(path, INDEX_HEADER_BYTES + rng.randrange(path.stat().st_size - INDEX_HEADER_BYTES),
             1 << rng.randrange(8))
        done["index"] += 1
    return done


def bad_on(bookie: str, md: object, seed: int) -> list[int]:
    """Entries ``md`` assigns to ``bookie`` that it does not serve with the right payload."""
    digest = make_digest(md.digest, md.password)  # type: ignore[attr-defined]
    bad = []
    with BookieConnection(bookie, timeout_s=5) as c:
        for e in expected_entries(md, bookie, closed_fragments_only=True):  # type: ignore[arg-type]
            r = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=md.ledger_id, first_entry_id=e))  # type: ignore[attr-defined]
            try:
                ok = r.status == Status.EOK and bool(r.entries) and bytes(parse_entry(
                    bytes(r.entries[0]), digest, ledger_id=md.ledger_id, entry_id=e).payload) == payload(  # type: ignore[attr-defined]
                    seed, md.ledger_id, e)  # type: ignore[attr-defined]
            except DigestMismatchError:
                ok = False
            if not ok:
                bad.append(e)
    return bad


def eio_reads(node: BookieNode) -> float:
    text = node.http(node.http_port, "/metrics")
    m = re.search(r'^zbk_bookie_requests_total\{op="read",status="EIO"\} (\S+)$', text, re.M)
    return float(m[1]) if m else 0.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ClockCluster]:
    c = ClockCluster(tmp_path, f"sqlite://{tmp_path}/meta.db")
    try:
        yield c
    finally:
        c.stop_all()


def test_reads_never_return_damaged_bytes_and_the_check_repairs_the_replica(cluster: ClockCluster) -> None:
    seed = int(os.environ.get("ZBK_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"\nZBK_SEED={seed}")
    rng = random.Random(seed)
    victim = cluster.bookie("b0", **VICTIM)
    bookies = [victim] + [cluster.bookie(f"b{i}", **BOOKIE) for i in (1, 2)]
    store = open_store(cluster.uri)
    warnings = DigestWarnings()
    logging.getLogger("zbk.client").addHandler(warnings)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        ids = sorted(b.bookie_id for b in bookies)
        wait_until(lambda: sorted(r.bookie_id for r in list_bookies(store)) == ids, timeout_s=60,
                   message="three bookies registered")
        with zbk.BookKeeper(cluster.uri, config=CONFIG) as bk:
            ledgers = []
            for _ in range(LEDGERS):
                lh = bk.create_ledger(3, 2, 2, password=PASSWORD)
                futs = [lh.append_async(payload(seed, lh.ledger_id, i)) for i in range(ENTRIES)]
                assert [f.result(120) for f in futs] == list(range(ENTRIES))
                lh.close()
                ledgers.append(lh.ledger_id)
        ar: AutoRecoveryNode = cluster.autorecovery("ar", **AUTORECOVERY)
        cluster.wait_http([ar])
        wait_until(lambda: (ar.metric("zbk_auditor_last_check_timestamp_seconds") or 0) > 0, timeout_s=60,
                   message="the first periodic check (a new cluster's runs at once)")
        assert ar.metric("zbk_auditor_check_damaged_replicas") == 0
        time.sleep(2.0)  # a checkpoint has put every entry log record and index page on disk

        stats = ReadStats()
        threads = [threading.Thread(target=reader, args=(cluster.uri, seed, ledgers, random.Random(seed + i), stop,
                                                         stats), daemon=True) for i in range(READERS)]
        for t in threads:
            t.start()
        time.sleep(2.0)
        clean_reads = stats.reads
        done: dict[str, int] = {}
        records = log_records(victim)
        for _ in range(ROUNDS):
            for kind, n in damage(victim, records, rng).items():
                done[kind] = done.get(kind, 0) + n
            time.sleep(1.5)
        time.sleep(3.0)
        ledger_store = LedgerStore(store)
        before = {lid: bad_on(victim.bookie_id, ledger_store.read(lid)[0], seed) for lid in ledgers}
        damaged_entries = sum(len(v) for v in before.values())
        eio_before = eio_reads(victim)

        # The periodic check, now (as `zbk shell triggeraudit` does).
        first_check = ar.metric("zbk_auditor_last_check_timestamp_seconds") or 0
        store.put(layout.AUDITOR_TRIGGER, str(int(time.time() * 1000)).encode("ascii"))
        wait_until(lambda: (ar.metric("zbk_auditor_last_check_timestamp_seconds") or 0) > first_check,
                   timeout_s=60, interval_s=0.5, message=f"the triggered check\n{cluster.logs()}")
        marked = ar.metric("zbk_auditor_check_damaged_replicas")

        def repaired() -> bool:
            if UnderReplicationRegistry(store, "t").list_repairs():
                return False
            return all(bad_on(victim.bookie_id, ledger_store.read(lid)[0], seed) == [] for lid in ledgers)
        wait_until(repaired, timeout_s=90, interval_s=1.0,
                   message=f"the damaged replica repaired\n{before}\n{cluster.logs()}")
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(60)

        assert stats.wrong == [], f"reads returned wrong bytes: {stats.wrong[:10]} (ZBK_SEED={seed})"
        assert stats.failed == [], f"reads failed: {stats.failed[:10]} (ZBK_SEED={seed})"
        assert damaged_entries > 0 and eio_before > 0, (before, eio_before)
        assert warnings.by_bookie.get(victim.bookie_id, 0) > 0, f"no digest mismatch seen: {warnings.by_bookie}"
        assert set(warnings.by_bookie) == {victim.bookie_id}, warnings.by_bookie
        for lid in ledgers:
            md, _ = ledger_store.read(lid)
            assert victim.bookie_id in md.all_bookies(), "repaired in place, not replaced"
            for b in bookies:
                assert bad_on(b.bookie_id, md, seed) == [], (lid, b.name)
        print(f"damage {done}: {damaged_entries} entries unreadable or wrong on {victim.name}; {stats.reads} reads "
              f"({clean_reads} before the damage), {stats.entries} entries, 0 wrong, 0 failed; {int(eio_before)} "
              f"EIO answers and {warnings.by_bookie.get(victim.bookie_id)} digest mismatches from {victim.name}; "
              f"the check marked {marked:.0f} ledger(s), repaired in place")
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        logging.getLogger("zbk.client").removeHandler(warnings)
        store.close()
