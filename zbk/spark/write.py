"""Writes: ``df.write.format("zbk").mode("append")``: one new ledger per Spark partition.

Commit protocol (docs/spark.md "Writing"):

1. The driver gives the job a fresh id (``writer()``).
2. Each task creates a ledger whose custom metadata carries the user's keys plus
   ``zbk.spark.job = <job id>`` and ``zbk.spark.state = pending``, appends the partition's
   ``payload`` column (pipelined, in row order), closes the ledger and reports its id. A
   task that fails deletes its ledger before re-raising. Empty partitions create nothing.
3. ``commit`` (driver, all tasks succeeded): flips every reported ledger to
   ``zbk.spark.state = committed`` by compare-and-set, marks the job settled, then deletes
   any other ledger of the job (a failed or superseded task attempt).
4. ``abort`` (driver, a task failed): marks the job settled, then deletes every ledger of
   the job.

A task attempt still running when the driver settles the job (cancelled, or a speculative
twin) may create its ledger after the driver's sweep, and Spark may then SIGKILL it. So a
task checks the settled mark just before and just after creating its ledger: a ledger
created before the mark is the sweep's, one created after it is found by its own task,
which deletes it and fails.

Selectors ("all", "meta:KEY=VALUE") never match pending ledgers, so readers see a job's
ledgers only once it committed.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

from zbk import limits
from zbk.client.sync import BookKeeper, SyncLedgerHandle
from zbk.errors import BadRequestError, NoSuchLedgerError, OperationRefusedError, ZbkError
from zbk.metadata.store import MetadataStore
from zbk.metadata.uri import open_store
from zbk.spark.catalog import delete_ledgers, is_settled, job_ledgers, mark_committed, mark_settled
from zbk.spark.options import WriteOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ZbkCommitMessage(WriterCommitMessage):
    ledger_id: int | None  # None: the partition was empty, no ledger was created
    entries: int
    bytes: int
    partition: int | None


def check_write_schema(schema: StructType) -> None:
    """The DataFrame needs a ``payload`` column of type binary or string."""
    field = next((f for f in schema.fields if f.name == "payload"), None)
    if field is None:
        raise BadRequestError(f"format zbk writes the column 'payload', which the DataFrame lacks "
                              f"(columns: {', '.join(schema.fieldNames())})")
    if not isinstance(field.dataType, BinaryType | StringType):
        raise BadRequestError(f"column 'payload' must be binary or string, not {field.dataType.simpleString()}")


class ZbkWriter(DataSourceArrowWriter):
    def __init__(self, opts: WriteOptions, job_id: str) -> None:
        self.opts = opts
        self.job_id = job_id

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ZbkCommitMessage:  # type: ignore[override]
        return write_partition(self.opts, self.job_id, iterator, _partition_id())

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        commit_job(self.opts, self.job_id, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:  # type: ignore[override]
        abort_job(self.opts, self.job_id, messages)


def write_partition(opts: WriteOptions, job_id: str, batches: Iterable[pa.RecordBatch],
                    partition: int | None) -> ZbkCommitMessage:
    entries = size = 0
    with BookKeeper(opts.metadata) as bk:
        lh: SyncLedgerHandle | None = None
        try:
            in_flight: deque[Future[int]] = deque()
            for batch in batches:
                for payload in _payloads(batch, partition):
                    if lh is None:
                        with contextlib.closing(open_store(opts.metadata)) as store:
                            _refuse_if_settled(store, job_id)
                            lh = bk.create_ledger(opts.ensemble, opts.write_quorum, opts.ack_quorum,
                                                  password=opts.password, digest=opts.digest,
                                                  custom_metadata=opts.ledger_metadata(job_id, partition))
                            _refuse_if_settled(store, job_id)
                    in_flight.append(lh.append_async(payload))
                    entries += 1
                    size += len(payload)
                    if len(in_flight) >= limits.spark_appends_in_flight_max:
                        in_flight.popleft().result()
            for fut in in_flight:
                fut.result()
            if lh is None:
                return ZbkCommitMessage(None, 0, 0, partition)
            lh.close()
            return ZbkCommitMessage(lh.ledger_id, entries, size, partition)
        except BaseException:
            if lh is not None:
                _delete_quietly(bk, lh.ledger_id)
            raise


def _payloads(batch: pa.RecordBatch, partition: int | None) -> list[bytes]:
    col = batch.column(batch.schema.get_field_index("payload"))
    if col.null_count:
        raise BadRequestError(f"column 'payload' is null in {col.null_count} row(s) of partition {partition}: "
                              "an entry needs bytes")
    values = col.to_pylist()
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return [v.encode() for v in values]
    return values


def _refuse_if_settled(store: MetadataStore, job_id: str) -> None:
    if is_settled(store, job_id):
        raise OperationRefusedError(f"Spark write job {job_id} was already committed or aborted by its driver; "
                                    "this task attempt keeps no ledger")


def _delete_quietly(bk: BookKeeper, ledger_id: int) -> None:
    try:
        bk.delete_ledger(ledger_id)
    except NoSuchLedgerError:
        pass  # the driver's sweep deleted it first
    except ZbkError as e:  # the driver's abort scans for the job's ledgers again
        log.warning("could not delete ledger %d of a failed write task: %s", ledger_id, e)


def _written(messages: list[WriterCommitMessage | None]) -> set[int]:
    return {m.ledger_id for m in messages if isinstance(m, ZbkCommitMessage) and m.ledger_id is not None}


def commit_job(opts: WriteOptions, job_id: str, messages: list[WriterCommitMessage | None]) -> None:
    written = _written(messages)
    store = open_store(opts.metadata)
    try:
        for lid in sorted(written):
            mark_committed(store, lid, job_id)
        mark_settled(store, job_id)
        strays = [lid for lid in job_ledgers(store, job_id) if lid not in written]
        if strays:
            log.info("write job %s: deleting ledgers of failed task attempts: %s", job_id, strays)
            delete_ledgers(store, strays)
    finally:
        store.close()


def abort_job(opts: WriteOptions, job_id: str, messages: list[WriterCommitMessage | None]) -> None:
    store = open_store(opts.metadata)
    try:
        mark_settled(store, job_id)
        doomed = _written(messages) | set(job_ledgers(store, job_id))
        deleted = delete_ledgers(store, sorted(doomed))
        log.info("write job %s aborted: deleted ledgers %s", job_id, deleted)
    finally:
        store.close()


def _partition_id() -> int | None:
    from pyspark import TaskContext

    tc = TaskContext.get()
    return None if tc is None else tc.partitionId()
