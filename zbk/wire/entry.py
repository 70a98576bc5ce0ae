"""The entry blob: built once by the writer, stored verbatim by bookies, returned verbatim.

Format version 1 (all integers big-endian)::

    offset  size  field
    0       1     format version (1)
    1       1     digest type (DigestType: 0 dummy, 1 crc32, 2 crc32c, 3 hmac-sha256)
    2       8     ledger id        int64 >= 0
    10      8     entry id         int64 >= 0
    18      8     LAC at write time int64, -1 <= lac < entry id
    26      8     ledger length    uint64: payload bytes of entries 0..entry id, this one included
    34      4     payload length   uint32 <= limits.entry_bytes_max
    38      D     digest (D = 0, 4, 4 or 32 bytes by digest type)
    38 + D  N     payload

The ledger length lets recovery close a ledger with its length from the last entry alone
(as BookKeeper's entry header does), without reading the whole ledger.

The digest covers the 38 header bytes and the payload: every field but itself. It is
computed with the ledger's digest (``zbk.client.digest``); a bookie never has the password,
so it checks only the structure (:func:`peek_entry_header`), while readers check the digest
(:func:`parse_entry`). The version and digest type lead the blob so that a reader can tell
formats apart before interpreting anything else; a new format gets a new version number and
readers keep accepting the old ones.
"""

from __future__ import annotations

import hmac
import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from zbk import limits
from zbk.errors import BadRequestError, DigestMismatchError
from zbk.wire.errors import FrameError
from zbk.wire.messages import Blob

ENTRY_FORMAT_VERSION = 1
_HEADER = struct.Struct(">BBqqqQI")
ENTRY_HEADER_BYTES = _HEADER.size  # 38
_INT64_MAX = 2**63 - 1


class DigestType(IntEnum):
    DUMMY = 0  # no digest: structure checks only
    CRC32 = 1  # zlib CRC-32, 4 bytes
    CRC32C = 2  # CRC-32C (Castagnoli), 4 bytes
    HMAC_SHA256 = 3  # HMAC-SHA256 keyed from the ledger password, 32 bytes


DIGEST_BYTES: dict[int, int] = {
    DigestType.DUMMY: 0,
    DigestType.CRC32: 4,
    DigestType.CRC32C: 4,
    DigestType.HMAC_SHA256: 32,
}
ENTRY_BYTES_MAX = ENTRY_HEADER_BYTES + max(DIGEST_BYTES.values()) + limits.entry_bytes_max


class EntryDigest(Protocol):
    """What the entry format needs of a digest (implemented by ``zbk.client.digest.Digest``)."""

    @property
    def type(self) -> DigestType: ...

    @property
    def size(self) -> int: ...

    def compute(self, header: Blob, payload: Blob) -> bytes: ...


@dataclass(frozen=True, slots=True)
class ParsedEntry:
    """A digest-checked entry. ``payload`` is a zero-copy view into the blob."""

    ledger_id: int
    entry_id: int
    lac: int
    payload: memoryview
    ledger_length: int = 0


def build_entry(ledger_id: int, entry_id: int, lac: int, payload: Blob, digest: EntryDigest,
                ledger_length: int | None = None) -> bytes:
    """The blob of one entry (one copy of the payload). ``ledger_length`` is the ledger's
    length including this payload (default: just this payload's size)."""
    # A writer builds every entry here, so the checks are few and cheap: lac < entry id also
    # says entry id >= 0, and each digest's size is checked against its type at import.
    size = len(payload) if type(payload) is bytes else memoryview(payload).nbytes
    if size > limits.entry_bytes_max:
        raise BadRequestError(f"entry payload of {size} bytes exceeds {limits.entry_bytes_max}")
    total = size if ledger_length is None else ledger_length
    assert 0 <= ledger_id <= _INT64_MAX and -1 <= lac < entry_id <= _INT64_MAX and total >= size, \
        f"ledger {ledger_id} entry {entry_id} lac {lac} (must be -1 or below the entry id) length {total} of {size}"
    header = _HEADER.pack(ENTRY_FORMAT_VERSION, digest.type, ledger_id, entry_id, lac, total, size)
    code = digest.compute(header, payload)
    assert len(code) == digest.size
    return b"".join((header, code, payload))


def with_lac(blob: bytes, lac: int, digest: EntryDigest) -> bytes:
    """The entry ``blob`` (built with ``digest``) carrying ``lac`` instead, its digest
    computed again: a writer gives an entry that waited to be sent the LAC it has by then."""
    _, _, ledger_id, entry_id, _, total, size = _HEADER.unpack_from(blob)
    payload = memoryview(blob)[_HEADER.size + digest.size:]
    assert payload.nbytes == size, (payload.nbytes, size)
    return build_entry(ledger_id, entry_id, lac, payload, digest, ledger_length=total)


def check_structure(blob: Blob) -> tuple[int, int, int, int, int, int] | str:
    """(digest type, ledger id, entry id, lac, digest size, ledger length) of a well-formed
    blob, else why not.

    One struct.unpack_from and a few comparisons: cheap enough for every add on a bookie.
    """
    try:
        version, dtype, ledger_id, entry_id, lac, total, size = _HEADER.unpack_from(blob)
    except (struct.error, TypeError):
        return "entry shorter than its header"
    if version != ENTRY_FORMAT_VERSION:
        return f"unknown entry format version {version}"
    dsize = DIGEST_BYTES.get(dtype)
    if dsize is None:
        return f"unknown digest type {dtype}"
    if ledger_id < 0 or entry_id < 0 or not -1 <= lac < entry_id:
        return f"bad ids: ledger {ledger_id} entry {entry_id} lac {lac}"
    if size > limits.entry_bytes_max or len(blob) != ENTRY_HEADER_BYTES + dsize + size:
        return f"entry of {len(blob)} bytes does not match its payload length {size}"
    if total < size:
        return f"ledger length {total} is below the entry's own payload length {size}"
    return dtype, ledger_id, entry_id, lac, dsize, total


def peek_entry_header(blob: Blob) -> tuple[int, int, int]:
    """(ledger id, entry id, lac) of a structurally valid blob; the bookie's only look inside.

    Raises :class:`FrameError` (no rid: the caller knows its request) on a short, oversized
    or garbled blob. The digest is not checked: a bookie lacks the key, and readers check it.
    """
    checked = check_structure(blob)
    if isinstance(checked, str):
        raise FrameError(checked)
    return checked[1], checked[2], checked[3]


def parse_entry(
    blob: Blob,
    digest: EntryDigest,
    *,
    ledger_id: int | None = None,
    entry_id: int | None = None,
) -> ParsedEntry:
    """Verify ``blob`` with ``digest`` and return its fields.

    Raises :class:`DigestMismatchError` on any malformed blob, a digest type other than the
    ledger's (no downgrade to a weaker digest), a digest mismatch, or ids other than the
    expected ``ledger_id``/``entry_id`` when given (a bookie answering with the wrong entry
    is as wrong as a corrupt one).
    """
    checked = check_structure(blob)
    if isinstance(checked, str):
        raise DigestMismatchError(checked)
    dtype, lid, eid, lac, dsize, total = checked
    if dtype != digest.type:
        raise DigestMismatchError(f"entry digest type {dtype} is not the ledger's {int(digest.type)}")
    if (ledger_id is not None and lid != ledger_id) or (entry_id is not None and eid != entry_id):
        raise DigestMismatchError(f"asked for entry {ledger_id}/{entry_id}, got {lid}/{eid}")
    view = memoryview(blob)
    payload = view[ENTRY_HEADER_BYTES + dsize :]
    expected = digest.compute(view[:ENTRY_HEADER_BYTES], payload)
    if not hmac.compare_digest(expected, view[ENTRY_HEADER_BYTES : ENTRY_HEADER_BYTES + dsize]):
        raise DigestMismatchError(f"digest mismatch in entry {lid}/{eid}")
    return ParsedEntry(lid, eid, lac, payload, total)
