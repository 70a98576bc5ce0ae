"""examples/spark_pipeline.py end to end: generated JSON events in ledgers -> Parquet
aggregates, then an incremental second run that ingests only what was added."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from zbk.client.sync import BookKeeper
from zbk.metadata.uri import open_store
from zbk.spark.catalog import iter_ledgers

from .conftest import ZbkCluster
from .util import retry_worker_start

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("zbk_spark_pipeline_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def revenue_by_sku(uri: str, app: str) -> dict[str, float]:
    """The expected aggregate, computed from the ledgers with the plain client."""
    out: dict[str, float] = defaultdict(float)
    store = open_store(uri)
    try:
        ids = [md.ledger_id for md in iter_ledgers(store) if md.custom_metadata.get("app") == app.encode()]
    finally:
        store.close()
    with BookKeeper(uri) as bk:
        for lid in ids:
            rh = bk.open_ledger(lid)
            for e in rh.read(0, rh.last_add_confirmed):
                try:
                    ev = json.loads(e.payload)
                except ValueError:
                    continue
                if ev["status"] != "cancelled":
                    out[ev["sku"]] += ev["qty"] * ev["unit_price"]
    return dict(out)


def test_pipeline_example_end_to_end_and_incremental(spark: Any, zbk_cluster: ZbkCluster, app: str,
                                                     tmp_path: Path) -> None:
    ex = load_example()
    out = tmp_path / "out"
    ex.generate(spark, zbk_cluster.uri, app, 3000)
    first = retry_worker_start(lambda: ex.run(spark, zbk_cluster.uri, out, app=app))
    assert (first.ingested, first.rejected) == (3000, 0)
    assert spark.read.parquet(str(out / "customers")).count() > 0

    # New input arrives: one good event and one that is not JSON, in a new ledger.
    good = {"order_id": "late-1", "customer": "c-9999", "sku": "sku-999", "qty": 2, "unit_price": 10.5,
            "ts": "2026-01-02T03:04:05.000Z", "status": "paid"}
    with BookKeeper(zbk_cluster.uri) as bk:
        lh = bk.create_ledger(3, 2, 2, custom_metadata={"app": app.encode()})
        lh.append(json.dumps(good).encode())
        lh.append(b"{not json")
        lh.close()
    second = retry_worker_start(lambda: ex.run(spark, zbk_cluster.uri, out, app=app))
    assert (second.ingested, second.rejected) == (3001, 1)  # nothing ingested twice
    rejected = spark.read.parquet(str(out / "events")).where("not ok").collect()
    assert [(r["ledger_id"], r["entry_id"], r["rejected_json"]) for r in rejected] == [(lh.ledger_id, 1, "{not json")]

    got = {r["sku"]: r["revenue"] for r in
           spark.read.parquet(str(out / "sku_hourly")).groupBy("sku").sum("revenue")
           .withColumnRenamed("sum(revenue)", "revenue").collect()}
    want = revenue_by_sku(zbk_cluster.uri, app)
    assert got.keys() == want.keys() and "sku-999" in got
    assert all(abs(got[k] - want[k]) < 1e-6 * max(1.0, want[k]) for k in want)
