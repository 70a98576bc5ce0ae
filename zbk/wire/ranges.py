"""Entry id sets as sorted inclusive ranges, and their packed wire form.

A bookie of an ensemble of E with write quorum WQ holds WQ of every E consecutive entries,
so the set of entry ids it holds is a run of short ranges; ranges keep a listing of millions
of entries small. Canonical form: ranges sorted, each ``first <= last``, and separated by a
gap (``first > previous_last + 1``), so equal sets have equal encodings.

Wire form (one payload frame): consecutive big-endian int64 pairs ``first, last``; 16 bytes
per range; an empty frame is the empty set.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator

from zbk.wire.messages import Blob, EntryRanges

RANGE_BYTES = 16
_INT64_MAX = 2**63 - 1
assert array("q").itemsize == 8, "array('q') must be int64 on this platform"


def ranges_from_ids(ids: Iterable[int]) -> EntryRanges:
    """The canonical ranges of a set of entry ids (any order, duplicates allowed)."""
    out: list[tuple[int, int]] = []
    first = last = -2
    for eid in sorted(set(ids)):
        assert 0 <= eid <= _INT64_MAX, f"entry id out of range: {eid}"
        if eid == last + 1:
            last = eid
            continue
        if last >= 0:
            out.append((first, last))
        first = last = eid
    if last >= 0:
        out.append((first, last))
    return tuple(out)


def iter_ids(ranges: EntryRanges) -> Iterator[int]:
    """Every entry id in ``ranges``, ascending (lazily: a range may be huge)."""
    for first, last in ranges:
        yield from range(first, last + 1)


def count_ids(ranges: EntryRanges) -> int:
    return sum(last - first + 1 for first, last in ranges)


def is_canonical(ranges: EntryRanges) -> bool:
    previous_last = -2
    for first, last in ranges:
        if not (previous_last + 1 < first <= last <= _INT64_MAX):
            return False
        previous_last = last
    return True


def pack_ranges(ranges: EntryRanges) -> bytes:
    flat = array("q", [eid for pair in ranges for eid in pair])
    if sys.byteorder == "little":
        flat.byteswap()  # the wire is big-endian, like every other zbk integer
    return flat.tobytes()


def unpack_ranges(frame: Blob) -> EntryRanges | None:
    """The ranges packed in ``frame``, or None if it is not a canonical packing."""
    if len(frame) % RANGE_BYTES:
        return None
    flat = array("q")
    flat.frombytes(frame)
    if sys.byteorder == "little":
        flat.byteswap()
    it = iter(flat)
    ranges = tuple(zip(it, it, strict=True))
    return ranges if is_canonical(ranges) else None
