"""A bookie killed -9 while its journal writes into a recycled segment (zbk/storage/journal.py,
"Recycling") loses no acknowledged entry, and boots again on what replay kept."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from zbk.errors import ZbkError
from zbk.wire.status import Status

from .util import check_payloads, read, seeded_rng, send_random_add

LEDGERS = 8
SIZE = 1024
BATCH = 10
WINDOW = 16
ROUNDS = 3


def _inodes(journal: Path) -> tuple[dict[str, int], dict[int, str]]:
    """Free files by name -> inode, and segments by inode -> name."""
    free: dict[str, int] = {}
    segments: dict[int, str] = {}
    for name in os.listdir(journal):
        try:
            ino = os.stat(journal / name).st_ino
        except FileNotFoundError:  # renamed or removed while we looked
            continue
        if name.endswith(".jnl.free"):
            free[name] = ino
        elif name.endswith(".jnl"):
            segments[ino] = name
    return free, segments


def _write_until_killed_in_recycled(bk, next_eid: dict[int, int], acked: dict[int, int],
                                    rng: random.Random) -> str:
    """Pipelined adds until a free file has become a segment, then a random number of entries
    more, then kill -9. Returns the name of the recycled segment."""
    journal = bk.data_dir / "journal"
    known_free: dict[str, int] = {}
    recycled: str | None = None
    more = 0
    pending: dict[int, tuple[int, list[int]]] = {}
    killed = False
    deadline = time.monotonic() + 60
    with bk.connect(timeout_s=5) as c:
        while True:
            while not killed and len(pending) < WINDOW:
                send_random_add(c, rng, next_eid, pending, BATCH, SIZE)
            try:
                resp = c.recv(timeout_s=2 if killed else 10)
            except ZbkError:
                assert killed, "bookie stopped answering before it was killed"
                assert recycled is not None
                return recycled
            lid, eids = pending.pop(resp.rid)
            assert resp.status == Status.EOK, resp
            acked[lid] = max(acked[lid], eids[-1])
            if killed:
                continue
            assert time.monotonic() < deadline, "no free journal file was reused within 60 s"
            if recycled is None:
                free, segments = _inodes(journal)
                for name, ino in known_free.items():
                    if name not in free and ino in segments:
                        recycled = segments[ino]
                        more = rng.randrange(0, 600)
                        break
                known_free.update(free)
            else:
                more -= BATCH
                if more <= 0:
                    bk.kill9()
                    killed = True


def test_kill9_while_writing_into_a_recycled_journal_segment(bookies):
    rng = seeded_rng()
    # 1 MiB segments and a checkpoint every 100 ms: segments are retired, kept and reused
    # within a second of writing.
    bk = bookies(settings={"flush_interval_ms": 100, "journal_max_size_mb": 1}).start()
    next_eid = dict.fromkeys(range(LEDGERS), 0)
    acked = dict.fromkeys(range(LEDGERS), -1)
    recycled = []
    for _ in range(ROUNDS):
        recycled.append(_write_until_killed_in_recycled(bk, next_eid, acked, rng))
        bk.start()  # replay cuts the recycled segment's old records off, then checkpoints
        for lid in range(LEDGERS):
            next_eid[lid] = acked[lid] + 1
    with bk.connect() as c:
        for lid in range(LEDGERS):
            seen: list[int] = []
            while len(seen) < acked[lid] + 1:
                resp = read(c, lid, len(seen), count=200)
                assert resp.entries, f"ledger {lid}: entry {len(seen)} missing (recycled segments {recycled})"
                seen += check_payloads(resp, lid, SIZE)
    print(f"recycled segments killed in: {recycled}; acked {sum(a + 1 for a in acked.values())} entries")
    assert bk.stop() == 0
