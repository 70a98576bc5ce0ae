"""IndexSyncer actor: owns the ledger cache (index pages) and the per-ledger index files.

Maps (ledger, entry) to locations, flushes dirty pages lazily, and runs the checkpoint:
every flush_interval (or when the cache is over its memory bound) it asks the EntryLogger to
start one; when the Checkpoint message comes back (logs flushed up to a mark M of every
journal, see zbk/actors/messages.py for the ordering argument) it flushes the index,
persists lastMark = M (one mark per journal), and lets each journal delete its segments
before its own mark.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from zbk.actors.base import Outbox
from zbk.actors.journals import journal_names
from zbk.actors.messages import (
    Checkpoint,
    CheckpointDone,
    CompactionDurable,
    DeleteLedgers,
    DeleteLogs,
    EntryList,
    HeaderUpdate,
    IndexPressure,
    IndexPut,
    ListEntries,
    LiveCheck,
    LiveResult,
    LocalLedgers,
    LocalLedgersRequest,
    Lookup,
    Marks,
    ReadLocations,
    Relocate,
    Relocated,
    StartCheckpoint,
    TrimJournal,
)
from zbk.errors import CorruptDataError
from zbk.metrics import bookie as m
from zbk.storage.entrylog import OFFSET_BITS
from zbk.storage.ledgercache import LedgerCache

log = logging.getLogger(__name__)


class IndexCore:
    name = "index"

    def __init__(self, cache: LedgerCache, *, outbox: Outbox, flush_interval_s: float,
                 persist_marks: Callable[[Marks], None], journals: int = 1) -> None:
        self.cache = cache
        self.tick_interval_s: float | None = min(flush_interval_s, 1.0)
        self.flush_interval_s = flush_interval_s
        self.persist_marks = persist_marks  # every journal's mark, in journal order
        self.journal_names = journal_names(journals)
        self.outbox: Outbox = outbox
        self.cp_seq = 0
        self.cp_in_flight: int | None = None
        self.last_cp_at: float | None = None
        self.gc_waiting: list[int] = []  # compaction jobs waiting for an index flush
        self.pressure = False  # IndexPressure(True) sent, not yet taken back
        self.dirty_hard_bytes = 2 * cache.bytes_max

    def on_message(self, msg: Any, now: float) -> None:
        cache = self.cache
        if isinstance(msg, IndexPut):
            cache.put_many(msg.ledger_ids, msg.entry_ids, msg.locations)
            if cache.needs_flush:
                self.start_checkpoint(now)
                if not self.pressure and cache.dirty_bytes >= self.dirty_hard_bytes:
                    self._set_pressure(True)
        elif isinstance(msg, Lookup):
            self._lookup(msg)
        elif isinstance(msg, HeaderUpdate):
            self._header(msg)
        elif isinstance(msg, ListEntries):
            known = cache.exists(msg.ledger_id)
            try:
                ranges = cache.entry_ids(msg.ledger_id) if known else []
                error = ""
            except CorruptDataError as e:
                log.error("index: listing ledger %d failed: %s", msg.ledger_id, e)
                ranges, error = [], str(e)
            self.outbox.send("server", EntryList(msg.ctx, msg.ledger_id, ranges, known, error))
        elif isinstance(msg, Checkpoint):
            self._finish_checkpoint(msg, now)
        elif isinstance(msg, DeleteLedgers):
            for lid in msg.ledger_ids:
                cache.delete_ledger(lid)
        elif isinstance(msg, (LocalLedgersRequest, LiveCheck, Relocate, DeleteLogs)):
            self._on_gc(msg, now)
        else:
            raise AssertionError(f"index: unexpected message {msg!r}")

    def _lookup(self, msg: Lookup) -> None:
        lid, first = msg.ledger_id, msg.first_entry_id
        entry_ids: list[int] | None = None
        try:
            found = self.cache.get_range(lid, first, msg.count)  # a page at a time
        except CorruptDataError:
            self._lookup_one_by_one(msg)  # finds the damaged slot and what precedes it
            return
        if msg.sparse:
            ids = _looked_up(msg)
            found = found[ids.start - first::ids.step]
            entry_ids = [eid for eid, loc in zip(ids, found, strict=True) if loc is not None]
            found = [loc for loc in found if loc is not None]
        elif None in found:
            found = found[:found.index(None)]
        locations: list[int] = found  # type: ignore[assignment]  # no None left
        known = bool(locations) or self.cache.exists(lid)
        self.outbox.send("entrylogger", ReadLocations(msg.ctx, lid, first, locations, known, msg.bytes_max,
                                                      entry_ids=entry_ids))

    def _lookup_one_by_one(self, msg: Lookup) -> None:
        """The lookup of a range with a damaged index slot: the entries before it, then EIO."""
        get, lid = self.cache.get, msg.ledger_id
        locations: list[int] = []
        entry_ids: list[int] = []
        error = ""
        for eid in _looked_up(msg):
            try:
                loc = get(lid, eid)
            except CorruptDataError as e:
                # A damaged index page answers EIO for this read (the client reads another
                # replica; the auditor's check repairs this one), never stops the bookie.
                log.error("index: lookup of ledger %d entry %d failed: %s", lid, eid, e)
                error = str(e)
                break
            if loc is None:
                if msg.sparse:
                    continue
                break
            locations.append(loc)
            entry_ids.append(eid)
        known = bool(locations) or bool(error) or self.cache.exists(lid)
        self.outbox.send("entrylogger", ReadLocations(msg.ctx, lid, msg.first_entry_id, locations,
                                                      known, msg.bytes_max, error,
                                                      entry_ids=entry_ids if msg.sparse else None))

    def _header(self, msg: HeaderUpdate) -> None:
        c, lid = self.cache, msg.ledger_id
        if msg.master_key is not None:
            c.set_master_key(lid, msg.master_key)
        if msg.fenced is not None:
            c.set_fenced(lid, msg.fenced)
        if msg.limbo is not None:
            c.set_limbo(lid, msg.limbo)
        if msg.explicit_lac is not None:
            c.set_explicit_lac(lid, msg.explicit_lac)

    def start_checkpoint(self, now: float) -> None:
        if self.cp_in_flight is not None:
            return
        self.cp_seq += 1
        self.cp_in_flight = self.cp_seq
        self.outbox.send("entrylogger", StartCheckpoint(self.cp_seq))

    def _finish_checkpoint(self, msg: Checkpoint, now: float) -> None:
        written = self.cache.flush()
        assert len(msg.marks) == len(self.journal_names), "a checkpoint holds a mark of every journal"
        self.persist_marks(msg.marks)
        for name, mark in zip(self.journal_names, msg.marks, strict=True):
            self.outbox.send(name, TrimJournal(mark))
        self.outbox.send("server", CheckpointDone(msg.cp_id, msg.marks, written))
        m.CHECKPOINTS_TOTAL.inc()
        self.cp_in_flight = None
        self.last_cp_at = now
        if self.pressure and self.cache.dirty_bytes < self.cache.bytes_max:
            self._set_pressure(False)
        elif self.cache.needs_flush:  # index puts queued during the flush: at once again
            self.start_checkpoint(now)
        self._gc_index_flushed()

    def _set_pressure(self, on: bool) -> None:
        self.pressure = on
        log.log(logging.WARNING if on else logging.INFO,
                "index: %d MiB of dirty index pages: %s new adds", self.cache.dirty_bytes >> 20,
                "holding" if on else "resuming")
        self.outbox.send("server", IndexPressure(on))

    # -- garbage collection (zbk/actors/gc.py has the protocol and why it is safe) ------------
    def _on_gc(self, msg: Any, now: float) -> None:
        if isinstance(msg, LocalLedgersRequest):
            self.outbox.send("gc", LocalLedgers(msg.ctx, self.cache.ledgers()))
        elif isinstance(msg, LiveCheck):
            self._live_check(msg)
        elif isinstance(msg, Relocate):
            self._relocate(msg, now)
        else:
            # On to the EntryLogger behind every ReadLocations sent so far, so no read of a
            # location in these logs arrives after they are gone.
            self.outbox.send("entrylogger", msg)

    def _live_check(self, msg: LiveCheck) -> None:
        get = self.cache.get
        try:
            live = [get(lid, eid) == loc for lid, eid, loc in msg.entries]
        except CorruptDataError as e:
            # Keep the log: a damaged slot is an operator's problem, not something to copy around.
            self.outbox.send("entrylogger", LiveResult(msg.job, [], error=str(e)))
            return
        self.outbox.send("entrylogger", LiveResult(msg.job, live))

    def _relocate(self, msg: Relocate, now: float) -> None:
        """Conditional puts: a slot moves to the copy only if it still holds the old location."""
        cache = self.cache
        applied = 0
        rejected: list[tuple[int, int, int]] = []
        for lid, eid, old, new, size in msg.moves:
            try:
                current = cache.get(lid, eid)
            except CorruptDataError:
                current = None
            if current == old:
                cache.put(lid, eid, new)
                applied += 1
            else:  # re-added or deleted meanwhile: the copy is garbage
                rejected.append((new >> OFFSET_BITS, lid, size))
        if msg.last:
            # The old log may go once an index flush that starts after this point has ended.
            self.gc_waiting.append(msg.job)
            self.start_checkpoint(now)
        elif cache.needs_flush:
            self.start_checkpoint(now)
        self.outbox.send("gc", Relocated(msg.job, applied, rejected, msg.scanned_bytes, msg.copied_bytes,
                                         msg.last, msg.error))

    def _gc_index_flushed(self) -> None:
        """Called after every completed checkpoint: its index flush ran after every Relocate
        received before it, so the waiting compactions are durable."""
        for job in self.gc_waiting:
            self.outbox.send("gc", CompactionDurable(job))
        self.gc_waiting.clear()

    def on_tick(self, now: float) -> None:
        if self.last_cp_at is None:
            self.last_cp_at = now
        if now - self.last_cp_at >= self.flush_interval_s or self.cache.needs_flush:
            self.start_checkpoint(now)


def _looked_up(msg: Lookup) -> range:
    """The entry ids a lookup covers: its range, or only the ids of its stripe in the range."""
    first, end = msg.first_entry_id, msg.first_entry_id + msg.count
    if msg.stripe is None:
        return range(first, end)
    modulus, residue = msg.stripe
    return range(first + (residue - first) % modulus, end, modulus)
