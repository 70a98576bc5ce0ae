"""EntryLogger actor: owns the entry log files. Appends batches and returns locations,
serves reads by location, flushes logs for checkpoints, rotates per-ledger logs on
WRITE_CLOSE (BP-32), reports usage to the garbage collector.

Reads are served a slice at a time (``limits.entry_log_read_slice_bytes``), round robin among
the reads under way, and the loop (zbk/actors/loops.py, EntryLoggerLoop) drains its pipes
between slices: an add waits for at most one slice of a read, however large the reads
queued before it. Only appends overtake a read under way: any other message is handled once
every read received before it has been answered, so a DeleteLogs (sent by the IndexSyncer
behind every read location it handed out) still finds those reads done.

It is also where an add batch's records are handed to the journals: each ledger's to the
journal of its ledger id (zbk/actors/journals.py), a batch of several journals' ledgers as
one JournalAppend per journal. A checkpoint asks every journal for its mark and flushes the
logs once it holds them all."""

from __future__ import annotations

import errno
import logging
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from zbk import limits
from zbk.actors.base import Outbox
from zbk.actors.journals import journal_index, journal_names, journals_touched, split_by_journal
from zbk.actors.messages import (
    AppendBatch,
    Appended,
    CheckpointReady,
    CompactChunk,
    CompactLog,
    DeleteLogs,
    ForceJournal,
    JournalAppend,
    LiveCheck,
    LiveResult,
    LogsDeleted,
    LogStats,
    LogStatsRequest,
    Mark,
    MarkRequest,
    ReadLocations,
    ReadResult,
    Relocate,
    StartCheckpoint,
    WriteClose,
)
from zbk.errors import CorruptDataError, ZbkError
from zbk.metrics import bookie as m
from zbk.storage.entrylog import RECORD_HEADER_BYTES, EntryLogWriter

log = logging.getLogger(__name__)

Record = tuple[int, int, int, bytes]  # ledger id, entry id, location, blob


@dataclass(eq=False)
class _Compaction:
    """The EntryLogger's side of one GC compaction job (zbk/actors/gc.py)."""

    job: int
    log_id: int
    records: Iterator[Record]  # EntryLogWriter.scan of the log, advanced chunk by chunk
    pending: list[Record] = field(default_factory=list)  # the chunk waiting for its LiveResult
    scanned: int = 0  # record bytes of the pending chunk
    done: bool = False  # the scan reached the end of the log


@dataclass(eq=False)
class _Read:
    """A range read under way: the blobs of its first ``len(blobs)`` locations are read."""

    msg: ReadLocations
    ids: Sequence[int]
    blobs: list[bytes | memoryview] = field(default_factory=list)
    total: int = 0  # bytes in blobs
    error: str = ""


class EntryLoggerCore:
    name = "entrylogger"

    def __init__(self, logs: EntryLogWriter, *, outbox: Outbox, tick_interval_s: float = 1.0,
                 journals: int = 1) -> None:
        self.logs = logs
        self.tick_interval_s: float | None = tick_interval_s
        self.outbox: Outbox = outbox
        self.compaction: _Compaction | None = None  # GC: at most one job at a time
        self.journals = journals
        self.journal_names = journal_names(journals)
        # Checkpoint id -> the marks received so far, by journal index (see on_message, Mark).
        self.marks: dict[int, dict[int, tuple[int, int]]] = {}
        self.reads: deque[_Read] = deque()  # range reads under way, served a slice at a time
        self.read_slice_bytes = limits.entry_log_read_slice_bytes

    def on_message(self, msg: Any, now: float) -> None:
        if isinstance(msg, AppendBatch):
            self._append(msg)
            return
        if isinstance(msg, ReadLocations):
            self.reads.append(_Read(msg, msg.ids()))
            return
        self.finish_reads()  # see the module docstring: only appends overtake a read
        if isinstance(msg, StartCheckpoint):
            self.marks[msg.cp_id] = {}
            for name in self.journal_names:
                self.outbox.send(name, MarkRequest(msg.cp_id))
        elif isinstance(msg, Mark):
            got = self.marks[msg.cp_id]
            got[msg.journal] = msg.mark
            if len(got) < self.journals:
                return
            del self.marks[msg.cp_id]
            # Every entry whose journal record precedes its journal's mark was appended before
            # the record was sent: make those entries durable in the logs, then let the index go.
            self.logs.flush()
            self.outbox.send("server", CheckpointReady(msg.cp_id, tuple(got[i] for i in range(self.journals))))
        elif isinstance(msg, ForceJournal):
            if msg.flush_logs:  # journal data off: the logs are where durability comes from
                self.logs.flush()
            # Behind every earlier add record of the ledger: they all went to its journal.
            self.outbox.send(self.journal_names[journal_index(msg.ledger_id, self.journals)], msg)
        elif isinstance(msg, WriteClose):
            self.logs.write_close(msg.ledger_id)
        elif isinstance(msg, (LogStatsRequest, DeleteLogs, CompactLog, CompactChunk, LiveResult)):
            self._on_gc(msg)
        else:
            raise AssertionError(f"entrylogger: unexpected message {msg!r}")

    def _append(self, msg: AppendBatch) -> None:
        lids = msg.ledger_ids
        try:
            locations, records = self.logs.append_batch(lids, msg.entry_ids, msg.blobs)
        except OSError as e:
            # A failed append is reported, never half-acknowledged: the Server answers the
            # whole batch with an error (and turns read-only on ENOSPC).
            log.error("entrylogger: append to ledger(s) %s failed: %s", sorted(set(lids)), e)
            self.outbox.send("server", Appended(msg.batch_id, lids, msg.entry_ids, [], error=str(e),
                                                no_space=e.errno == errno.ENOSPC))
            return
        # The journal record first: its write and fsync are the longest step of an add, and
        # they run (without the GIL) while the Server and the index handle Appended.
        if msg.journal:
            self._to_journals(msg, records)
        self.outbox.send("server", Appended(msg.batch_id, lids, msg.entry_ids, locations))
        m.ENTRYLOG_BYTES_WRITTEN.inc(sum(map(len, msg.blobs)))

    def _to_journals(self, msg: AppendBatch, records: bytes | memoryview) -> None:
        """The batch's records, as the entry log holds them, to the journal of each entry's
        ledger: one JournalAppend per journal (the Server waits for as many Synced,
        zbk/actors/journals.py), which it writes as one ADDS record."""
        lids = msg.ledger_ids
        touched = journals_touched(lids, self.journals)
        if touched == 0:  # no entries (the wire admits none): no record, and no Synced expected
            return
        if touched == 1:  # an ADD_ENTRY, or ledgers of one journal
            self.outbox.send(self.journal_names[journal_index(lids[0], self.journals)],
                             JournalAppend(msg.batch_id, records, len(lids)))
            return
        starts = [0]
        for blob in msg.blobs:
            starts.append(starts[-1] + RECORD_HEADER_BYTES + len(blob))
        view = memoryview(records)
        for j, positions in split_by_journal(lids, self.journals):
            part = b"".join([view[starts[i]:starts[i + 1]] for i in positions])
            self.outbox.send(self.journal_names[j], JournalAppend(msg.batch_id, part, len(positions)))

    def serve_read_slice(self) -> None:
        """Serve one slice of the read at the head of the queue: answer it if that ends it,
        else move it to the back (round robin: a small read is not held behind a large one)."""
        r = self.reads.popleft()
        if self._read_slice(r):
            msg = r.msg
            self.outbox.send("server", ReadResult(msg.ctx, msg.ledger_id, r.blobs, msg.ledger_known, r.error))
        else:
            self.reads.append(r)

    def finish_reads(self) -> None:
        while self.reads:
            self.serve_read_slice()

    def _read_slice(self, r: _Read) -> bool:
        """Read the next slice of ``r``; True when the read is done. The slices add up to
        exactly what one read_entries call over all the locations would return: entries in
        order, up to the request's bytes_max (its first entry always), stopping before the
        first entry that cannot be served."""
        msg = r.msg
        done, budget = len(r.blobs), msg.bytes_max - r.total
        limit = min(budget, self.read_slice_bytes)
        batch = self.logs.read_entries(msg.ledger_id, r.ids[done:], msg.locations[done:], limit)
        blobs = batch.blobs
        if done and blobs and len(blobs[0]) > budget:
            return True  # read_entries takes a slice's first entry whatever its size; the request's bytes_max does not
        r.blobs += blobs
        r.total += sum(map(len, blobs))
        if batch.error is not None:
            # Never serve bad bytes: stop at the corrupt entry and say so (the error names
            # the file and the offset).
            log.error("entrylogger: read of ledger %d failed: %s", msg.ledger_id, batch.error)
            r.error = str(batch.error)
            return True
        if len(r.blobs) == len(msg.locations):
            r.error = msg.error  # every entry before the damaged index slot was sent: then EIO
            return True
        return limit == budget  # stopped short: by the request's bytes_max, or by the slice

    def on_tick(self, now: float) -> None:
        self.logs.maintain(now)

    # -- garbage collection (zbk/actors/gc.py has the protocol and why it is safe) ------------
    def _on_gc(self, msg: Any) -> None:
        if isinstance(msg, LogStatsRequest):
            logs = self.logs
            self.outbox.send("gc", LogStats(msg.ctx, logs.usage(), sorted(logs.unflushed_log_ids()),
                                            logs.least_unflushed_log_id()))
        elif isinstance(msg, DeleteLogs):
            self._delete_logs(msg)
        elif isinstance(msg, CompactLog):
            self._compact_start(msg)
        elif isinstance(msg, CompactChunk):
            self._compact_scan(msg)
        else:
            self._compact_copy(msg)

    def _delete_logs(self, msg: DeleteLogs) -> None:
        busy = self.logs.unflushed_log_ids()
        if self.compaction is not None:
            busy.add(self.compaction.log_id)
        deleted: list[int] = []
        for log_id in msg.log_ids:
            if log_id in busy:  # the GC never asks for these; refuse rather than trust it
                log.warning("entrylogger: not deleting entry log %d: still open or being compacted", log_id)
                continue
            try:
                if self.logs.delete_log(log_id):
                    deleted.append(log_id)
            except OSError as e:
                log.error("entrylogger: deleting entry log %d failed: %s", log_id, e)
        self.outbox.send("gc", LogsDeleted(msg.ctx, deleted))

    def _compact_start(self, msg: CompactLog) -> None:
        assert self.compaction is None, "the GC runs one compaction at a time"
        if msg.log_id in self.logs.unflushed_log_ids() or msg.log_id not in self.logs.log_ids():
            self._compact_end(msg.job, 0, f"entry log {msg.log_id} is not a sealed log")
            return
        self.compaction = _Compaction(msg.job, msg.log_id, self.logs.scan(msg.log_id))

    def _compact_scan(self, msg: CompactChunk) -> None:
        """Read about ``budget_bytes`` of records, then ask the index which are still live."""
        c = self._running(msg.job)
        if c is None:
            return
        try:
            while c.scanned < msg.budget_bytes:
                rec = next(c.records, None)
                if rec is None:
                    c.done = True
                    break
                c.pending.append(rec)
                c.scanned += RECORD_HEADER_BYTES + len(rec[3])
        except (CorruptDataError, OSError) as e:
            self._compact_end(c.job, c.scanned, f"scanning entry log {c.log_id} failed: {e}")
            return
        if not c.pending:
            self._compact_end(c.job, 0, "")
            return
        # Through the Server: it follows every IndexPut of these entries (zbk/actors/gc.py).
        self.outbox.send("server", LiveCheck(c.job, [(lid, eid, loc) for lid, eid, loc, _ in c.pending]))

    def _compact_copy(self, msg: LiveResult) -> None:
        """Append the live entries of the chunk, make them durable, send their relocations."""
        c = self._running(msg.job)
        if c is None:
            return
        if msg.error:
            self._compact_end(c.job, c.scanned, f"index check failed: {msg.error}")
            return
        moves: list[tuple[int, int, int, int, int]] = []
        try:
            for (lid, eid, loc, blob), live in zip(c.pending, msg.live, strict=True):
                if live:
                    moves.append((lid, eid, loc, self.logs.append(lid, eid, blob), RECORD_HEADER_BYTES + len(blob)))
            if moves:
                # fsync before the index may point at the copies: a checkpoint in flight may
                # have flushed the logs before these appends, and then flushes the index.
                self.logs.flush()
        except (OSError, ZbkError) as e:
            # Nothing was relocated to these copies: unreferenced garbage, never a lost entry.
            self._compact_end(c.job, c.scanned, f"copying from entry log {c.log_id} failed: {e}")
            return
        scanned, last = c.scanned, c.done
        c.pending, c.scanned = [], 0
        if last:
            self._close_compaction()
        self.outbox.send("server", Relocate(c.job, moves, scanned, sum(mv[4] for mv in moves), last))

    def _running(self, job: int) -> _Compaction | None:
        """The job's state, or None when it already ended (the GC sends the first chunk with
        CompactLog, before it can know that the job was refused)."""
        c = self.compaction
        if c is None or c.job != job:
            log.debug("entrylogger: ignoring a message for compaction job %d, which is not running", job)
            return None
        return c

    def _compact_end(self, job: int, scanned: int, error: str) -> None:
        """Finish the job with an empty last Relocate (the index still runs the checkpoint
        that makes earlier chunks durable); ``error`` tells the GC to keep the log."""
        self._close_compaction()
        self.outbox.send("server", Relocate(job, [], scanned, 0, True, error))

    def _close_compaction(self) -> None:
        c, self.compaction = self.compaction, None
        if c is not None and isinstance(c.records, Generator):
            c.records.close()  # closes the scan's file and mmap now, not at garbage collection
