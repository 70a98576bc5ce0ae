"""A Spark pipeline over zbk: ledgers of JSON order events -> parsed -> aggregated -> Parquet.

Start a local cluster in one terminal (it prints the metadata URI):

    .venv/bin/zbk sandbox --data-dir ./zbk-sandbox

then, in another:

    .venv/bin/python examples/spark_pipeline.py --metadata sqlite:///$PWD/zbk-sandbox/meta.db \\
        --generate 50000 --out ./orders-out

Stages:

1. ``--generate N`` (optional): N synthetic order events, as JSON, written by Spark into new
   ledgers tagged ``app=<app>`` (one ledger per partition; committed atomically).
2. Ingest: a streaming read of every ledger tagged ``app=<app>`` (``Trigger.AvailableNow``),
   JSON parsed into typed columns, appended to ``<out>/events`` as Parquet (partitioned by
   day). The checkpoint in ``<out>/_checkpoint`` makes ingestion incremental and
   exactly-once: run the script again and only entries (or ledgers) added since are
   ingested, none twice. Entries that do not parse are kept too (``ok = false``, the raw
   text in ``rejected_json``, with their ledger and entry ids).
3. Aggregate: from all ingested events, revenue and quantities per SKU per hour
   (``<out>/sku_hourly``, partitioned by day) and per customer (``<out>/customers``),
   rewritten on each run.

``run(spark, ...)`` does the same on an existing SparkSession (the tests call it).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EVENT_SCHEMA = ("order_id string, customer string, sku string, qty int, unit_price double, "
                "ts timestamp, status string")
SKUS = [f"sku-{i:03d}" for i in range(40)]
STATUSES = ["placed", "placed", "placed", "paid", "cancelled"]


@dataclass(frozen=True)
class Summary:
    ingested: int  # events parsed, in all runs so far
    rejected: int  # entries that are not events (kept with their ledger and entry ids)


def generate(spark: Any, uri: str, app: str, n: int, *, seed: int = 7, partitions: int = 4) -> None:
    """Write ``n`` JSON order events into new ledgers tagged ``app`` (one per partition)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        rows.append((f"o-{seed}-{i}", f"c-{rng.randrange(500):04d}", rng.choice(SKUS), rng.randint(1, 5),
                     round(rng.uniform(2.0, 120.0), 2), 1_767_225_600 + rng.randrange(3 * 86_400),
                     rng.choice(STATUSES)))
    df = spark.createDataFrame(rows, "order_id string, customer string, sku string, qty int, unit_price double, "
                                     "epoch long, status string").repartition(partitions)
    events = df.selectExpr("cast(to_json(named_struct('order_id', order_id, 'customer', customer, 'sku', sku, "
                           "'qty', qty, 'unit_price', unit_price, 'ts', timestamp_seconds(epoch), "
                           "'status', status)) as binary) as payload")
    (events.write.format("zbk").mode("append").option("metadata", uri)
     .option("custom_metadata", f"app={app}").save())


def ingest(spark: Any, uri: str, app: str, out: Path) -> None:
    """Streaming, exactly-once ingestion of every ledger tagged ``app`` into Parquet: the
    zbk offsets and the file sink's log share one checkpoint, so a rerun (or a replay
    after a crash) appends only what it has not committed before."""
    raw = (spark.readStream.format("zbk").option("metadata", uri).option("ledgers", f"meta:app={app}")
           .option("maxEntriesPerTrigger", "200000").load())
    parsed = (raw.selectExpr("ledger_id", "entry_id", "cast(payload as string) as json",
                             f"from_json(cast(payload as string), '{EVENT_SCHEMA}') as e")
              .selectExpr("ledger_id", "entry_id", "e.*", "e.order_id is not null and e.ts is not null as ok",
                          "case when e.order_id is null or e.ts is null then json end as rejected_json",
                          "to_date(e.ts) as day"))
    q = (parsed.writeStream.format("parquet").option("path", str(out / "events"))
         .option("checkpointLocation", str(out / "_checkpoint")).partitionBy("day")
         .trigger(availableNow=True).start())
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(f"ingestion failed: {q.exception()}")


def aggregate(spark: Any, out: Path) -> Summary:
    """Rewrite the reports from every event ingested so far."""
    if not (out / "events" / "_spark_metadata").exists():
        return Summary(0, 0)
    events = spark.read.parquet(str(out / "events"))  # the sink's log: committed files only
    counts = events.selectExpr("count_if(ok) as good", "count_if(not ok) as bad").collect()[0]
    live = events.where("ok and status != 'cancelled'")
    sku_hourly = (live.selectExpr("sku", "day", "date_trunc('hour', ts) as hour", "qty", "qty * unit_price as revenue")
                  .groupBy("day", "hour", "sku")
                  .agg({"qty": "sum", "revenue": "sum", "*": "count"})
                  .withColumnsRenamed({"sum(qty)": "units", "sum(revenue)": "revenue", "count(1)": "orders"}))
    sku_hourly.write.mode("overwrite").partitionBy("day").parquet(str(out / "sku_hourly"))
    customers = (live.selectExpr("customer", "qty * unit_price as spend", "ts").groupBy("customer")
                 .agg({"spend": "sum", "*": "count", "ts": "max"})
                 .withColumnsRenamed({"sum(spend)": "spend", "count(1)": "orders", "max(ts)": "last_order"}))
    customers.write.mode("overwrite").parquet(str(out / "customers"))
    return Summary(counts["good"], counts["bad"])


def run(spark: Any, uri: str, out: Path, *, app: str = "orders", generate_events: int = 0) -> Summary:
    import zbk.spark

    zbk.spark.register(spark)
    if generate_events:
        generate(spark, uri, app, generate_events)
    ingest(spark, uri, app, out)
    return aggregate(spark, out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metadata", required=True, help="metadata URI (zbk sandbox prints it)")
    ap.add_argument("--out", default="./orders-out", help="output directory (Parquet and the checkpoint)")
    ap.add_argument("--app", default="orders", help="ledgers tagged app=<this> are the input")
    ap.add_argument("--generate", type=int, default=0, metavar="N", help="first write N synthetic events")
    ap.add_argument("--master", default="local[2]")
    args = ap.parse_args()

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # executors must import zbk
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(args.master).appName("zbk-orders-pipeline")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "4").config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    try:
        s = run(spark, args.metadata, Path(args.out).resolve(), app=args.app, generate_events=args.generate)
        print(f"events ingested: {s.ingested}, rejected: {s.rejected} (Parquet under {Path(args.out).resolve()})")
        top = (spark.read.parquet(str(Path(args.out).resolve() / "sku_hourly")).groupBy("sku")
               .agg({"revenue": "sum"}).withColumnRenamed("sum(revenue)", "revenue").orderBy("revenue", ascending=False)
               .limit(5).collect())
        for row in top:
            print(f"  {row['sku']}: {row['revenue']:.2f}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
