"""Entry logs: where entry blobs live. The format (files, header, records, footer, and
sealing after a crash) is in zbk/storage/entrylogformat.py; reads in
zbk/storage/entrylogreader.py.

Writing
    Appends are encoded into a per-log in-memory buffer (``write_buffer_bytes``) and
    written when it fills; reads are served from that buffer too. :meth:`EntryLogWriter.flush`
    writes every buffer and fsyncs every log (and directory) with unsynced data: it is the
    first step of a checkpoint. Until then entries live only in memory or the page cache:
    the journal, not the entry log, is what makes an acknowledged add durable.

Page cache ("drop behind", ``keep_cached_bytes``; buffered writes only)
    Of everything the writer has written, the last ``keep_cached_bytes`` (across its logs)
    are left in the page cache for readers; older ranges are dropped from it
    (``posix_fadvise(DONTNEED)``, :meth:`Disk.drop_cache`) in steps of
    ``limits.entry_log_drop_step_bytes_min``. Dirty pages and pages still being written back are not dropped
    by the kernel, so this never loses data: the pages it frees were already on disk
    (``writeback_bytes`` starts their writeback early). Why: data written once and read
    rarely would otherwise keep asking the kernel for new memory. Freed pages are reused
    by the next writes at once; new ones cost reclaim on a full machine, and on a VM whose
    balloon reports free memory to the host, a fault into the host per page.
    ``bench/ab.py --a-set entry_log_keep_cached_mb=0`` measures the gain (docs/performance.md,
    "What limits throughput at window 1,000"). Reads of older entries
    are served from disk (with the kernel's readahead). ``keep_cached_bytes=0``: caching is
    left to the kernel.

Direct I/O (``direct_io``)
    Buffers are written with ``O_DIRECT`` through a second descriptor of the log, past the
    page cache, whose copy took a third of one bookie's CPU at window 1,000 (docs/storage.md,
    "Entry log"). A direct write waits for the disk, on the add path whenever the buffer
    fills. :class:`zbk.storage.disk.DirectWrites` rewrites the block holding the end of the
    last write and pads its last block with zeros, which sealing reads as the end of the
    records; rotation cuts them off behind the footer, whose trailer ends the file. Reads
    go through the buffered descriptor (the kernel drops cached pages of a range written
    direct). ``keep_cached_bytes`` and ``writeback_bytes`` do not apply. Logs per ledger stay
    buffered (a second descriptor each, and a block rewritten by each small write), and so
    does a file system that refuses ``O_DIRECT`` at the open or the first write.

Entry log per ledger (BP-32)
    With ``per_ledger=True`` each ledger has its own active log. A log is rotated (footer
    written) when its ledger was write-closed (at the next flush), when it was idle for
    ``expire_after_access_s``, or when opening another would exceed ``open_max`` (least
    recently used first).

Failure
    An ``OSError`` while writing poisons the writer for writes (:class:`BookieIOError`
    afterwards); reads keep working, including of entries still in memory buffers.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence

from crc32c import crc32c

from zbk import limits
from zbk.clock import SYSTEM_CLOCK, Clock
from zbk.errors import BookieIOError, CorruptDataError
from zbk.storage.disk import O_DIRECT, REAL_DISK, DirectWrites, Disk, only_zeros
from zbk.storage.entrylogformat import (
    _LENGTH_MIN,
    HEADER_BYTES,
    LAST_ID_FILE,
    LOG_ID_MAX,
    OFFSET_BITS,
    OFFSET_MASK,
    RECORD_HEADER_BYTES,
    Footer,
    _encode_footer,
    _encode_header,
    _header_ok,
    _pack_ids,
    _pack_prefix,
    _records,
    _usage_of,
    encode_last_id,
    encode_records,
    list_logs,
    log_name,
    make_location,
    read_footer,
    read_last_id,
    scan_file,
    split_location,
)
from zbk.storage.entrylogreader import EntryLogReads, ReadBatch, _Log

# The format's names stay importable from here, beside the writer.
__all__ = ["HEADER_BYTES", "LAST_ID_FILE", "OFFSET_BITS", "OFFSET_MASK", "RECORD_HEADER_BYTES", "EntryLogWriter",
           "Footer", "ReadBatch", "list_logs", "log_name", "make_location", "read_footer", "scan_file",
           "split_location"]

log = logging.getLogger(__name__)


class EntryLogWriter(EntryLogReads):
    """Owns every entry log of a bookie: appends, reads, rotation, flush, usage.

    One owner (the EntryLogger actor); not thread-safe.
    """

    def __init__(self, dirs: Sequence[str], size_limit_bytes: int = limits.entry_log_bytes_default,
                 write_buffer_bytes: int = limits.entry_log_write_buffer_bytes_default,
                 disk: Disk = REAL_DISK, *, per_ledger: bool = False,
                 open_max: int = limits.entry_logs_open_max,
                 expire_after_access_s: float = limits.entry_log_expire_after_access_s,
                 clock: Clock = SYSTEM_CLOCK,
                 writeback_bytes: int = limits.entry_log_flush_bytes_default,
                 keep_cached_bytes: int = limits.entry_log_keep_cached_bytes_default,
                 direct_io: bool = False) -> None:
        assert dirs, "at least one ledger directory"
        assert HEADER_BYTES < size_limit_bytes <= OFFSET_MASK, "size limit must fit a 40-bit offset"
        assert open_max >= 1
        self._dirs = tuple(dirs)
        self._size_limit = size_limit_bytes
        self._write_buffer = write_buffer_bytes
        self._writeback_bytes = writeback_bytes  # 0: leave writeback to the kernel and the checkpoint
        self._keep_cached = keep_cached_bytes  # 0: leave the page cache to the kernel
        # Written ranges still in the page cache, oldest first: [log id, start, end].
        self._cached: deque[list[int]] = deque()
        self._cached_bytes = 0
        # "Direct I/O" (above): interleaved logs only.
        self._direct = direct_io and O_DIRECT != 0 and not per_ledger
        self._dwrites = DirectWrites(limits.entry_log_direct_buffer_bytes_min)
        self._disk = disk
        self._per_ledger = per_ledger
        self._open_max = open_max
        self._expire_s = expire_after_access_s
        self._clock = clock
        self._failed: BaseException | None = None
        self._bytes_written = 0
        self._paths: dict[int, str] = {}
        self._footers: dict[int, Footer] = {}  # every log that is not open for writing
        self._active: OrderedDict[int, _Log] = OrderedDict()  # key -> log, least recently used first
        self._open: dict[int, _Log] = {}  # log id -> active or retired log
        self._retired: list[_Log] = []
        self._write_closed: set[int] = set()
        self._read_fds: OrderedDict[int, int] = OrderedDict()
        for d in self._dirs:
            os.makedirs(d, exist_ok=True)
        self._discover()
        self._last_id_persisted = max(read_last_id(d) for d in self._dirs)
        self._last_id = max([*self._paths, self._last_id_persisted])
        self.sealed_on_open: list[int] = []
        self._seal_unfinished()

    # --- opening -----------------------------------------------------------------------

    def _discover(self) -> None:
        for d in self._dirs:
            for log_id, path in list_logs(d).items():
                if log_id in self._paths:
                    raise CorruptDataError(f"entry log {log_id} exists twice (also {self._paths[log_id]})",
                                           path=path, offset=0)
                self._paths[log_id] = path

    def _seal_unfinished(self) -> None:
        dirs_touched: set[str] = set()
        for log_id, path in sorted(self._paths.items()):
            fd = os.open(path, os.O_RDWR)
            try:
                footer = self._footer_or_seal(fd, log_id, path)
            finally:
                os.close(fd)
            if footer is None:  # the log's creation was torn: it held no record
                del self._paths[log_id]
            else:
                self._footers[log_id] = footer
            dirs_touched.add(os.path.dirname(path))
        if self.sealed_on_open:
            for d in sorted(dirs_touched):
                self._disk.fsync_dir(d)

    def _footer_or_seal(self, fd: int, log_id: int, path: str) -> Footer | None:
        size = os.fstat(fd).st_size
        if not _header_ok(os.pread(fd, HEADER_BYTES, 0), log_id):
            if size <= HEADER_BYTES:
                log.warning("entry log %s: creation was interrupted (%d bytes); removing it", path, size)
                os.unlink(path)
                self.sealed_on_open.append(log_id)
                return None
            raise CorruptDataError("entry log header is invalid", path=path, offset=0)
        footer = read_footer(fd, log_id)
        if footer is not None:
            return footer
        usage: dict[int, int] = {}
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            end = _usage_of(mm, size, usage)
        if end < size:
            if only_zeros(fd, end, size):  # a direct write's padding, or blocks never written
                log.info("entry log %s: records end at offset %d, then %d zero bytes; sealed there", path, end,
                         size - end)
            else:
                log.warning("entry log %s: unreadable record at offset %d; sealed there (%d bytes after it "
                            "ignored)", path, end, size - end)
        footer = Footer(end, usage)
        self._disk.pwrite(fd, _encode_footer(log_id, end, usage, size), size)
        self._disk.fsync(fd)
        self.sealed_on_open.append(log_id)
        return footer

    # --- appending ---------------------------------------------------------------------

    def append(self, ledger_id: int, entry_id: int, blob: bytes | bytearray | memoryview) -> int:
        """Buffer one entry; returns its location. Durable only after :meth:`flush`."""
        if self._failed is not None:
            raise BookieIOError(f"entry logger failed earlier: {self._failed}")
        key = ledger_id if self._per_ledger else -1
        lg = self._active.get(key)
        if lg is None:
            lg = self._new_active(key)
        elif self._per_ledger:
            self._active.move_to_end(key)
        size = RECORD_HEADER_BYTES + len(blob)
        pos = lg.written + len(lg.buf)
        if pos + size > self._size_limit and pos > HEADER_BYTES:
            self._retire(lg)
            lg = self._new_active(key)
            pos = lg.written + len(lg.buf)
        ids = _pack_ids(ledger_id, entry_id)
        buf = lg.buf
        buf += _pack_prefix(_LENGTH_MIN + len(blob), crc32c(blob, crc32c(ids))) + ids
        buf += blob
        lg.usage[ledger_id] = lg.usage.get(ledger_id, 0) + size
        if self._per_ledger:
            lg.last_access = self._clock.monotonic()
        if len(buf) >= self._write_buffer:
            self._write_out(lg)
        return (lg.log_id << OFFSET_BITS) | pos

    def append_batch(self, ledger_ids: Sequence[int], entry_ids: Sequence[int],
                     blobs: Sequence[bytes | bytearray | memoryview]) -> tuple[list[int], bytes | memoryview]:
        """:meth:`append` of each entry ``entry_ids[i]`` of ledger ``ledger_ids[i]`` in order
        (the same bytes, locations and rotations; one write at the end). Returns the
        locations and the records, as :func:`encode_records` makes them, for the journal's
        ADDS record: a view of the buffer written (which the logs then let go of), else a
        copy. Durable only after :meth:`flush`."""
        if self._per_ledger:  # a log per ledger: rotation and access times are per entry
            return ([self.append(lid, eid, blob) for lid, eid, blob in zip(ledger_ids, entry_ids, blobs, strict=True)],
                    bytes(encode_records(ledger_ids, entry_ids, blobs)))
        if self._failed is not None:
            raise BookieIOError(f"entry logger failed earlier: {self._failed}")
        lg = self._active.get(-1)
        if lg is None:
            lg = self._new_active(-1)
        limit = self._size_limit
        buf, base, usage, high = lg.buf, lg.written, lg.usage, lg.log_id << OFFSET_BITS
        first = len(buf)  # where this batch's records start in ``buf``
        earlier: list[bytes] = []  # the batch's records in logs it filled and retired
        locations: list[int] = []
        append = locations.append
        for lid, eid, blob in zip(ledger_ids, entry_ids, blobs, strict=True):
            n = len(blob)
            size = RECORD_HEADER_BYTES + n
            pos = base + len(buf)
            if pos + size > limit and pos > HEADER_BYTES:
                earlier.append(bytes(buf[first:]))
                self._retire(lg)
                lg = self._new_active(-1)
                buf, base, usage, high = lg.buf, lg.written, lg.usage, lg.log_id << OFFSET_BITS
                first = len(buf)
                pos = base + len(buf)
            ids = _pack_ids(lid, eid)
            buf += _pack_prefix(_LENGTH_MIN + n, crc32c(blob, crc32c(ids))) + ids
            buf += blob
            usage[lid] = usage.get(lid, 0) + size
            append(high | pos)
        full = len(buf) >= self._write_buffer
        if full:  # written first: a failed write leaves lg.buf unexported, free to grow
            self._write_out(lg)  # lg.buf is a new buffer from here on: nothing changes ``buf``
        records = memoryview(buf)[first:] if full else bytes(buf[first:])
        return locations, b"".join([*earlier, records]) if earlier else records

    def _new_active(self, key: int) -> _Log:
        while len(self._active) >= self._open_max:
            self._retire(next(iter(self._active.values())))
        self._last_id += 1
        log_id = self._last_id
        assert log_id <= LOG_ID_MAX, "entry log ids exhausted"
        directory = self._pick_dir()
        path = os.path.join(directory, log_name(log_id))
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        # The header rides in the buffer: creating a log costs no write and no fsync here.
        lg = _Log(log_id, path, directory, fd, key, buf=bytearray(_encode_header(log_id)),
                  last_access=self._clock.monotonic())
        self._paths[log_id] = path
        self._open[log_id] = lg
        self._active[key] = lg
        if self._direct:
            self._open_direct(lg)
        return lg

    def _open_direct(self, lg: _Log) -> None:
        """The O_DIRECT descriptor of the new log ``lg`` (see "Direct I/O"); none if the file
        system refuses it."""
        try:
            lg.dfd = os.open(lg.path, os.O_WRONLY | O_DIRECT)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
                raise
            log.info("entry logs in %s: the file system refuses O_DIRECT (%s): buffered writes instead",
                     lg.directory, e)
            self._direct = False

    def _write_direct(self, lg: _Log) -> bool:
        """Write the buffer of ``lg`` through its O_DIRECT descriptor; False, with direct I/O
        turned off for every log, if the file system refused it before writing anything."""
        try:
            lg.dtail = self._dwrites.write(self._disk, lg.dfd, lg.dtail, [lg.buf], lg.written)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            # The message only: the error's traceback holds views of the buffer.
            log.info("entry log %s: O_DIRECT writes refused (%s): buffered writes instead", lg.path, str(e))
            self._direct = False
            for other in self._open.values():
                self._close_direct(other)
            return False
        return True

    @staticmethod
    def _close_direct(lg: _Log) -> None:
        if lg.dfd >= 0:
            os.close(lg.dfd)
            lg.dfd = -1

    def _pick_dir(self) -> str:
        if len(self._dirs) == 1:
            return self._dirs[0]

        def used_fraction(d: str) -> float:
            used, total = self._disk.usage(d)
            return used / total if total else 1.0

        return min(self._dirs, key=used_fraction)

    def _write_out(self, lg: _Log) -> None:
        if not lg.buf:
            return
        try:
            direct = lg.dfd >= 0 and self._write_direct(lg)
            if not direct:
                # At the offset, not the file position: direct writes went through another descriptor.
                self._disk.pwrite(lg.fd, lg.buf, lg.written)
        except OSError as e:
            # The buffer stays: its entries are still readable from memory.
            self._failed = e
            raise
        start = lg.written
        lg.written += len(lg.buf)
        self._bytes_written += len(lg.buf)
        lg.buf = bytearray()
        lg.unsynced = True
        if direct:  # past the page cache: nothing to drop, nothing to write back
            return
        if self._keep_cached:
            self._note_cached(lg.log_id, start, lg.written)
        if self._writeback_bytes and lg.written - lg.writeback_from >= self._writeback_bytes:
            # Start writing the last few MiB to disk now (BookKeeper's flushEntrylogBytes):
            # else a checkpoint's fsync sends every byte written since the last one at once,
            # and the journals' fsyncs on the same disk wait behind it.
            self._disk.start_writeback(lg.fd, lg.writeback_from, lg.written - lg.writeback_from)
            lg.writeback_from = lg.written

    def _note_cached(self, log_id: int, start: int, end: int) -> None:
        """Remember a written range; drop the oldest ones beyond ``keep_cached_bytes``
        ("Page cache" above)."""
        cached = self._cached
        if cached and cached[-1][0] == log_id and cached[-1][2] == start:
            cached[-1][2] = end
        else:
            cached.append([log_id, start, end])
        self._cached_bytes += end - start
        excess = self._cached_bytes - self._keep_cached
        if excess < limits.entry_log_drop_step_bytes_min:
            return
        while excess > 0 and cached:
            rng = cached[0]
            n = min(rng[2] - rng[1], excess)
            fd = self._fd_of(rng[0])
            if fd is not None:
                self._disk.drop_cache(fd, rng[1], n)
            rng[1] += n
            if rng[1] == rng[2]:
                cached.popleft()
            excess -= n
            self._cached_bytes -= n

    def _fd_of(self, log_id: int) -> int | None:
        """A descriptor of a log that still exists (None for one that GC removed)."""
        lg = self._open.get(log_id)
        if lg is not None:
            return lg.fd
        if log_id not in self._paths:
            return None
        try:
            return self._read_fd(log_id)
        except OSError:
            return None

    def _retire(self, lg: _Log) -> None:
        """Rotate: write the buffer and the footer; the fsync and close happen at :meth:`flush`."""
        del self._active[lg.key]
        data_end = lg.written + len(lg.buf)
        lg.buf += _encode_footer(lg.log_id, data_end, lg.usage, data_end)
        self._write_out(lg)
        self._close_direct(lg)
        try:
            if os.fstat(lg.fd).st_size > lg.written:  # a direct write's zeros: the trailer must end the file
                self._disk.truncate(lg.fd, lg.written)
        except OSError as e:
            self._failed = e
            raise
        self._footers[lg.log_id] = Footer(data_end, lg.usage)
        self._retired.append(lg)

    # --- rotation (BP-32) ----------------------------------------------------------------

    def rotate(self, ledger_id: int | None = None) -> None:
        """Seal the active log (per-ledger mode: that ledger's, or all when ``None``)."""
        self._check_writable()
        if not self._per_ledger or ledger_id is None:
            for lg in list(self._active.values()):
                self._retire(lg)
        elif ledger_id in self._active:
            self._retire(self._active[ledger_id])

    def write_close(self, ledger_id: int) -> None:
        """BP-32 advisory write close: rotate this ledger's log at the next flush."""
        if self._per_ledger and ledger_id in self._active:
            self._write_closed.add(ledger_id)

    def expire_idle(self, now: float | None = None) -> list[int]:
        """Per-ledger mode: seal logs not appended to for ``expire_after_access_s``.

        ``now`` is a reading of the writer's clock (default: read it); returns the sealed ids.
        """
        self._check_writable()
        if not self._per_ledger:
            return []
        now = self._clock.monotonic() if now is None else now
        expired = []
        for lg in list(self._active.values()):  # least recently used first
            if now - lg.last_access < self._expire_s:
                break
            self._retire(lg)
            expired.append(lg.log_id)
        return expired

    def maintain(self, now: float | None = None) -> list[int]:
        """Periodic housekeeping for the owner's tick: seal idle per-ledger logs."""
        if self._failed is not None:
            return []
        return self.expire_idle(now)

    # --- flushing ----------------------------------------------------------------------

    def flush(self) -> int:
        """Make every appended entry durable (checkpoint step one); returns bytes written.

        Write-closed and idle logs are sealed first, so their footers ride the same fsync.
        """
        self._check_writable()
        before = self._bytes_written
        for ledger_id in sorted(self._write_closed):
            if ledger_id in self._active:
                self._retire(self._active[ledger_id])
        self._write_closed.clear()
        self.expire_idle()
        for lg in self._active.values():
            self._write_out(lg)
        self._sync_all()
        for lg in self._retired:
            del self._open[lg.log_id]
            os.close(lg.fd)
        self._retired.clear()
        return self._bytes_written - before

    def _sync_all(self) -> None:
        dirs: set[str] = set()
        try:
            for lg in [*self._active.values(), *self._retired]:
                if lg.unsynced:
                    self._disk.fsync(lg.fd)
                    lg.unsynced = False
                if lg.new_name:
                    dirs.add(lg.directory)
            for d in sorted(dirs):
                self._disk.fsync_dir(d)
            for lg in [*self._active.values(), *self._retired]:
                lg.new_name = False
            if self._last_id > self._last_id_persisted:
                self._persist_last_id()
        except OSError as e:
            self._failed = e
            raise

    def _persist_last_id(self) -> None:
        data = encode_last_id(self._last_id)
        for d in self._dirs:
            self._disk.write_file_atomic(os.path.join(d, LAST_ID_FILE), data)
        self._last_id_persisted = self._last_id

    def unflushed_log_ids(self) -> set[int]:
        """Logs still open for writing or holding unsynced data: GC must not touch them."""
        return {*(lg.log_id for lg in self._active.values()), *(lg.log_id for lg in self._retired)}

    def least_unflushed_log_id(self) -> int:
        """The smallest id GC must leave alone; every log below it is sealed and durable."""
        return min(self.unflushed_log_ids(), default=self._last_id + 1)

    def scan(self, log_id: int) -> Iterator[tuple[int, int, int, bytes]]:
        """``(ledger id, entry id, location, blob)`` of every record of a log, in order.

        For compaction and index rebuilds. Strict: a bad record inside the log's records is
        :class:`CorruptDataError` (a torn tail was already cut off by sealing).
        """
        lg = self._open.get(log_id)
        if lg is not None and log_id not in self._footers:  # active: its records end at the buffer
            self._check_writable()
            self._write_out(lg)
            end = lg.written
        else:
            assert log_id in self._footers, f"unknown entry log {log_id}"
            end = self._footers[log_id].data_end
        path = self._paths[log_id]
        base = log_id << OFFSET_BITS
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            for ledger_id, entry_id, offset, blob in _records(mm, HEADER_BYTES, end, path):
                yield ledger_id, entry_id, base | offset, blob

    def usage(self) -> dict[int, dict[int, int]]:
        """``{log id: {ledger id: bytes}}`` for every log (a copy: the caller may keep it)."""
        out = {log_id: dict(f.usage) for log_id, f in self._footers.items()}
        for lg in self._active.values():
            out[lg.log_id] = dict(lg.usage)
        return out

    def log_ids(self) -> list[int]:
        return sorted(self._paths)

    def active_log_ids(self) -> list[int]:
        return sorted(lg.log_id for lg in self._active.values())

    def delete_log(self, log_id: int) -> bool:
        """Remove a sealed, flushed log (GC). Returns False when it did not exist."""
        assert log_id not in self._open, "cannot delete a log that is still being written"
        path = self._paths.pop(log_id, None)
        if path is None:
            return False
        self._footers.pop(log_id, None)
        gone = [rng for rng in self._cached if rng[0] == log_id]
        if gone:
            self._cached = deque(rng for rng in self._cached if rng[0] != log_id)
            self._cached_bytes -= sum(rng[2] - rng[1] for rng in gone)
        fd = self._read_fds.pop(log_id, None)
        if fd is not None:
            os.close(fd)
        os.unlink(path)
        self._disk.fsync_dir(os.path.dirname(path))
        return True

    def close(self) -> None:
        """Seal every active log and flush (unless a write failed earlier); close all files."""
        try:
            if self._failed is None:
                for lg in list(self._active.values()):
                    self._retire(lg)
                self.flush()
        finally:
            for lg in self._open.values():
                self._close_direct(lg)
                os.close(lg.fd)
            self._open.clear()
            self._active.clear()
            self._retired.clear()
            for fd in self._read_fds.values():
                os.close(fd)
            self._read_fds.clear()

    def _check_writable(self) -> None:
        if self._failed is not None:
            raise BookieIOError(f"entry logger failed earlier: {self._failed}")


