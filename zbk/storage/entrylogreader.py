"""Reading entry logs: single records, runs of records (range reads), read descriptors.

EntryLogWriter (zbk/storage/entrylog.py) owns the logs and builds on ``EntryLogReads``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from crc32c import crc32c

from zbk import limits
from zbk.errors import CorruptDataError
from zbk.storage.entrylogformat import (
    _LENGTH_MAX,
    _LENGTH_MIN,
    _REC,
    HEADER_BYTES,
    OFFSET_BITS,
    OFFSET_MASK,
    RECORD_HEADER_BYTES,
    Footer,
    _decode,
    _entry,
    _read_record,
    log_name,
    make_location,
)


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
    dfd: int = -1  # its O_DIRECT descriptor (-1: buffered writes)
    dtail: bytes = b""  # with dfd: the written bytes of the block holding ``written``


class EntryLogReads:
    """The read side of :class:`zbk.storage.entrylog.EntryLogWriter`, which sets this state."""

    _dirs: tuple[str, ...]
    _paths: dict[int, str]
    _footers: dict[int, Footer]
    _open: dict[int, _Log]
    _read_fds: OrderedDict[int, int]

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
        # total > bytes_max only after a first entry larger than bytes_max: nothing more fits.
        while i < n and error is None and not full and total <= bytes_max:
            j, run, base = self._read_run(locations, i, bytes_max - total)
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

    def _read_run(self, locations: Sequence[int], i: int, budget: int) -> tuple[int, bytes, int]:
        """One read covering ``locations[i:j]``: returns ``j``, the bytes and their log offset.

        The run reaches no further than the blobs still wanted (``budget`` bytes, plus an
        eighth for the record headers) could: a read served in slices reads each slice's
        records, not a whole ``limits.entry_log_read_run_bytes_max`` of which a slice uses a quarter.

        The run's locations lie in one log between ``locations[i]`` and ``locations[j - 1]``
        (:func:`_run_end`), so every record of the run starts inside the bytes; they are on
        one side of where an active log's written bytes end and its write buffer begins.
        The bytes reach ``limits.entry_log_read_guess_bytes`` past the last location, or to the records' end. A
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
        span = min(limits.entry_log_read_run_bytes_max, budget + budget // 8)
        j = _run_end(locations, i, max(low, loc), min(high, loc + span))
        first, last = loc, locations[j - 1]
        base = first & OFFSET_MASK
        want = min((last & OFFSET_MASK) - base + limits.entry_log_read_guess_bytes, limit - base)
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
        if len(self._read_fds) > limits.entry_log_read_fds_max:
            os.close(self._read_fds.popitem(last=False)[1])
        return fd

    # --- scanning, usage, deletion --------------------------------------------------------


def _run_end(locations: Sequence[int], i: int, low: int, high: int) -> int:
    """The end ``j > i`` of the run of ``locations`` from ``i == low``: every location of the
    run lies in [low, locations[j - 1]], within [low, high], on average at most
    ``limits.entry_log_read_run_gap_bytes_max``
    past ``low`` per location.

    Locations of a ledger written in sequence ascend, so the end is found by a binary search
    on the last location of the run, and the guess is then checked in C (min and max of the
    run). Where the locations do not ascend, the run is grown one location at a time."""
    n = len(locations)
    lo, hi = i + 1, n  # the end is in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        loc = locations[mid - 1]
        if low <= loc <= high and loc - low <= (mid - i) * limits.entry_log_read_run_gap_bytes_max:
            lo = mid
        else:
            hi = mid - 1
    if lo - i <= 2 or (min(locations[i:lo]) == low and max(locations[i:lo]) == locations[lo - 1]):
        return lo
    j, last = i + 1, low  # not ascending: grow step by step
    while j < n and last < locations[j] <= min(high, last + limits.entry_log_read_run_gap_bytes_max):
        last = locations[j]
        j += 1
    return j


