"""Microbenchmark of a bookie's add path, stage by stage, in one process (no sockets).

    PYTHONPATH=TREE .venv/bin/python bench/addpath_micro.py [--reps N] [--n ENTRIES] [--dir DIR]

Drives the cores of one bookie with list outboxes, as its actors would hand messages on:
the ServerCore decodes and admits a request (an ADD_ENTRY of ``--n`` entries of one ledger,
and a MULTI_ADD of ``--n`` ledgers with one entry each), the EntryLoggerCore appends the
AppendBatch to its logs, the JournalCore encodes the JournalAppend, the ServerCore takes
the Appended and the Synced (reply included) and sends the IndexPut, and the IndexCore puts
it into its cache. Prints microseconds per entry for each stage: the median of ``--reps``
repetitions (min-max). The directory should be a tmpfs (the stages measure CPU, not disks);
nothing is fsynced.

The script adapts to older trees (a core's outbox set after construction, a batch of one
ledger sent with ``ledger_id`` rather than ``ledger_ids``), so that one tree can be compared
with another: run it once with each tree on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import inspect
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from zbk.actors.base import ListOutbox
from zbk.actors.entrylogger import EntryLoggerCore
from zbk.actors.indexsyncer import IndexCore
from zbk.actors.journal import JournalCore
from zbk.actors.messages import AppendBatch, Appended, IndexPut, JournalAppend, Synced
from zbk.actors.server import LedgerState, ServerCore
from zbk.client.digest import make_digest, master_key
from zbk.storage.entrylog import EntryLogWriter
from zbk.storage.journal import JournalWriter
from zbk.storage.ledgercache import LedgerCache
from zbk.wire import messages as w
from zbk.wire.codec import encode
from zbk.wire.entry import build_entry
from zbk.wire.ops import AddFlag

DIGEST = make_digest("crc32c", b"")
KEY = master_key(b"bench")
PAYLOAD = os.urandom(1024)
SINGLE_LID = 7
MULTI_BASE = 1000


def _make(cls: type, *args: Any, **kw: Any) -> Any:
    """``cls(*args, **kw)`` with the outbox given to the constructor where it takes one,
    else set afterwards (the older trees)."""
    outbox = ListOutbox()
    if "outbox" in inspect.signature(cls.__init__).parameters:
        return cls(*args, outbox=outbox, **kw)
    core = cls(*args, **kw)
    core.outbox = outbox
    return core


def _persist_kw() -> dict[str, Any]:
    params = inspect.signature(IndexCore.__init__).parameters
    return {"persist_marks": lambda marks: None} if "persist_marks" in params else {"persist_mark": lambda mark: None}


class Bookie:
    def __init__(self, root: str, n: int) -> None:
        ledgers = {SINGLE_LID: LedgerState(master_key=KEY)}
        for i in range(n):
            ledgers[MULTI_BASE + i] = LedgerState(master_key=KEY)
        self.replies: list[tuple[bytes, list[Any]]] = []
        self.server = _make(ServerCore, ledgers=ledgers, journal_write_data=True, max_frame_bytes=64 << 20,
                            reply=lambda ident, frames: self.replies.append((ident, frames)))
        logs = EntryLogWriter([os.path.join(root, "ledgers")])
        self.entrylogger = _make(EntryLoggerCore, logs)
        self.jwriter = JournalWriter(os.path.join(root, "journal"))
        self.journal = _make(JournalCore, self.jwriter, sync_data=False, group_bytes_max=1 << 40, group_wait_s=1e9)
        cache = LedgerCache([os.path.join(root, "index")], bytes_max=1 << 30)
        for lid in ledgers:  # as the HeaderUpdate of each ledger's first add would
            cache.set_master_key(lid, KEY)
        self.index = _make(IndexCore, cache, flush_interval_s=1e9, **_persist_kw())


def _take(outbox: ListOutbox, kind: type) -> list[Any]:
    got = outbox.take(kind=kind)
    outbox.sent.clear()
    return got


def run_once(b: Bookie, frames: list[bytes], n: int) -> dict[str, float]:
    """One request through every stage: seconds per stage."""
    t: dict[str, float] = {}
    now = time.monotonic()
    s = b.server
    t0 = time.perf_counter()
    s.on_request(b"peer", frames, now)
    t["server: request -> AppendBatch"] = time.perf_counter() - t0
    (batch,) = _take(s.outbox, AppendBatch)
    assert len(batch.entry_ids) == n, len(batch.entry_ids)

    t0 = time.perf_counter()
    b.entrylogger.on_message(batch, now)
    t["entrylogger: AppendBatch"] = time.perf_counter() - t0
    sent = list(b.entrylogger.outbox.sent)
    b.entrylogger.outbox.sent.clear()
    (jappend,) = [m for _, m in sent if isinstance(m, JournalAppend)]
    (appended,) = [m for _, m in sent if isinstance(m, Appended)]

    t0 = time.perf_counter()
    b.journal.on_message(jappend, now)
    t["journal: JournalAppend"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    b.journal.commit()  # write() of the buffer, no fsync (sync_data off): the group commit's CPU
    t["journal: commit (write, no fsync)"] = time.perf_counter() - t0
    (synced,) = _take(b.journal.outbox, Synced)

    t0 = time.perf_counter()
    s.on_message(appended, now)
    s.on_message(synced, now)
    s.send_held_puts()
    t["server: Appended + Synced + reply + IndexPut"] = time.perf_counter() - t0
    (put,) = _take(s.outbox, IndexPut)
    assert len(b.replies) == 1
    b.replies.clear()

    t0 = time.perf_counter()
    b.index.on_message(put, now)
    t["index: IndexPut"] = time.perf_counter() - t0
    b.index.outbox.sent.clear()
    return t


def single_request(rep: int, n: int) -> list[bytes]:
    first = rep * n
    entries = [build_entry(SINGLE_LID, e, e - 1, PAYLOAD, DIGEST) for e in range(first, first + n)]
    req = w.AddRequest(rid=rep + 1, ledger_id=SINGLE_LID, master_key=KEY, flags=AddFlag(0), entries=entries)
    return [bytes(f) for f in encode(req)]


def multi_request(rep: int, n: int) -> list[bytes]:
    parts = [w.AddRequest(rid=0, ledger_id=MULTI_BASE + i, master_key=KEY, flags=AddFlag(0),
                          entries=[build_entry(MULTI_BASE + i, rep, rep - 1, PAYLOAD, DIGEST)]) for i in range(n)]
    return [bytes(f) for f in encode(w.MultiAddRequest(rid=rep + 1, parts=parts))]


def measure(label: str, make: Callable[[int, int], list[bytes]], root: str, n: int, reps: int, warm: int) -> None:
    b = Bookie(root, n)
    requests = [make(r, n) for r in range(warm + reps)]
    rows: dict[str, list[float]] = {}
    for r, frames in enumerate(requests):
        t = run_once(b, frames, n)
        if r >= warm:
            for k, v in t.items():
                rows.setdefault(k, []).append(v / n * 1e6)
    print(f"\n{label} ({n} entries of {len(PAYLOAD)} B, {reps} reps): us per entry, median (min-max)")
    total = 0.0
    for k, vals in rows.items():
        med = statistics.median(vals)
        total += med
        print(f"  {k:<48} {med:7.3f}  ({min(vals):.3f}-{max(vals):.3f})")
    print(f"  {'sum of medians':<48} {total:7.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warm", type=int, default=5)
    ap.add_argument("--dir", default="/dev/shm" if os.path.isdir("/dev/shm") else None)
    args = ap.parse_args()
    import zbk
    print(f"zbk from {os.path.dirname(zbk.__file__)}")
    for label, make in (("ADD_ENTRY of one ledger", single_request), ("MULTI_ADD of many ledgers", multi_request)):
        root = tempfile.mkdtemp(prefix="zbk-addpath-", dir=args.dir)
        try:
            measure(label, make, root, args.n, args.reps, args.warm)
        finally:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
