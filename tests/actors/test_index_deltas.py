"""Index deltas (zbk/storage/ledgerpages.py) in a whole bookie's cores.

MULTI_ADD over many ledgers whose index pages are in their files but not in the cache (a
small cache, and every boot starts with none): their puts are deltas, and checkpoints write
only the changed slots in place. A kill -9 (every object abandoned, nothing closed; the page
cache keeps what was written) lands at a random step, also in the middle of checkpoints;
after a boot (journal replay from the last mark) every acknowledged entry reads back.
"""

from __future__ import annotations

import collections
import os
import random
from pathlib import Path
from typing import Any

import pytest

from zbk.actors.entrylogger import EntryLoggerCore
from zbk.actors.indexsyncer import IndexCore
from zbk.actors.journal import JournalCore
from zbk.actors.messages import Checkpoint
from zbk.actors.server import LedgerState, ServerCore
from zbk.storage.entrylog import EntryLogWriter
from zbk.storage.index import PAGE_BYTES
from zbk.storage.journal import JournalWriter
from zbk.storage.ledgercache import LedgerCache
from zbk.storage.markers import write_last_marks
from zbk.wire import messages as w
from zbk.wire.codec import decode_response, encode
from zbk.wire.status import Status

from .test_gc import DISK, MK, T0, PipeOutbox, _unchanged, blob
from .test_gc import boot as gc_boot

LEDGERS = range(1, 121)
CACHE_BYTES = 8 * PAGE_BYTES  # far fewer pages than ledgers: most puts find no page cached


def boot(root: Path) -> tuple[EntryLogWriter, LedgerCache, JournalWriter]:
    """The storage half of Bookie.boot (tests/actors/test_gc.py's), with a small cache."""
    return gc_boot(root, log_bytes=256 * 1024, write_buffer_bytes=4096, cache_bytes=CACHE_BYTES)


class Sim:
    def __init__(self, root: Path, rng: random.Random, acked: set[tuple[int, int]]) -> None:
        self.rng, self.acked = rng, acked
        self.now = T0
        self.logs, self.cache, self.journal = boot(root)
        xdir = str(root / "index")
        self.replies: list[Any] = []
        states = {lid: LedgerState(master_key=self.cache.get_master_key(lid)) for lid in self.cache.ledgers()}
        self.pipes: dict[tuple[str, str], collections.deque[tuple[Any, bytes]]] = collections.defaultdict(
            collections.deque)
        self.server = ServerCore(ledgers=states, journal_write_data=True, max_frame_bytes=1 << 24,
                                 reply=lambda _i, frames: self.replies.append(decode_response(frames)),
                                 outbox=PipeOutbox(self.pipes, "server"))
        self.jcore = JournalCore(self.journal, outbox=PipeOutbox(self.pipes, "journal"), sync_data=False,
                                 group_bytes_max=1 << 20, group_wait_s=0.002)
        self.index = IndexCore(self.cache, outbox=PipeOutbox(self.pipes, "index"), flush_interval_s=0.05,
                               persist_marks=lambda marks: write_last_marks(xdir, marks, disk=DISK))
        self.cores: dict[str, Any] = {"server": self.server, "journal": self.jcore, "index": self.index,
                                      "entrylogger": EntryLoggerCore(self.logs,
                                                                     outbox=PipeOutbox(self.pipes, "entrylogger"))}
        self.next_tick = {n: T0 + c.tick_interval_s for n, c in self.cores.items() if c.tick_interval_s}
        self.pending: dict[int, list[tuple[int, list[int]]]] = {}
        self.rid = 0
        self.steps = 0
        self.delta_puts_seen = 0  # index messages delivered while the cache held deltas
        self.delta_checkpoints = 0  # checkpoints that started with deltas to write

    def multi_add(self, next_eid: dict[int, int]) -> None:
        self.rid += 1
        parts, shape = [], []
        for lid in sorted(self.rng.sample(list(LEDGERS), self.rng.randrange(20, len(LEDGERS)))):
            eids = list(range(next_eid[lid], next_eid[lid] + self.rng.randrange(1, 3)))
            next_eid[lid] = eids[-1] + 1
            parts.append(w.AddRequest(rid=0, ledger_id=lid, master_key=MK, flags=w.AddFlag(0),
                                      entries=[blob(lid, e) for e in eids]))
            shape.append((lid, eids))
        self.pending[self.rid] = shape
        self.server.on_request(b"client", encode(w.MultiAddRequest(rid=self.rid, parts=parts)), self.now)

    def step(self) -> None:
        self.steps += 1
        idle = not self.jcore.pending and not any(self.pipes.values())
        self.now = max(self.now + 0.001, min(self.next_tick.values())) if idle else self.now + 0.001
        for name, at in self.next_tick.items():
            if self.now >= at:
                self.cores[name].on_tick(self.now)
                self.next_tick[name] = self.now + self.cores[name].tick_interval_s
        ready = [key for key, q in self.pipes.items() if q]
        if ready:
            key = self.rng.choice(ready)
            msg, snapshot = self.pipes[key].popleft()
            _unchanged(msg, snapshot)
            if key[1] == "index" and self.cache._deltas:
                self.delta_puts_seen += 1
                self.delta_checkpoints += isinstance(msg, Checkpoint)
            self.cores[key[1]].on_message(msg, self.now)
        if self.jcore.pending and self.rng.random() < 0.3:  # the journal loop commits after a drain
            self.jcore.commit()
        for resp in self.replies:
            assert isinstance(resp, w.MultiAddResponse), resp
            shape = self.pending.pop(resp.rid)
            assert list(resp.statuses) == [Status.EOK] * len(shape), resp
            self.acked.update((lid, e) for lid, eids in shape for e in eids)
        self.replies.clear()

    def settle(self) -> None:
        for _ in range(50_000):
            if (not self.pending and not any(self.pipes.values()) and not self.jcore.pending
                    and not self.server.held_puts):  # the Server's tick sends the index updates it holds
                return
            self.step()
        raise AssertionError("the cores did not settle")

    def verify(self) -> int:
        for lid, eid in sorted(self.acked):
            loc = self.cache.get(lid, eid)
            assert loc is not None, f"entry {lid}:{eid} lost"
            assert self.logs.read(loc, lid, eid) == blob(lid, eid), f"entry {lid}:{eid} wrong bytes"
        return len(self.acked)


def _run(sim: Sim, next_eid: dict[int, int], requests: int, crash_at: int | None) -> bool:
    """``requests`` MULTI_ADDs, a few in flight at a time, with deliveries in between; True
    when it 'crashed' (stopped dead) at step ``crash_at``."""
    for _ in range(requests):
        sim.multi_add(next_eid)
        for _ in range(sim.rng.randrange(0, 40)):
            if crash_at is not None and sim.steps >= crash_at:
                return True
            sim.step()
        while len(sim.pending) > 3:
            if crash_at is not None and sim.steps >= crash_at:
                return True
            sim.step()
    sim.settle()
    return False


def _seed(index: int) -> int:
    env = os.environ.get("ZBK_SEED")
    return int(env) if env else 6007 * index + 11


def test_sim_multi_add_over_many_ledgers_writes_deltas_and_reads_back(tmp_path: Path) -> None:
    seed = _seed(0)
    print(f"ZBK_SEED={seed}")
    acked: set[tuple[int, int]] = set()
    next_eid = dict.fromkeys(LEDGERS, 0)
    sim = Sim(tmp_path, random.Random(seed), acked)
    assert not _run(sim, next_eid, 40, None)
    assert sim.delta_puts_seen > 0 and sim.delta_checkpoints > 0, "no checkpoint wrote deltas"
    assert sim.verify() > 1000
    rebooted = Sim(tmp_path, random.Random(seed + 1), acked)  # a clean restart: nothing cached
    assert rebooted.verify() == len(acked)
    assert not _run(rebooted, next_eid, 10, None)
    assert rebooted.delta_checkpoints > 0
    assert rebooted.verify() == len(acked)


@pytest.mark.parametrize("index", range(6))
def test_sim_kill9_at_a_random_step_loses_no_acknowledged_entry(tmp_path: Path, index: int) -> None:
    seed = _seed(100 + index)
    print(f"ZBK_SEED={seed}")
    rng = random.Random(seed)
    acked: set[tuple[int, int]] = set()
    next_eid = dict.fromkeys(LEDGERS, 0)
    root = tmp_path / "b"
    sim = Sim(root, random.Random(seed), acked)
    assert not _run(sim, next_eid, 8, None)  # every ledger's index file exists
    for crash in range(3):  # kill -9, boot, more adds (now deltas from the start), kill -9 again
        crashed = _run(sim, next_eid, 500, crash_at=sim.steps + rng.randrange(50, 1500))
        assert crashed, "the run ended before its crash point"
        sim = Sim(root, random.Random(seed + crash + 1), acked)
        sim.verify()
    assert not _run(sim, next_eid, 5, None)
    assert sim.verify() == len(acked) > 0


# -- a real bookie process: checkpoints with deltas, kill -9, every acknowledged entry back ---


def test_real_bookie_kill9_after_checkpoints_that_wrote_deltas_loses_no_acknowledged_entry(bookies) -> None:
    """400 ledgers and an index cache of 64 pages: after the checkpoint that created their
    index files most pages are evicted, so the next MULTI_ADDs put deltas and the next
    checkpoints write single slots in place; the journal before their marks is deleted, and
    after a kill -9 in the middle of more adds every acknowledged entry is read back."""
    from bookie.util import multi_adds_through_checkpoints_then_kill9

    bk = bookies(settings={"flush_interval_ms": 200, "journal_max_size_mb": 1,
                           "ledger_cache_bytes_max": 64 * PAGE_BYTES})
    bk.start()
    multi_adds_through_checkpoints_then_kill9(bk, list(range(2000, 2400)), rounds=5)
