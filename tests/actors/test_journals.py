"""Parallel journals inside the bookie: ledgers assigned to journals by id, batches split per
journal and acknowledged once every journal they touched synced, checkpoints that collect
and persist every journal's mark, and (a bookie of two journals under the actor simulation,
tests/helpers/actorsim.py) kill -9 at random steps losing no acknowledged entry after a
replay of both journals."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest
from helpers.actorsim import MK, T0, BookieSettings, Sim, SimDisk, blob, journal_dirs, storage_dirs

from zbk.actors.base import ListOutbox
from zbk.actors.entrylogger import EntryLoggerCore
from zbk.actors.indexsyncer import IndexCore
from zbk.actors.journal import JournalCore
from zbk.actors.journals import (
    journal_index,
    journal_name,
    journal_names,
    journal_of_actor,
    journals_touched,
    split_by_journal,
)
from zbk.actors.messages import (
    AppendBatch,
    Appended,
    Checkpoint,
    CheckpointDone,
    CheckpointReady,
    ForceJournal,
    JournalAppend,
    JournalMeta,
    Mark,
    MarkRequest,
    StartCheckpoint,
    Synced,
    TrimJournal,
)
from zbk.actors.server import LedgerState, ServerCore
from zbk.storage.entrylogformat import _records as entry_records
from zbk.storage.entrylogformat import encode_records
from zbk.storage.journal import JournalWriter, RecordType, list_segments, replay
from zbk.storage.ledgercache import LedgerCache
from zbk.storage.markers import read_last_mark
from zbk.wire import messages as w
from zbk.wire.codec import decode_response, encode
from zbk.wire.status import Status

# -- 1. the assignment ---------------------------------------------------------------------


def _entries(msg: JournalAppend) -> list[tuple[int, int, bytes]]:
    """The (ledger id, entry id, blob) of each entry record a JournalAppend carries."""
    data = bytes(msg.records)
    return [(lid, eid, bytes(b)) for lid, eid, _, b in entry_records(data, 0, len(data), strict_path="JournalAppend")]


def test_ledgers_map_to_journals_by_id_and_names_follow_the_count() -> None:
    assert [journal_index(lid, 2) for lid in range(6)] == [0, 1, 0, 1, 0, 1]
    assert [journal_index(lid, 3) for lid in (0, 4, 8, 2**63 - 1)] == [0, 1, 2, (2**63 - 1) % 3]
    assert all(journal_index(lid, 1) == 0 for lid in (0, 1, 7, 2**62))
    assert journal_names(1) == ["journal"]  # one journal keeps its historical name
    assert journal_names(3) == ["journal-0", "journal-1", "journal-2"]
    assert journal_name(1, 2) == "journal-1"
    assert [journal_of_actor(n) for n in ("journal", "journal-0", "journal-12", "server", "journalx", "journal-")] == \
        [0, 0, 12, None, None, None]


def test_a_batch_touches_and_splits_into_the_journals_of_its_ledgers() -> None:
    assert journals_touched([], 2) == 0 and journals_touched([], 1) == 0
    assert journals_touched([5, 5, 5], 1) == 1 and journals_touched([5, 6], 1) == 1
    assert journals_touched([5, 5, 5], 2) == 1
    assert journals_touched([2, 4, 6], 2) == 1  # different ledgers, one journal
    assert journals_touched([2, 3, 4], 2) == 2
    assert journals_touched([3, 2, 3], 2) == 2  # ends agree, the middle differs
    assert journals_touched([0, 1, 2, 3, 4], 3) == 3
    assert split_by_journal([4, 5, 6, 7, 4], 2) == [(0, [0, 2, 4]), (1, [1, 3])]
    assert split_by_journal([7, 9], 2) == [(1, [0, 1])]
    assert split_by_journal([5, 1, 3], 3) == [(0, [2]), (1, [1]), (2, [0])]


# -- 2. each core with two journals ---------------------------------------------------------

def _server(out: ListOutbox, replies: list[Any], **kw: Any) -> ServerCore:
    return ServerCore(ledgers={4: LedgerState(master_key=MK), 5: LedgerState(master_key=MK)}, journal_write_data=True,
                      max_frame_bytes=1 << 20, reply=lambda _i, frames: replies.append(decode_response(frames)),
                      outbox=out, journals=2, **kw)


def _add(lid: int, eids: list[int], rid: int = 1) -> w.AddRequest:
    return w.AddRequest(rid=rid, ledger_id=lid, master_key=MK, flags=w.AddFlag(0), entries=[blob(lid, e) for e in eids])


def test_an_add_and_its_new_ledgers_key_go_to_the_ledgers_journal() -> None:
    out, replies = ListOutbox(), []
    server = _server(out, replies)
    server.on_request(b"c", encode(_add(9, [0, 1])), T0)  # a new ledger of journal 1
    metas = out.take("journal-1", JournalMeta)
    assert [r[:2] for m in metas for r in m.records] == [(int(RecordType.MASTER_KEY), 9)]
    assert out.take("journal-0") == [] and out.take("journal") == []
    (batch,) = out.take("entrylogger", AppendBatch)
    server.on_message(Appended(batch.batch_id, batch.ledger_ids, batch.entry_ids, [1, 2]), T0)
    server.on_message(Synced([batch.batch_id]), T0)
    assert replies == [], "the key's record and the entries' records each get their own Synced"
    server.on_message(Synced([batch.batch_id]), T0)
    assert [(r.rid, r.status) for r in replies] == [(1, Status.EOK)]


def test_a_multi_add_across_journals_is_acknowledged_only_when_every_journal_synced() -> None:
    out, replies = ListOutbox(), []
    server = _server(out, replies)
    parts = [_add(4, [0]), _add(5, [0, 1]), _add(6, [0]), _add(7, [0])]  # 6 and 7 are new here
    server.on_request(b"c", encode(w.MultiAddRequest(rid=3, parts=parts)), T0)
    m0, m1 = out.take("journal-0", JournalMeta), out.take("journal-1", JournalMeta)
    assert [r[1] for m in m0 for r in m.records] == [6] and [r[1] for m in m1 for r in m.records] == [7]
    (batch,) = out.take("entrylogger", AppendBatch)
    assert m0[0].batch_id == m1[0].batch_id == batch.batch_id
    # The EntryLogger sends each journal the records of its own ledgers, under the batch id.
    el_out = ListOutbox()

    class Logs:  # the EntryLogWriter's append, enough for routing
        def append_batch(self, lids: list[int], eids: list[int], blobs: list[bytes]) -> tuple[list[int], bytearray]:
            return list(range(len(lids))), encode_records(lids, eids, blobs)

    EntryLoggerCore(Logs(), outbox=el_out, journals=2).on_message(batch, T0)  # type: ignore[arg-type]
    (j0,), (j1,) = el_out.take("journal-0", JournalAppend), el_out.take("journal-1", JournalAppend)
    assert _entries(j0) == [(4, 0, blob(4, 0)), (6, 0, blob(6, 0))] and j0.count == 2
    assert _entries(j1) == [(5, 0, blob(5, 0)), (5, 1, blob(5, 1)), (7, 0, blob(7, 0))] and j1.count == 3
    assert j0.batch_id == j1.batch_id == batch.batch_id
    (appended,) = el_out.take("server", Appended)
    server.on_message(appended, T0)
    for n in range(3):  # two journals' key records and two journals' entry records: 4 Synced
        server.on_message(Synced([batch.batch_id]), T0)
        assert replies == [], f"acknowledged after {n + 1} of 4 Synced"
    server.on_message(Synced([batch.batch_id]), T0)
    assert len(replies) == 1 and list(replies[0].statuses) == [Status.EOK] * 4


def test_fence_and_force_go_to_the_ledgers_journal() -> None:
    out, replies = ListOutbox(), []
    server = _server(out, replies)
    server.on_request(b"c", encode(w.ReadRequest(rid=1, ledger_id=5, first_entry_id=0, count=1,
                                                 flags=w.ReadFlag.FENCE, master_key=MK)), T0)
    (fence,) = out.take("journal-1", JournalMeta)
    assert fence.records == [(int(RecordType.FENCE), 5, -1, b"")] and out.take("journal-0") == []
    server.on_request(b"c", encode(w.ForceLedgerRequest(rid=2, ledger_id=4)), T0)
    (force,) = out.take("entrylogger", ForceJournal)
    assert force.ledger_id == 4
    el_out = ListOutbox()
    EntryLoggerCore(None, outbox=el_out, journals=2).on_message(force, T0)  # type: ignore[arg-type]
    assert el_out.take("journal-0") == [force] and el_out.sent == []


def test_a_checkpoint_waits_for_every_journals_mark_and_trims_each_at_its_own(tmp_path: Path) -> None:
    el_out = ListOutbox()

    class Logs:
        flushed = 0

        def flush(self) -> None:
            self.flushed += 1

    logs = Logs()
    el = EntryLoggerCore(logs, outbox=el_out, journals=2)  # type: ignore[arg-type]
    el.on_message(StartCheckpoint(7), T0)
    assert [(d, type(m)) for d, m in el_out.sent] == [("journal-0", MarkRequest), ("journal-1", MarkRequest)]
    el_out.sent.clear()
    # A journal's core answers with its own index.
    jw = JournalWriter(str(tmp_path / "j1"))
    j_out = ListOutbox()
    jcore = JournalCore(jw, outbox=j_out, sync_data=True, group_bytes_max=1 << 20, group_wait_s=0.01, index=1,
                        journals=2)
    assert jcore.name == "journal-1"
    jcore.on_message(MarkRequest(7), T0)
    (mark1,) = j_out.take("entrylogger", Mark)
    assert mark1.journal == 1 and mark1.mark == tuple(jw.mark)
    el.on_message(mark1, T0)
    assert el_out.sent == [] and logs.flushed == 0, "one journal's mark is not a checkpoint"
    el.on_message(Mark(7, (3, 100), 0), T0)
    assert logs.flushed == 1
    assert el_out.take("server", CheckpointReady) == [CheckpointReady(7, ((3, 100), mark1.mark))]
    persisted: list[Any] = []
    ix_out = ListOutbox()
    index = IndexCore(LedgerCache([str(tmp_path / "x")]), outbox=ix_out, flush_interval_s=60,
                      persist_marks=persisted.append, journals=2)
    index.start_checkpoint(T0)
    index.on_message(Checkpoint(index.cp_in_flight or 0, ((3, 100), mark1.mark)), T0)
    assert persisted == [((3, 100), mark1.mark)]
    assert ix_out.take("journal-0", TrimJournal) == [TrimJournal((3, 100))]
    assert ix_out.take("journal-1", TrimJournal) == [TrimJournal(mark1.mark)]
    assert ix_out.take("server", CheckpointDone)[0].marks == ((3, 100), mark1.mark)
    jw.close()


# -- 3. the cores of a bookie with two journals: seeded interleavings, kill -9 ---------------

LEDGERS = range(1, 31)
JOURNALS = 2
# Small entry logs, journal segments and a short flush interval: a run rolls files and
# checkpoints (and so trims each journal) many times. The journal acknowledges once a
# record is written: a kill -9 keeps what was written (tests/helpers/actorsim.py). Each
# journal commits rarely, so records wait long in one journal while the other's are written:
# the window in which a batch over both is half durable, which an acknowledgement must wait out.
COMMIT_PROBABILITY = 0.1
SETTINGS = BookieSettings(journals=JOURNALS, journal_sync_data=False, flush_interval_s=0.05, log_bytes=64 * 1024,
                          write_buffer_bytes=2048, journal_segment_bytes=32 * 1024, group_bytes_max=1 << 20,
                          group_wait_s=0.002, max_frame_bytes=1 << 22)


class TwoJournals:
    """A bookie of two journals under the actor simulation (tests/helpers/actorsim.py),
    sent adds of random shape; it notes the ledgers of the records each journal actor got,
    and the checkpoints that completed."""

    def __init__(self, root: Path, rng: random.Random, acked: set[tuple[int, int]], disk: SimDisk) -> None:
        self.root, self.rng, self.acked = root, rng, acked
        self.sim = Sim(root, rng, acked, settings=SETTINGS, keep_delivered=False, disk=disk,
                       commit_probability=COMMIT_PROBABILITY)
        self.checkpoints = 0
        self.routed: list[set[int]] = [set() for _ in range(JOURNALS)]
        self.sim.bookie.before_delivery = self._observe

    def _observe(self, dest: str, msg: Any) -> None:
        self.checkpoints += isinstance(msg, CheckpointDone)
        journal = journal_of_actor(dest)
        if journal is None:
            return
        if isinstance(msg, JournalAppend):
            self.routed[journal].update(lid for lid, _, _ in _entries(msg))
        elif isinstance(msg, JournalMeta):
            self.routed[journal].update(rec[1] for rec in msg.records)

    @property
    def steps(self) -> int:
        return self.sim.steps

    @property
    def pending(self) -> int:
        return len(self.sim.waiting)

    def add(self, next_eid: dict[int, int]) -> None:
        """An ADD_ENTRY to one ledger, or a MULTI_ADD over ledgers of both journals."""
        single = self.rng.random() < 0.5
        if single:
            lid = self.rng.choice(list(LEDGERS))
            eids = list(range(next_eid[lid], next_eid[lid] + self.rng.randrange(1, 4)))
            next_eid[lid] = eids[-1] + 1
            shape = [(lid, eids)]
        else:
            shape = []
            for lid in sorted(self.rng.sample(list(LEDGERS), self.rng.randrange(2, 12))):
                eids = list(range(next_eid[lid], next_eid[lid] + self.rng.randrange(1, 3)))
                next_eid[lid] = eids[-1] + 1
                shape.append((lid, eids))

        def make(rid: int) -> w.AddRequest | w.MultiAddRequest:
            if single:
                return _add(*shape[0], rid)
            return w.MultiAddRequest(rid=rid, parts=[_add(lid, eids, 0) for lid, eids in shape])

        def done(resp: Any) -> None:
            statuses = list(resp.statuses) if isinstance(resp, w.MultiAddResponse) else [resp.status]
            assert statuses == [Status.EOK] * len(shape), resp
            self.acked.update((lid, e) for lid, eids in shape for e in eids)

        self.sim.send(make, done)

    def journal_ledgers(self) -> list[set[int]]:
        """The ledgers named by the records each journal still holds (from its first segment)."""
        return [{rec.ledger_id for rec, _ in replay(d)} for d in journal_dirs(self.root, JOURNALS)]


def _run(bk: TwoJournals, next_eid: dict[int, int], requests: int, crash_at: int | None) -> bool:
    for _ in range(requests):
        bk.add(next_eid)
        for _ in range(bk.rng.randrange(0, 30)):
            if crash_at is not None and bk.steps >= crash_at:
                return True
            bk.sim.step()
        for _ in range(50_000):
            if bk.pending <= 4:
                break
            if crash_at is not None and bk.steps >= crash_at:
                return True
            bk.sim.step()
        else:
            raise AssertionError("adds in flight were never acknowledged")
    bk.sim.settle()
    return False


def _seed(index: int) -> int:
    env = os.environ.get("ZBK_SEED")
    return int(env) if env else 7919 * index + 5


def test_sim_two_journals_checkpoint_trim_and_keep_each_ledger_in_its_journal(tmp_path: Path) -> None:
    seed = _seed(0)
    print(f"ZBK_SEED={seed}")
    acked: set[tuple[int, int]] = set()
    next_eid = dict.fromkeys(LEDGERS, 0)
    disk = SimDisk()
    bk = TwoJournals(tmp_path, random.Random(seed), acked, disk)
    assert not _run(bk, next_eid, 300, None)
    assert bk.checkpoints > 3 and bk.sim.verify() > 1000
    for i, ledgers in enumerate(bk.routed):
        assert ledgers == {lid for lid in LEDGERS if journal_index(lid, JOURNALS) == i}, (i, sorted(ledgers))
    for i, ledgers in enumerate(bk.journal_ledgers()):  # what the segments kept since the last trim
        assert all(journal_index(lid, JOURNALS) == i for lid in ledgers), (i, sorted(ledgers))
    index_dir = storage_dirs(tmp_path)[1]
    for i, jdir in enumerate(journal_dirs(tmp_path, JOURNALS)):  # each journal trimmed at its own mark
        mark = read_last_mark(index_dir, journal=i)
        assert mark.segment_id > 1 and list_segments(jdir)[0] <= mark.segment_id
        assert list_segments(jdir)[0] > 1, f"journal {i} was never trimmed"
    bk.sim.crash()  # settled: nothing is in flight
    rebooted = TwoJournals(tmp_path, random.Random(seed + 1), acked, disk)
    assert rebooted.sim.verify() == len(acked)


@pytest.mark.parametrize("index", range(6))
def test_sim_kill9_at_a_random_step_loses_no_acknowledged_entry_of_either_journal(tmp_path: Path, index: int) -> None:
    seed = _seed(100 + index)
    print(f"ZBK_SEED={seed}")
    rng = random.Random(seed)
    acked: set[tuple[int, int]] = set()
    next_eid = dict.fromkeys(LEDGERS, 0)
    disk = SimDisk()
    bk = TwoJournals(tmp_path, random.Random(seed), acked, disk)
    for crash in range(3):  # kill -9 (what the journals had not written yet is lost), boot, again
        crashed = _run(bk, next_eid, 1000, crash_at=bk.steps + rng.randrange(50, 2000))
        assert crashed, "the run ended before its crash point"
        bk.sim.crash()
        bk = TwoJournals(tmp_path, random.Random(seed + crash + 1), acked, disk)
        bk.sim.verify()
    assert not _run(bk, next_eid, 5, None)
    assert bk.sim.verify() == len(acked) > 0
