"""Writes on local Spark against real bookies: commit, read-back, abort."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from zbk.client.sync import BookKeeper
from zbk.errors import OperationRefusedError
from zbk.metadata.uri import open_store
from zbk.spark import write
from zbk.spark.catalog import iter_ledgers, job_ledgers
from zbk.spark.options import JOB_KEY, PARTITION_KEY, STATE_COMMITTED, STATE_KEY, WriteOptions

from .conftest import ZbkCluster
from .util import wait_for

ROWS, PARTITIONS = 8_000, 4


def ledgers_tagged(uri: str, app: str) -> list[Any]:
    store = open_store(uri)
    try:
        return [md for md in iter_ledgers(store) if md.custom_metadata.get("app") == app.encode()]
    finally:
        store.close()


def test_write_job_ledgers_read_back_equal(spark: Any, zbk_cluster: ZbkCluster, app: str) -> None:
    df = spark.range(0, ROWS, 1, PARTITIONS).selectExpr("cast(concat('event-', id) as binary) as payload", "id")
    (df.write.format("zbk").mode("append").option("metadata", zbk_cluster.uri)
     .option("custom_metadata", f"app={app},team=data").option("ensemble", "3").option("quorums", "3,2")
     .option("digest", "crc32").save())

    mds = ledgers_tagged(zbk_cluster.uri, app)
    assert len(mds) == PARTITIONS
    per = ROWS // PARTITIONS
    with BookKeeper(zbk_cluster.uri) as bk:
        partitions = set()
        for md in mds:
            assert md.is_closed and (md.ensemble_size, md.write_quorum, md.ack_quorum, md.digest) == (3, 3, 2, "crc32")
            assert md.custom_metadata["team"] == b"data"
            assert md.custom_metadata[STATE_KEY] == STATE_COMMITTED
            part = int(md.custom_metadata[PARTITION_KEY])
            partitions.add(part)
            rh = bk.open_ledger(md.ledger_id)
            got = [e.payload for e in rh.read(0, rh.last_add_confirmed)]
            # Each ledger holds its partition's rows, in order.
            assert got == [f"event-{i}".encode() for i in range(part * per, (part + 1) * per)]
        assert partitions == set(range(PARTITIONS))
        assert len({md.custom_metadata[JOB_KEY] for md in mds}) == 1

    # And through Spark: the committed ledgers match their selector.
    back = spark.read.format("zbk").option("metadata", zbk_cluster.uri).option("ledgers", f"meta:app={app}").load()
    payloads = sorted(back.toArrow().column("payload").to_pylist())
    assert payloads == sorted(f"event-{i}".encode() for i in range(ROWS))


def test_aborted_write_leaves_no_ledger(spark: Any, zbk_cluster: ZbkCluster, app: str) -> None:
    store = open_store(zbk_cluster.uri)
    try:
        before = {md.ledger_id for md in iter_ledgers(store)}
    finally:
        store.close()
    # Partition 1 fails at its 1,500th row, after its ledger has entries; partition 0 succeeds.
    df = spark.range(0, 4000, 1, 2).selectExpr(
        "case when id = 3500 then raise_error('boom at 3500') else cast(concat('x', id) as binary) end as payload")
    with pytest.raises(Exception, match="boom at 3500"):
        (df.write.format("zbk").mode("append").option("metadata", zbk_cluster.uri)
         .option("custom_metadata", f"app={app}").save())

    # Abort ran on the driver; a task killed mid-write cleans up its own ledger just after.
    wait_for(lambda: not ledgers_tagged(zbk_cluster.uri, app), 30, "the aborted job's ledgers to be deleted")
    store = open_store(zbk_cluster.uri)
    try:
        assert {md.ledger_id for md in iter_ledgers(store)} - before == set()
    finally:
        store.close()


def test_write_refuses_bad_frames_and_modes(spark: Any, zbk_cluster: ZbkCluster, app: str) -> None:
    w = spark.range(3).selectExpr("cast(id as string) as body").write.format("zbk").option("metadata", zbk_cluster.uri)
    with pytest.raises(Exception, match="payload"):
        w.mode("append").save()
    ok = spark.range(3).selectExpr("cast(cast(id as string) as binary) as payload").write.format("zbk")
    with pytest.raises(Exception, match="only appends"):
        ok.mode("overwrite").option("metadata", zbk_cluster.uri).save()
    with pytest.raises(Exception, match="reserved"):
        ok.mode("append").option("metadata", zbk_cluster.uri).option("custom_metadata", "zbk.spark.job=x").save()
    assert not ledgers_tagged(zbk_cluster.uri, app)


def test_plain_save_appends_as_api_md_shows(spark: Any, zbk_cluster: ZbkCluster, app: str) -> None:
    """``df.write.format("zbk").option(...).save()`` with no mode: Spark's default
    (errorifexists) is refused for Python data sources, so zbk's writer appends."""
    df = spark.range(0, 50, 1, 1).selectExpr("cast(concat('plain-', id) as binary) as payload")
    df.write.format("zbk").option("metadata", zbk_cluster.uri).option("custom_metadata", f"app={app}").save()
    (md,) = ledgers_tagged(zbk_cluster.uri, app)
    with BookKeeper(zbk_cluster.uri) as bk:
        rh = bk.open_ledger(md.ledger_id, password=b"")
        assert [e.payload for e in rh.read(0, md.last_entry_id)] == [b"plain-%d" % i for i in range(50)]


# A task attempt racing its driver, without Spark: the driver's commit or abort runs at a
# chosen point of the task, around the creation of the task's ledger.

def _job_ledgers(uri: str, job: str) -> list[int]:
    store = open_store(uri)
    try:
        return job_ledgers(store, job)
    finally:
        store.close()


def _batch(n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"payload": [f"late-{i}".encode() for i in range(n)]})


def _create_wrapped(monkeypatch: pytest.MonkeyPatch, before: Callable[[], None] | None,
                    after: Callable[[], None] | None) -> None:
    real = write.BookKeeper.create_ledger

    def create(self: BookKeeper, *a: Any, **kw: Any) -> Any:
        if before:
            before()
        lh = real(self, *a, **kw)
        if after:
            after()
        return lh

    monkeypatch.setattr(write.BookKeeper, "create_ledger", create)


@pytest.mark.parametrize("when", ["before_the_task", "before_create", "after_create"])
def test_a_task_attempt_keeps_no_ledger_once_the_job_is_aborted(
        zbk_cluster: ZbkCluster, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """Whenever the driver's abort lands (mark, then sweep) around the task's ledger
    creation, no ledger of the job survives, even one the sweep could not see."""
    opts, job = WriteOptions(metadata=zbk_cluster.uri), uuid.uuid4().hex
    aborts: list[int] = []

    def abort() -> None:
        aborts.append(1)
        write.abort_job(opts, job, [])

    if when == "before_the_task":
        abort()
    _create_wrapped(monkeypatch, abort if when == "before_create" else None,
                    abort if when == "after_create" else None)
    with pytest.raises(OperationRefusedError, match="already committed or aborted"):
        write.write_partition(opts, job, [_batch(10)], 0)
    assert aborts == [1]
    assert _job_ledgers(zbk_cluster.uri, job) == []


def test_a_late_attempt_after_commit_leaves_the_committed_ledgers_alone(
        zbk_cluster: ZbkCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A speculative twin that creates its ledger after the commit's sweep deletes its own
    ledger; the committed one stays, with its entries."""
    opts, job = WriteOptions(metadata=zbk_cluster.uri), uuid.uuid4().hex
    done = write.write_partition(opts, job, [_batch(5)], 0)
    assert done.ledger_id is not None
    _create_wrapped(monkeypatch, lambda: write.commit_job(opts, job, [done]), None)
    with pytest.raises(OperationRefusedError):
        write.write_partition(opts, job, [_batch(5)], 0)
    assert _job_ledgers(zbk_cluster.uri, job) == [done.ledger_id]
    with BookKeeper(zbk_cluster.uri) as bk:
        rh = bk.open_ledger(done.ledger_id)
        assert rh.metadata.custom_metadata[STATE_KEY] == STATE_COMMITTED
        assert [e.payload for e in rh.read(0, rh.last_add_confirmed)] == [f"late-{i}".encode() for i in range(5)]
