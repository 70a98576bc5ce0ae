"""JournalWriter actor: appends records, group-commits them, acknowledges after fsync.

Group commit: the loop drains every message that is ready, then the core writes all
buffered records with one write() and one fsync() and acknowledges every batch in them.
Under load, messages pile up while an fsync runs, so the next commit carries them all; when
idle, a lone record is synced at once (no timer wait). While messages keep arriving
faster than they can be drained, the drain stops and a commit happens as soon as the
buffered bytes reach journal_buffered_writes_threshold_bytes or the oldest buffered record
has waited journal_max_group_wait_ms.

A bookie runs one of these per journal directory (zbk/actors/journals.py): each owns its
writer and its group commit, and its metrics carry its index as the ``journal`` label.
"""

from __future__ import annotations

import logging
from typing import Any

from zbk.actors.base import Outbox
from zbk.actors.journals import journal_name
from zbk.actors.messages import (
    ForceJournal,
    JournalAppend,
    JournalMeta,
    Mark,
    MarkRequest,
    Synced,
    TrimJournal,
)
from zbk.metrics import bookie as m
from zbk.storage.journal import JournalWriter, LogMark, RecordType

log = logging.getLogger(__name__)


class JournalCore:
    tick_interval_s: float | None = None

    def __init__(self, writer: JournalWriter, *, outbox: Outbox, sync_data: bool, group_bytes_max: int,
                 group_wait_s: float, index: int = 0, journals: int = 1) -> None:
        self.name = journal_name(index, journals)
        self.index = index
        self.writer = writer
        label = str(index)
        self.m_fsync_seconds = m.JOURNAL_FSYNC_SECONDS.labels(label)
        self.m_group_entries = m.JOURNAL_GROUP_COMMIT_ENTRIES.labels(label)
        self.m_queue_depth = m.JOURNAL_QUEUE_DEPTH.labels(label)
        self.sync_data = sync_data
        self.group_bytes_max = group_bytes_max
        self.group_wait_s = group_wait_s
        self.pending: list[int] = []
        self.pending_entries = 0
        self.oldest_pending_at: float | None = None
        self.mark_waiters: list[int] = []
        self.outbox: Outbox = outbox

    def on_message(self, msg: Any, now: float) -> None:
        if isinstance(msg, JournalAppend):
            self.writer.append_records(msg.records, msg.count)
            self.pending_entries += msg.count
            self._pend(msg.batch_id, now)
        elif isinstance(msg, JournalMeta):
            for rtype, lid, value, payload in msg.records:
                self.writer.append(RecordType(rtype), lid, value, payload)
            self._pend(msg.batch_id, now)
        elif isinstance(msg, ForceJournal):
            self._pend(msg.batch_id, now)
        elif isinstance(msg, MarkRequest):
            # The mark must follow every record received so far: commit first.
            self.commit()
            self.outbox.send("entrylogger", Mark(msg.cp_id, tuple(self.writer.mark), self.index))  # type: ignore[arg-type]
        elif isinstance(msg, TrimJournal):
            retired = self.writer.delete_segments_before(LogMark(*msg.mark))
            if retired:
                log.info("%s: retired %d segment(s) before checkpoint mark %s (%d kept for reuse)",
                         self.name, len(retired), msg.mark, self.writer.free_segments)
        else:
            raise AssertionError(f"{self.name}: unexpected message {msg!r}")

    def _pend(self, batch_id: int, now: float) -> None:
        if not self.pending:
            self.oldest_pending_at = now
        self.pending.append(batch_id)
        self.m_queue_depth.set(len(self.pending))

    def must_commit_now(self, now: float) -> bool:
        """True when the drain should stop and commit even though more may be waiting."""
        if not self.pending:
            return False
        if self.writer.pending_bytes >= self.group_bytes_max:
            return True
        return self.oldest_pending_at is not None and now - self.oldest_pending_at >= self.group_wait_s

    def commit(self) -> None:
        """One write + one fsync for everything buffered; then acknowledge every batch."""
        if not self.pending and not self.writer.pending_bytes:
            return
        with self.m_fsync_seconds.time():
            self.writer.sync(fsync=self.sync_data)
        self.m_group_entries.observe(self.pending_entries)
        batches, self.pending, self.pending_entries = self.pending, [], 0
        self.oldest_pending_at = None
        self.m_queue_depth.set(0)
        if batches:
            self.outbox.send("server", Synced(batches))
        # After the acknowledgement, not before: zeros for the next commits to write into.
        self.writer.preallocate()

    def on_tick(self, now: float) -> None:
        pass
