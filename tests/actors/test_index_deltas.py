"""Index deltas (zbk/storage/ledgerpages.py) in a whole bookie's cores.

MULTI_ADD over many ledgers whose index pages are in their files but not in the cache (a
small cache, and every boot starts with none): their puts are deltas, and checkpoints write
only the changed slots in place. The cores run under the actor simulation
(tests/helpers/actorsim.py). A kill -9 (the page cache keeps what was written, what was only
in memory is gone) lands at a random step, also in the middle of checkpoints; after a boot
(journal replay from the last mark) every acknowledged entry reads back.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from helpers.actorsim import MK, BookieSettings, Sim, blob

from zbk.actors.messages import Checkpoint
from zbk.storage.index import PAGE_BYTES
from zbk.wire import messages as w
from zbk.wire.status import Status

LEDGERS = range(1, 121)
# Far fewer index pages cached than ledgers: most puts find no page cached.
SETTINGS = BookieSettings(flush_interval_s=0.05, log_bytes=256 * 1024, write_buffer_bytes=4096,
                          cache_bytes=8 * PAGE_BYTES, group_bytes_max=1 << 20, group_wait_s=0.002,
                          max_frame_bytes=1 << 24)


class DeltaBookie:
    """A bookie under the actor simulation (tests/helpers/actorsim.py) that counts the
    index messages delivered while the cache held deltas."""

    def __init__(self, root: Path, rng: random.Random, acked: set[tuple[int, int]]) -> None:
        self.sim = Sim(root, rng, acked, settings=SETTINGS, keep_delivered=False)
        self.rng, self.acked = rng, acked
        self.cache = self.sim.cache
        self.delta_puts_seen = 0  # index messages delivered while the cache held deltas
        self.delta_checkpoints = 0  # checkpoints that started with deltas to write
        self.sim.bookie.before_delivery = self._count

    def _count(self, dest: str, msg: Any) -> None:
        if dest == "index" and self.cache._deltas:
            self.delta_puts_seen += 1
            self.delta_checkpoints += isinstance(msg, Checkpoint)

    @property
    def steps(self) -> int:
        return self.sim.steps

    @property
    def pending(self) -> dict[int, Any]:
        return self.sim.waiting

    def multi_add(self, next_eid: dict[int, int]) -> None:
        parts, shape = [], []
        for lid in sorted(self.rng.sample(list(LEDGERS), self.rng.randrange(20, len(LEDGERS)))):
            eids = list(range(next_eid[lid], next_eid[lid] + self.rng.randrange(1, 3)))
            next_eid[lid] = eids[-1] + 1
            parts.append(w.AddRequest(rid=0, ledger_id=lid, master_key=MK, flags=w.AddFlag(0),
                                      entries=[blob(lid, e) for e in eids]))
            shape.append((lid, eids))

        def done(resp: Any) -> None:
            assert isinstance(resp, w.MultiAddResponse), resp
            assert list(resp.statuses) == [Status.EOK] * len(shape), resp
            self.acked.update((lid, e) for lid, eids in shape for e in eids)

        self.sim.send(lambda rid: w.MultiAddRequest(rid=rid, parts=parts), done)

    def step(self) -> None:
        self.sim.step()

    def settle(self) -> None:
        self.sim.settle()

    def verify(self) -> int:
        return self.sim.verify()

    def crash(self) -> None:
        self.sim.crash()


def _run(sim: DeltaBookie, next_eid: dict[int, int], requests: int, crash_at: int | None) -> bool:
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
    sim = DeltaBookie(tmp_path, random.Random(seed), acked)
    assert not _run(sim, next_eid, 40, None)
    assert sim.delta_puts_seen > 0 and sim.delta_checkpoints > 0, "no checkpoint wrote deltas"
    assert sim.verify() > 1000
    sim.crash()
    rebooted = DeltaBookie(tmp_path, random.Random(seed + 1), acked)  # a restart: nothing cached
    assert rebooted.verify() == len(acked)
    assert not _run(rebooted, next_eid, 10, None)
    assert rebooted.delta_checkpoints > 0
    assert rebooted.verify() == len(acked)
    rebooted.crash()


@pytest.mark.parametrize("index", range(6))
def test_sim_kill9_at_a_random_step_loses_no_acknowledged_entry(tmp_path: Path, index: int) -> None:
    seed = _seed(100 + index)
    print(f"ZBK_SEED={seed}")
    rng = random.Random(seed)
    acked: set[tuple[int, int]] = set()
    next_eid = dict.fromkeys(LEDGERS, 0)
    root = tmp_path / "b"
    sim = DeltaBookie(root, random.Random(seed), acked)
    assert not _run(sim, next_eid, 8, None)  # every ledger's index file exists
    for crash in range(3):  # kill -9, boot, more adds (now deltas from the start), kill -9 again
        crashed = _run(sim, next_eid, 500, crash_at=sim.steps + rng.randrange(50, 1500))
        assert crashed, "the run ended before its crash point"
        sim.crash()
        sim = DeltaBookie(root, random.Random(seed + crash + 1), acked)
        sim.verify()
    assert not _run(sim, next_eid, 5, None)
    assert sim.verify() == len(acked) > 0
    sim.crash()


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
