"""The newest entries of the ledgers that tailing readers follow, kept by the Server.

A tailing reader's long poll is woken by the add that raises its ledger's LAC, and its
answer carries the entries from the polled LAC + 1 up to the new LAC. Those entries came
in the last few adds, so the Server keeps them: the answer goes out at once from memory,
with every entry up to the LAC, instead of waiting for a lookup by the IndexSyncer, a
hand-over each way (on a busy machine each can take milliseconds), whose answer carries
only the entries up to the LAC seen when it was asked. BookKeeper's DbLedgerStorage
answers such reads from its write cache for the same reason.

Only ledgers long-polled lately are kept, and only entries already appended (the Server
puts them in on Appended), so an answer from here is what the index would give. The
cache is bounded per ledger (entries) and in all (bytes); a ledger that does not fit is
emptied rather than kept with a hole, and its polls go to the index until it fits again.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class _Tail:
    until: float  # kept while polled: dropped once this passes with no poll
    entries: dict[int, bytes] = field(default_factory=dict)  # entry id -> blob, oldest first
    nbytes: int = 0


@dataclass(slots=True)
class TailCache:
    """Per watched ledger, its newest appended entries by entry id (see the module)."""

    entries_max: int  # per ledger
    bytes_max: int  # in all
    nbytes: int = 0
    _tails: dict[int, _Tail] = field(default_factory=dict)
    # No ledger's watch ends before this: the Server's tick (every 50 ms) looks at every
    # watched ledger only once one may have ended, not at each tick.
    _due: float = float("inf")

    def __contains__(self, ledger_id: int) -> bool:
        return ledger_id in self._tails

    def __bool__(self) -> bool:
        return bool(self._tails)

    def __len__(self) -> int:
        return len(self._tails)

    def watch(self, ledger_id: int, until: float) -> None:
        """A long poll of ``ledger_id`` arrived: keep its entries until ``until`` (at least)."""
        t = self._tails.get(ledger_id)
        if t is None:
            self._tails[ledger_id] = _Tail(until)
            if until < self._due:
                self._due = until
        elif until > t.until:
            t.until = until

    def put(self, ledger_id: int, entry_id: int, blob: bytes | bytearray | memoryview) -> None:
        """An appended entry of a watched ledger (others are ignored), kept as bytes of its
        own: the add path hands on views into the request's frame, and a kept view would hold
        the whole frame while ``bytes_max`` counted only the entry."""
        t = self._tails.get(ledger_id)
        if t is None:
            return
        size = len(blob)
        old = t.entries.pop(entry_id, None)
        if old is not None:  # the same entry again (a recovery add): the newer copy
            t.nbytes -= len(old)
            self.nbytes -= len(old)
        if self.nbytes + size > self.bytes_max:
            self._empty(t)
            return
        entries = t.entries
        entries[entry_id] = bytes(blob)  # bytes() of a bytes object is that object: no copy
        t.nbytes += size
        self.nbytes += size
        if len(entries) > self.entries_max:
            gone = entries.pop(next(iter(entries)))
            t.nbytes -= len(gone)
            self.nbytes -= len(gone)

    def take(self, ledger_id: int, first: int, count: int, bytes_max: int) -> list[bytes]:
        """The entries ``first``, ``first`` + 1, ... held here, up to ``count`` of them and
        ``bytes_max`` bytes (at least one), stopping at the first one not held."""
        t = self._tails.get(ledger_id)
        if t is None:
            return []
        entries = t.entries
        out: list[bytes] = []
        nbytes = 0
        for eid in range(first, first + count):
            blob = entries.get(eid)
            if blob is None:
                break
            nbytes += len(blob)
            if out and nbytes > bytes_max:
                break
            out.append(blob)
        return out

    def drop(self, ledger_id: int) -> None:
        """Forget ``ledger_id`` (deleted)."""
        t = self._tails.pop(ledger_id, None)
        if t is not None:
            self.nbytes -= t.nbytes

    def expire(self, now: float) -> None:
        """Forget the ledgers no poll asked for in time."""
        if now < self._due:
            return
        for lid in [lid for lid, t in self._tails.items() if t.until <= now]:
            self.drop(lid)
        self._due = min((t.until for t in self._tails.values()), default=float("inf"))

    def _empty(self, t: _Tail) -> None:
        self.nbytes -= t.nbytes
        t.entries.clear()
        t.nbytes = 0
