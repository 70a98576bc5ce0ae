"""The checkpoint protocol and crash recovery of docs/storage.md, end to end over the formats.

A tiny single-threaded "bookie" drives the journal, entry logs and ledger cache the way the
actors will: add = entry log append + index put, then a journal record; acknowledge after
the journal sync; checkpoint = flush entry logs, flush index, persist the mark, delete old
journal segments. A crash abandons every object without closing it (kill -9: the page cache
survives, process memory does not). After each boot, every acknowledged entry must read back
and every acknowledged fence must hold.
"""

from __future__ import annotations

import random

from zbk.storage.entrylog import EntryLogWriter
from zbk.storage.journal import JournalWriter, RecordType, replay
from zbk.storage.ledgercache import LedgerCache
from zbk.storage.markers import clear_dirty, mark_dirty, read_last_mark, was_dirty, write_last_mark


class MiniBookie:
    def __init__(self, root: str) -> None:
        self.jdir, self.ldir, self.xdir = f"{root}/journal", f"{root}/ledgers", f"{root}/index"
        self.entries = EntryLogWriter([self.ldir], 64 * 1024, 4096)
        self.cache = LedgerCache([self.xdir], 8 * 16 * 1024)
        self.unclean = was_dirty(self.xdir)
        mark_dirty(self.xdir)
        self.replayed = self._replay()
        self.journal = JournalWriter(self.jdir, 16 * 1024)

    def _replay(self) -> int:
        n = 0
        for rec, _ in replay(self.jdir, read_last_mark(self.xdir)):
            n += 1
            if rec.type == RecordType.ADD:
                location = self.entries.append(rec.ledger_id, rec.entry_id, rec.payload)
                self.cache.put(rec.ledger_id, rec.entry_id, location)
            elif rec.type == RecordType.FENCE:
                self.cache.set_fenced(rec.ledger_id)
            elif rec.type == RecordType.MASTER_KEY:
                self.cache.set_master_key(rec.ledger_id, rec.payload)
        return n

    def add(self, ledger_id: int, entry_id: int, blob: bytes) -> None:
        location = self.entries.append(ledger_id, entry_id, blob)
        self.cache.put(ledger_id, entry_id, location)
        self.journal.append(RecordType.ADD, ledger_id, entry_id, blob)

    def fence(self, ledger_id: int) -> None:
        self.cache.set_fenced(ledger_id)
        self.journal.append(RecordType.FENCE, ledger_id)

    def read(self, ledger_id: int, entry_id: int) -> bytes | None:
        location = self.cache.get(ledger_id, entry_id)
        return None if location is None else self.entries.read(location, ledger_id, entry_id)

    def checkpoint(self) -> None:
        mark = self.journal.synced_mark  # everything before it is in entry logs and cache memory
        self.entries.flush()
        self.cache.flush()
        write_last_mark(self.xdir, mark)
        self.journal.delete_segments_before(mark)

    def shutdown(self) -> None:
        self.journal.sync()
        self.checkpoint()
        self.journal.close()
        self.entries.close()
        self.cache.close()
        clear_dirty(self.xdir)


def test_acknowledged_entries_and_fences_survive_crashes(tmp_path, rng: random.Random):
    root = str(tmp_path)
    bookie = MiniBookie(root)
    acked: dict[tuple[int, int], bytes] = {}
    unacked: dict[tuple[int, int], bytes] = {}
    fenced: set[int] = set()
    next_entry: dict[int, int] = {}
    crashes = 0
    for _ in range(3000):
        op = rng.random()
        if op < 0.80:
            ledger_id = rng.randrange(1, 6)
            entry_id = next_entry.get(ledger_id, 0)
            next_entry[ledger_id] = entry_id + 1
            blob = rng.randbytes(rng.randrange(1, 400))
            bookie.add(ledger_id, entry_id, blob)
            unacked[(ledger_id, entry_id)] = blob
        elif op < 0.83:
            ledger_id = rng.randrange(1, 6)
            bookie.fence(ledger_id)
            bookie.journal.sync()
            fenced.add(ledger_id)
            acked.update(unacked)
            unacked.clear()
        elif op < 0.93:
            bookie.journal.sync()  # everything appended so far is now acknowledged
            acked.update(unacked)
            unacked.clear()
        elif op < 0.985:
            bookie.checkpoint()
        else:
            crashes += 1  # kill -9: nothing is closed, buffers in memory are lost
            bookie = MiniBookie(root)
            assert bookie.unclean
            _check(bookie, acked, fenced)
            unacked.clear()
            next_entry = {lid: bookie.cache.last_entry_id(lid) + 1 for lid in range(1, 6)}
            _adopt_survivors(bookie, next_entry, acked)
    bookie.shutdown()
    bookie = MiniBookie(root)
    assert not bookie.unclean and bookie.replayed == 0
    _check(bookie, acked, fenced)
    assert crashes > 5


def _adopt_survivors(bookie: MiniBookie, next_entry: dict[int, int],
                     acked: dict[tuple[int, int], bytes]) -> None:
    """An unacknowledged entry may survive a crash (a checkpoint flushed it); then it must stay."""
    for lid, n in next_entry.items():
        for eid in range(n):
            survivor = bookie.read(lid, eid)
            if (lid, eid) not in acked and survivor is not None:
                acked[(lid, eid)] = survivor


def _check(bookie: MiniBookie, acked: dict[tuple[int, int], bytes], fenced: set[int]) -> None:
    for (lid, eid), blob in acked.items():
        assert bookie.read(lid, eid) == blob, f"acknowledged entry {lid}:{eid} lost"
    for lid in fenced:
        assert bookie.cache.is_fenced(lid), f"acknowledged fence of ledger {lid} lost"
