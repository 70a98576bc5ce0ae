"""The GarbageCollector's persisted state: ``<ledger dir>/GCSTATE``.

Format (version 1), replaced atomically::

    0   8s   magic b"ZBKGCST\\0"
    8   u32  format version (1)
    12  i64  dupes_from: logs with this id or larger may hold unreferenced copies of an
             interrupted compaction; -1: none
    20  u32  crc32c of bytes [0, 20)

A missing file means -1. A damaged one is reported and ignored: the worst outcome is
duplicate copies that stay until their ledgers are deleted, never a lost entry. Why
``dupes_from`` exists: zbk/actors/gc.py, "Compaction of log O".
"""

from __future__ import annotations

import logging
import os
import struct

from crc32c import crc32c

from zbk.storage.disk import REAL_DISK, Disk

# Named as the module this code was split from: log configuration and output stay as they were.
log = logging.getLogger("zbk.actors.gc")


class GcStateFile:
    """``<ledger dir>/GCSTATE``: the format is in the module docstring."""

    MAGIC = b"ZBKGCST\x00"
    VERSION = 1
    NAME = "GCSTATE"
    _BODY = struct.Struct("<8sIq")
    _CRC = struct.Struct("<I")

    def __init__(self, directory: str, disk: Disk = REAL_DISK) -> None:
        self.path = os.path.join(directory, self.NAME)
        self._disk = disk

    def load(self) -> int | None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        body = self._BODY.size
        if (len(data) != body + self._CRC.size or self._CRC.unpack_from(data, body)[0] != crc32c(data[:body])
                or data[:8] != self.MAGIC or self._BODY.unpack_from(data)[1] != self.VERSION):
            log.error("gc: %s is damaged; ignoring it (duplicate compaction copies, if any, stay "
                      "until their ledgers are deleted)", self.path)
            return None
        value = int(self._BODY.unpack_from(data)[2])
        return None if value < 0 else value

    def save(self, dupes_from: int | None) -> None:
        if dupes_from is None and not os.path.exists(self.path):
            return
        data = self._BODY.pack(self.MAGIC, self.VERSION, -1 if dupes_from is None else dupes_from)
        self._disk.write_file_atomic(self.path, data + self._CRC.pack(crc32c(data)))
