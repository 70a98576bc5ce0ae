"""The journal format: the bookie's write-ahead log (format version 3; versions 1 and 2 are
still read).

Files
    ``<journal dir>/<segment id as 16 hex digits>.jnl``. Segment ids start at 1 and grow by
    one; a :class:`JournalWriter` always opens a NEW segment (max existing id + 1), so a
    segment that replay truncated is never appended to again. Retired segments kept for
    reuse are named ``<segment id>.jnl.free`` (see "Recycling"); they are not part of the log.

Segment header (24 bytes, written and fsynced, with the directory, before any record)::

    0   8s   magic  b"ZBKJRNL\\0"
    8   u32  format version (3; segments written by older bookies say 1 or 2)
    12  u64  segment id (must match the file name)
    20  u32  crc32c of bytes [0, 20)

Record (all integers little-endian)::

    0   u32  length: bytes after the crc (type + ledger id + entry id + payload), >= 17
    4   u32  crc32c of those ``length`` bytes, started from the segment's seed (versions 2
             and 3: :func:`segment_seed`; version 1: 0, the plain crc32c)
    8   u8   record type (:class:`RecordType`)
    9   u64  ledger id (0 for ADDS)
    17  i64  entry id (-1 when the type has none; LIMBO: 1 set / 0 clear; EXPLICIT_LAC: the
             LAC; ADDS: how many entry records its payload holds, >= 1)
    25  ...  payload (ADD: the entry blob; ADDS: entry records; MASTER_KEY: the key; others:
             empty)

ADDS records (version 3)
    An add batch's entries in one record: the payload is their records exactly as an entry
    log holds them (zbk/storage/entrylogformat.py: length, crc32c, ledger id, entry id,
    blob), back to back, as many as the entry id says. The bookie builds those records once,
    for its entry log, and the journal writes the same bytes, so an entry's bytes are
    checked and copied per entry once rather than once per file. Replay yields one ADD
    record per entry record, each with the mark after the whole ADDS record. The record's
    own crc32c, seeded as any other, is what tells a torn or recycled tail (below and
    "Recycling" in zbk/storage/journal.py); an entry record that fails its own length or
    crc32c check inside a record that passes its check, or a count that does not match,
    is :class:`CorruptDataError`. A batch larger than a record may be is written as several
    ADDS records, split between entries. Version 1 and 2 segments hold one ADD record per
    entry instead; the writer still writes those for a single entry appended by
    :meth:`JournalWriter.append`.

Batches and group commit
    Records are encoded into one in-memory buffer; :meth:`JournalWriter.sync` writes the
    whole buffer with one ``write()`` and one ``fsync`` (group commit). Every such write is
    a *batch* that starts with a 33-byte BATCH record: ledger id = segment id, entry id =
    ``synced_upto`` (how many bytes of this segment were known durable, i.e. fsynced,
    when the batch was written) and payload ``b"ZBKBATCH"``. Replay skips BATCH records;
    they exist to tell a torn tail from corruption. :meth:`JournalWriter.close` ends the
    segment with an empty batch written after the final fsync, so after a clean shutdown
    even the last data record is covered by a later ``synced_upto``.

The replay rule (torn tail versus corruption) is in zbk/storage/journalreplay.py; the
writer, preallocation, rotation and recycling of segments in zbk/storage/journal.py.
"""

from __future__ import annotations

import mmap
import os
import struct
from enum import IntEnum
from typing import NamedTuple

from crc32c import crc32c

from zbk import limits

FORMAT_VERSION = 3  # written; version 1 (unseeded CRCs) and 2 (no ADDS records) segments are read as well
READABLE_VERSIONS = frozenset({1, 2, 3})
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
    ADDS = 6  # entries added: entry id = how many; payload = their entry log records (version 3)


_KNOWN_TYPES = frozenset(int(t) for t in RecordType)
_ADDS = int(RecordType.ADDS)


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



def segment_seed(segment_id: int, version: int = FORMAT_VERSION) -> int:
    """The value every record CRC of a segment starts from (see "Recycling"): 0 in version 1
    segments, a function of the segment id from version 2 on (never 0)."""
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


