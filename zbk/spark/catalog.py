"""The metadata side of the data source: which ledgers a selector covers, and the commit
protocol of Spark writes (pending -> committed, or deleted).

These run on the driver (planning, commit, abort) against the metadata store only; no
bookie is contacted here.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator

from zbk import limits
from zbk.client.recovery import check_password
from zbk.errors import CorruptMetadataError, MetadataVersionError, NoSuchLedgerError
from zbk.metadata import layout
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import LedgerStore
from zbk.metadata.store import MetadataStore, iter_prefix
from zbk.spark.options import JOB_KEY, STATE_COMMITTED, STATE_KEY, STATE_PENDING, Selector

log = logging.getLogger(__name__)


def iter_ledgers(store: MetadataStore) -> Iterator[LedgerMetadata]:
    """Every ledger's metadata, in id order, page by page (one listing, no per-ledger get).
    A value that does not decode is logged and skipped."""
    for kv in iter_prefix(store, layout.LEDGERS):
        try:
            lid = layout.ledger_id_from_key(kv.key)
            yield LedgerMetadata.decode(kv.value, ledger_id=lid)
        except (ValueError, CorruptMetadataError) as e:
            log.error("skipping ledger key %r: %s", kv.key, e)


def select_ledgers(store: MetadataStore, selector: Selector, password: bytes) -> list[LedgerMetadata]:
    """The ledgers ``selector`` names, in id order, each checked against ``password``.

    Explicit ids must all exist (NoSuchLedgerError names the first missing one); a wrong
    password for any selected ledger is an UnauthorizedError before anything is read."""
    if selector.kind == "ids":
        ledgers = LedgerStore(store)
        found = []
        for lid in sorted(selector.ids):
            try:
                md, _ = ledgers.read(lid)
            except NoSuchLedgerError:
                raise NoSuchLedgerError(f'ledger {lid} does not exist (option "ledgers"={selector})') from None
            found.append(md)
    else:
        found = [md for md in iter_ledgers(store) if selector.matches(md)]
    for md in found:
        check_password(md, password)
    return found


def is_pending(md: LedgerMetadata) -> bool:
    return md.custom_metadata.get(STATE_KEY) == STATE_PENDING


def job_ledgers(store: MetadataStore, job_id: str) -> list[int]:
    """Ids of every ledger a write job created (pending or committed)."""
    tag = job_id.encode()
    return [md.ledger_id for md in iter_ledgers(store) if md.custom_metadata.get(JOB_KEY) == tag]


def mark_committed(store: MetadataStore, ledger_id: int, job_id: str) -> None:
    """Flip one ledger of ``job_id`` from pending to committed (compare-and-set, retried
    when auto-recovery changes the ledger's ensembles meanwhile)."""
    ledgers = LedgerStore(store)
    for _ in range(limits.spark_commit_attempts_max):
        md, version = ledgers.read(ledger_id)
        if md.custom_metadata.get(JOB_KEY) != job_id.encode():
            raise MetadataVersionError(f"ledger {ledger_id} does not belong to Spark write job {job_id}")
        if md.custom_metadata.get(STATE_KEY) == STATE_COMMITTED:
            return
        committed = dataclasses.replace(md, custom_metadata={**md.custom_metadata, STATE_KEY: STATE_COMMITTED})
        try:
            ledgers.write(committed, version)
            return
        except MetadataVersionError:
            continue
    raise MetadataVersionError(f"ledger {ledger_id}: gave up committing after {limits.spark_commit_attempts_max} conflicts")


def mark_settled(store: MetadataStore, job_id: str) -> None:
    """Record that ``job_id``'s driver committed or aborted it: its set of ledgers is final.
    The mark lives ``limits.spark_settled_mark_ttl_s`` (a lease), long past the job's tasks."""
    lease = store.grant_lease(limits.spark_settled_mark_ttl_s)
    store.put(layout.spark_settled_key(job_id), b"", lease=lease)


def is_settled(store: MetadataStore, job_id: str) -> bool:
    return store.get(layout.spark_settled_key(job_id)) is not None


def delete_ledgers(store: MetadataStore, ledger_ids: Iterable[int]) -> list[int]:
    """Delete each ledger; already-absent ones are fine. Returns the ids actually deleted."""
    ledgers = LedgerStore(store)
    deleted = []
    for lid in ledger_ids:
        try:
            ledgers.delete(lid)
            deleted.append(lid)
        except NoSuchLedgerError:
            pass
    return deleted
