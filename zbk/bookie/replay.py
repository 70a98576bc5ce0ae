"""Step 3 of a bookie's boot: replay every journal from its last mark, then checkpoint.

Each journal (one per directory of ``journal_dirs``) is replayed from its own last mark
(zbk/storage/markers.py) into the entry logs and the index, one journal after the other.
The order of the journals does not matter: every record of a ledger is in the journal of
its ledger id (zbk/actors/journals.py), and records of different ledgers touch different
index files and headers. (A bookie whose journal list grew moves some ledgers to the new
journal; the checkpoint at the end of this replay, before any new record is written,
puts all their old records behind the old journal's mark.)

Then a checkpoint: the entry logs and the index are flushed, and every journal's mark is
persisted at the end of what it holds, so the replayed segments can be retired.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from zbk import limits
from zbk.storage import markers
from zbk.storage.disk import REAL_DISK, Disk
from zbk.storage.entrylog import EntryLogWriter
from zbk.storage.journal import JournalWriter, LogMark, RecordType, list_segments, replay
from zbk.storage.ledgercache import LedgerCache

log = logging.getLogger("zbk.bookie.boot")


def replay_journal(directory: str, start: LogMark, logs: EntryLogWriter, cache: LedgerCache) -> tuple[int, LogMark]:
    """Apply every record of the journal in ``directory`` after ``start`` to ``logs`` and
    ``cache``. Returns (records applied, the mark after the last one)."""
    n = 0
    last = start
    # Index updates of consecutive ADD records go in batches (LedgerCache.put_many),
    # in journal order: before any other record is applied, and at most limits.replay_index_puts_max.
    lids: list[int] = []
    eids: list[int] = []
    locs: list[int] = []

    def put_pending() -> None:
        if lids:
            cache.put_many(lids, eids, locs)
            lids.clear()
            eids.clear()
            locs.clear()

    for rec, mark in replay(directory, start):
        n += 1
        last = mark
        t = rec.type
        if t == RecordType.ADD:
            lids.append(rec.ledger_id)
            eids.append(rec.entry_id)
            locs.append(logs.append(rec.ledger_id, rec.entry_id, rec.payload))
            if len(lids) >= limits.replay_index_puts_max:
                put_pending()
            continue
        put_pending()
        if t == RecordType.FENCE:
            cache.set_fenced(rec.ledger_id, True)
        elif t == RecordType.MASTER_KEY:
            cache.set_master_key(rec.ledger_id, rec.payload)
        elif t == RecordType.LIMBO:
            cache.set_limbo(rec.ledger_id, rec.entry_id == 1)
        elif t == RecordType.EXPLICIT_LAC:
            cache.set_explicit_lac(rec.ledger_id, max(rec.entry_id, cache.get_explicit_lac(rec.ledger_id)))
    put_pending()
    return n, last


def replay_journals(journal_dirs: Sequence[str], index_dir: str, logs: EntryLogWriter, cache: LedgerCache, *,
                    journal_replaced: bool = False) -> int:
    """Replay every journal from its last mark; returns the records applied in all.

    ``journal_replaced``: the cookie check fixed the cookies. A journal directory that is
    then empty while its mark points into it had its disk replaced: its records after the
    last checkpoint are gone, it starts anew, and phase one fences and limbos this bookie's
    open ledgers so that repair copies back what it lacks (BP-46)."""
    total = 0
    for j, directory in enumerate(journal_dirs):
        start = markers.read_last_mark(index_dir, journal=j)
        if journal_replaced and start.offset > 0 and not list_segments(directory):
            log.warning("journal %s is empty but the last mark is %s: journal disk replaced, starting a new "
                        "journal (records after the last checkpoint are lost here)", directory, tuple(start))
            start = LogMark(0, 0)
        n, last = replay_journal(directory, start, logs, cache)
        if n:
            log.info("journal replay: %s: %d records up to %s", directory, n, tuple(last))
        total += n
    return total


def checkpoint_after_replay(journals: Sequence[JournalWriter], index_dir: str, logs: EntryLogWriter,
                            cache: LedgerCache, disk: Disk = REAL_DISK) -> list[LogMark]:
    """Make what replay rebuilt durable, persist every journal's mark at its end, and
    retire the segments before it. Returns the marks, in journal order."""
    logs.flush()
    cache.flush()
    marks = [j.sync(fsync=True) for j in journals]
    markers.write_last_marks(index_dir, marks, disk)
    for j, mark in zip(journals, marks, strict=True):
        j.delete_segments_before(mark)
    return marks
