"""The read-only state an operator set, kept on the bookie's disks so that it lasts.

``<index dir>/READONLY`` in every index directory, present while an operator wants the
bookie read-only (``PUT /api/v1/bookie/state {"state": "readonly"}``, or ``zbk bookie
--readonly``): a restart comes back read-only, and stays so until an operator switches it
back (BookKeeper's ``persistBookieStatusEnabled``). Its contents do not matter. It is
written (and removed) durably, before the bookie's state changes: a crash right after the
operator's answer cannot lose it. A read-only state the disk checker set (a full disk) is
not kept: the disk decides that again at start.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from zbk.storage.disk import REAL_DISK, Disk

READ_ONLY_FILE = "READONLY"


def operator_read_only(dirs: Sequence[str]) -> bool:
    """True when any directory holds the marker (a crash between two directories leaves it
    in some: read-only is the side to err on)."""
    return any(os.path.exists(os.path.join(d, READ_ONLY_FILE)) for d in dirs)


def set_operator_read_only(dirs: Sequence[str], read_only: bool, disk: Disk = REAL_DISK) -> None:
    """Persist the operator's choice in every directory, durably, before returning."""
    for d in dirs:
        path = os.path.join(d, READ_ONLY_FILE)
        if read_only:
            os.makedirs(d, exist_ok=True)
            disk.write_file_atomic(path, b"zbk: read-only, set by an operator\n")
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        disk.fsync_dir(d)
