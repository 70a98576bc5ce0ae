"""The under-replication registry: which ledgers need re-replication, and who works on one.

Keys (ARCHITECTURE.md "Metadata layout"):

* ``underreplication/ledgers/<20-digit id>`` — a mark, CBOR map, format version 1::

      fv  int     format version (1)
      lid int     ledger id (must match the key)
      mb  [text]  missing bookies: replicas the auditor found lost (sorted, no duplicates)
      ct  int     when the ledger was first marked, milliseconds since the epoch

  Marking an already marked ledger adds the new bookies to ``mb`` (compare-and-set), so
  two audits never overwrite each other. A mark is removed only by :meth:`clear` at the
  version the replicator read before its work: a bookie marked meanwhile keeps the mark.
* ``underreplication/locks/<id>`` — a :class:`LeaseLock` held by the replicator working on
  the ledger; it vanishes with the worker's lease if the worker dies.
* ``underreplication/repairs/<20-digit id>/<bookie>`` — an in-place repair mark: that
  bookie is alive but its copy of the ledger lacks entries its fragments assign to it (or
  holds damaged ones). CBOR map, format version 1::

      fv  int     format version (1)
      lid int     ledger id, bk text bookie id (must match the key)
      why text    "limbo" (BP-46 phase one ran on the bookie after an unclean shutdown:
                  the repairer recovers the ledger, fills the bookie's holes, then clears
                  its limbo status), "unclean" (the same boot found a CLOSED ledger
                  lacking entries assigned to the bookie: the repairer copies them) or
                  "check" (the auditor's periodic check found missing or unreadable
                  entries: the repairer rewrites them from other replicas)
      ct  int     when it was marked, milliseconds since the epoch
      d   text    detail for operators (what the check saw), may be empty

  Written by the bookie itself at boot (one per limbo ledger, so that a crash between
  phase one and the marks is repaired by the next boot's marks; one per closed ledger
  lacking entries, before it serves, so a crash before then repeats phase one) and by the
  auditor; the
  repairer holds the ledger's lock (``underreplication/locks/<id>``) while it works, so a
  ledger is never re-replicated and repaired at the same time.
* ``config/lost_bookie_recovery_delay`` — seconds (decimal text) the auditor waits before
  auditing a vanished bookie; changeable at runtime (the auditor watches it).
"""

from __future__ import annotations

import builtins
import math
import time
from dataclasses import dataclass
from typing import Any

import cbor2

from zbk.errors import BadRequestError, CorruptMetadataError, KeyExistsError, MetadataVersionError
from zbk.metadata import layout
from zbk.metadata.coordination import LeaseLock, cas_retry
from zbk.metadata.store import MetadataStore, iter_prefix

MARK_FORMAT = 1


def _decode_map(data: bytes, what: str) -> dict[str, Any]:
    """A mark's CBOR map of format MARK_FORMAT, or CorruptMetadataError naming ``what``."""
    try:
        raw: Any = cbor2.loads(data)
    except Exception as e:  # cbor2 raises several types for garbage input
        raise CorruptMetadataError(f"{what}: not valid CBOR ({e})") from None
    if not isinstance(raw, dict) or raw.get("fv") != MARK_FORMAT:
        raise CorruptMetadataError(f"{what}: not a format {MARK_FORMAT} map")
    return raw


@dataclass(frozen=True)
class UnderReplicatedLedger:
    ledger_id: int
    missing_bookies: tuple[str, ...]
    marked_ms: int
    version: int = 0  # the mark's CAS token when read from the store

    def encode(self) -> bytes:
        return cbor2.dumps({"fv": MARK_FORMAT, "lid": self.ledger_id, "mb": sorted(set(self.missing_bookies)),
                            "ct": self.marked_ms})

    @classmethod
    def decode(cls, data: bytes, *, ledger_id: int, version: int = 0) -> UnderReplicatedLedger:
        what = f"under-replication mark of ledger {ledger_id}"
        raw = _decode_map(data, what)
        lid, mb, ct = raw.get("lid"), raw.get("mb"), raw.get("ct")
        if lid != ledger_id or not isinstance(ct, int) or not isinstance(mb, list) \
                or not all(isinstance(b, str) for b in mb):
            raise CorruptMetadataError(f"{what}: malformed")
        return cls(ledger_id, tuple(mb), ct, version)

    def as_json(self) -> dict[str, Any]:
        return {"ledger_id": self.ledger_id, "missing_bookies": list(self.missing_bookies),
                "marked_ms": self.marked_ms}


REPAIR_REASONS = ("limbo", "unclean", "check")


@dataclass(frozen=True)
class RepairMark:
    """One bookie's copy of one ledger needs an in-place repair (see the module docstring)."""

    ledger_id: int
    bookie_id: str
    why: str
    marked_ms: int
    detail: str = ""
    version: int = 0

    def encode(self) -> bytes:
        assert self.why in REPAIR_REASONS, self.why
        return cbor2.dumps({"fv": MARK_FORMAT, "lid": self.ledger_id, "bk": self.bookie_id, "why": self.why,
                            "ct": self.marked_ms, "d": self.detail})

    @classmethod
    def decode(cls, data: bytes, *, ledger_id: int, bookie_id: str, version: int = 0) -> RepairMark:
        what = f"repair mark of ledger {ledger_id} on {bookie_id}"
        raw = _decode_map(data, what)
        why, ct, detail = raw.get("why"), raw.get("ct"), raw.get("d", "")
        if raw.get("lid") != ledger_id or raw.get("bk") != bookie_id or why not in REPAIR_REASONS \
                or not isinstance(ct, int) or not isinstance(detail, str):
            raise CorruptMetadataError(f"{what}: malformed")
        return cls(ledger_id, bookie_id, why, ct, detail, version)

    def as_json(self) -> dict[str, Any]:
        return {"ledger_id": self.ledger_id, "bookie": self.bookie_id, "why": self.why,
                "marked_ms": self.marked_ms, "detail": self.detail}


class UnderReplicationRegistry:
    """Marks, locks and the recovery delay, over any MetadataStore."""

    def __init__(self, store: MetadataStore, owner: str) -> None:
        self.store = store
        self.locks = LeaseLock(store, owner)

    # -- marks ----------------------------------------------------------------------------
    def mark(self, ledger_id: int, missing: list[str] | tuple[str, ...]) -> UnderReplicatedLedger:
        """Mark ``ledger_id`` under-replicated, naming ``missing`` replicas (merged with any
        bookies an existing mark already names)."""
        assert missing, "a mark names at least one missing bookie"
        key = layout.underreplicated_key(ledger_id)

        def merge(current: bytes | None) -> bytes:
            if current is None:
                return UnderReplicatedLedger(ledger_id, tuple(missing), int(time.time() * 1000)).encode()
            old = UnderReplicatedLedger.decode(current, ledger_id=ledger_id)
            return UnderReplicatedLedger(ledger_id, tuple(set(old.missing_bookies) | set(missing)),
                                         old.marked_ms).encode()

        value, version = cas_retry(self.store, key, merge)
        return UnderReplicatedLedger.decode(value, ledger_id=ledger_id, version=version)

    def get(self, ledger_id: int) -> UnderReplicatedLedger | None:
        kv = self.store.get(layout.underreplicated_key(ledger_id))
        if kv is None:
            return None
        return UnderReplicatedLedger.decode(kv.value, ledger_id=ledger_id, version=kv.version)

    def list(self) -> list[UnderReplicatedLedger]:
        """Every mark, by ledger id. Marks that do not decode are reported, not skipped:
        a ledger nobody can see as under-replicated would never be repaired."""
        out = []
        for kv in iter_prefix(self.store, layout.UNDERREPLICATED_LEDGERS):
            lid = int(kv.key[len(layout.UNDERREPLICATED_LEDGERS):])
            out.append(UnderReplicatedLedger.decode(kv.value, ledger_id=lid, version=kv.version))
        return out

    def count(self) -> int:
        return sum(1 for _ in iter_prefix(self.store, layout.UNDERREPLICATED_LEDGERS))

    def clear(self, mark: UnderReplicatedLedger) -> bool:
        """Remove the mark if it is unchanged since ``mark`` was read (the caller made the
        ledger whole). False if it changed (a new loss was marked meanwhile) or is gone."""
        try:
            return self.store.delete(layout.underreplicated_key(mark.ledger_id), version=mark.version)
        except MetadataVersionError:
            return False

    # -- in-place repair marks -------------------------------------------------------------
    def mark_repair(self, ledger_id: int, bookie_id: str, why: str, detail: str = "") -> bool:
        """Ask for ``bookie_id``'s copy of ``ledger_id`` to be repaired in place. False if a
        mark exists already (the older one stands: its repair covers this one too)."""
        mark = RepairMark(ledger_id, bookie_id, why, int(time.time() * 1000), detail[:500])
        try:
            self.store.create(layout.repair_key(ledger_id, bookie_id), mark.encode())
            return True
        except KeyExistsError:
            return False

    def list_repairs(self) -> builtins.list[RepairMark]:
        """Every repair mark, by ledger id then bookie (undecodable ones are reported)."""
        out = []
        for kv in iter_prefix(self.store, layout.REPAIRS):
            lid, bookie = layout.repair_from_key(kv.key)
            out.append(RepairMark.decode(kv.value, ledger_id=lid, bookie_id=bookie, version=kv.version))
        return out

    def get_repair(self, ledger_id: int, bookie_id: str) -> RepairMark | None:
        kv = self.store.get(layout.repair_key(ledger_id, bookie_id))
        if kv is None:
            return None
        return RepairMark.decode(kv.value, ledger_id=ledger_id, bookie_id=bookie_id, version=kv.version)

    def count_repairs(self) -> int:
        return sum(1 for _ in iter_prefix(self.store, layout.REPAIRS))

    def clear_repair(self, mark: RepairMark) -> bool:
        """Remove the mark if unchanged since it was read."""
        try:
            return self.store.delete(layout.repair_key(mark.ledger_id, mark.bookie_id), version=mark.version)
        except MetadataVersionError:
            return False

    # -- locks ----------------------------------------------------------------------------
    def try_lock(self, ledger_id: int, lease: int) -> bool:
        return self.locks.try_acquire(layout.underreplicated_lock_key(ledger_id), lease)

    def unlock(self, ledger_id: int) -> bool:
        return self.locks.release(layout.underreplicated_lock_key(ledger_id))

    def lock_holder(self, ledger_id: int) -> str | None:
        return self.locks.holder(layout.underreplicated_lock_key(ledger_id))

    def held_locks(self) -> dict[int, str]:
        """Every ledger whose lock is held now (whoever holds it) -> the holder's id: what is
        being repaired at this moment, and by whom."""
        return {int(kv.key[len(layout.UNDERREPLICATED_LOCKS):]): kv.value.decode(errors="replace")
                for kv in iter_prefix(self.store, layout.UNDERREPLICATED_LOCKS)}


# -- lost bookie recovery delay ---------------------------------------------------------------
def get_recovery_delay(store: MetadataStore, default_s: float = 0.0) -> float:
    """The cluster's lost_bookie_recovery_delay in seconds (``default_s`` if never set)."""
    kv = store.get(layout.LOST_BOOKIE_RECOVERY_DELAY)
    if kv is None:
        return default_s
    try:
        value = float(kv.value.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise CorruptMetadataError(f"{layout.LOST_BOOKIE_RECOVERY_DELAY}: not a number: {kv.value[:40]!r}") from None
    if not math.isfinite(value) or value < 0:
        raise CorruptMetadataError(f"{layout.LOST_BOOKIE_RECOVERY_DELAY}: out of range: {value}")
    return value


def set_recovery_delay(store: MetadataStore, seconds: float) -> None:
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or not math.isfinite(seconds) \
            or seconds < 0:
        raise BadRequestError(f"lost_bookie_recovery_delay must be a number of seconds >= 0, got {seconds!r}")
    store.put(layout.LOST_BOOKIE_RECOVERY_DELAY, repr(float(seconds)).encode("ascii"))


def init_recovery_delay(store: MetadataStore, seconds: float) -> None:
    """Store ``seconds`` only if the cluster has no delay yet: a running cluster's setting
    (changed at runtime) wins over a restarted process's configuration."""
    try:
        store.create(layout.LOST_BOOKIE_RECOVERY_DELAY, repr(float(seconds)).encode("ascii"))
    except KeyExistsError:
        pass
