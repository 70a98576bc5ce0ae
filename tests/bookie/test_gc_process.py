"""Garbage collection in a real bookie process (zbk/actors/gc.py).

* Ledgers deleted in metadata lose their local data: the entry logs they filled disappear
  from disk and zbk_gc_reclaimed_bytes_total grows (periodic runs, gc_wait_time_ms=500).
* kill -9 in the middle of a compaction (throttled by compaction_rate_bytes so that the
  kill lands mid-way, after a seeded random delay; adds keep arriving meanwhile), restart:
  every acknowledged entry of the live ledger reads back byte for byte; then a forced run
  (POST /api/v1/bookie/gc) finishes the work: the space is reclaimed and no log is left
  marked as possibly holding duplicate copies. Repeated for a few seeds.

ZBK_SEED=<n> replays one seed. Every process is stopped by PID (the ``bookies`` fixture).
"""

from __future__ import annotations

import glob
import json
import os
import random
import re
import time
import urllib.request
from collections.abc import Callable

from helpers.bookie import BookieProcess
from helpers.wait import wait_until

from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import LedgerStore
from zbk.metadata.uri import open_store
from zbk.storage.gcstate import GcStateFile
from zbk.wire.status import Status

from .util import PASSWORD, add, check_payloads, read

SIZE = 4096  # payload bytes per entry
BATCH = 16
GC_SETTINGS = {"gc_wait_time_ms": 500, "entry_log_size_limit_mb": 1, "flush_interval_ms": 200}


def create_ledgers(uri: str, bookie_id: str, n: int) -> list[int]:
    store = open_store(uri)
    try:
        ledgers = LedgerStore(store)
        md = LedgerMetadata(ledger_id=0, ensemble_size=1, write_quorum=1, ack_quorum=1, password=PASSWORD,
                            fragments=((0, (bookie_id,)),))
        return [ledgers.create(md)[0].ledger_id for _ in range(n)]
    finally:
        store.close()


def delete_ledgers(uri: str, ids: list[int]) -> None:
    store = open_store(uri)
    try:
        for lid in ids:
            LedgerStore(store).delete(lid)
    finally:
        store.close()


def log_sizes(bk: BookieProcess) -> list[int]:
    """Sizes of the entry logs, oldest first."""
    return [os.path.getsize(p) for p in sorted(glob.glob(str(bk.data_dir / "ledgers" / "*.log")))]


def log_bytes(bk: BookieProcess) -> int:
    return sum(log_sizes(bk))


def metric(bk: BookieProcess, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{bk.http_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    want = name + ("{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else "")
    for line in text.splitlines():
        if line.startswith(want + " "):
            return float(line.split()[-1])
    return 0.0


def post_gc(bk: BookieProcess, **flags: bool) -> dict[str, object]:
    req = urllib.request.Request(f"http://127.0.0.1:{bk.http_port}/api/v1/bookie/gc", method="POST",
                                 data=json.dumps(flags).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return dict(json.loads(r.read()))


def ledger_count(bk: BookieProcess) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{bk.http_port}/api/v1/bookie/info", timeout=5) as r:
        return int(json.loads(r.read())["ledgers"])


def write(bk: BookieProcess, plan: list[tuple[int, int]], next_eid: dict[int, int]) -> None:
    """Add ``count`` entries to ``ledger`` for each (ledger, count) of ``plan``, in order."""
    with bk.connect() as c:
        for lid, count in plan:
            for first in range(0, count, BATCH):
                eids = list(range(next_eid[lid], next_eid[lid] + min(BATCH, count - first)))
                resp = add(c, lid, eids, size=SIZE)
                assert resp.status == Status.EOK, resp
                next_eid[lid] += len(eids)


def read_all(bk: BookieProcess, lid: int, count: int) -> None:
    """Entries 0..count-1 of ``lid`` all read back, byte for byte."""
    seen: list[int] = []
    with bk.connect() as c:
        while len(seen) < count:
            resp = read(c, lid, len(seen), count=count - len(seen))
            assert resp.entries, f"ledger {lid}: entry {len(seen)} of {count} unreadable ({resp.status!r})"
            seen += check_payloads(resp, lid, SIZE)
    assert seen == list(range(count))


def test_deleted_ledgers_free_their_disk_space(bookies: Callable[..., BookieProcess]) -> None:
    bk = bookies(settings=GC_SETTINGS)
    bk.start()
    uri = bookies.metadata_uri  # type: ignore[attr-defined]
    a, b, keep = create_ledgers(uri, bk.bookie_id, 3)
    next_eid = dict.fromkeys((a, b, keep), 0)
    # One after the other, so whole logs hold only the ledgers about to be deleted.
    write(bk, [(a, 400), (b, 400), (keep, 100)], next_eid)
    before = log_bytes(bk)
    assert before > 3 * 1024 * 1024
    delete_ledgers(uri, [a, b])
    wait_until(lambda: log_bytes(bk) < before - 2 * 1024 * 1024, timeout_s=30,
               message=f"entry logs of the deleted ledgers to go ({log_bytes(bk)} of {before} bytes left)")
    # The files go first (EntryLogger), then the GarbageCollector counts them when it hears
    # back: the counter lags the disk by a message.
    wait_until(lambda: metric(bk, "zbk_gc_reclaimed_bytes_total") >= 2 * 1024 * 1024, timeout_s=10,
               message="zbk_gc_reclaimed_bytes_total to count the reclaimed logs")
    read_all(bk, keep, next_eid[keep])
    with bk.connect() as c:
        assert read(c, a, 0).status == Status.ENOLEDGER
    assert not glob.glob(str(bk.data_dir / "index" / "*" / f"{a:016x}.idx"))


def _kill_during_compaction(bk: BookieProcess, rng: random.Random, keep: int, next_eid: dict[int, int],
                            window_s: float) -> float:
    """Force a compaction, keep adding to ``keep`` while it runs, kill -9 after a random
    delay from its start. Returns the delay."""
    marker = "gc: compacting entry log"
    seen = bk.log.read_text().count(marker)

    def started() -> bool:
        # Only sealed, flushed logs are compacted: the logs rotated by the last writes become
        # candidates after the next checkpoint, so ask again until a compaction starts.
        assert post_gc(bk, minor=True)["triggered"] is True
        return bk.log.read_text().count(marker) > seen

    wait_until(started, timeout_s=20, interval_s=0.1, message="a compaction to start")
    delay = rng.uniform(0.0, window_s)
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline:
        write(bk, [(keep, 1)], next_eid)  # acknowledged before the kill: must survive it
        time.sleep(0.05)
    bk.kill9()
    return delay


def _kill9_round(bookies: Callable[..., BookieProcess], name: str, seed: int) -> None:
    """One bookie: two ledgers interleaved, one deleted, kill -9 mid-compaction, restart,
    check, finish the GC, check again."""
    print(f"ZBK_SEED={seed}")
    rng = random.Random(seed)
    uri = bookies.metadata_uri  # type: ignore[attr-defined]
    rate = 400_000  # bytes scanned per second: a 1 MiB log takes ~2.6 s
    bk = bookies(name=name, settings={**GC_SETTINGS, "minor_compaction_threshold": 0.5,
                                      "compaction_rate_bytes": rate})
    bk.start()
    keep, gone = create_ledgers(uri, bk.bookie_id, 2)
    next_eid = {keep: 0, gone: 0}
    # Interleaved, 30% live once ``gone`` is deleted: every sealed log is a candidate.
    write(bk, [(gone, 7), (keep, 3)] * 60, next_eid)
    full, gone_bytes, kept = log_bytes(bk), next_eid[gone] * SIZE, next_eid[keep]
    sealed = sum(log_sizes(bk)[:-1])  # the newest log is still open: not compacted now
    delete_ledgers(uri, [gone])
    wait_until(lambda: ledger_count(bk) == 1, timeout_s=20, message="the GC to drop the deleted ledger")
    # The throttle lets the compaction go no faster than ``rate``, so a kill before
    # sealed / rate (less what seeing the start and the last add may add) lands mid-way.
    delay = _kill_during_compaction(bk, rng, keep, next_eid, window_s=sealed / rate - 0.6)
    print(f"seed {seed}: killed {delay:.2f}s into the compaction, {next_eid[keep]} entries acknowledged")
    bk.settings["compaction_rate_bytes"] = 64 * 1024 * 1024
    bk.start()
    read_all(bk, keep, next_eid[keep])
    # Finish the job: the old logs and any copies the kill left unreferenced must go.
    post_gc(bk, minor=True)
    state = GcStateFile(str(bk.data_dir / "ledgers"))
    added = (next_eid[keep] - kept) * SIZE

    def finished() -> bool:
        # The log being compacted at the kill is still there, so this process compacts at
        # least once (suspects of the interrupted job count as major).
        compactions = sum(metric(bk, "zbk_gc_compactions_total", kind=k) for k in ("minor", "major"))
        return compactions >= 1 and state.load() is None and log_bytes(bk) - added < full - 0.7 * gone_bytes

    wait_until(finished, timeout_s=30,
               message=f"the compaction to finish after the restart ({log_bytes(bk)} of {full} bytes)")
    read_all(bk, keep, next_eid[keep])
    assert re.search(r"gc: entry log \d+ compacted", bk.log.read_text())
    assert bk.stop() == 0


def test_kill9_in_the_middle_of_compaction_loses_no_entry(bookies: Callable[..., BookieProcess]) -> None:
    base = int(os.environ.get("ZBK_SEED", random.randrange(1 << 30)))
    for round_ in range(3):
        _kill9_round(bookies, f"bookie{round_}", base + round_)
