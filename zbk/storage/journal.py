"""The journal writer: appends, group commit, segments (preallocation, rotation,
recycling). The format is in zbk/storage/journalformat.py, replay in
zbk/storage/journalreplay.py.

Preallocation
    A segment's file is kept ahead of its records by up to ``preallocate_bytes`` of zeros
    (written, not fallocated: unwritten extents need metadata updates too). A write into
    space that already exists does not change the file's size or block map, so the fsync
    of a small batch flushes its data alone instead of also committing the file system's
    journal; on ext4 that commit lengthens small syncs, their tail most of all when several
    bookies sync at once. (BookKeeper does the same,
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
    still cached. ``bench/pagecache.py`` measures what writing into new pages costs
    (docs/performance.md, "Storage").

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

Direct I/O (``direct_io``)
    The records go to the disk with ``O_DIRECT`` through a second descriptor of the segment,
    bypassing the page cache: nothing reads the journal back but replay at start-up, and
    the journal thread's kernel time, mostly copying every record into the page cache and
    writing those pages back at the fsync, was about a fifth of a bookie's CPU at window
    1,000 (docs/performance.md, "Storage").
    Such writes must start and end on a block boundary (``DIRECT_BLOCK_BYTES``) and come
    from aligned memory, so each write starts at the block holding the end of the previous
    one, carries that block's bytes again (kept in memory: they are the bytes on disk, so a
    torn rewrite leaves them as they were), and is padded with zeros to the next boundary;
    the zeros are what replay reads as the end of the records. Preallocation then writes
    its zeros the same way, from the first whole block past the file's end. The fsync stays
    what makes a batch durable: an ``O_DIRECT`` write may still sit in the disk's cache. A
    file system that refuses ``O_DIRECT`` (tmpfs, some FUSE mounts) at the open, or at the
    first write before any byte is written, gets buffered writes instead, with an info line.

Failure
    Any ``OSError`` while writing or syncing poisons the writer: the file may now end in a
    partial batch, so every later call raises :class:`BookieIOError` and the owner must
    stop (a reboot replays and truncates the partial batch).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from collections.abc import Iterator

from crc32c import crc32c

from zbk import limits
from zbk.errors import BookieIOError
from zbk.storage.disk import DIRECT_BLOCK_BYTES, O_DIRECT, REAL_DISK, DirectWrites, Disk, align_up
from zbk.storage.entrylogformat import RECORD_HEADER_BYTES as ENTRY_RECORD_HEADER_BYTES
from zbk.storage.entrylogformat import record_lengths
from zbk.storage.journalformat import (
    _ADDS,
    _BODY_MIN,
    BATCH_MAGIC,
    BATCH_RECORD_BYTES,
    FORMAT_VERSION,
    FREE_SUFFIX,
    HEADER_BYTES,
    RECORD_HEADER_BYTES,
    SEGMENT_SUFFIX,
    START,
    JournalRecord,
    LogMark,
    RecordType,
    _batch_record,
    _encode_header,
    _ids_named,
    _pack_body,
    _pack_prefix,
    list_segments,
    segment_name,
    segment_seed,
)
from zbk.storage.journalreplay import replay

# The format's names and replay stay importable from here, beside the writer.
__all__ = ["BATCH_MAGIC", "BATCH_RECORD_BYTES", "FORMAT_VERSION", "FREE_SUFFIX", "HEADER_BYTES", "RECORD_HEADER_BYTES",
           "START", "JournalRecord", "JournalWriter", "LogMark", "RecordType", "list_free", "list_segments", "replay",
           "segment_name", "segment_seed"]

log = logging.getLogger(__name__)

# The zeros preallocation writes, buffered or direct: an anonymous mapping is page-aligned,
# and read-only it shares the kernel's zero page until something reads it.
_ZEROS = mmap.mmap(-1, max(DIRECT_BLOCK_BYTES, limits.journal_preallocate_bytes_default), prot=mmap.PROT_READ)


def _zeros(n: int) -> bytes | memoryview:
    """``n`` zero bytes; a view of one shared block when it is large enough (a fresh 1 MiB
    ``bytes(n)`` per extension showed in a bookie profile at window 1,000)."""
    return memoryview(_ZEROS)[:n] if n <= len(_ZEROS) else bytes(n)


def _split_records(records: bytes | bytearray | memoryview,
                   limit: int) -> Iterator[tuple[memoryview, int]]:
    """``records`` in runs of whole entry records of at most ``limit`` bytes each (one
    record is never larger), with how many records each run holds."""
    view = memoryview(records)
    start = end = k = 0
    for size in record_lengths(view):
        if end + size - start > limit and k:
            yield view[start:end], k
            start, k = end, 0
        end += size
        k += 1
    if k:
        yield view[start:end], k


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
                 reuse_files: int = 0, direct_io: bool = False) -> None:
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
        # "Direct I/O": the O_DIRECT descriptor of the current segment (-1: buffered writes),
        # the bytes of the block holding its end, and the aligned buffer a write is built in.
        self._direct = direct_io and O_DIRECT != 0
        self._dfd = -1
        self._dtail = b""
        self._dwrites = DirectWrites(2 * limits.journal_preallocate_bytes_default)
        self._offset = 0  # bytes written to the current segment
        self._synced = 0  # bytes of the current segment known to be fsynced
        # What the next sync() writes, in order: whole parts (an ADDS record's header, then
        # the entry records it was given, kept as they came rather than copied), then the
        # buffer the other records are encoded into. The first part, or the buffer when there
        # is none, starts with room for the batch record, filled in by sync().
        self._parts: list[bytes | bytearray | memoryview] = []
        self._parts_bytes = 0
        self._buf = bytearray(BATCH_RECORD_BYTES)
        self._open_segment()

    # --- appending ---------------------------------------------------------------------

    def append(self, rec_type: RecordType, ledger_id: int, entry_id: int = -1, payload: bytes = b"") -> int:
        """Encode one record into the buffer; returns the bytes now waiting for :meth:`sync`.
        ADDS records are :meth:`append_records`'s."""
        assert len(payload) <= limits.journal_record_bytes_max, "journal record too large"
        if rec_type == RecordType.ADDS:
            raise ValueError("journal: ADDS records are written by append_records")
        body = _pack_body(rec_type, ledger_id, entry_id)
        buf, seed = self._buf, self._seed
        # Two appends, not three: each bytearray append costs about as much as the crc.
        buf += _pack_prefix(_BODY_MIN + len(payload), crc32c(payload, crc32c(body, seed))) + body
        buf += payload
        return self.pending_bytes

    def append_records(self, records: bytes | bytearray | memoryview, count: int) -> int:
        """Encode ``count`` entries' records, as an entry log holds them (back to back in
        ``records``, zbk/storage/entrylogformat.py), as one ADDS record, or as several split
        between entries when they exceed a record's size; returns the bytes now waiting for
        :meth:`sync`. Replay yields an ADD record per entry."""
        n = len(records)
        if count <= 0 or n < ENTRY_RECORD_HEADER_BYTES * count:
            raise ValueError(f"journal: {n} bytes cannot hold {count} entry records")
        if n > limits.journal_record_bytes_max:
            runs = list(_split_records(records, limits.journal_record_bytes_max))
            if sum(k for _, k in runs) != count:
                raise ValueError(f"journal: {n} bytes hold {sum(k for _, k in runs)} entry records, not {count}")
            if any(len(part) > limits.journal_record_bytes_max for part, _ in runs):
                raise ValueError("journal: an entry record is larger than a journal record may be")
            for part, k in runs:
                self.append_records(part, k)
            return self.pending_bytes
        body = _pack_body(_ADDS, 0, count)
        buf = self._buf
        buf += _pack_prefix(_BODY_MIN + n, crc32c(records, crc32c(body, self._seed))) + body
        self._parts += (buf, records)
        self._parts_bytes += len(buf) + n
        self._buf = bytearray()
        return self.pending_bytes

    @property
    def pending_bytes(self) -> int:
        """Bytes appended but not yet written by :meth:`sync`."""
        return self._parts_bytes + len(self._buf) - BATCH_RECORD_BYTES

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
        parts = self._parts
        if self._buf:
            parts.append(self._buf)
        head = parts[0]
        assert isinstance(head, bytearray)
        head[:BATCH_RECORD_BYTES] = _batch_record(self._segment_id, self._synced, self._seed)
        n = self._parts_bytes + len(self._buf)
        self._parts, self._parts_bytes, self._buf = [], 0, bytearray(BATCH_RECORD_BYTES)
        if self._dfd < 0 or not self._write_direct(parts, n):
            # At the offset, not the file position: a recycled file was opened at 0.
            self._disk.pwrite(self._fd, head if len(parts) == 1 else b"".join(parts), self._offset)
        self._offset += n
        if self._offset > self._alloc_end:
            self._alloc_end = self._offset

    def _write_direct(self, parts: list[bytes | bytearray | memoryview], n: int) -> bool:
        """Write ``parts`` (``n`` bytes) at the end of the records through the O_DIRECT
        descriptor (see "Direct I/O"); False, with direct I/O turned off, if the file system
        refused it before writing anything."""
        try:
            self._dtail = self._dwrites.write(self._disk, self._dfd, self._dtail, parts, self._offset)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            # Refused before any byte was written (misaligned for this file system).
            # The message only: the error's traceback holds views of the buffer.
            log.info("journal %s: O_DIRECT writes refused (%s): buffered writes instead", self._dir, str(e))
            self._close_direct()
            self._direct = False
            return False
        end = align_up(self._offset + n)
        if end > self._alloc_end:
            self._alloc_end = end
        return True

    def _close_direct(self) -> None:
        if self._dfd >= 0:
            os.close(self._dfd)
            self._dfd = -1

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
            if self._dfd >= 0:
                # Whole blocks past the file's end; the bytes up to the first boundary read
                # as zeros once the file grows past them.
                start, end = align_up(start), align_up(end)
                while start < end:
                    k = min(end - start, len(_ZEROS))
                    self._disk.pwrite(self._dfd, _zeros(k), start)
                    start += k
            else:
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
        header = _encode_header(self._segment_id)
        path = os.path.join(self._dir, segment_name(self._segment_id))
        free = os.path.join(self._dir, segment_name(self._free.pop()) + FREE_SUFFIX) if self._free else None
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644) if free is None else os.open(free, os.O_WRONLY)
        try:
            if free is None:
                size = self._prealloc
                self._disk.write(fd, header)
                if self._prealloc > HEADER_BYTES:
                    self._disk.pwrite(fd, _zeros(self._prealloc - HEADER_BYTES), HEADER_BYTES)
                self._disk.fsync(fd)
            else:
                size = os.fstat(fd).st_size
                # Cached pages are overwritten in place; pages the kernel dropped are read
                # back ahead of the writes instead of one by one inside them.
                if hasattr(os, "posix_fadvise") and not self._direct:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
                self._disk.pwrite(fd, header, 0)
                self._disk.fsync(fd)
                os.rename(free, path)
            self._disk.fsync_dir(self._dir)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        try:
            self._open_direct(path, header)
        except OSError:
            os.close(fd)
            self._fd = -1
            raise
        self._offset = self._synced = HEADER_BYTES
        self._alloc_end = max(HEADER_BYTES, size)

    def _open_direct(self, path: str, header: bytes) -> None:
        """The O_DIRECT descriptor of the new segment ``path``, whose ``header`` is written
        (see "Direct I/O"); none if the file system refuses it."""
        if not self._direct:
            return
        try:
            self._dfd = os.open(path, os.O_WRONLY | O_DIRECT)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            log.info("journal %s: the file system refuses O_DIRECT (%s): buffered writes instead", self._dir, e)
            self._direct = False
            return
        self._dtail = header  # the start of the first block

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
        self._close_direct()
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
            self._close_direct()
            os.close(self._fd)
            self._fd = -1
            self._dwrites.drop()

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise BookieIOError(f"journal writer failed earlier: {self._failed}")
        assert self._fd >= 0, "journal writer is closed"


