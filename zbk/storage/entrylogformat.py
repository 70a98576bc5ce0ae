"""The entry log format (version 1): files, header, records, footer; sealing; scans.

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

Crash recovery ("sealing")
    A log without a valid footer was being written when the bookie stopped. On open, the
    writer scans it from the header, stops at the first bad record (short, bad length,
    CRC mismatch), and appends a footer whose ``end`` is that offset. Nothing is
    truncated: bytes after ``end`` are kept for inspection, but reading a location at or
    after ``end`` is a :class:`CorruptDataError`, never a wrong answer. A sealed log is
    read strictly: a bad record before ``end`` is :class:`CorruptDataError`. Torn tails
    hold only entries that were never flushed; checkpoints flush the entry logs before
    the index points at them, and journal replay re-adds newer entries into new logs.
    A tail of nothing but zeros (the padding of a direct write, zbk/storage/entrylog.py, or
    blocks never written) is logged as information; any other bad tail as a warning.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import cbor2
from crc32c import crc32c

from zbk import limits
from zbk.errors import CorruptDataError

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


def encode_last_id(log_id: int) -> bytes:
    """The contents of a ``LASTLOGID`` file naming ``log_id``."""
    data = _LAST_ID.pack(LAST_ID_MAGIC, log_id)
    return data + _CRC.pack(crc32c(data))


def read_last_id(directory: str) -> int:
    """The log id the ``LASTLOGID`` file of ``directory`` names; 0 without one."""
    path = os.path.join(directory, LAST_ID_FILE)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return 0
    if (len(data) != _LAST_ID.size + _CRC.size or data[:8] != LAST_ID_MAGIC
            or _CRC.unpack_from(data, _LAST_ID.size)[0] != crc32c(data[:_LAST_ID.size])):
        raise CorruptDataError("entry log id file is corrupt", path=path, offset=0)
    return int(_LAST_ID.unpack_from(data, 0)[1])


def encode_records(ledger_ids: Sequence[int], entry_ids: Sequence[int],
                   blobs: Sequence[bytes | bytearray | memoryview]) -> bytearray:
    """The records of entry ``entry_ids[i]`` of ledger ``ledger_ids[i]`` with blob
    ``blobs[i]``, in order, as a log holds them (the journal's ADDS records carry the same
    bytes, zbk/storage/journalformat.py)."""
    out = bytearray()
    for lid, eid, blob in zip(ledger_ids, entry_ids, blobs, strict=True):
        ids = _pack_ids(lid, eid)
        out += _pack_prefix(_LENGTH_MIN + len(blob), crc32c(blob, crc32c(ids))) + ids
        out += blob
    return out


def record_lengths(records: bytes | bytearray | memoryview) -> Iterator[int]:
    """The size of each record in ``records`` (records back to back, as
    :func:`encode_records` makes them), headers included; ValueError where one does not fit."""
    pos, end = 0, len(records)
    while pos < end:
        if pos + RECORD_HEADER_BYTES > end:
            raise ValueError(f"entry record at {pos} of {end} bytes is cut short")
        size = _PREFIX.size + _CRC.unpack_from(records, pos)[0]
        if size < RECORD_HEADER_BYTES or pos + size > end:
            raise ValueError(f"entry record at {pos} of {end} bytes has a bad length")
        yield size
        pos += size


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
    data = os.pread(fd, min(limits.entry_log_read_guess_bytes, end - offset), offset)
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
