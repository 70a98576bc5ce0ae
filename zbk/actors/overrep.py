"""Over-replicated ledgers: which local copies the GarbageCollector may drop although the
ledger still exists (BookKeeper's over-replicated ledger GC).

A bookie holds a ledger that its metadata no longer names in any fragment when
re-replication copied the data elsewhere while the bookie was away, and the bookie came
back. Nothing reads that copy again, so it only wastes disk. The GarbageCollector
(zbk/actors/gc.py) scans its local ledgers against metadata from time to time and deletes
such copies, the same way it deletes the copies of ledgers deleted in metadata
(DeleteLedgers; their entry logs go in the same run once no live ledger is left in them).

A copy is kept (never deleted):
    * while metadata names this bookie in any fragment, or the ledger is not closed (an open
      ledger's ensemble may still change, and its recovery reads every bookie it knows);
    * while the ledger is locked for replication or marked under-replicated (a replicator is
      rewriting its fragments);
    * until ``grace_s`` has passed since this process first saw the ledger not name it (so at
      least ``grace_s`` after the bookie last appeared in the ledger's metadata; BookKeeper's
      ``gcOverreplicatedLedgerWaitTime``). The clock restarts whenever the ledger names the
      bookie again, and with every process start: nothing of it is persisted, which errs on
      the side of keeping;
    * while a cookie fix of this bookie waits for the auditor's full check (after
      ``auto_fix_cookie`` the bookie's data was rebuilt from an unknown state; until every
      ledger's replicas were checked, metadata is not trusted to say what it may drop);
    * when reading metadata fails: the scan ends and deletes nothing.

Every candidate is read from metadata once more right before the deletion is sent, as the
GC re-reads a ledger missing from the listing before deleting it, and that last read is made
holding the ledger's replication lock (the lock replicators take before they write a
fragment). The GC keeps the lock until the Server has dropped the ledger
(:meth:`OverrepTracker.release`, once the Server answers the GC's next request, which it
handles after the DeleteLedgers). So no replicator can pick this bookie as the target of a
new copy between that read and the deletion, and see the copy it wrote deleted after it
named the bookie in metadata. A ledger whose lock another process holds is kept.

:class:`OverrepTracker` holds the decisions and the clock state; the metadata reads come
from an injected :class:`OverrepSource` (zbk/bookie/overrepsource.py in a bookie).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from zbk import limits

log = logging.getLogger(__name__)

DELETE = "delete"
KEEP_NAMED = "named"
KEEP_OPEN = "open"
KEEP_REPLICATING = "replicating"
KEEP_GRACE = "grace"


@dataclass(frozen=True, kw_only=True)
class LedgerView:
    """What metadata says about one local ledger, as far as this bookie's copy goes."""

    closed: bool
    names_self: bool  # some fragment's ensemble holds this bookie
    replicating: bool  # the replication lock is held, or the ledger is marked under-replicated


class OverrepSource(Protocol):
    def view(self, ledger_id: int) -> LedgerView | None:
        """The ledger as metadata has it now; None when it does not exist."""

    def audit_pending(self) -> bool:
        """True while a cookie fix of this bookie waits for the auditor's full check."""

    def lock(self, ledger_id: int) -> bool:
        """Take the ledger's replication lock; False when another holds it (or it cannot be
        taken now)."""

    def unlock(self, ledger_id: int) -> None:
        """Release a lock taken by :meth:`lock`."""


def verdict(view: LedgerView, absent_since: float | None, now: float, grace_s: float) -> str:
    """DELETE, or why the copy is kept. ``absent_since``: when this ledger was first seen not
    naming the bookie (None: not yet seen so)."""
    if view.names_self:
        return KEEP_NAMED
    if not view.closed:
        return KEEP_OPEN
    if view.replicating:
        return KEEP_REPLICATING
    if absent_since is None or now - absent_since < grace_s:
        return KEEP_GRACE
    return DELETE


def scan_interval_s(grace_s: float) -> float:
    """How often the scan runs: often enough that a copy goes soon after its grace period,
    at most every ``limits.gc_overreplicated_scan_interval_max_s`` (a scan reads the metadata
    of every local ledger)."""
    return min(grace_s / 2, limits.gc_overreplicated_scan_interval_max_s)


class OverrepTracker:
    """The over-replication scan of a GarbageCollector: when a scan is due, and which local
    ledgers it finds over-replicated (see the module docstring)."""

    def __init__(self, grace_s: float, source: OverrepSource) -> None:
        assert grace_s >= 0, grace_s
        self.grace_s = grace_s
        self.source = source
        self.absent_since: dict[int, float] = {}  # ledger -> first seen not naming this bookie
        self.next_scan_at: float | None = None
        self.held: set[int] = set()  # replication locks held for a deletion not yet done

    def due(self, now: float, *, forced: bool) -> bool:
        """A scan is due ``scan_interval_s`` after the previous one (the first one at once),
        and on every forced GC run."""
        return forced or self.next_scan_at is None or now >= self.next_scan_at

    def scan(self, local: set[int], now: float) -> set[int]:
        """The ledgers of ``local`` (held here, present in metadata) to delete now. Raises
        whatever the source raises: the caller then deletes nothing."""
        self.next_scan_at = now + scan_interval_s(self.grace_s)
        for lid in [lid for lid in self.absent_since if lid not in local]:
            del self.absent_since[lid]
        if self.source.audit_pending():
            log.info("gc: a cookie fix of this bookie awaits the auditor's full check: over-replicated "
                     "ledgers are kept until then")
            return set()
        candidates = [lid for lid in sorted(local) if self._observe(lid, self.source.view(lid), now) == DELETE]
        if not candidates or self.source.audit_pending():
            return set()
        # Read once more right before the deletion, under the ledger's replication lock: a
        # scan of many ledgers takes a while, and a replicator may be about to copy here.
        doomed: set[int] = set()
        try:
            for lid in candidates:
                if not self.source.lock(lid):
                    continue
                self.held.add(lid)
                if self._observe(lid, self.source.view(lid), now) == DELETE:
                    doomed.add(lid)
                else:
                    self._unlock(lid)
        except Exception:
            self.release()
            raise
        if doomed:
            log.info("gc: deleting %d over-replicated ledger(s) (no fragment names this bookie for %.0f s "
                     "or more): %s", len(doomed), self.grace_s, sorted(doomed))
        return doomed

    def release(self) -> None:
        """Release every lock the last scan took: the Server has dropped those ledgers (or
        the run ended without deleting them)."""
        for lid in sorted(self.held):
            self._unlock(lid)

    def _unlock(self, lid: int) -> None:
        self.held.discard(lid)
        try:
            self.source.unlock(lid)
        except Exception as e:  # noqa: BLE001 - the lock dies with the bookie's lease anyway
            log.warning("gc: releasing the replication lock of ledger %d failed: %s", lid, e)

    def _observe(self, lid: int, view: LedgerView | None, now: float) -> str:
        if view is None:  # deleted meanwhile: the deleted-ledger GC takes it next run
            self.absent_since.pop(lid, None)
            return KEEP_NAMED
        if view.names_self or not view.closed:
            self.absent_since.pop(lid, None)  # the grace period restarts from its next absence
        elif lid not in self.absent_since:
            self.absent_since[lid] = now
        return verdict(view, self.absent_since.get(lid), now, self.grace_s)
