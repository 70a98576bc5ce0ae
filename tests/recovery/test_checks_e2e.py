"""The auditor's periodic check and decommission, against real processes: a bookie whose
entry log is damaged on disk is found by the check (run at once by `zbk shell
triggeraudit`) and repaired in place; `zbk shell recover B` moves everything off a bookie."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from helpers.wait import wait_until

import zbk
from zbk.config import ClientConfig
from zbk.metadata.registry import LedgerStore, list_bookies
from zbk.metadata.uri import open_store
from zbk.recovery.underreplication import UnderReplicationRegistry

from .replicas import unreadable_on

PW = b"checks"
FAST = ClientConfig(add_timeout_ms=2000, read_timeout_ms=1500, speculative_read_ms=300)
ENTRIES = 200


def data(lid: int, i: int) -> bytes:
    return hashlib.sha256(f"{lid}/{i}".encode()).digest() * 16


def write_ledger(bk: zbk.BookKeeper, ensemble: int, wq: int, n: int, *, close: bool = True) -> zbk.SyncLedgerHandle:
    lh = bk.create_ledger(ensemble, wq, 2 if wq >= 2 else 1, password=PW)
    futs = [lh.append_async(data(lh.ledger_id, i)) for i in range(n)]
    assert [f.result(30) for f in futs] == list(range(n))
    if close:
        lh.close()
    return lh


def shell(uri: str, *args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zbk.cli.main", "shell", "--metadata", uri, "--json", *args],
                          capture_output=True, text=True, timeout=timeout_s)


def damage_entry_logs(data_dir: Path) -> int:
    """Flip one byte every 256 in the first half of each entry log (past its header; the
    footer at the end stays intact). Returns the number of bytes flipped."""
    flipped = 0
    for log in sorted(data_dir.rglob("*.log")):
        raw = bytearray(log.read_bytes())
        for off in range(64, len(raw) // 2, 256):
            raw[off] ^= 0x5A
            flipped += 1
        log.write_bytes(bytes(raw))
    return flipped


def test_damaged_entry_log_is_found_by_the_check_and_repaired(rcluster) -> None:
    bookies = rcluster.start_bookies(3)
    store = open_store(rcluster.uri)
    ledgers = LedgerStore(store)
    bk = zbk.BookKeeper(rcluster.uri, config=FAST)
    try:
        lids = [write_ledger(bk, 3, 2, ENTRIES).ledger_id for _ in range(3)]
        ar = rcluster.start_autorecovery(lost_bookie_recovery_delay_s=60, auditor_periodic_check_interval_s=3600,
                                         lease_ttl_s=3)
        # A new cluster's first check runs at once and finds nothing.
        wait_until(lambda: ar.metric("zbk_auditor_last_check_timestamp_seconds") > 0, timeout_s=30,
                   message="the first periodic check")
        assert ar.metric("zbk_auditor_check_damaged_replicas") == 0
        first_check = ar.metric("zbk_auditor_last_check_timestamp_seconds")

        victim = bookies[0]
        assert victim.stop() == 0  # a clean stop: entry logs flushed
        assert damage_entry_logs(victim.data_dir) > 0
        victim.start()
        damaged = {lid: unreadable_on(victim.bookie_id, ledgers.read(lid)[0]) for lid in lids}
        assert any(damaged.values()), "the damage must be visible before the repair"

        # The check is due in an hour: triggeraudit runs it now.
        res = shell(rcluster.uri, "triggeraudit")
        assert res.returncode == 0, res.stderr
        assert json.loads(res.stdout)["auditor"] == ar.candidate_id
        wait_until(lambda: ar.metric("zbk_auditor_last_check_timestamp_seconds") > first_check, timeout_s=30,
                   message="the triggered check")
        assert ar.metric("zbk_auditor_check_damaged_replicas") == sum(1 for v in damaged.values() if v)

        def repaired() -> bool:
            return not UnderReplicationRegistry(store, "t").list_repairs() and \
                all(unreadable_on(victim.bookie_id, ledgers.read(lid)[0]) == [] for lid in lids)
        wait_until(repaired, timeout_s=60, interval_s=0.5, message="the damaged replica repaired in place")
        for lid in lids:
            assert victim.bookie_id in ledgers.read(lid)[0].all_bookies(), "repaired in place, not replaced"
        # Every other bookie gone: the repaired one alone still serves its share.
        for b in bookies[1:]:
            b.stop()
        for lid in lids:
            assert unreadable_on(victim.bookie_id, ledgers.read(lid)[0]) == []
        assert ar.stop() == 0
    finally:
        bk.close()
        store.close()


def test_recover_decommissions_a_bookie(rcluster) -> None:
    rcluster.start_bookies(4)
    store = open_store(rcluster.uri)
    ledgers = LedgerStore(store)
    bk = zbk.BookKeeper(rcluster.uri, config=FAST)
    try:
        closed = [write_ledger(bk, 3, 2, ENTRIES).ledger_id for _ in range(4)]
        single = write_ledger(bk, 2, 1, 50).ledger_id  # WQ=1: the bookie itself is a copy's only source
        writer = write_ledger(bk, 3, 3, 30, close=False)
        victim_id = writer.metadata.ensembles[0][0]
        victim = rcluster.by_id(victim_id)
        named = [lid for lid in closed + [single, writer.ledger_id] if victim_id in ledgers.read(lid)[0].all_bookies()]
        assert writer.ledger_id in named

        res = shell(rcluster.uri, "recover", victim_id)
        assert res.returncode == 1 and "writable" in res.stderr and "Traceback" not in res.stderr

        req = urllib.request.Request(f"http://127.0.0.1:{victim.http_port}/api/v1/bookie/state",
                                     data=json.dumps({"state": "readonly"}).encode(), method="PUT")
        urllib.request.urlopen(req, timeout=5).read()
        wait_until(lambda: victim_id in {r.bookie_id for r in list_bookies(store, readonly=True)}, timeout_s=10,
                   message="the bookie registered read-only")
        t0 = time.monotonic()
        res = shell(rcluster.uri, "recover", victim_id)
        assert res.returncode == 0, res.stdout + res.stderr
        report = json.loads(res.stdout)
        assert report["safe_to_remove"] and report["ledgers"] == len(named)
        assert report["recovered_open_ledgers"] == [writer.ledger_id]
        assert report["entries_copied"] > 0
        print(f"decommissioned {len(named)} ledgers in {time.monotonic() - t0:.1f} s")

        victim.stop()
        for lid in closed + [single, writer.ledger_id]:
            md, _ = ledgers.read(lid)
            assert victim_id not in md.all_bookies() and md.is_closed
            rh = bk.open_ledger(lid, password=PW)
            got = [e.payload for e in rh.read(0, md.last_entry_id)]
            assert got == [data(lid, i) for i in range(md.last_entry_id + 1)]
        assert shell(rcluster.uri, "recover", "127.0.0.1:1").returncode == 0, "a bookie nobody names: nothing to do"
    finally:
        bk.close()
        store.close()


def test_autorecovery_enabled_runs_inside_bookies(rcluster) -> None:
    settings = {"autorecovery_enabled": True, "lost_bookie_recovery_delay_s": 0,
                "open_ledger_rereplication_grace_period_s": 1}
    bookies = rcluster.start_bookies(4, settings=settings)
    store = open_store(rcluster.uri)
    ledgers = LedgerStore(store)
    bk = zbk.BookKeeper(rcluster.uri, config=FAST)

    def get(b: object, path: str) -> object:
        with urllib.request.urlopen(f"http://127.0.0.1:{b.http_port}{path}", timeout=5) as resp:  # type: ignore[attr-defined]
            return json.loads(resp.read())
    try:
        def auditors_seen() -> set[object]:
            try:
                seen = {get(b, "/api/v1/autorecovery/who_is_auditor")["auditor"] for b in bookies}  # type: ignore[index]
            except OSError:  # autorecovery starts just after the bookie serves
                return set()
            return seen if None not in seen else set()
        auditors = wait_until(auditors_seen, timeout_s=20, interval_s=0.2, message="an auditor")
        assert len(auditors) == 1, f"one auditor among the bookies: {auditors}"
        lids = [write_ledger(bk, 3, 2, ENTRIES).ledger_id for _ in range(4)]
        # A bookie of the first ledger's ensemble (3 of the 4) that is not the auditor: with
        # any bookie, random placement leaves it in none of the 4 ledgers once in 256 runs.
        first = ledgers.read(lids[0])[0].all_bookies()
        victim = next(b for b in bookies if f"127.0.0.1:{b.http_port}" not in auditors and b.bookie_id in first)
        named = [lid for lid in lids if victim.bookie_id in ledgers.read(lid)[0].all_bookies()]
        assert named
        victim.kill9()

        def replaced() -> bool:
            return all(victim.bookie_id not in ledgers.read(lid)[0].all_bookies() for lid in named) \
                and not UnderReplicationRegistry(store, "t").list()
        wait_until(replaced, timeout_s=60, interval_s=0.3, message="the bookies' replicators to replace the dead one")
        for lid in lids:
            md, _ = ledgers.read(lid)
            rh = bk.open_ledger(lid, password=PW)
            assert [e.payload for e in rh.read(0, md.last_entry_id)] == [data(lid, i) for i in range(ENTRIES)]
        for b in bookies:
            if b is not victim:
                assert b.stop() == 0
    finally:
        bk.close()
        store.close()
