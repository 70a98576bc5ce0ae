"""Small durable markers kept in every index directory: the dirty marker and the last marks.

Dirty marker ``<index dir>/DIRTY``
    Created (durably) when the bookie starts and removed (durably) at a clean shutdown. If
    it is present at boot, the previous run ended uncleanly and BP-46 phase one runs
    (fence and limbo every ledger that is not closed). Its contents do not matter.

Last mark ``<index dir>/lastMark`` (format version 1, 32 bytes, replaced atomically)::

    0   8s   magic b"ZBKMARK\\0"
    8   u32  format version (1)
    12  u64  journal segment id
    20  u64  offset in that segment
    28  u32  crc32c of bytes [0, 28)

    The journal position up to which a checkpoint made everything durable in the entry
    logs and the index: boot replays the journal from here. It is written to every index
    directory; the reader takes the greatest valid mark (a crash between two directories
    leaves one of them one checkpoint behind, which only means replaying a little more).
    No file anywhere means "replay everything" (``LogMark(0, 0)``); a damaged file is
    :class:`CorruptDataError`, because guessing a mark could skip acknowledged records.

One last mark per journal (several ``journal_dirs``, as BookKeeper keeps a lastMark per
journal): journal 0's is ``lastMark``, journal i's (i >= 1) ``lastMark.<i>``, each in the
format above. A checkpoint writes every journal's mark; each journal replays from its own.
A crash between two of them leaves one journal's mark a checkpoint behind, which again
only means replaying a little more of that journal. So a bookie that had one journal
keeps its ``lastMark``, and a journal added later has no file yet: it replays from its
start, which is where its records begin.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

from crc32c import crc32c

from zbk.errors import CorruptDataError
from zbk.storage.disk import REAL_DISK, Disk
from zbk.storage.journal import START, LogMark

FORMAT_VERSION = 1
DIRTY_FILE = "DIRTY"
LAST_MARK_FILE = "lastMark"
MARK_MAGIC = b"ZBKMARK\x00"
_MARK = struct.Struct("<8sIQQ")
_CRC = struct.Struct("<I")
MARK_BYTES = _MARK.size + _CRC.size


def _dirs(dirs: str | Sequence[str]) -> tuple[str, ...]:
    return (dirs,) if isinstance(dirs, str) else tuple(dirs)


def mark_dirty(dirs: str | Sequence[str], disk: Disk = REAL_DISK) -> None:
    """Set the dirty marker durably in every directory (at start, before serving)."""
    for d in _dirs(dirs):
        os.makedirs(d, exist_ok=True)
        disk.write_file_atomic(os.path.join(d, DIRTY_FILE), b"zbk: running or crashed\n")


def was_dirty(dirs: str | Sequence[str]) -> bool:
    """True when any directory still holds the dirty marker: the last shutdown was not clean."""
    return any(os.path.exists(os.path.join(d, DIRTY_FILE)) for d in _dirs(dirs))


def clear_dirty(dirs: str | Sequence[str], disk: Disk = REAL_DISK) -> None:
    """Remove the dirty marker durably (the last step of a clean shutdown)."""
    for d in _dirs(dirs):
        try:
            os.unlink(os.path.join(d, DIRTY_FILE))
        except FileNotFoundError:
            continue
        disk.fsync_dir(d)


def encode_mark(mark: LogMark) -> bytes:
    body = _MARK.pack(MARK_MAGIC, FORMAT_VERSION, mark.segment_id, mark.offset)
    return body + _CRC.pack(crc32c(body))


def decode_mark(data: bytes, path: str) -> LogMark:
    if len(data) != MARK_BYTES:
        raise CorruptDataError(f"last mark file has {len(data)} bytes, not {MARK_BYTES}", path=path, offset=0)
    magic, version, segment_id, offset = _MARK.unpack_from(data, 0)
    if magic != MARK_MAGIC or _CRC.unpack_from(data, _MARK.size)[0] != crc32c(data[: _MARK.size]):
        raise CorruptDataError("last mark file fails its checks", path=path, offset=0)
    if version != FORMAT_VERSION:
        raise CorruptDataError(f"last mark format version {version} is not {FORMAT_VERSION}", path=path,
                               offset=0)
    return LogMark(segment_id, offset)


def last_mark_file(journal: int = 0) -> str:
    """The name of journal ``journal``'s last mark file."""
    assert journal >= 0, journal
    return LAST_MARK_FILE if journal == 0 else f"{LAST_MARK_FILE}.{journal}"


def write_last_mark(dirs: str | Sequence[str], mark: LogMark, disk: Disk = REAL_DISK, *, journal: int = 0) -> None:
    """Persist journal ``journal``'s ``mark`` atomically in every directory (checkpoint step three)."""
    data = encode_mark(mark)
    name = last_mark_file(journal)
    for d in _dirs(dirs):
        os.makedirs(d, exist_ok=True)
        disk.write_file_atomic(os.path.join(d, name), data)


def write_last_marks(dirs: str | Sequence[str], marks: Sequence[LogMark | tuple[int, int]],
                     disk: Disk = REAL_DISK) -> None:
    """Persist the mark of every journal (``marks[i]`` is journal i's)."""
    for journal, mark in enumerate(marks):
        write_last_mark(dirs, LogMark(*mark), disk, journal=journal)


def read_last_mark(dirs: str | Sequence[str], *, journal: int = 0) -> LogMark:
    """Journal ``journal``'s greatest persisted mark; ``LogMark(0, 0)`` when none was ever written."""
    best = START
    name = last_mark_file(journal)
    for d in _dirs(dirs):
        path = os.path.join(d, name)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        best = max(best, decode_mark(data, path))
    return best


def read_last_marks(dirs: str | Sequence[str], journals: int) -> list[LogMark]:
    """The last mark of each of ``journals`` journals, in journal order."""
    return [read_last_mark(dirs, journal=j) for j in range(journals)]
