"""Over-replicated ledgers in a real bookie process (zbk/actors/overrep.py).

The bookie writes three ledgers one after the other (whole entry logs per ledger), then
stops. While it is away its ledgers are "re-replicated" the way a replicator leaves them:
closed, and ``moved``'s only fragment now names another bookie; ``partly``'s last
fragment names another bookie but its first still names this one; ``kept`` is untouched.
The bookie comes back with a short grace period (gc_overreplicated_ledger_wait_time_ms):
``moved``'s entry logs leave the disk and the bookie no longer has the ledger, while
every entry of ``partly`` and ``kept`` still reads back byte for byte.

``locked`` is moved like ``moved``, but a replicator holds its replication lock: the bookie
keeps it until the lock is released, then drops it, and leaves no lock of its own behind.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from helpers.bookie import BookieProcess
from helpers.wait import wait_until

from zbk.metadata import layout
from zbk.metadata.registry import LedgerStore
from zbk.metadata.uri import open_store
from zbk.recovery.underreplication import UnderReplicationRegistry
from zbk.storage.cookie import COOKIE_FILE
from zbk.wire.status import Status

from .test_gc_process import GC_SETTINGS, create_ledgers, ledger_count, log_bytes, metric, read_all, write
from .util import read

OTHER = "127.0.0.1:1"  # the bookie the data was re-replicated to (never contacted)


def rewrite(uri: str, lid: int, fragments: tuple[tuple[int, tuple[str, ...]], ...], last: int) -> None:
    store = open_store(uri)
    try:
        ledgers = LedgerStore(store)
        md, version = ledgers.read(lid)
        ledgers.write(dataclasses.replace(md, state="CLOSED", last_entry_id=last, fragments=fragments), version)
    finally:
        store.close()


def test_a_returning_bookie_frees_a_moved_ledger_and_keeps_the_named_ones(
        bookies: Callable[..., BookieProcess]) -> None:
    bk = bookies(settings={**GC_SETTINGS, "gc_overreplicated_ledger_wait_time_ms": 1000})
    bk.start()
    uri = bookies.metadata_uri  # type: ignore[attr-defined]
    moved, partly, kept, locked = create_ledgers(uri, bk.bookie_id, 4)
    next_eid = dict.fromkeys((moved, partly, kept, locked), 0)
    write(bk, [(moved, 400), (partly, 300), (kept, 100), (locked, 50)], next_eid)
    assert bk.stop() == 0
    full = log_bytes(bk)
    assert full > 3 * 1024 * 1024
    rewrite(uri, moved, ((0, (OTHER,)),), next_eid[moved] - 1)
    rewrite(uri, partly, ((0, (bk.bookie_id,)), (200, (OTHER,))), next_eid[partly] - 1)
    rewrite(uri, kept, ((0, (bk.bookie_id,)),), next_eid[kept] - 1)
    rewrite(uri, locked, ((0, (OTHER,)),), next_eid[locked] - 1)
    store = open_store(uri)
    replicator = UnderReplicationRegistry(store, "replicator-elsewhere")
    lease = store.grant_lease(60)
    assert replicator.try_lock(locked, lease)

    bk.start()
    wait_until(lambda: ledger_count(bk) == 3, timeout_s=30, message="the GC to drop the over-replicated ledger")
    moved_bytes = next_eid[moved] * 4096
    # The whole logs that hold only ``moved`` go (1 MiB of its 1.6 MB); the log it shares with
    # ``partly`` stays until compaction finds it sparse enough.
    wait_until(lambda: log_bytes(bk) < full - 0.6 * moved_bytes, timeout_s=30,
               message=f"the moved ledger's entry logs to go ({log_bytes(bk)} of {full} bytes left)")
    assert metric(bk, "zbk_gc_overreplicated_ledgers_total") == 1
    with bk.connect() as c:
        assert read(c, moved, 0).status == Status.ENOLEDGER
    # Still named in a fragment (even one of two) or in every fragment: every entry stays.
    read_all(bk, partly, next_eid[partly])
    read_all(bk, kept, next_eid[kept])
    read_all(bk, locked, next_eid[locked])  # its lock is held elsewhere: kept, scan after scan
    assert replicator.unlock(locked)
    wait_until(lambda: ledger_count(bk) == 2, timeout_s=30, message="the GC to drop the unlocked ledger")
    assert metric(bk, "zbk_gc_overreplicated_ledgers_total") == 2
    # The GC lets its locks go once the Server has dropped the ledgers (the run's next phase).
    wait_until(lambda: replicator.held_locks() == {}, timeout_s=10, message="the GC to let its replication locks go")
    store.revoke_lease(lease)
    store.close()
    assert "over-replicated" in bk.log.read_text()
    assert bk.stop() == 0


def test_after_a_cookie_fix_surplus_copies_wait_for_the_auditors_full_check(
        bookies: Callable[..., BookieProcess]) -> None:
    """The journal disk of a bookie is replaced (its cookie file is gone) and the bookie comes
    back with ``auto_fix_cookie``: it fixes its cookie and records the fix. Until a full
    check of the auditor has started after that fix, metadata is not trusted to say what the
    bookie may drop, so a moved ledger stays; once ``auditor/last_check_started`` is later
    than the fix, it goes."""
    bk = bookies(settings={**GC_SETTINGS, "gc_overreplicated_ledger_wait_time_ms": 500, "auto_fix_cookie": True})
    bk.start()
    uri = bookies.metadata_uri  # type: ignore[attr-defined]
    moved, kept = create_ledgers(uri, bk.bookie_id, 2)
    next_eid = dict.fromkeys((moved, kept), 0)
    write(bk, [(moved, 100), (kept, 100)], next_eid)
    assert bk.stop() == 0
    rewrite(uri, moved, ((0, (OTHER,)),), next_eid[moved] - 1)
    rewrite(uri, kept, ((0, (bk.bookie_id,)),), next_eid[kept] - 1)
    (bk.data_dir / "journal" / COOKIE_FILE).unlink()

    bk.start()
    store = open_store(uri)
    try:
        fixed = store.get(layout.cookie_fix_key(bk.bookie_id))
        assert fixed is not None, "the boot did not record its cookie fix"
        wait_until(lambda: "awaits the auditor's full check" in bk.log.read_text(), timeout_s=30,
                   message="an over-replication scan while the fix awaits its audit")
        time.sleep(2.0)  # four scan intervals past the grace period
        assert ledger_count(bk) == 2, "a surplus copy was dropped before the auditor checked"
        read_all(bk, moved, next_eid[moved])
        after_fix_ms = int(fixed.value.decode()) + 1
        store.put(layout.AUDITOR_LAST_CHECK_STARTED, str(after_fix_ms).encode())
        wait_until(lambda: ledger_count(bk) == 1, timeout_s=30, message="the GC to drop the moved ledger")
        assert store.get(layout.cookie_fix_key(bk.bookie_id)) is None, "the fix marker outlived its audit"
        read_all(bk, kept, next_eid[kept])
    finally:
        store.close()
    assert bk.stop() == 0
