"""Acknowledged adds survive kill -9 (journal on), torn journal tails, and restarts."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.journal import records_end, write_torn
from helpers.wait import wait_until

from zbk.errors import ZbkError
from zbk.storage.journal import list_segments, segment_name
from zbk.wire import messages as w
from zbk.wire.status import Status

from .util import (
    MK,
    add,
    check_payloads,
    entry,
    multi_adds_through_checkpoints_then_kill9,
    read,
    seeded_rng,
    send_random_add,
)

LEDGERS = 50
TARGET_ACKED = 10_000
BATCH = 10
WINDOW = 40


def _write_until_killed(bk, next_eid: dict[int, int], acked: dict[int, int], kill_after: int, rng: random.Random) -> int:
    """Pipelined batched adds to random ledgers; kill -9 the bookie once ``kill_after`` more
    entries were acknowledged (in flight requests are then lost). Returns entries acked."""
    got = 0
    pending: dict[int, tuple[int, list[int]]] = {}
    killed = False
    with bk.connect(timeout_s=5) as c:
        while True:
            while not killed and len(pending) < WINDOW:
                send_random_add(c, rng, next_eid, pending, BATCH)
            try:
                resp = c.recv(timeout_s=2 if killed else 10)
            except ZbkError:
                assert killed, "bookie stopped answering before it was killed"
                return got
            lid, eids = pending.pop(resp.rid)
            assert resp.status == Status.EOK, resp
            acked[lid] = max(acked[lid], eids[-1])
            got += len(eids)
            if not killed and got >= kill_after:
                bk.kill9()
                killed = True


def test_acknowledged_entries_survive_kill9_at_random_points(bookies):
    rng = seeded_rng()
    bk = bookies(settings={"flush_interval_ms": 300, "entry_log_size_limit_mb": 2,
                           "journal_max_size_mb": 1})
    bk.start()
    next_eid = dict.fromkeys(range(LEDGERS), 0)
    acked = dict.fromkeys(range(LEDGERS), -1)
    total = rounds = 0
    while total < TARGET_ACKED:
        total += _write_until_killed(bk, next_eid, acked, rng.randrange(500, 4000), rng)
        rounds += 1
        bk.start()
        # Restart continues after the highest *acknowledged* id; unacknowledged ids are reused.
        for lid in range(LEDGERS):
            next_eid[lid] = acked[lid] + 1
    with bk.connect() as c:
        for lid in range(LEDGERS):
            if acked[lid] < 0:
                continue
            seen: list[int] = []
            while len(seen) < acked[lid] + 1:
                resp = read(c, lid, len(seen), count=1000)
                assert resp.entries, f"ledger {lid}: entry {len(seen)} missing after {rounds} kill -9s ({resp.status!r})"
                seen += check_payloads(resp, lid)
    print(f"rounds={rounds} acked={total} ledgers={LEDGERS}")
    assert bk.stop() == 0


def _append_torn_record(journal_dir: Path) -> tuple[Path, int]:
    """A torn record after the segment's last one; returns the segment and its offset."""
    seg = journal_dir / segment_name(list_segments(str(journal_dir))[-1])
    # A record header that promises 4 KiB and a few bytes of it: a write cut short by a crash.
    torn = (4096 + 17).to_bytes(4, "little") + b"\x12\x34\x56\x78" + b"\x01" + b"\x00" * 20
    return seg, write_torn(seg, torn)


def test_torn_last_journal_record_is_truncated_and_acked_entries_served(bookies):
    bk = bookies(settings={"flush_interval_ms": 600_000})  # no checkpoint: everything comes from the journal
    bk.start()
    with bk.connect() as c:
        for lid in range(3):
            resp = c.call(w.AddRequest(rid=c.next_rid(), ledger_id=lid, master_key=MK, flags=w.AddFlag(0),
                                       entries=[entry(lid, e) for e in range(100)]))
            assert resp.status == Status.EOK
    bk.kill9()
    seg, good_size = _append_torn_record(bk.data_dir / "journal")
    bk.start()
    log = bk.log_tail(200)
    # Boot truncates the torn record (logged with file and offset), then checkpoints the
    # replayed records and drops the segment.
    assert "torn" in log.lower() and str(seg) in log and str(good_size) in log, log
    with bk.connect() as c:
        for lid in range(3):
            assert check_payloads(read(c, lid, 0, 200), lid) == list(range(100))
    assert bk.stop() == 0


def test_mid_file_journal_corruption_stops_boot_with_file_and_offset(bookies):
    bk = bookies(settings={"flush_interval_ms": 600_000})
    bk.start()
    with bk.connect() as c:
        for k in range(20):  # 20 separate commits, so the damage is not in the last batch
            resp = c.call(w.AddRequest(rid=c.next_rid(), ledger_id=1, master_key=MK, flags=w.AddFlag(0),
                                       entries=[entry(1, e) for e in range(k * 5, k * 5 + 5)]))
            assert resp.status == Status.EOK
    bk.kill9()
    journal = bk.data_dir / "journal"
    seg = journal / segment_name(list_segments(str(journal))[-1])
    data = bytearray(seg.read_bytes())
    at = records_end(seg) // 3  # a third into the records, not into the preallocated zeros
    data[at] ^= 0xFF
    seg.write_bytes(bytes(data))
    bk.start(wait=False)
    code = bk.exit_code(60)
    assert code == 5, f"expected boot failure exit 5, got {code}\n{bk.log_tail()}"
    log = bk.log_tail(50)
    assert str(seg) in log and "offset" in log


def test_entries_survive_clean_restart_and_checkpoint(bookies):
    bk = bookies(settings={"flush_interval_ms": 100, "journal_max_size_mb": 1})
    bk.start()
    with bk.connect() as c:
        for k in range(40):
            resp = c.call(w.AddRequest(rid=c.next_rid(), ledger_id=9, master_key=MK, flags=w.AddFlag(0),
                                       entries=[entry(9, e, 4096) for e in range(k * 25, k * 25 + 25)]))
            assert resp.status == Status.EOK
    wait_until(lambda: len(list_segments(str(bk.data_dir / "journal"))) <= 3, timeout_s=30,
               message="checkpoints to trim the journal")
    assert bk.stop() == 0
    bk.start()
    with bk.connect() as c:
        got: list[int] = []
        while len(got) < 1000:
            resp = read(c, 9, len(got), 500)
            assert resp.entries
            got += check_payloads(resp, 9, 4096)
    assert bk.stop() == 0


def test_concurrent_writers_and_readers_see_acked_entries(bookies):
    """Invariant: once an add is acknowledged, every later read on the bookie finds it."""
    bk = bookies()
    bk.start()
    errors: list[str] = []

    def writer_reader(lid: int) -> None:
        try:
            with bk.connect() as c:
                for e in range(0, 300, 3):
                    resp = c.call(w.AddRequest(rid=c.next_rid(), ledger_id=lid, master_key=MK, flags=w.AddFlag(0),
                                               entries=[entry(lid, x) for x in range(e, e + 3)]))
                    assert resp.status == Status.EOK
                    r = read(c, lid, e, 3)
                    assert check_payloads(r, lid) == [e, e + 1, e + 2], r
        except Exception as ex:  # noqa: BLE001 - collected and asserted below
            errors.append(f"ledger {lid}: {ex!r}")

    threads = [threading.Thread(target=writer_reader, args=(lid,)) for lid in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert bk.stop() == 0


@pytest.mark.parametrize(("syncfs", "files_open"), [(True, 20_000), (False, 100)], ids=["syncfs", "fsync-100-open"])
def test_acked_multi_adds_survive_kill9_after_checkpoints_with_many_dirty_ledgers(bookies, syncfs, files_open):
    """MULTI_ADD over 600 ledgers (more than one group of index files flushed before their
    fsyncs, see LedgerCache.flush, with only 100 index files kept open; or one syncfs, all
    kept open): checkpoints run with hundreds of dirty ledgers (new index files, then
    rewritten pages), the journal before their marks is deleted, and after a kill -9 in the
    middle of more adds every acknowledged entry is read back."""
    bk = bookies(settings={"flush_interval_ms": 200, "journal_max_size_mb": 1, "index_flush_syncfs": syncfs,
                           "index_files_open_max": files_open})
    bk.start()
    multi_adds_through_checkpoints_then_kill9(bk, list(range(1000, 1600)), rounds=4)


def _keep_calling(bk: Any, stop: threading.Event, body: Callable[[Any, Any], None], arg: Any) -> None:
    """``body(connection, arg)`` again and again until ``stop``, reconnecting while the bookie
    goes away and comes back."""
    while not stop.is_set():
        try:
            with bk.connect(timeout_s=2) as c:
                while not stop.is_set():
                    body(c, arg)
        except ZbkError:
            time.sleep(0.01)  # the bookie is going away or coming back


def test_a_stop_under_reads_and_adds_is_quick_and_clean(bookies):
    """SIGTERM while clients keep reading and adding: the actors see the stop at different
    moments, and one that sends to an actor already stopped must not wait for it (a Server
    blocked in such a send once kept a stop from finishing: 10 s, dirty marker left set)."""
    bk = bookies(settings={"flush_interval_ms": 200})
    bk.start()
    with bk.connect() as c:
        assert add(c, 5, list(range(50))).status == Status.EOK
    next_eid = [50]
    for round_ in range(5):
        stop = threading.Event()

        def hammer(c: Any, kind: str) -> None:
            if kind == "read":
                read(c, 5, 10, 20)
            else:
                eid = next_eid[0]
                next_eid[0] += 1
                add(c, 5, [eid])

        threads = [threading.Thread(target=_keep_calling, args=(bk, stop, hammer, k), daemon=True)
                   for k in ("read", "read", "add")]
        for t in threads:
            t.start()
        time.sleep(0.3 + 0.1 * round_)
        t0 = time.monotonic()
        code = bk.stop()
        took = time.monotonic() - t0
        stop.set()
        for t in threads:
            t.join(10)
        log = bk.log_tail(80)
        assert code == 0 and "did not stop" not in log, f"round {round_}: unclean stop after {took:.1f} s:\n{log}"
        assert took < 9, f"round {round_}: the stop took {took:.1f} s"
        bk.start()
        assert "boot: unclean=False" in bk.log_tail(5), f"round {round_}: the next boot saw a dirty marker"
    assert bk.stop() == 0


def test_every_add_acknowledged_before_a_clean_stop_is_readable_after_it(bookies):
    """SIGTERM while writers keep adding: the actors stop at different moments, so an add can
    be acknowledged while its index update is still on its way to the IndexSyncer. The clean
    stop must not lose it (its last mark would otherwise skip the journal record that could
    restore it), and the next boot must find every acknowledged entry."""
    bk = bookies(settings={"flush_interval_ms": 200})
    bk.start()
    ledgers = [21, 22, 23, 24]
    acked: dict[int, set[int]] = {lid: set() for lid in ledgers}
    next_eid = dict.fromkeys(ledgers, 0)
    for round_ in range(5):
        stop = threading.Event()

        def writer(c: Any, lid: int) -> None:
            eids = list(range(next_eid[lid], next_eid[lid] + 5))
            next_eid[lid] += 5
            if add(c, lid, eids).status == Status.EOK:
                acked[lid].update(eids)

        threads = [threading.Thread(target=_keep_calling, args=(bk, stop, writer, lid), daemon=True)
                   for lid in ledgers]
        for t in threads:
            t.start()
        time.sleep(0.3 + 0.1 * round_)
        assert bk.stop() == 0, f"round {round_}: unclean stop"
        stop.set()
        for t in threads:
            t.join(10)
        bk.start()
        with bk.connect() as c:
            for lid in ledgers:
                want = sorted(acked[lid])
                got: list[int] = []
                # Adds cut off by the stop leave gaps; a ranged read stops at a gap, so read
                # each run of acknowledged ids on its own.
                runs = [[want[0]]] if want else []
                for eid in want[1:]:
                    if eid == runs[-1][-1] + 1:
                        runs[-1].append(eid)
                    else:
                        runs.append([eid])
                for run in runs:
                    for first in range(run[0], run[-1] + 1, 500):
                        got += check_payloads(read(c, lid, first, min(500, run[-1] + 1 - first)), lid)
                missing = sorted(set(want) - set(got))
                assert not missing, f"round {round_}, ledger {lid}: acknowledged entries lost by a clean stop: {missing[:10]}"
    assert bk.stop() == 0
