"""zbk.storage: the bookie's on-disk formats, as plain synchronous single-owner classes.

Each format is documented in its module's docstring; docs/storage.md ties them together
(checkpoint protocol, crash recovery).

* :mod:`~zbk.storage.journal`: write-ahead log segments, group commit, replay.
* :mod:`~zbk.storage.entrylog`: entry log files (interleaved, or one per ledger: BP-32).
* :mod:`~zbk.storage.index` and :mod:`~zbk.storage.ledgercache`: per-ledger index files
  and the in-memory page cache over them.
* :mod:`~zbk.storage.cookie`, :mod:`~zbk.storage.markers`: cookie, dirty marker, last marks.
* :mod:`~zbk.storage.disk`: the Disk protocol (fsync, atomic replace) and a faulty fake.
"""

from zbk.storage.cookie import Cookie, read_cookie, verify_cookies, write_cookie, write_cookies
from zbk.storage.disk import REAL_DISK, Disk, FaultyDisk, RealDisk
from zbk.storage.entrylog import EntryLogWriter, make_location, split_location
from zbk.storage.index import IndexHeader
from zbk.storage.journal import START, JournalRecord, JournalWriter, LogMark, RecordType, replay
from zbk.storage.ledgercache import LedgerCache
from zbk.storage.markers import (
    clear_dirty,
    mark_dirty,
    read_last_mark,
    read_last_marks,
    was_dirty,
    write_last_mark,
    write_last_marks,
)

__all__ = [
    "REAL_DISK", "START", "Cookie", "Disk", "EntryLogWriter", "FaultyDisk", "IndexHeader",
    "JournalRecord", "JournalWriter", "LedgerCache", "LogMark", "RealDisk", "RecordType",
    "clear_dirty", "make_location", "mark_dirty", "read_cookie", "read_last_mark", "read_last_marks", "replay",
    "split_location", "verify_cookies", "was_dirty", "write_cookie", "write_cookies", "write_last_mark",
    "write_last_marks",
]
