"""The journal: the bookie's write-ahead log (format version 2; version 1 is still read).

Files
    ``<journal dir>/<segment id as 16 hex digits>.jnl``. Segment ids start at 1 and grow by
    one; a :class:`JournalWriter` always opens a NEW segment (max existing id + 1), so a
    segment that replay truncated is never appended to again. Retired segments kept for
    reuse are named ``<segment id>.jnl.free`` (see "Recycling"); they are not part of the log.

Segment header (24 bytes, written and fsynced, with the directory, before any record)::

    0   8s   magic  b"ZBKJRNL\\0"
    8   u32  format version (2; segments written by older bookies say 1)
    12  u64  segment id (must match the file name)
    20  u32  crc32c of bytes [0, 20)

Record (all integers little-endian)::

    0   u32  length: bytes after the crc (type + ledger id + entry id + payload), >= 17
    4   u32  crc32c of those ``length`` bytes, started from the segment's seed (version 2:
             :func:`segment_seed`; version 1: 0, the plain crc32c)
    8   u8   record type (:class:`RecordType`)
    9   u64  ledger id
    17  i64  entry id (-1 when the type has none; LIMBO: 1 set / 0 clear; EXPLICIT_LAC: the LAC)
    25  ...  payload (ADD: the entry blob; MASTER_KEY: the key; others: empty)

Batches and group commit
    Records are encoded into one in-memory buffer; :meth:`JournalWriter.sync` writes the
    whole buffer with one ``write()`` and one ``fsync`` (group commit). Every such write is
    a *batch* that starts with a 33-byte BATCH record: ledger id = segment id, entry id =
    ``synced_upto`` (how many bytes of this segment were known durable, i.e. fsynced,
    when the batch was written) and payload ``b"ZBKBATCH"``. Replay skips BATCH records;
    they exist to tell a torn tail from corruption. :meth:`JournalWriter.close` ends the
    segment with an empty batch written after the final fsync, so after a clean shutdown
    even the last data record is covered by a later ``synced_upto``.

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

Preallocation
    A segment's file is kept ahead of its records by up to ``preallocate_bytes`` of zeros
    (written, not fallocated: unwritten extents need metadata updates too). A write into
    space that already exists does not change the file's size or block map, so the fsync
    of a small batch flushes its data alone instead of also committing the file system's
    journal: on this project's ext4 machine, three bookies' concurrent 1 KiB syncs went
    from 215 to 162 us at p50 and from 470 to 275 us at p99. (BookKeeper does the same,
    ``journalPreAllocSizeMB``.) The zeros are part of no record: replay stops at the first
    record whose length is 0, and a tail that is all zeros is the unused preallocation,
    truncated without a warning. A segment is cut back to its last record before it is
    sealed (rotation, clean close), so sealed segments end exactly at their last batch.

Rotation
    When a :meth:`JournalWriter.sync` leaves a segment at ``segment_bytes_max`` or more, it
    then fsyncs the segment (if this sync skipped fsync), cuts it back to its last batch,
    and creates the next segment. Old
    segments are retired by :meth:`JournalWriter.delete_segments_before` once a
    checkpoint has made everything before a mark durable elsewhere.

Recycling (``reuse_files``, BookKeeper's ``journalReuseFiles``)
    A retired segment that this writer wrote is renamed to ``<id>.jnl.free`` instead of
    removed, up to ``reuse_files`` of them (the newest are kept), and the next segment is
    made from such a file rather than a new one: its new header is written over the old one
    and fsynced *before* the file is renamed to the new segment's name (and the directory
    fsynced), so a segment name never holds a header of another segment. Segments and free
    files of an earlier process are removed, never reused: after a reboot their pages are
    no longer cached, and a group commit that ends inside an uncached page makes ``write()``
    read that page from disk first. The file keeps its old size
    and contents; records overwrite the old ones in place. The point is the page cache: a
    new file's pages are memory the kernel must allocate (and, on a VM whose balloon
    reports free pages, the host must fault in again), while a recycled file's pages are
    still cached; in a bookie at 45,000 entries/s, filling new journal pages was a tenth of
    the machine's CPU (``perf``, 2026-11-24; docs/performance.md).

    The old records after the new ones must never replay as part of the new segment. They
    cannot: every record's crc32c starts from a seed derived from its segment's id, so a
    record left over from segment M fails the CRC check in segment N != M (the seeds of two
    ids below 2**32 differ, and CRC-32C tells apart any two messages that differ in 32
    adjacent bits; a chance CRC match of a misaligned read is 2**-32, as for any torn
    write). To replay, the first stale record is a bad record at the end of the written
    data: the torn-tail rule applies unchanged (the BATCH records of the old contents name
    another segment and fail the CRC, so they never count as later durable batches), and
    replay truncates the segment there. A recycled segment that is sealed (rotation, clean
    close) is cut back to its last batch like any other.

Failure
    Any ``OSError`` while writing or syncing poisons the writer: the file may now end in a
    partial batch, so every later call raises :class:`BookieIOError` and the owner must
    stop (a reboot replays and truncates the partial batch).
"""

from __future__ import annotations

import logging
import mmap
import os
import struct
from collections.abc import Generator, Iterator, Sequence
from enum import IntEnum
from typing import NamedTuple

from crc32c import crc32c

from zbk import limits
from zbk.errors import BookieIOError, CorruptDataError
from zbk.storage.disk import REAL_DISK, Disk

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # written; version 1 segments (unseeded CRCs) are read as well
READABLE_VERSIONS = frozenset({1, 2})
FREE_SUFFIX = ".free"  # <segment name>.free: a retired segment kept for reuse
SEGMENT_MAGIC = b"ZBKJRNL\x00"
SEGMENT_SUFFIX = ".jnl"
BATCH_MAGIC = b"ZBKBATCH"

_SEG_HEADER = struct.Struct("<8sIQ")
_CRC = struct.Struct("<I")
HEADER_BYTES = _SEG_HEADER.size + _CRC.size  # 24
_PREFIX = struct.Struct("<II")  # length, crc32c
_BODY = struct.Struct("<BQq")  # type, ledger id, entry id
RECORD_HEADER_BYTES = _PREFIX.size + _BODY.size  # 25
_BODY_MIN = _BODY.size  # 17
_BODY_MAX = _BODY.size + limits.journal_record_bytes_max
_BATCH_BODY = _BODY.size + len(BATCH_MAGIC)  # 25
BATCH_RECORD_BYTES = _PREFIX.size + _BATCH_BODY  # 33
_pack_body = _BODY.pack
_pack_prefix = _PREFIX.pack


class RecordType(IntEnum):
    BATCH = 0  # start of one write (group commit); internal, never yielded by replay
    ADD = 1  # an entry was added: ledger id, entry id, payload = the entry blob
    FENCE = 2  # the ledger was fenced on this bookie
    MASTER_KEY = 3  # the ledger's master key: payload = key bytes
    LIMBO = 4  # BP-46 limbo state: entry id 1 = set, 0 = cleared
    EXPLICIT_LAC = 5  # explicit last-add-confirmed: entry id = the LAC


_KNOWN_TYPES = frozenset(int(t) for t in RecordType)
_ADD = int(RecordType.ADD)


class LogMark(NamedTuple):
    """A position in the journal: everything before it is covered. Orders as a tuple."""

    segment_id: int
    offset: int


START = LogMark(0, 0)  # before the first segment: replay everything


class JournalRecord(NamedTuple):
    type: RecordType
    ledger_id: int
    entry_id: int
    payload: bytes


def segment_name(segment_id: int) -> str:
    return f"{segment_id:016x}{SEGMENT_SUFFIX}"


def list_segments(directory: str) -> list[int]:
    """Segment ids present in ``directory``, ascending (other files are ignored)."""
    return _ids_named(directory, SEGMENT_SUFFIX)


def _ids_named(directory: str, suffix: str) -> list[int]:
    """The ids of the files ``<16 hex digits><suffix>`` in ``directory``, ascending."""
    ids = []
    for name in os.listdir(directory):
        stem, dot, ext = name.partition(".")
        if dot and "." + ext == suffix and len(stem) == 16:
            try:
                ids.append(int(stem, 16))
            except ValueError:
                continue
    return sorted(ids)


_ZEROS = bytes(limits.journal_preallocate_bytes_default)


def _zeros(n: int) -> bytes | memoryview:
    """``n`` zero bytes; a view of one shared block when it is large enough (a fresh 1 MiB
    ``bytes(n)`` per extension showed in a bookie profile at window 1,000)."""
    return memoryview(_ZEROS)[:n] if n <= len(_ZEROS) else bytes(n)


def segment_seed(segment_id: int, version: int = FORMAT_VERSION) -> int:
    """The value every record CRC of a segment starts from (see "Recycling"): 0 in version 1
    segments, a function of the segment id in version 2 (never 0)."""
    if version == 1:
        return 0
    return crc32c(struct.pack("<8sQ", b"ZBKJSEED", segment_id)) or 1


def _encode_header(segment_id: int) -> bytes:
    head = _SEG_HEADER.pack(SEGMENT_MAGIC, FORMAT_VERSION, segment_id)
    return head + _CRC.pack(crc32c(head))


def _header_version(data: bytes | mmap.mmap, segment_id: int) -> int | None:
    """The format version of a valid header of segment ``segment_id``, else None."""
    magic, version, sid = _SEG_HEADER.unpack_from(data, 0)
    (crc,) = _CRC.unpack_from(data, _SEG_HEADER.size)
    if (magic == SEGMENT_MAGIC and crc == crc32c(data[: _SEG_HEADER.size])
            and version in READABLE_VERSIONS and sid == segment_id):
        return int(version)
    return None


def _batch_record(segment_id: int, synced_upto: int, seed: int) -> bytes:
    body = _BODY.pack(RecordType.BATCH, segment_id, synced_upto) + BATCH_MAGIC
    return _PREFIX.pack(len(body), crc32c(body, seed)) + body


def list_free(directory: str) -> list[int]:
    """Ids of the retired segments kept for reuse in ``directory`` (``<id>.jnl.free``), ascending."""
    return _ids_named(directory, SEGMENT_SUFFIX + FREE_SUFFIX)


class JournalWriter:
    """Appends journal records into the current segment with group commit.

    One owner (the JournalWriter actor); not thread-safe. ``append`` only encodes into
    memory; nothing is durable until :meth:`sync` returns.
    """

    def __init__(self, directory: str, segment_bytes_max: int = limits.journal_segment_bytes_default,
                 disk: Disk = REAL_DISK, *,
                 preallocate_bytes: int = limits.journal_preallocate_bytes_default,
                 reuse_files: int = 0) -> None:
        assert segment_bytes_max > HEADER_BYTES, "segment_bytes_max too small"
        assert preallocate_bytes >= 0, "preallocate_bytes must be >= 0"
        assert reuse_files >= 0, "reuse_files must be >= 0"
        self._dir = directory
        self._segment_bytes_max = segment_bytes_max
        self._disk = disk
        self._prealloc = min(preallocate_bytes, segment_bytes_max)
        self._reuse_files = reuse_files
        self._alloc_end = 0  # the current segment's file size (zeros or old records beyond _offset)
        self._failed: BaseException | None = None
        os.makedirs(directory, exist_ok=True)
        existing = list_segments(directory)
        self._segment_id = existing[-1] + 1 if existing else 1
        self._seed = segment_seed(self._segment_id)
        # Only segments this writer wrote are reused ("Recycling"); the pool refills at
        # this run's checkpoints.
        self._first_own = self._segment_id
        self._free = list_free(directory)
        if self._trim_free(0):
            self._disk.fsync_dir(directory)
        self._fd = -1
        self._offset = 0  # bytes written to the current segment
        self._synced = 0  # bytes of the current segment known to be fsynced
        # The buffer always starts with room for the batch record, filled in by sync().
        self._buf = bytearray(BATCH_RECORD_BYTES)
        self._open_segment()

    # --- appending ---------------------------------------------------------------------

    def append(self, rec_type: RecordType, ledger_id: int, entry_id: int = -1, payload: bytes = b"") -> int:
        """Encode one record into the buffer; returns the bytes now waiting for :meth:`sync`."""
        assert len(payload) <= limits.journal_record_bytes_max, "journal record too large"
        body = _pack_body(rec_type, ledger_id, entry_id)
        buf, seed = self._buf, self._seed
        # Two appends, not three: each bytearray append costs about as much as the crc.
        buf += _pack_prefix(_BODY_MIN + len(payload), crc32c(payload, crc32c(body, seed))) + body
        buf += payload
        return len(buf) - BATCH_RECORD_BYTES

    def append_adds(self, ledger_id: int, entry_ids: Sequence[int], blobs: Sequence[bytes]) -> int:
        """:meth:`append` of one ADD record per (entry id, blob), for a batch of one ledger
        (the add path: one call per batch instead of one per entry). Same bytes as
        ``append(RecordType.ADD, ledger_id, eid, blob)`` for each pair, in order."""
        if len(entry_ids) != len(blobs):
            raise ValueError("journal: entry ids and blobs differ in length")
        limit = limits.journal_record_bytes_max
        buf, seed = self._buf, self._seed
        for eid, payload in zip(entry_ids, blobs, strict=True):
            n = len(payload)
            assert n <= limit, "journal record too large"
            body = _pack_body(_ADD, ledger_id, eid)
            buf += _pack_prefix(_BODY_MIN + n, crc32c(payload, crc32c(body, seed))) + body
            buf += payload
        return len(buf) - BATCH_RECORD_BYTES

    def append_adds_multi(self, ledger_ids: Sequence[int], entry_ids: Sequence[int],
                          blobs: Sequence[bytes]) -> int:
        """:meth:`append_adds` for a batch of several ledgers (MULTI_ADD): one ADD record per
        (ledger id, entry id, blob), in order; the same bytes as one ``append`` each."""
        if not len(ledger_ids) == len(entry_ids) == len(blobs):
            raise ValueError("journal: ledger ids, entry ids and blobs differ in length")
        limit = limits.journal_record_bytes_max
        buf, seed = self._buf, self._seed
        for lid, eid, payload in zip(ledger_ids, entry_ids, blobs, strict=True):
            n = len(payload)
            assert n <= limit, "journal record too large"
            body = _pack_body(_ADD, lid, eid)
            buf += _pack_prefix(_BODY_MIN + n, crc32c(payload, crc32c(body, seed))) + body
            buf += payload
        return len(buf) - BATCH_RECORD_BYTES

    @property
    def pending_bytes(self) -> int:
        """Bytes appended but not yet written by :meth:`sync`."""
        return len(self._buf) - BATCH_RECORD_BYTES

    @property
    def mark(self) -> LogMark:
        """The position after the last record written (not necessarily fsynced)."""
        return LogMark(self._segment_id, self._offset)

    @property
    def synced_mark(self) -> LogMark:
        """The position after the last record known to be fsynced."""
        return LogMark(self._segment_id, self._synced)

    @property
    def segment_id(self) -> int:
        return self._segment_id

    @property
    def free_segments(self) -> int:
        """Retired segments kept for reuse ("Recycling")."""
        return len(self._free)

    def sync(self, fsync: bool = True) -> LogMark:
        """Write everything buffered in one ``write()``, then ``fsync`` (group commit).

        Returns the mark after the last record written. With ``fsync=False`` the records are
        handed to the page cache only (``journal_sync_data = false``): they survive a
        process crash but not a power loss.

        A sync that leaves the segment at ``segment_bytes_max`` or more then rotates (see
        "Rotation"), so that records appended later are encoded for the segment they will be
        written to: their CRCs start from its seed.
        """
        self._check_usable()
        try:
            if self.pending_bytes:
                self._write_batch()
            if fsync and self._synced < self._offset:
                self._disk.fsync(self._fd)
                self._synced = self._offset
            mark = self.mark
            if self._offset >= self._segment_bytes_max:
                self._rotate()
        except OSError as e:
            self._failed = e
            raise
        return mark

    def _write_batch(self) -> None:
        buf = self._buf
        buf[:BATCH_RECORD_BYTES] = _batch_record(self._segment_id, self._synced, self._seed)
        self._buf = bytearray(BATCH_RECORD_BYTES)
        # At the offset, not the file position: a recycled file was opened at 0.
        self._disk.pwrite(self._fd, buf, self._offset)
        self._offset += len(buf)
        if self._offset > self._alloc_end:
            self._alloc_end = self._offset

    def preallocate(self) -> bool:
        """Extend the segment with zeros when less than half of ``preallocate_bytes`` is left
        ahead of the records (see "Preallocation"); True if it did. The journal actor calls
        it after acknowledging a commit, so the extension is off the commit's path; it
        becomes durable with the next fsync (a crash before that leaves a shorter tail of
        zeros, or none: both replay the same). An ``OSError`` poisons the writer like any
        failed write."""
        if not self._prealloc or self._failed is not None or self._fd < 0:
            return False
        if self._alloc_end - self._offset >= self._prealloc // 2:
            return False
        start, end = self._alloc_end, self._offset + self._prealloc  # _alloc_end >= _offset always
        try:
            self._disk.pwrite(self._fd, _zeros(end - start), start)
        except OSError as e:
            self._failed = e
            raise
        self._alloc_end = end
        return True

    def _seal(self) -> None:
        """Cut the unused preallocation off the segment (then fsync it: the caller does)."""
        if self._alloc_end > self._offset:
            self._disk.truncate(self._fd, self._offset)
            self._alloc_end = self._offset

    # --- segments ----------------------------------------------------------------------

    def _open_segment(self) -> None:
        """Create the next segment, or make it from the newest free file (see "Recycling"):
        header written and fsynced before the name exists (a recycled file is renamed only
        then), then the directory fsynced."""
        self._seed = segment_seed(self._segment_id)
        path = os.path.join(self._dir, segment_name(self._segment_id))
        free = os.path.join(self._dir, segment_name(self._free.pop()) + FREE_SUFFIX) if self._free else None
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644) if free is None else os.open(free, os.O_WRONLY)
        try:
            if free is None:
                size = self._prealloc
                self._disk.write(fd, _encode_header(self._segment_id))
                if self._prealloc > HEADER_BYTES:
                    self._disk.pwrite(fd, _zeros(self._prealloc - HEADER_BYTES), HEADER_BYTES)
                self._disk.fsync(fd)
            else:
                size = os.fstat(fd).st_size
                # Cached pages are overwritten in place; pages the kernel dropped are read
                # back ahead of the writes instead of one by one inside them.
                if hasattr(os, "posix_fadvise"):
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                self._disk.pwrite(fd, _encode_header(self._segment_id), 0)
                self._disk.fsync(fd)
                os.rename(free, path)
            self._disk.fsync_dir(self._dir)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._offset = self._synced = HEADER_BYTES
        self._alloc_end = max(HEADER_BYTES, size)

    def _trim_free(self, keep: int) -> bool:
        """Remove the free files beyond the newest ``keep`` (the caller fsyncs the
        directory); True if it removed any."""
        excess = len(self._free) - keep
        if excess <= 0:
            return False
        for fid in self._free[:excess]:
            os.unlink(os.path.join(self._dir, segment_name(fid) + FREE_SUFFIX))
        del self._free[:excess]
        return True

    def _rotate(self) -> None:
        # A segment is complete and durable before the next one exists: replay relies on
        # it (a bad record in a non-last segment is corruption, never a torn write).
        if self._synced < self._offset or self._alloc_end > self._offset:
            self._seal()
            self._disk.fsync(self._fd)
        os.close(self._fd)
        self._fd = -1
        self._segment_id += 1
        self._open_segment()

    def segments(self) -> list[int]:
        """Segment ids on disk, ascending (the current one included)."""
        return list_segments(self._dir)

    def delete_segments_before(self, mark: LogMark) -> list[int]:
        """Retire segments wholly before ``mark`` (never the current one); returns their ids.
        The newest ``reuse_files`` of those this writer wrote (with the free files already
        kept) are renamed to free files for the next segments to reuse; the others are removed.

        Call only after a checkpoint made everything before ``mark`` durable in the entry
        logs and the index, and persisted ``mark`` as the last mark.
        """
        doomed = [s for s in list_segments(self._dir) if s < mark.segment_id and s != self._segment_id]
        if not doomed:
            return doomed
        own = [s for s in doomed if s >= self._first_own]
        keep = own[-self._reuse_files:] if self._reuse_files else []
        for sid in doomed:
            path = os.path.join(self._dir, segment_name(sid))
            if sid in keep:
                os.rename(path, path + FREE_SUFFIX)
            else:
                os.unlink(path)
        self._free = sorted(self._free + keep)
        self._trim_free(self._reuse_files)
        self._disk.fsync_dir(self._dir)
        return doomed

    def close(self) -> None:
        """Sync what is buffered, seal the segment with an empty batch, close the file."""
        if self._fd < 0:
            return
        try:
            if self._failed is None:
                if self.pending_bytes:  # no rotation here: the closing batch belongs to this segment
                    self._write_batch()
                if self._synced < self._offset:
                    self._disk.fsync(self._fd)
                    self._synced = self._offset
                # The closing batch proves that everything before it was fsynced (see the
                # replay rule): damage in the last data record then reads as corruption.
                self._write_batch()
                self._seal()
                self._disk.fsync(self._fd)
                self._synced = self._offset
        except OSError as e:
            self._failed = e
            raise
        finally:
            os.close(self._fd)
            self._fd = -1

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise BookieIOError(f"journal writer failed earlier: {self._failed}")
        assert self._fd >= 0, "journal writer is closed"


# --- replay ------------------------------------------------------------------------------


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
            bad = yield from _records(mm, path, sid, seed, start, size)
            if bad >= 0:
                _check_torn_tail(mm, path, sid, seed, bad, last)
                zeros = _all_zero(mm, bad)
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


def _records(mm: mmap.mmap, path: str, sid: int, seed: int, pos: int,
             size: int) -> Generator[tuple[JournalRecord, LogMark], None, int]:
    """Yield the valid records from ``pos``; returns the offset of a bad record, or -1."""
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
        else:
            payload = mm[pos + RECORD_HEADER_BYTES:end]
            yield JournalRecord(RecordType(rtype), ledger_id, entry_id, payload), LogMark(sid, end)
        pos = end
    return -1


def _all_zero(mm: mmap.mmap, start: int, chunk: int = 1 << 20) -> bool:
    """True when every byte from ``start`` to the end is zero (unused preallocation)."""
    for pos in range(start, len(mm), chunk):
        part = mm[pos:pos + chunk]
        if part.count(0) != len(part):
            return False
    return True


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
