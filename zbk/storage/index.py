"""Per-ledger index files: entry id -> entry log location, plus the ledger's state (format version 1).

Files
    ``<index dir>/<ledger id & 0xff as 2 hex digits>/<ledger id as 16 hex digits>.idx``.
    The two-digit shard keeps directories small. A new ledger goes to index dir number
    ``ledger_id % len(index_dirs)``; an existing file is found wherever it is.

Header (128 bytes at offset 0; inside one 512-byte sector, so a header write is atomic on
any disk that honours sector atomicity)::

    0    8s   magic  b"ZBKIDX\\0\\0"
    8    u32  format version (1)
    12   u32  flags: 1 fenced, 2 limbo (BP-46), 4 master key present
    16   u64  ledger id (must match the file name)
    24   i64  explicit LAC (-1: none)
    32   u8   master key length (<= 64)
    33   64s  master key, zero padded
    97   27x  reserved (zero)
    124  u32  crc32c of bytes [0, 124)

    A header that is all zeros, or a file shorter than a header, is one whose creating
    flush never completed: it reads as a fresh ledger (nothing in it was durable yet). Any
    other header that fails its checks is :class:`CorruptDataError`.

Slots (from offset 128; slot ``e`` at ``128 + 16 * e``; pages of ``index_page_entries``)::

    0   u64  location ((entry log id << 40) | offset), never 0 for a stored entry
    8   u64  check = location ^ entry id ^ SLOT_KEY

    ``(0, 0)`` is an absent entry (a hole of a sparse file reads as zeros). A slot that is
    not ``(0, 0)`` and fails its check raises :class:`CorruptDataError` with the slot's
    file offset. The check binds a slot to its position, so a page written to the wrong
    place is detected too. Slots are 16-byte aligned and never straddle a sector. The
    check is an xor, not a crc: it is computed on the add path and verified on every
    read, and catches what disks actually do to a slot (zeros, garbage, misplacement).

A page is written whole (pages are the unit of caching in the ledger cache; rewriting a
page rewrites unchanged slots with identical bytes), or, when it lies wholly inside the
file already, only its changed slots are written in place (:func:`write_slots`; such a
write never changes the file's size). So a file ends on a page boundary, except after a crash in the middle of a write that extended it: the kernel grows
a file's size one page-cache page (4 KiB) at a time, so a torn extension ends on a 4 KiB
boundary, and its missing slots read as absent (journal replay puts them back). A last
page that ends anywhere else was cut by something other than a crash: reading it is
:class:`CorruptDataError` (never "the entries past the cut are absent", which would be an
explicit negative for acknowledged entries). A cut on a 4 KiB boundary, or one that removes
whole pages, cannot be told from a torn write or from pages never written: the format has
no page count to check it against (docs/reliability.md, "Known limits").
"""

from __future__ import annotations

import array
import os
import struct
import sys
from dataclasses import dataclass

from crc32c import crc32c

from zbk import limits
from zbk.errors import BadRequestError, CorruptDataError
from zbk.storage.disk import Disk

FORMAT_VERSION = 1
INDEX_MAGIC = b"ZBKIDX\x00\x00"
INDEX_SUFFIX = ".idx"
MASTER_KEY_BYTES_MAX = 64
FLAG_FENCED = 1
FLAG_LIMBO = 2
FLAG_MASTER_KEY = 4
SLOT_KEY = 0x5A424B5F534C4F54  # b"ZBK_SLOT" as an integer
SLOT_BYTES = 16
PAGE_ENTRIES = limits.index_page_entries
PAGE_BYTES = PAGE_ENTRIES * SLOT_BYTES

_HEADER = struct.Struct("<8sIIQqB64s27x")
_CRC = struct.Struct("<I")
HEADER_BYTES = _HEADER.size + _CRC.size  # 128
_LITTLE = sys.byteorder == "little"
_TORN_SIZE_GRANULE = 4096  # a crash leaves a growing file's size on a page-cache page boundary


@dataclass(slots=True)
class IndexHeader:
    """A ledger's durable state on this bookie (BP-46 fenced and limbo, master key, explicit LAC)."""

    fenced: bool = False
    limbo: bool = False
    master_key: bytes | None = None
    explicit_lac: int = -1

    def encode(self, ledger_id: int) -> bytes:
        key = self.master_key or b""
        if len(key) > MASTER_KEY_BYTES_MAX:
            raise BadRequestError(f"master key of {len(key)} bytes exceeds {MASTER_KEY_BYTES_MAX}")
        flags = ((FLAG_FENCED if self.fenced else 0) | (FLAG_LIMBO if self.limbo else 0)
                 | (FLAG_MASTER_KEY if self.master_key is not None else 0))
        head = _HEADER.pack(INDEX_MAGIC, FORMAT_VERSION, flags, ledger_id, self.explicit_lac, len(key), key)
        return head + _CRC.pack(crc32c(head))


def decode_header(data: bytes, ledger_id: int, path: str) -> IndexHeader:
    """The header in ``data`` (the first bytes of an index file); see the module doc."""
    if len(data) < HEADER_BYTES or not any(data[:HEADER_BYTES]):
        return IndexHeader()
    magic, version, flags, lid, lac, key_len, key = _HEADER.unpack_from(data, 0)
    (crc,) = _CRC.unpack_from(data, _HEADER.size)
    if magic != INDEX_MAGIC or crc != crc32c(data[: _HEADER.size]):
        raise CorruptDataError("index header fails its checks", path=path, offset=0)
    if version != FORMAT_VERSION or lid != ledger_id or key_len > MASTER_KEY_BYTES_MAX:
        raise CorruptDataError(f"index header is of version {version}, ledger {lid}", path=path, offset=0)
    master_key = bytes(key[:key_len]) if flags & FLAG_MASTER_KEY else None
    return IndexHeader(bool(flags & FLAG_FENCED), bool(flags & FLAG_LIMBO), master_key, lac)


def index_path(directory: str, ledger_id: int) -> str:
    return os.path.join(directory, f"{ledger_id & 0xFF:02x}", f"{ledger_id:016x}{INDEX_SUFFIX}")


def list_index_files(directory: str) -> dict[int, str]:
    """``{ledger id: path}`` of the index files under one index directory."""
    out: dict[int, str] = {}
    for shard in os.listdir(directory):
        shard_dir = os.path.join(directory, shard)
        if len(shard) != 2 or not os.path.isdir(shard_dir):
            continue
        for name in os.listdir(shard_dir):
            stem, dot, ext = name.partition(".")
            if dot and "." + ext == INDEX_SUFFIX and len(stem) == 16:
                try:
                    out[int(stem, 16)] = os.path.join(shard_dir, name)
                except ValueError:
                    continue
    return out


# --- pages -------------------------------------------------------------------------------


def new_page() -> array.array[int]:
    """An in-memory page: ``2 * PAGE_ENTRIES`` u64 words, (location, check) per slot."""
    return array.array("Q", bytes(PAGE_BYTES))


def page_offset(page_no: int) -> int:
    return HEADER_BYTES + page_no * PAGE_BYTES


def page_count(file_size: int) -> int:
    """Pages present (possibly partly) in a file of ``file_size`` bytes."""
    return max(0, -(-(file_size - HEADER_BYTES) // PAGE_BYTES))


def whole_pages(file_size: int) -> int:
    """Pages wholly inside a file of ``file_size`` bytes (a torn extension's last page is not)."""
    return max(0, (file_size - HEADER_BYTES) // PAGE_BYTES)


def read_page(fd: int, page_no: int, path: str = "") -> array.array[int]:
    """A page from the file; slots past the end read as absent, unless the file ends inside
    the page somewhere a torn write cannot leave it: :class:`CorruptDataError` (truncated)."""
    data = os.pread(fd, PAGE_BYTES, page_offset(page_no))
    if 0 < len(data) < PAGE_BYTES and (page_offset(page_no) + len(data)) % _TORN_SIZE_GRANULE:
        raise CorruptDataError(f"index page {page_no} is cut short ({len(data)} of {PAGE_BYTES} bytes): "
                               "the file was truncated", path=path or _fd_path(fd),
                               offset=page_offset(page_no) + len(data))
    page = array.array("Q", data[: len(data) - len(data) % 8])
    if not _LITTLE:
        page.byteswap()
    missing = 2 * PAGE_ENTRIES - len(page)
    if missing:
        page.frombytes(bytes(8 * missing))
    return page


def _fd_path(fd: int) -> str:
    """The file behind ``fd``, for error messages (Linux /proc; else the descriptor)."""
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"<fd {fd}>"


def write_page(disk: Disk, fd: int, page_no: int, page: array.array[int]) -> None:
    if _LITTLE:
        disk.pwrite(fd, page, page_offset(page_no))
    else:
        swapped = array.array("Q", page)
        swapped.byteswap()
        disk.pwrite(fd, swapped, page_offset(page_no))


def write_page_words(disk: Disk, fd: int, page_no: int, page: array.array[int], lo: int, hi: int) -> None:
    """Write words ``lo:hi`` of a page (whole slots: both even) in place, for a page wholly
    inside the file whose other slots on disk equal the page's (zbk.storage.ledgercache,
    "Changed ranges"); such a write never changes the file's size."""
    assert 0 <= lo < hi <= 2 * PAGE_ENTRIES and lo % 2 == 0 and hi % 2 == 0
    words = page[lo:hi]
    if not _LITTLE:
        words.byteswap()
    disk.pwrite(fd, words, page_offset(page_no) + 8 * lo)


def write_slots(disk: Disk, fd: int, first_entry_id: int, locations: list[int]) -> None:
    """Write the slots of consecutive entries ``first_entry_id, first_entry_id + 1, ...`` in
    place (no page around them): for pages wholly in the file already, whose other slots on
    disk are what the cache would write back anyway (zbk.storage.ledgercache, "deltas")."""
    words = array.array("Q", bytes(16 * len(locations)))
    words[0::2] = array.array("Q", locations)
    words[1::2] = array.array("Q", [loc ^ (first_entry_id + k) ^ SLOT_KEY for k, loc in enumerate(locations)])
    if not _LITTLE:
        words.byteswap()
    disk.pwrite(fd, words, HEADER_BYTES + first_entry_id * SLOT_BYTES)


def set_slot(page: array.array[int], entry_id: int, location: int) -> None:
    i = (entry_id % PAGE_ENTRIES) * 2
    page[i] = location
    page[i + 1] = location ^ entry_id ^ SLOT_KEY


def slot_location(page: array.array[int], entry_id: int, path: str) -> int | None:
    """The location in the entry's slot, ``None`` when absent; CorruptDataError when damaged."""
    i = (entry_id % PAGE_ENTRIES) * 2
    location, check = page[i], page[i + 1]
    if location ^ check == entry_id ^ SLOT_KEY and location:
        return location
    if location == 0 and check == 0:
        return None
    raise CorruptDataError(f"index slot of entry {entry_id} fails its check", path=path,
                           offset=HEADER_BYTES + entry_id * SLOT_BYTES)


def _lanes(words: array.array[int]) -> int:
    """The u64 words of an array as one int, word ``k`` in bits [64k, 64k + 64)."""
    return int.from_bytes(words, sys.byteorder)  # native order both ways: lanes line up


# Slot i of any page checks against (page base + i) ^ SLOT_KEY = page base ^ (i ^ SLOT_KEY),
# because a page base has no bits below PAGE_ENTRIES (a power of two).
assert PAGE_ENTRIES & (PAGE_ENTRIES - 1) == 0, "pages must hold a power of two of slots"
_LOW_KEYS = array.array("Q", [i ^ SLOT_KEY for i in range(PAGE_ENTRIES)])


def slot_locations(page: array.array[int], page_no: int, lo: int, hi: int, path: str) -> list[int | None]:
    """The locations in slots ``lo <= i < hi`` of page ``page_no`` (``None`` where absent), each
    checked as :func:`slot_location` checks one; the first damaged slot raises CorruptDataError.

    A range read looks up thousands of slots, so the checks run on the whole range at once:
    the check word every slot must hold (``location ^ entry id ^ SLOT_KEY``, or 0 where the
    location is 0) is computed as xors of big ints whose 64-bit lanes are the slots, and
    compared with the check words in C. Only when that fails are the slots checked one by
    one, so a damaged slot is reported exactly as :func:`slot_location` reports it."""
    n = hi - lo
    locations = page[2 * lo:2 * hi:2]
    checks = page[2 * lo + 1:2 * hi:2]
    out: list[int | None] = locations.tolist()  # type: ignore[assignment]
    want = _lanes(locations) ^ _lanes(_LOW_KEYS[lo:hi]) ^ _lanes(array.array("Q", [page_no * PAGE_ENTRIES]) * n)
    if 0 not in out:
        ok = want == _lanes(checks)
    else:  # absent slots (a sparse range, or its end): their check word must be 0 too
        expected = array.array("Q")
        expected.frombytes(want.to_bytes(8 * n, sys.byteorder))
        i = out.index(0)
        while True:
            expected[i] = 0
            out[i] = None
            try:
                i = out.index(0, i + 1)
            except ValueError:
                break
        ok = expected == checks
    if ok:
        return out
    first = page_no * PAGE_ENTRIES
    return [slot_location(page, first + i, path) for i in range(lo, hi)]


def page_entries(page: array.array[int], page_no: int, path: str) -> list[int]:
    """Entry ids present in a page, ascending (every present slot is checked)."""
    base = page_no * PAGE_ENTRIES
    out = []
    locations = page[0::2]
    for i, location in enumerate(locations):
        if location or page[2 * i + 1]:
            slot_location(page, base + i, path)
            out.append(base + i)
    return out
