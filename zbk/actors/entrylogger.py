"""EntryLogger actor: owns the entry log files. Appends batches and returns locations,
serves reads by location, flushes logs for checkpoints, rotates per-ledger logs on
WRITE_CLOSE (BP-32), reports usage to the garbage collector."""

from __future__ import annotations

import errno
import logging
from typing import Any

from zbk.actors.base import Outbox
from zbk.actors.messages import (
    AppendBatch,
    Appended,
    CheckpointReady,
    JournalAppend,
    Mark,
    MarkRequest,
    ReadLocations,
    ReadResult,
    StartCheckpoint,
    UsageReport,
    UsageRequest,
    WriteClose,
)
from zbk.errors import CorruptDataError
from zbk.metrics import bookie as m
from zbk.storage.entrylog import EntryLogWriter

log = logging.getLogger(__name__)


class EntryLoggerCore:
    name = "entrylogger"

    def __init__(self, logs: EntryLogWriter, *, tick_interval_s: float = 1.0) -> None:
        self.logs = logs
        self.tick_interval_s: float | None = tick_interval_s
        self.outbox: Outbox | None = None

    def on_message(self, msg: Any, now: float) -> None:
        assert self.outbox is not None
        if isinstance(msg, AppendBatch):
            self._append(msg)
        elif isinstance(msg, ReadLocations):
            self._read(msg)
        elif isinstance(msg, StartCheckpoint):
            self.outbox.send("journal", MarkRequest(msg.cp_id))
        elif isinstance(msg, Mark):
            # Every entry whose journal record precedes the mark was appended before the
            # record was sent: make those entries durable in the logs, then let the index go.
            self.logs.flush()
            self.outbox.send("server", CheckpointReady(msg.cp_id, msg.mark))
        elif isinstance(msg, WriteClose):
            self.logs.write_close(msg.ledger_id)
        elif isinstance(msg, UsageRequest):
            self.outbox.send("gc", UsageReport(msg.ctx, self.logs.usage()))
        else:
            raise AssertionError(f"entrylogger: unexpected message {msg!r}")

    def _append(self, msg: AppendBatch) -> None:
        assert self.outbox is not None
        lid, append = msg.ledger_id, self.logs.append
        locations: list[int] = []
        try:
            for eid, blob in zip(msg.entry_ids, msg.blobs, strict=True):
                locations.append(append(lid, eid, blob))
        except OSError as e:
            # A failed append is reported, never half-acknowledged: the Server answers the
            # whole batch with an error (and turns read-only on ENOSPC).
            log.error("entrylogger: append to ledger %d failed: %s", lid, e)
            self.outbox.send("server", Appended(msg.batch_id, lid, msg.entry_ids, [], error=str(e),
                                                no_space=e.errno == errno.ENOSPC))
            return
        m.ENTRYLOG_BYTES_WRITTEN.inc(sum(len(b) for b in msg.blobs))
        self.outbox.send("server", Appended(msg.batch_id, lid, msg.entry_ids, locations))
        if msg.journal:
            self.outbox.send("journal", JournalAppend(msg.batch_id, lid, msg.entry_ids, msg.blobs))

    def _read(self, msg: ReadLocations) -> None:
        assert self.outbox is not None
        blobs: list[bytes] = []
        size = 0
        error = ""
        for loc in msg.locations:
            try:
                blob = self.logs.read(loc)
            except (CorruptDataError, OSError) as e:
                # Never serve bad bytes: stop at the corrupt entry and say so.
                log.error("entrylogger: read of ledger %d failed: %s", msg.ledger_id, e)
                error = str(e)
                break
            if blobs and size + len(blob) > msg.bytes_max:
                break
            blobs.append(blob)
            size += len(blob)
        self.outbox.send("server", ReadResult(msg.ctx, msg.ledger_id, blobs, msg.ledger_known, error))

    def on_tick(self, now: float) -> None:
        self.logs.maintain(now)
