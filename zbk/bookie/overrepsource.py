"""The metadata a bookie's over-replicated ledger GC reads (zbk/actors/overrep.py), and the
cookie-fix marker that holds that GC back until the auditor's next full check.

``cookiefixes/<bookie>`` holds the time (ms since the epoch) ``auto_fix_cookie`` rewrote the
bookie's cookie. The auditor writes ``auditor/last_check_started`` (the start of its last
*finished* full check of every ledger's replicas) with ``auditor/last_check``. A fix is
pending while no finished check started after it; the GC removes the marker (at the
version it read) once one has, so a newer fix is never lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from zbk.actors.overrep import LedgerView
from zbk.errors import LeaseExpiredError, MetadataVersionError, NoSuchLedgerError
from zbk.metadata import layout
from zbk.metadata.registry import LedgerStore
from zbk.metadata.store import MetadataStore
from zbk.recovery.underreplication import UnderReplicationRegistry

log = logging.getLogger(__name__)


def _ms(raw: bytes | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return None


def record_cookie_fix(store: MetadataStore, bookie_id: str) -> None:
    """Called by the boot that fixed the cookie, before the bookie serves."""
    store.put(layout.cookie_fix_key(bookie_id), str(int(time.time() * 1000)).encode("ascii"))


class BookieOverrepSource:
    """:class:`zbk.actors.overrep.OverrepSource` over the metadata store.

    Its replication locks are taken under the owner ``gc@<bookie>`` and bound to ``lease()``,
    the bookie's registration lease (None while it has none): a replicator in the same
    process locks under another owner, and a bookie that dies holding a lock loses it with
    its lease."""

    def __init__(self, store: MetadataStore, bookie_id: str, lease: Callable[[], int | None]) -> None:
        self.store = store
        self.bookie_id = bookie_id
        self.lease = lease
        self.ledgers = LedgerStore(store)
        self.registry = UnderReplicationRegistry(store, f"gc@{bookie_id}")

    def view(self, ledger_id: int) -> LedgerView | None:
        try:
            md, _ = self.ledgers.read(ledger_id)
        except NoSuchLedgerError:
            return None
        names_self = any(self.bookie_id in bookies for _, bookies in md.fragments)
        holder = self.registry.lock_holder(ledger_id)
        locked_by_other = holder is not None and not self.registry.locks.holds(
            layout.underreplicated_lock_key(ledger_id))
        replicating = locked_by_other or self.registry.get(ledger_id) is not None
        return LedgerView(closed=md.is_closed, names_self=names_self, replicating=replicating)

    def lock(self, ledger_id: int) -> bool:
        lease = self.lease()
        if lease is None:
            return False
        try:
            return self.registry.try_lock(ledger_id, lease)
        except LeaseExpiredError:
            return False

    def unlock(self, ledger_id: int) -> None:
        self.registry.unlock(ledger_id)

    def audit_pending(self) -> bool:
        kv = self.store.get(layout.cookie_fix_key(self.bookie_id))
        if kv is None:
            return False
        fixed_ms = _ms(kv.value)
        started = self.store.get(layout.AUDITOR_LAST_CHECK_STARTED)
        started_ms = _ms(started.value) if started is not None else None
        if fixed_ms is None or started_ms is None or started_ms <= fixed_ms:
            return True
        log.info("gc: the auditor's full check ran after this bookie's cookie fix: over-replicated "
                 "ledgers may be deleted again")
        try:
            self.store.delete(layout.cookie_fix_key(self.bookie_id), version=kv.version)
        except MetadataVersionError:
            return True  # fixed again meanwhile
        return False
