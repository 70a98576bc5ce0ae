"""Batch reads on local Spark against real bookies."""

from __future__ import annotations

import math
from typing import Any

import pytest
from pyspark.sql.functions import spark_partition_id

from zbk.client.sync import BookKeeper
from zbk.errors import BadRequestError, NoSuchLedgerError, UnauthorizedError
from zbk.metadata.uri import open_store
from zbk.spark.batch import plan_batch
from zbk.spark.catalog import mark_committed
from zbk.spark.options import JOB_KEY, STATE_KEY, STATE_PENDING, read_options

from .conftest import ZbkCluster
from .util import append_all, client_read, payload


def rows_of(t: Any) -> dict[tuple[int, int], bytes]:
    """Every row of an Arrow table as {(ledger, entry): payload}; fails on a duplicate."""
    out: dict[tuple[int, int], bytes] = {}
    for lid, eid, p in zip(t.column("ledger_id").to_pylist(), t.column("entry_id").to_pylist(),
                           t.column("payload").to_pylist(), strict=True):
        assert (lid, eid) not in out, f"duplicate row {(lid, eid)}"
        out[(lid, eid)] = p
    return out


def test_three_ledgers_30000_entries_equal_the_client_read(spark: Any, zbk_cluster: ZbkCluster, app: str) -> None:
    counts = (12_000, 10_000, 8_000)
    with BookKeeper(zbk_cluster.uri) as bk:
        ids = []
        for n in counts:
            lh = bk.create_ledger(3, 2, 2, custom_metadata={"app": app.encode()})
            append_all(lh, [payload(app, i, 100 + i % 300) for i in range(n)])
            lh.close()
            ids.append(lh.ledger_id)
        expected: dict[tuple[int, int], bytes] = {}
        for lid in ids:
            expected.update(client_read(bk, lid))
    assert len(expected) == 30_000

    df = (spark.read.format("zbk").option("metadata", zbk_cluster.uri)
          .option("ledgers", ",".join(map(str, ids))).option("entries_per_partition", "4000").load())
    assert [f.name for f in df.schema.fields] == ["ledger_id", "entry_id", "payload"]
    assert [f.dataType.simpleString() for f in df.schema.fields] == ["bigint", "bigint", "binary"]
    t = df.withColumn("pid", spark_partition_id()).toArrow()  # one Spark job
    got: dict[tuple[int, int], bytes] = {}
    by_partition: dict[int, list[tuple[int, int]]] = {}
    for lid, eid, p, pid in zip(*(t.column(c).to_pylist() for c in ("ledger_id", "entry_id", "payload", "pid")),
                                strict=True):
        assert (lid, eid) not in got, f"duplicate row {(lid, eid)}"
        got[(lid, eid)] = p
        by_partition.setdefault(pid, []).append((lid, eid))
    assert got == expected
    # One partition per entry range: ceil(n / 4000) per (single-fragment) ledger, each a run
    # of consecutive entries of one ledger.
    assert len(by_partition) == sum(math.ceil(n / 4000) for n in counts)
    for keys in by_partition.values():
        lid, first = keys[0]
        assert keys == [(lid, first + i) for i in range(len(keys))]
        assert first % 4000 == 0 and len(keys) <= 4000


def test_open_ledger_is_read_up_to_its_lac_only(spark: Any, zbk_cluster: ZbkCluster, app: str) -> None:
    with BookKeeper(zbk_cluster.uri) as bk:
        lh = bk.create_ledger(3, 3, 2, password=b"pw", custom_metadata={"app": app.encode()})
        for i in range(100):
            lh.append(payload(app, i))  # each append carries the LAC of the one before
        assert lh.last_add_confirmed == 99  # the writer's view: all 100 acknowledged
        expected = client_read(bk, lh.ledger_id, b"pw")
        assert sorted(expected) == [(lh.ledger_id, i) for i in range(99)]  # a reader's: up to LAC 98

        def load() -> Any:
            return (spark.read.format("zbk").option("metadata", zbk_cluster.uri)
                    .option("ledgers", str(lh.ledger_id)).option("password", "pw")
                    .option("extra_columns", "closed,bookies").load())

        df = load()
        got = df.toArrow()
        assert got.schema.names == ["ledger_id", "entry_id", "payload", "closed", "bookies"]
        assert set(got.column("closed").to_pylist()) == {False}
        ensemble = bk.ledger_metadata(lh.ledger_id).ensembles[0]
        assert got.column("bookies").to_pylist() == [ensemble] * len(got)
        assert rows_of(got) == expected  # entry 99 is not confirmed to readers: never returned

        lh.close()
        # A DataFrame is planned once (a snapshot); a new one sees the closed ledger whole.
        assert df.count() == 99
        again = load().toArrow()
        assert set(again.column("closed").to_pylist()) == {True}
        assert rows_of(again) == client_read(bk, lh.ledger_id, b"pw")
        assert len(again) == 100


def test_bad_options_are_typed_errors(spark: Any, zbk_cluster: ZbkCluster, app: str) -> None:
    uri = zbk_cluster.uri
    with BookKeeper(uri) as bk:
        lh = bk.create_ledger(3, 2, 2, password=b"secret", custom_metadata={"app": app.encode()})
        lh.append(b"x")
        lh.close()
    lid = lh.ledger_id

    with pytest.raises(NoSuchLedgerError, match="ledger 999999999 does not exist"):
        plan_batch(read_options({"metadata": uri, "ledgers": f"{lid},999999999", "password": "secret"}))
    with pytest.raises(UnauthorizedError, match=f"wrong password for ledger {lid}"):
        plan_batch(read_options({"metadata": uri, "ledgers": str(lid), "password": "nope"}))
    with pytest.raises(BadRequestError, match="not a ledger id"):
        read_options({"metadata": uri, "ledgers": "1,two"})

    def load(**opts: str) -> Any:
        r = spark.read.format("zbk")
        for k, v in {"metadata": uri, **opts}.items():
            r = r.option(k, v)
        return r.load().collect()

    # Through Spark the typed error arrives inside Spark's exception, named in its text.
    for opts, name in [({"ledgers": "999999999"}, "NoSuchLedgerError"),
                       ({"ledgers": str(lid), "password": "nope"}, "UnauthorizedError"),
                       ({"ledgers": str(lid), "entriesPerPartition": "5"}, "BadRequestError")]:
        with pytest.raises(Exception) as err:
            load(**opts)
        assert name in str(err.value), (opts, str(err.value)[:2000])


def test_selectors_skip_uncommitted_spark_writes(zbk_cluster: ZbkCluster, app: str) -> None:
    with BookKeeper(zbk_cluster.uri) as bk:
        done = bk.create_ledger(3, 2, 2, custom_metadata={"app": app.encode()})
        done.append(b"a")
        done.close()
        pending = bk.create_ledger(3, 2, 2, custom_metadata={"app": app.encode(), JOB_KEY: b"job1",
                                                             STATE_KEY: STATE_PENDING})
        pending.append(b"b")
        pending.close()

    def planned() -> set[int]:
        return {r.ledger_id for r in plan_batch(read_options({"metadata": zbk_cluster.uri,
                                                              "ledgers": f"meta:app={app}"}))}

    assert planned() == {done.ledger_id}
    store = open_store(zbk_cluster.uri)
    try:
        mark_committed(store, pending.ledger_id, "job1")
    finally:
        store.close()
    assert planned() == {done.ledger_id, pending.ledger_id}
