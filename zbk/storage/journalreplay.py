"""Journal replay: every record after a LogMark, oldest first (the format is in
zbk/storage/journalformat.py).

Torn tail versus corruption (the replay rule)
    Replay reads records from the last checkpointed :class:`LogMark`. A *bad* record is a
    short header, a length outside [17, 17 + journal_record_bytes_max], a length past the
    end of the file, or a CRC mismatch. At a bad record at offset X:

    * in any segment but the last one -> :class:`CorruptDataError` (a segment is fsynced
      before the writer moves to the next one, so it can hold no torn write);
    * in the last segment, if some later valid BATCH record of this segment says
      ``synced_upto > X`` -> :class:`CorruptDataError`: X was fsynced (and possibly
      acknowledged) before that later batch was written, so this is damage, not a tear;
    * otherwise X lies in the final, never-completed write: a torn tail. The file is
      truncated at X (and fsynced) with a warning naming the file and the offset.

    Consequence: bit rot that strikes the final batch of a segment that was not closed
    cleanly is indistinguishable from a torn write and is truncated. The records lost that
    way are replicated on the ledger's other bookies, and the crash already makes the
    bookie run BP-46 phase one (fence + limbo) for every open ledger.

    A CRC-valid record of an unknown type is always :class:`CorruptDataError` (a format
    this code does not know, never skipped). A last segment shorter than its header, or
    exactly a header long with a bad header, is a segment whose creation was interrupted:
    it holds no record and is removed with a warning.
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Generator, Iterator

from crc32c import crc32c

from zbk.errors import CorruptDataError
from zbk.storage.disk import REAL_DISK, Disk, only_zeros
from zbk.storage.entrylogformat import _records as entry_records
from zbk.storage.journalformat import (
    _BATCH_BODY,
    _BODY,
    _BODY_MAX,
    _BODY_MIN,
    _KNOWN_TYPES,
    _PREFIX,
    BATCH_MAGIC,
    HEADER_BYTES,
    RECORD_HEADER_BYTES,
    START,
    JournalRecord,
    LogMark,
    RecordType,
    _header_version,
    list_segments,
    segment_name,
    segment_seed,
)

# Named as the module this code was split from: log configuration and output stay as they were.
log = logging.getLogger("zbk.storage.journal")


def replay(directory: str, from_mark: LogMark = START,
           disk: Disk = REAL_DISK) -> Iterator[tuple[JournalRecord, LogMark]]:
    """Yield every record after ``from_mark`` with the mark just after it, oldest first.

    Applies the module's torn-tail rule: a torn tail of the last segment is truncated
    (with a warning) when the iteration reaches it; damage anywhere else raises
    :class:`CorruptDataError` naming the file and offset. Run it before a
    :class:`JournalWriter` is opened on the same directory.
    """
    if not os.path.isdir(directory):
        return
    ids = [s for s in list_segments(directory) if s >= from_mark.segment_id]
    if from_mark.offset > 0 and from_mark.segment_id not in ids:
        raise CorruptDataError(f"journal segment {from_mark.segment_id} of the last mark is missing",
                               path=os.path.join(directory, segment_name(from_mark.segment_id)),
                               offset=from_mark.offset)
    for n, sid in enumerate(ids):
        if n and sid != ids[n - 1] + 1:
            raise CorruptDataError(f"journal segment {ids[n - 1] + 1} is missing",
                                   path=os.path.join(directory, segment_name(ids[n - 1] + 1)), offset=0)
        start = from_mark.offset if sid == from_mark.segment_id else HEADER_BYTES
        path = os.path.join(directory, segment_name(sid))
        yield from _replay_segment(path, sid, start, n == len(ids) - 1, disk)


def _replay_segment(path: str, sid: int, start: int, last: bool,
                    disk: Disk) -> Iterator[tuple[JournalRecord, LogMark]]:
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        version = _segment_header_usable(fd, path, sid, size, last, disk)
        if version is None:
            return
        seed = segment_seed(sid, version)
        start = max(start, HEADER_BYTES)
        if start > size:
            log.warning("journal %s: last mark offset %d is past the end (%d bytes); nothing to replay",
                        path, start, size)
            return
        zeros = False
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            bad = yield from _records(mm, path, sid, seed, start, size, version)
            if bad >= 0:
                _check_torn_tail(mm, path, sid, seed, bad, last)
                zeros = only_zeros(fd, bad, size)
        if bad >= 0:
            if zeros:
                log.info("journal %s: %d bytes of unused preallocation after offset %d; truncating",
                         path, size - bad, bad)
            else:
                log.warning("journal %s: torn tail: the records end at offset %d; the %d bytes after it are "
                            "a torn final write or a recycled segment's old records; truncating",
                            path, bad, size - bad)
            disk.truncate(fd, bad)
            disk.fsync(fd)
    finally:
        os.close(fd)


def _segment_header_usable(fd: int, path: str, sid: int, size: int, last: bool, disk: Disk) -> int | None:
    """The format version when the header is valid; None after removing a last segment
    whose creation was torn."""
    head = os.pread(fd, HEADER_BYTES, 0)
    version = _header_version(head, sid) if len(head) == HEADER_BYTES else None
    if version is not None:
        return version
    if last and size <= HEADER_BYTES:
        log.warning("journal %s: segment creation was interrupted (%d bytes); removing it", path, size)
        os.unlink(path)
        disk.fsync_dir(os.path.dirname(path))
        return None
    raise CorruptDataError("journal segment header is invalid", path=path, offset=0)


def _records(mm: mmap.mmap, path: str, sid: int, seed: int, pos: int, size: int,
             version: int) -> Generator[tuple[JournalRecord, LogMark], None, int]:
    """Yield the valid records from ``pos``, an ADD for each entry of an ADDS record;
    returns the offset of a bad record, or -1."""
    prefix, body_hdr = _PREFIX.unpack_from, _BODY.unpack_from
    while pos < size:
        if pos + RECORD_HEADER_BYTES > size:
            return pos
        length, crc = prefix(mm, pos)
        end = pos + _PREFIX.size + length
        if not _BODY_MIN <= length <= _BODY_MAX or end > size:
            return pos
        if crc32c(mm[pos + _PREFIX.size:end], seed) != crc:
            return pos
        rtype, ledger_id, entry_id = body_hdr(mm, pos + _PREFIX.size)
        if rtype not in _KNOWN_TYPES:
            raise CorruptDataError(f"journal record of unknown type {rtype}", path=path, offset=pos)
        if rtype == RecordType.BATCH:
            if ledger_id != sid or entry_id > pos:
                raise CorruptDataError("journal batch record does not belong here", path=path, offset=pos)
        elif rtype == RecordType.ADDS:
            if version < 3:
                raise CorruptDataError(f"journal ADDS record in a version {version} segment", path=path, offset=pos)
            mark, count = LogMark(sid, end), 0
            for lid, eid, _, blob in entry_records(mm, pos + RECORD_HEADER_BYTES, end, strict_path=path):
                count += 1
                yield JournalRecord(RecordType.ADD, lid, eid, blob), mark
            if count != entry_id:
                raise CorruptDataError(f"journal ADDS record holds {count} entries where it says {entry_id}",
                                       path=path, offset=pos)
        else:
            payload = mm[pos + RECORD_HEADER_BYTES:end]
            yield JournalRecord(RecordType(rtype), ledger_id, entry_id, payload), LogMark(sid, end)
        pos = end
    return -1


def _check_torn_tail(mm: mmap.mmap, path: str, sid: int, seed: int, bad: int, last: bool) -> None:
    """Raise unless the bad record at ``bad`` is a torn tail (see the module's rule)."""
    if not last:
        raise CorruptDataError("journal record is corrupt in a sealed segment", path=path, offset=bad)
    if _durable_beyond(mm, sid, seed, bad):
        raise CorruptDataError("journal record is corrupt before later durable batches", path=path,
                               offset=bad)


def _durable_beyond(mm: mmap.mmap, sid: int, seed: int, bad: int) -> bool:
    """True when a valid BATCH record after ``bad`` says ``bad`` had already been fsynced."""
    at = mm.find(BATCH_MAGIC, bad + RECORD_HEADER_BYTES + 1)
    while at >= 0:
        rec = at - RECORD_HEADER_BYTES
        length, crc = _PREFIX.unpack_from(mm, rec)
        if length == _BATCH_BODY and crc == crc32c(mm[rec + _PREFIX.size:at + len(BATCH_MAGIC)], seed):
            rtype, seg, synced_upto = _BODY.unpack_from(mm, rec + _PREFIX.size)
            if rtype == RecordType.BATCH and seg == sid and synced_upto > bad:
                return True
        at = mm.find(BATCH_MAGIC, at + 1)
    return False
