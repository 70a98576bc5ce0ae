"""Journal segments as a crash leaves them, for tests that damage them on purpose."""

from __future__ import annotations

from pathlib import Path

from crc32c import crc32c

from zbk.storage.journal import HEADER_BYTES, segment_seed


def records_end(seg: Path) -> int:
    """Where the segment's last valid record ends: its preallocated zeros (or, in a recycled
    segment, old records) follow (zbk/storage/journal.py, "Preallocation", "Recycling")."""
    data = seg.read_bytes()
    version = int.from_bytes(data[8:12], "little")
    seed = segment_seed(int.from_bytes(data[12:20], "little"), version)
    end = HEADER_BYTES
    while end + 8 <= len(data):  # walk the records: length, crc32c, then the body
        length = int.from_bytes(data[end:end + 4], "little")
        if length == 0 or end + 8 + length > len(data):
            break
        if crc32c(data[end + 8:end + 8 + length], seed) != int.from_bytes(data[end + 4:end + 8], "little"):
            break
        end += 8 + length
    return end


def write_torn(seg: Path, data: bytes) -> int:
    """Write ``data`` where the next commit would have gone (right after the last record,
    over the preallocated zeros): the state a crash in the middle of that write leaves.
    Returns the offset written at."""
    end = records_end(seg)
    with open(seg, "r+b") as f:
        f.seek(end)
        f.write(data)
    return end
