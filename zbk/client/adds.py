"""A writer's pending adds, and the per-bookie batches the AddDispatcher sends them in."""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

# The writer a part belongs to (LedgerHandle): a type parameter, since the writer's module
# imports this one.
H = TypeVar("H")
_future_init = asyncio.Future.__init__


class PendingAdd(asyncio.Future[int]):
    """One pending entry, and the future `LedgerHandle.append` returns for it: one object
    per entry in flight rather than two, since each one an append makes outlives the young
    generations of the cyclic GC and brings its next full collection nearer. ``acked`` and
    ``sent`` are bookie bit masks (AddDispatcher.bit), not sets, for the same reason. The
    entry's bytes are dropped once it is confirmed or failed: the caller may keep the future."""

    __slots__ = ("entry_id", "blob", "size", "started", "acked", "sent")

    def __init__(self, entry_id: int, blob: bytes, size: int, started: float,
                 loop: asyncio.AbstractEventLoop) -> None:
        _future_init(self, loop=loop)
        self.entry_id = entry_id
        self.blob = blob
        self.size = size
        self.started = started
        self.acked = 0  # bookies that acknowledged it (bits)
        self.sent = 0  # bookies it is in flight to, or acked by (bits)


class Batch(Generic[H]):
    """Adds for one bookie: parts of one or more handles, kept flat (handles, each part's end
    in ``ents``, the entries in a row): a part costs no object of its own while in flight."""

    __slots__ = ("hs", "ends", "ents", "nbytes")

    def __init__(self) -> None:
        self.hs: list[H] = []
        self.ends: list[int] = []  # part i is ents[ends[i-1]:ends[i]]
        self.ents: list[PendingAdd] = []
        self.nbytes = 0

    def add_one(self, h: H, a: PendingAdd) -> None:
        ents = self.ents
        ents.append(a)
        self.hs.append(h)
        self.ends.append(len(ents))
        self.nbytes += len(a.blob)

    def add(self, h: H, adds: list[PendingAdd]) -> None:
        ents = self.ents
        ents.extend(adds)
        self.hs.append(h)
        self.ends.append(len(ents))
        self.nbytes += sum([len(a.blob) for a in adds])

    def extend(self, other: Batch[H]) -> None:
        """Append ``other``'s parts (of other handles than this batch's)."""
        base = len(self.ents)
        self.ents.extend(other.ents)
        self.hs.extend(other.hs)
        self.ends.extend([base + end for end in other.ends])
        self.nbytes += other.nbytes

    def parts(self) -> list[list[PendingAdd]]:
        out, start = [], 0
        ents = self.ents
        for end in self.ends:
            out.append(ents[start:end])
            start = end
        return out

