"""Entry logs: where entry blobs live (format version 1).

Files
    ``<ledger dir>/<log id as 8 hex digits>.log``. Log ids are unique across all ledger
    directories and only grow: ``<ledger dir>/LASTLOGID`` (written atomically at flushes
    that created logs) remembers the highest id handed out, so ids are not reused after
    the newest logs were garbage collected. A new log goes to the ledger directory with
    the lowest used fraction. Ids fit in 24 bits and offsets in 40 bits: a *location* is
    one int, ``(log_id << 40) | offset`` of the record.

Header (24 bytes)::

    0   8s   magic  b"ZBKELOG\\0"
    8   u32  format version (1)
    12  u64  log id (must match the file name)
    20  u32  crc32c of bytes [0, 20)

Record (little-endian)::

    0   u32  length: bytes after the crc (ledger id + entry id + blob), >= 16
    4   u32  crc32c of those ``length`` bytes
    8   u64  ledger id
    16  i64  entry id
    24  ...  the entry blob, exactly as the client sent it

Footer (written when a log is rotated or closed; appended after the records)::

    body      CBOR map {"v": 1, "log": log id, "end": data end offset,
                        "usage": {ledger id: bytes of its records, headers included}}
    trailer   u64 footer offset | u32 body length | u32 crc32c(body) | 8s b"ZBKEFOOT"

    The trailer is the last 24 bytes of the file, so GC learns a log's per-ledger usage
    from one read, without scanning. ``end`` is where records stop.

Writing
    Appends are encoded into a per-log in-memory buffer (``write_buffer_bytes``) and
    written when it fills; reads are served from that buffer too. :meth:`EntryLogWriter.flush`
    writes every buffer and fsyncs every log (and directory) with unsynced data: it is the
    first step of a checkpoint. Until then entries live only in memory or the page cache:
    the journal, not the entry log, is what makes an acknowledged add durable.

Crash recovery ("sealing")
    A log without a valid footer was being written when the bookie stopped. On open, the
    writer scans it from the header, stops at the first bad record (short, bad length,
    CRC mismatch), and appends a footer whose ``end`` is that offset. Nothing is
    truncated: bytes after ``end`` are kept for inspection, but reading a location at or
    after ``end`` is a :class:`CorruptDataError`, never a wrong answer. A sealed log is
    read strictly: a bad record before ``end`` is :class:`CorruptDataError`. Torn tails
    hold only entries that were never flushed; checkpoints flush the entry logs before
    the index points at them, and journal replay re-adds newer entries into new logs.

Page cache ("drop behind", ``keep_cached_bytes``)
    Of everything the writer has written, the last ``keep_cached_bytes`` (across its logs)
    are left in the page cache for readers; older ranges are dropped from it
    (``posix_fadvise(DONTNEED)``, :meth:`Disk.drop_cache`) in steps of
    ``_DROP_STEP_BYTES``. Dirty pages and pages still being written back are not dropped
    by the kernel, so this never loses data: the pages it frees were already on disk
    (``writeback_bytes`` starts their writeback early). Why: data written once and read
    rarely would otherwise keep asking the kernel for new memory. Freed pages are reused
    by the next writes at once; new ones cost reclaim on a full machine, and on a VM whose
    balloon reports free memory to the host, a fault into the host per page. Measured on
    this project's VM (``bench/ab.py``, three bookies at window 1,000, 2026-11-24): 50,096
    against 55,482 entries/s, system CPU 30-35 % against 18-26 %. Reads of older entries
    are served from disk (with the kernel's readahead). ``keep_cached_bytes=0``: caching is
    left to the kernel.

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

import logging
import mmap
import os
import struct
from collections import OrderedDict, deque
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import cbor2
from crc32c import crc32c

from zbk import limits
from zbk.clock import SYSTEM_CLOCK, Clock
from zbk.errors import BookieIOError, CorruptDataError
from zbk.storage.disk import REAL_DISK, Disk

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
LOG_MAGIC = b"ZBKELOG\x00"
FOOTER_MAGIC = b"ZBKEFOOT"
LAST_ID_MAGIC = b"ZBKLGID\x00"
LOG_SUFFIX = ".log"
LAST_ID_FILE = "LASTLOGID"

OFFSET_BITS = 40
OFFSET_MASK = (1 << OFFSET_BITS) - 1
LOG_ID_MAX = (1 << (64 - OFFSET_BITS)) - 1

_LOG_HEADER = struct.Struct("<8sIQ")
_CRC = struct.Struct("<I")
HEADER_BYTES = _LOG_HEADER.size + _CRC.size  # 24
_PREFIX = struct.Struct("<II")  # length, crc32c
_IDS = struct.Struct("<Qq")  # ledger id, entry id
RECORD_HEADER_BYTES = _PREFIX.size + _IDS.size  # 24
_LENGTH_MIN = _IDS.size
_LENGTH_MAX = _IDS.size + limits.entry_bytes_max + 4096  # room for the entry's own header/digest
_TRAILER = struct.Struct("<QII8s")
_LAST_ID = struct.Struct("<8sQ")
_REC = struct.Struct("<IIQq")  # a record's header: length, crc32c, ledger id, entry id
_READ_FDS_MAX = 64
_DROP_STEP_BYTES = 4 * 1024 * 1024  # drop behind in steps of at least this much
_READ_GUESS_BYTES = 4096
# Range reads (read_entries) coalesce records that lie close together in one log into one
# pread of at most _RUN_BYTES_MAX. A location more than _RUN_GAP_MAX past the previous one
# (a large entry, or records of other ledgers in between) starts a new run, so a run never
# drags much more than the records it serves through memory.
_RUN_BYTES_MAX = 1 << 20
_RUN_GAP_MAX = 16 << 10
_pack_ids = _IDS.pack
_pack_prefix = _PREFIX.pack


def make_location(log_id: int, offset: int) -> int:
    return (log_id << OFFSET_BITS) | offset


def split_location(location: int) -> tuple[int, int]:
    return location >> OFFSET_BITS, location & OFFSET_MASK


def log_name(log_id: int) -> str:
    return f"{log_id:08x}{LOG_SUFFIX}"


def list_logs(directory: str) -> dict[int, str]:
    """``{log id: path}`` of the entry logs in ``directory``."""
    out = {}
    for name in os.listdir(directory):
        stem, dot, ext = name.partition(".")
        if dot and "." + ext == LOG_SUFFIX and len(stem) == 8:
            try:
                out[int(stem, 16)] = os.path.join(directory, name)
            except ValueError:
                continue
    return out


def _encode_header(log_id: int) -> bytes:
    head = _LOG_HEADER.pack(LOG_MAGIC, FORMAT_VERSION, log_id)
    return head + _CRC.pack(crc32c(head))


def _header_ok(data: bytes, log_id: int) -> bool:
    if len(data) < HEADER_BYTES:
        return False
    magic, version, lid = _LOG_HEADER.unpack_from(data, 0)
    (crc,) = _CRC.unpack_from(data, _LOG_HEADER.size)
    return (magic == LOG_MAGIC and crc == crc32c(data[: _LOG_HEADER.size])
            and version == FORMAT_VERSION and lid == log_id)


def _encode_footer(log_id: int, data_end: int, usage: dict[int, int], footer_offset: int) -> bytes:
    body = cbor2.dumps({"v": FORMAT_VERSION, "log": log_id, "end": data_end, "usage": usage})
    return body + _TRAILER.pack(footer_offset, len(body), crc32c(body), FOOTER_MAGIC)


@dataclass(frozen=True)
class Footer:
    data_end: int
    usage: dict[int, int]


def read_footer(fd: int, log_id: int) -> Footer | None:
    """The log's footer, or ``None`` when it has none (or a damaged one: then it is resealed)."""
    size = os.fstat(fd).st_size
    if size < HEADER_BYTES + _TRAILER.size:
        return None
    offset, length, crc, magic = _TRAILER.unpack(os.pread(fd, _TRAILER.size, size - _TRAILER.size))
    if magic != FOOTER_MAGIC or offset < HEADER_BYTES or offset + length + _TRAILER.size != size:
        return None
    body = os.pread(fd, length, offset)
    if crc32c(body) != crc:
        return None
    try:
        doc: Any = cbor2.loads(body)
    except (cbor2.CBORDecodeError, ValueError):
        return None
    if not _footer_doc_ok(doc, log_id, offset):
        return None
    return Footer(doc["end"], dict(doc["usage"]))


def _footer_doc_ok(doc: Any, log_id: int, footer_offset: int) -> bool:
    if not isinstance(doc, dict) or doc.get("v") != FORMAT_VERSION or doc.get("log") != log_id:
        return False
    end, usage = doc.get("end"), doc.get("usage")
    if not isinstance(end, int) or not HEADER_BYTES <= end <= footer_offset or not isinstance(usage, dict):
        return False
    return all(isinstance(k, int) and isinstance(v, int) for k, v in usage.items())


def _records(mm: mmap.mmap | bytes, start: int, end: int,
             strict_path: str = "") -> Generator[tuple[int, int, int, bytes], None, int]:
    """Yield ``(ledger id, entry id, offset, blob)`` of valid records in [start, end).

    Returns the offset where valid records stop (``end`` when all of them are valid); with
    ``strict_path`` a bad record raises :class:`CorruptDataError` naming that file instead.
    """
    pos = start
    while pos < end:
        if not _record_ok(mm, pos, end):
            if strict_path:
                raise CorruptDataError("entry log record is corrupt", path=strict_path, offset=pos)
            return pos
        (length,) = _CRC.unpack_from(mm, pos)
        rec_end = pos + _PREFIX.size + length
        ledger_id, entry_id = _IDS.unpack_from(mm, pos + _PREFIX.size)
        yield ledger_id, entry_id, pos, mm[pos + RECORD_HEADER_BYTES:rec_end]
        pos = rec_end
    return end


def _record_ok(mm: mmap.mmap | bytes, pos: int, end: int) -> bool:
    if pos + RECORD_HEADER_BYTES > end:
        return False
    length, crc = _PREFIX.unpack_from(mm, pos)
    rec_end = pos + _PREFIX.size + length
    return _LENGTH_MIN <= length <= _LENGTH_MAX and rec_end <= end and crc32c(mm[pos + _PREFIX.size:rec_end]) == crc


def scan_file(path: str) -> Iterator[tuple[int, int, int, bytes]]:
    """Offline reader (``zbk shell readlog``): the valid records of one log file, leniently.

    Yields ``(ledger id, entry id, offset, blob)`` up to the footer's ``end`` (or, without a
    footer, up to the first bad record).
    """
    with open(path, "rb") as f:
        data = f.read()
    footer = None
    if len(data) >= HEADER_BYTES:
        lid = _LOG_HEADER.unpack_from(data, 0)[2]
        fd = os.open(path, os.O_RDONLY)
        try:
            footer = read_footer(fd, lid)
        finally:
            os.close(fd)
    end = footer.data_end if footer else len(data)
    yield from _records(data, HEADER_BYTES, end)


@dataclass(slots=True)
class ReadBatch:
    """What :meth:`EntryLogWriter.read_entries` read: the blobs (read-only views into the
    buffers they were read into, or copies where a buffer served little), and why it
    stopped before the last location (a damaged record, an I/O error), or ``None``."""

    blobs: list[memoryview | bytes]
    error: CorruptDataError | OSError | None = None


@dataclass(eq=False)
class _Log:
    """One entry log open for writing (active), or rotated but not yet fsynced (retired)."""

    log_id: int
    path: str
    directory: str
    fd: int
    key: int  # ledger id in per-ledger mode, -1 in interleaved mode
    written: int = 0  # bytes in the file; the buffer continues from here
    buf: bytearray = field(default_factory=bytearray)
    usage: dict[int, int] = field(default_factory=dict)
    unsynced: bool = False  # written but not fsynced
    writeback_from: int = 0  # file offset from which no writeback was started yet
    new_name: bool = True  # its directory entry is not yet fsynced
    last_access: float = 0.0


class EntryLogWriter:
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
                 keep_cached_bytes: int = limits.entry_log_keep_cached_bytes_default) -> None:
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
        self._last_id_persisted = self._read_last_id()
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

    def _read_last_id(self) -> int:
        best = 0
        for d in self._dirs:
            path = os.path.join(d, LAST_ID_FILE)
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                continue
            if len(data) != _LAST_ID.size + _CRC.size or _CRC.unpack_from(data, _LAST_ID.size)[0] != crc32c(
                    data[: _LAST_ID.size]) or data[:8] != LAST_ID_MAGIC:
                raise CorruptDataError("entry log id file is corrupt", path=path, offset=0)
            best = max(best, _LAST_ID.unpack_from(data, 0)[1])
        return best

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
            log.warning("entry log %s: unreadable record at offset %d; sealed there (%d bytes after it "
                        "ignored)", path, end, size - end)
        footer = Footer(end, usage)
        self._disk.pwrite(fd, _encode_footer(log_id, end, usage, size), size)
        self._disk.fsync(fd)
        self.sealed_on_open.append(log_id)
        return footer

    # --- appending ---------------------------------------------------------------------

    def append(self, ledger_id: int, entry_id: int, blob: bytes) -> int:
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

    def append_batch(self, ledger_id: int, entry_ids: Sequence[int], blobs: Sequence[bytes],
                     ledger_ids: Sequence[int] | None = None) -> list[int]:
        """:meth:`append` of each entry in order (of ``ledger_id``, or of ``ledger_ids[i]``),
        returning their locations: the same bytes, locations and rotations, with the loop's
        per-entry work in one place (the add path's largest per-entry cost in a bookie
        profile) and one write of the buffer at the end instead of one per
        ``entry_log_write_buffer_bytes``. Durable only after :meth:`flush`."""
        lids: Iterable[int] = ledger_ids if ledger_ids is not None else repeat(ledger_id, len(entry_ids))
        if self._per_ledger:  # a log per ledger: rotation and access times are per entry
            return [self.append(lid, eid, blob) for lid, eid, blob in zip(lids, entry_ids, blobs, strict=True)]
        if self._failed is not None:
            raise BookieIOError(f"entry logger failed earlier: {self._failed}")
        lg = self._active.get(-1)
        if lg is None:
            lg = self._new_active(-1)
        limit = self._size_limit
        buf, base, usage, high = lg.buf, lg.written, lg.usage, lg.log_id << OFFSET_BITS
        locations: list[int] = []
        append = locations.append
        for lid, eid, blob in zip(lids, entry_ids, blobs, strict=True):
            n = len(blob)
            size = RECORD_HEADER_BYTES + n
            pos = base + len(buf)
            if pos + size > limit and pos > HEADER_BYTES:
                self._retire(lg)
                lg = self._new_active(-1)
                buf, base, usage, high = lg.buf, lg.written, lg.usage, lg.log_id << OFFSET_BITS
                pos = base + len(buf)
            ids = _pack_ids(lid, eid)
            buf += _pack_prefix(_LENGTH_MIN + n, crc32c(blob, crc32c(ids))) + ids
            buf += blob
            usage[lid] = usage.get(lid, 0) + size
            append(high | pos)
        if len(lg.buf) >= self._write_buffer:
            self._write_out(lg)
        return locations

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
        return lg

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
            self._disk.write(lg.fd, lg.buf)
        except OSError as e:
            # The buffer stays: its entries are still readable from memory.
            self._failed = e
            raise
        start = lg.written
        lg.written += len(lg.buf)
        self._bytes_written += len(lg.buf)
        lg.buf = bytearray()
        lg.unsynced = True
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
        if excess < _DROP_STEP_BYTES:
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
        data = _LAST_ID.pack(LAST_ID_MAGIC, self._last_id)
        data += _CRC.pack(crc32c(data))
        for d in self._dirs:
            self._disk.write_file_atomic(os.path.join(d, LAST_ID_FILE), data)
        self._last_id_persisted = self._last_id

    def unflushed_log_ids(self) -> set[int]:
        """Logs still open for writing or holding unsynced data: GC must not touch them."""
        return {*(lg.log_id for lg in self._active.values()), *(lg.log_id for lg in self._retired)}

    def least_unflushed_log_id(self) -> int:
        """The smallest id GC must leave alone; every log below it is sealed and durable."""
        return min(self.unflushed_log_ids(), default=self._last_id + 1)

    # --- reading -----------------------------------------------------------------------

    def read(self, location: int, ledger_id: int | None = None, entry_id: int | None = None) -> bytes:
        """The blob at ``location``, checked against its crc; never returns bad bytes.

        With ``ledger_id`` and ``entry_id`` the record must also hold that entry (an index
        slot pointing at the wrong record is :class:`CorruptDataError`, not a wrong answer).
        """
        log_id, offset = location >> OFFSET_BITS, location & OFFSET_MASK
        lg = self._open.get(log_id)
        path, end = self._records_extent(log_id, lg, offset)
        if not HEADER_BYTES <= offset or offset + RECORD_HEADER_BYTES > end:
            raise CorruptDataError(f"location of {_entry(ledger_id, entry_id)} is outside the log's records",
                                   path=path, offset=offset)
        if lg is None:
            return _read_record(self._read_fd(log_id), path, offset, end, ledger_id, entry_id)
        if offset >= lg.written:  # still in the write buffer
            return _decode(lg.buf, offset - lg.written, len(lg.buf), path, offset, ledger_id, entry_id)
        return _read_record(lg.fd, path, offset, min(end, lg.written), ledger_id, entry_id)

    def read_entries(self, ledger_id: int, entry_ids: Sequence[int], locations: Sequence[int],
                     bytes_max: int) -> ReadBatch:
        """The blobs of entry ``entry_ids[i]`` of the ledger at ``locations[i]``, in order.

        Stops before the first entry that cannot be served (``error`` says why: exactly the
        error :meth:`read` raises for it; the entries before it are in the batch) and before
        the entry that would take the blobs past ``bytes_max`` (the first entry is always
        taken). Every record is checked as strictly as :meth:`read` checks one (length, crc32c,
        ledger and entry id), but records close together in a log are read with one pread
        and checked in place: the range read of a ledger written in sequence costs one
        system call per run of records instead of one or two per entry. A record the run
        cannot vouch for (damaged, or not wholly inside the run) goes through :meth:`read`.
        The blobs are views of the run (no copies), unless the run is mostly other bytes.
        """
        blobs: list[memoryview | bytes] = []
        total = 0
        n = len(locations)
        i = 0
        unpack = _REC.unpack_from
        length_min, length_max = _LENGTH_MIN, _LENGTH_MAX
        error: CorruptDataError | OSError | None = None
        full = False
        while i < n and error is None and not full:
            j, run, base = self._read_run(locations, i)
            size = len(run)
            mv = memoryview(run)
            run_first, run_start_total = len(blobs), total
            try:
                for loc, entry_id in zip(locations[i:j], entry_ids[i:j], strict=True):
                    at = (loc & OFFSET_MASK) - base  # >= 0: the run starts at its lowest location
                    blob: memoryview | bytes | None = None
                    if at + RECORD_HEADER_BYTES <= size:
                        length, crc, lid, eid = unpack(run, at)
                        rec_end = at + 8 + length  # 8: the length and crc fields
                        if (lid == ledger_id and eid == entry_id and length_min <= length <= length_max
                                and rec_end <= size):
                            body = mv[at + 8:rec_end]
                            if crc32c(body) == crc:
                                blob = body[16:]  # 16: the ledger and entry ids
                    if blob is None:  # the exact, strict path: raises for a bad record
                        blob = self.read(loc, ledger_id, entry_id)
                    total += len(blob)
                    if blobs and total > bytes_max:
                        total -= len(blob)
                        full = True
                        break
                    blobs.append(blob)
            except (CorruptDataError, OSError) as e:
                error = e
            if 4 * (total - run_start_total) < size:
                # A sparse run (records far apart, or a small record in a read-ahead guess):
                # copy its few blobs out so that the reply does not hold the whole run.
                blobs[run_first:] = [bytes(b) for b in blobs[run_first:]]
            i = j
        return ReadBatch(blobs, error)

    def _read_run(self, locations: Sequence[int], i: int) -> tuple[int, bytes, int]:
        """One read covering ``locations[i:j]``: returns ``j``, the bytes and their log offset.

        The run's locations lie in one log between ``locations[i]`` and ``locations[j - 1]``
        (:func:`_run_end`), so every record of the run starts inside the bytes; they are on
        one side of where an active log's written bytes end and its write buffer begins.
        The bytes reach _READ_GUESS_BYTES past the last location, or to the records' end. A
        location that cannot start a run (unknown log, outside the records) gets an empty
        run: :meth:`read` then raises its error."""
        loc = locations[i]
        log_id, offset = loc >> OFFSET_BITS, loc & OFFSET_MASK
        lg = self._open.get(log_id)
        footer = self._footers.get(log_id)
        if footer is not None:
            end = footer.data_end
        elif lg is not None:
            end = lg.written + len(lg.buf)
        else:
            return i + 1, b"", offset
        if offset < HEADER_BYTES or offset + RECORD_HEADER_BYTES > end:
            return i + 1, b"", offset
        in_buffer = lg is not None and offset >= lg.written
        floor = lg.written if in_buffer and lg is not None else HEADER_BYTES
        limit = end if lg is None or in_buffer else min(end, lg.written)
        # As locations: [low, high] is where the run's records may start.
        low, high = make_location(log_id, floor), make_location(log_id, limit - RECORD_HEADER_BYTES)
        j = _run_end(locations, i, max(low, loc), min(high, loc + _RUN_BYTES_MAX))
        first, last = loc, locations[j - 1]
        base = first & OFFSET_MASK
        want = min((last & OFFSET_MASK) - base + _READ_GUESS_BYTES, limit - base)
        if in_buffer:  # a copy: the write buffer changes, the views handed out must not
            assert lg is not None
            start = base - lg.written
            with memoryview(lg.buf) as buf:  # one copy (a bytearray slice would be a second)
                return j, bytes(buf[start:start + want]), base
        fd = self._read_fd(log_id) if lg is None else lg.fd
        return j, os.pread(fd, want, base), base

    def _records_extent(self, log_id: int, lg: _Log | None, offset: int) -> tuple[str, int]:
        """The log's path and where its records end (written or buffered)."""
        footer = self._footers.get(log_id)
        if footer is not None:
            return self._paths[log_id], footer.data_end
        if lg is not None:
            return lg.path, lg.written + len(lg.buf)
        raise CorruptDataError(f"entry log {log_id} does not exist",
                               path=os.path.join(self._dirs[0], log_name(log_id)), offset=offset)

    def _read_fd(self, log_id: int) -> int:
        fd = self._read_fds.get(log_id)
        if fd is not None:
            self._read_fds.move_to_end(log_id)
            return fd
        fd = os.open(self._paths[log_id], os.O_RDONLY)
        self._read_fds[log_id] = fd
        if len(self._read_fds) > _READ_FDS_MAX:
            os.close(self._read_fds.popitem(last=False)[1])
        return fd

    # --- scanning, usage, deletion --------------------------------------------------------

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


def _run_end(locations: Sequence[int], i: int, low: int, high: int) -> int:
    """The end ``j > i`` of the run of ``locations`` from ``i == low``: every location of the
    run lies in [low, locations[j - 1]], within [low, high], on average at most _RUN_GAP_MAX
    past ``low`` per location.

    Locations of a ledger written in sequence ascend, so the end is found by a binary search
    on the last location of the run, and the guess is then checked in C (min and max of the
    run). Where the locations do not ascend, the run is grown one location at a time."""
    n = len(locations)
    lo, hi = i + 1, n  # the end is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        loc = locations[mid - 1]
        if low <= loc <= high and loc - low <= (mid - i) * _RUN_GAP_MAX:
            lo = mid
        else:
            hi = mid - 1
    if lo - i <= 2 or (min(locations[i:lo]) == low and max(locations[i:lo]) == locations[lo - 1]):
        return lo
    j, last = i + 1, low  # not ascending: grow step by step
    while j < n and last < locations[j] <= min(high, last + _RUN_GAP_MAX):
        last = locations[j]
        j += 1
    return j


def _usage_of(mm: mmap.mmap, size: int, usage: dict[int, int]) -> int:
    """Fill ``usage`` from the valid records of a footerless log; returns where they stop."""
    gen = _records(mm, HEADER_BYTES, size)
    while True:
        try:
            ledger_id, _, _, blob = next(gen)
        except StopIteration as stop:
            return int(stop.value)
        usage[ledger_id] = usage.get(ledger_id, 0) + RECORD_HEADER_BYTES + len(blob)


def _entry(ledger_id: int | None, entry_id: int | None) -> str:
    return "entry" if ledger_id is None else f"entry {ledger_id}:{entry_id}"


def _read_record(fd: int, path: str, offset: int, end: int, ledger_id: int | None,
                 entry_id: int | None) -> bytes:
    # One pread serves most entries; a larger one needs a second read for its rest.
    data = os.pread(fd, min(_READ_GUESS_BYTES, end - offset), offset)
    length = _CRC.unpack_from(data, 0)[0] if len(data) >= _CRC.size else -1
    if not _LENGTH_MIN <= length <= _LENGTH_MAX or offset + _PREFIX.size + length > end:
        raise CorruptDataError(f"{_entry(ledger_id, entry_id)} has a bad record length {length}",
                               path=path, offset=offset)
    want = _PREFIX.size + length
    if len(data) < want:
        data += os.pread(fd, want - len(data), offset + len(data))
    return _decode(data, 0, min(len(data), want), path, offset, ledger_id, entry_id)


def _decode(data: bytes | bytearray, at: int, end: int, path: str, offset: int,
            ledger_id: int | None, entry_id: int | None) -> bytes:
    """Check the record at ``data[at:]`` and return its blob, or raise CorruptDataError."""
    if at + RECORD_HEADER_BYTES > end:
        raise CorruptDataError(f"{_entry(ledger_id, entry_id)} is cut short", path=path, offset=offset)
    length, crc = _PREFIX.unpack_from(data, at)
    rec_end = at + _PREFIX.size + length
    if not _LENGTH_MIN <= length <= _LENGTH_MAX or rec_end > end:
        raise CorruptDataError(f"{_entry(ledger_id, entry_id)} has a bad record length {length}",
                               path=path, offset=offset)
    ids = bytes(data[at + _PREFIX.size:at + RECORD_HEADER_BYTES])
    blob = bytes(data[at + RECORD_HEADER_BYTES:rec_end])
    if crc32c(blob, crc32c(ids)) != crc:
        raise CorruptDataError(f"{_entry(ledger_id, entry_id)} fails its crc32c", path=path, offset=offset)
    found = _IDS.unpack(ids)
    if (ledger_id is not None and found[0] != ledger_id) or (entry_id is not None and found[1] != entry_id):
        raise CorruptDataError(f"location of {_entry(ledger_id, entry_id)} holds entry {found[0]}:{found[1]}",
                               path=path, offset=offset)
    return blob
