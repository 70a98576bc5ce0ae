"""Key layout below a store's scope (ARCHITECTURE.md "Metadata layout").

Ledger ids are written as 20-digit zero-padded decimals so that key order is id order.
"""

from __future__ import annotations

from zbk import limits

LAYOUT = "layout"
INSTANCE_ID = "instanceid"
COOKIES = "cookies/"
BOOKIES_WRITABLE = "bookies/writable/"
BOOKIES_READONLY = "bookies/readonly/"
LEDGERS = "ledgers/"
IDGEN_LEDGER = "idgen/ledger"
UNDERREPLICATED_LEDGERS = "underreplication/ledgers/"
UNDERREPLICATED_LOCKS = "underreplication/locks/"
# In-place repairs: one bookie's copy of a ledger lacks entries it should hold (BP-46 limbo
# after an unclean shutdown, or damage found by the auditor's periodic check).
REPAIRS = "underreplication/repairs/"
AUDITOR_LEADER = "auditor/leader"
AUDITOR_TRIGGER = "auditor/trigger"  # written by `zbk shell triggeraudit`: run the periodic check now
AUDITOR_LAST_CHECK = "auditor/last_check"  # when the last periodic check finished (ms since the epoch)
# When the last finished periodic check had started (ms since the epoch; written with last_check).
AUDITOR_LAST_CHECK_STARTED = "auditor/last_check_started"
COOKIE_FIXES = "cookiefixes/"  # cookiefixes/<bookie>: when auto_fix_cookie rewrote its cookie (ms since the epoch)
LOST_BOOKIE_RECOVERY_DELAY = "config/lost_bookie_recovery_delay"
# Present while an operator has switched auto-recovery off (BookKeeper's
# ``underreplication/disable``): the auditor marks nothing and replicators repair nothing.
AUTORECOVERY_DISABLED = "underreplication/disable"
# spark/settled/<job id>: a Spark write job whose driver committed or aborted it, written
# before the driver sweeps the job's ledgers. A task attempt that creates its ledger after
# that sweep finds the mark and deletes the ledger itself. Bound to a lease
# (limits.spark_settled_mark_ttl_s), so the marks of old jobs expire on their own.
SPARK_SETTLED_JOBS = "spark/settled/"


def ledger_key(ledger_id: int) -> str:
    assert 0 <= ledger_id <= limits.ledger_id_max, ledger_id
    return f"{LEDGERS}{ledger_id:020d}"


def ledger_id_from_key(key: str) -> int:
    assert key.startswith(LEDGERS), key
    return int(key[len(LEDGERS):])


def spark_settled_key(job_id: str) -> str:
    assert job_id and "/" not in job_id, job_id
    return SPARK_SETTLED_JOBS + job_id


def cookie_key(bookie_id: str) -> str:
    return COOKIES + bookie_id


def cookie_fix_key(bookie_id: str) -> str:
    return COOKIE_FIXES + bookie_id


def writable_key(bookie_id: str) -> str:
    return BOOKIES_WRITABLE + bookie_id


def readonly_key(bookie_id: str) -> str:
    return BOOKIES_READONLY + bookie_id


def underreplicated_key(ledger_id: int) -> str:
    return f"{UNDERREPLICATED_LEDGERS}{ledger_id:020d}"


def underreplicated_lock_key(ledger_id: int) -> str:
    return f"{UNDERREPLICATED_LOCKS}{ledger_id:020d}"


def repair_key(ledger_id: int, bookie_id: str) -> str:
    assert "/" not in bookie_id, bookie_id
    return f"{REPAIRS}{ledger_id:020d}/{bookie_id}"


def repair_from_key(key: str) -> tuple[int, str]:
    """(ledger id, bookie id) of a repair mark's key."""
    assert key.startswith(REPAIRS), key
    lid, _, bookie = key[len(REPAIRS):].partition("/")
    return int(lid), bookie
