"""Batch read throughput: zbk ledgers into Spark (local[N]) beside the plain client.

    .venv/bin/python bench/spark_read.py                      # starts 3 bookies itself
    .venv/bin/python bench/spark_read.py --metadata URI       # an existing cluster (e.g. zbk sandbox)

Writes ``--ledgers`` ledgers of ``--entries`` entries of ``--entry-size`` bytes (E3 WQ2 AQ2
by default), then times, on the same ledgers:

* client: the synchronous client reading every ledger 0..last, one after the other;
* spark:  ``spark.read.format("zbk")...load().selectExpr("sum(length(payload))")`` on
  ``--master`` (payloads cross into the JVM; nothing is cached between runs).

Both figures are payload MB/s (10**6 bytes). Spark is run once untimed first (its Python
workers start then), then ``--runs`` times; the best and the median are printed. The
bookies this script starts listen on loopback only and are stopped by PID at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from zbk.client.sync import BookKeeper


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metadata", help="metadata URI of a running cluster (default: start 3 bookies)")
    ap.add_argument("--ledgers", type=int, default=3)
    ap.add_argument("--entries", type=int, default=40_000, help="entries per ledger")
    ap.add_argument("--entry-size", type=int, default=1024)
    ap.add_argument("--ensemble", type=int, default=3)
    ap.add_argument("--write-quorum", type=int, default=2)
    ap.add_argument("--ack-quorum", type=int, default=2)
    ap.add_argument("--entries-per-partition", type=int, default=10_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="zbk-spark-bench-") as tmp:
        cluster = None if args.metadata else LocalCluster(Path(tmp), 3)
        try:
            uri = args.metadata or cluster.start()  # type: ignore[union-attr]
            ids, total = write_ledgers(uri, args)
            client_s = [client_read(uri, ids, total) for _ in range(args.runs)]
            spark_s = spark_read(uri, ids, total, args, Path(tmp))
        finally:
            if cluster is not None:
                cluster.stop()
    result = {
        "ledgers": args.ledgers, "entries_per_ledger": args.entries, "entry_size": args.entry_size,
        "payload_mb": round(total / 1e6, 1), "master": args.master,
        "client_mb_s_best": round(total / 1e6 / min(client_s), 1),
        "client_mb_s_median": round(total / 1e6 / statistics.median(client_s), 1),
        "spark_mb_s_best": round(total / 1e6 / min(spark_s), 1),
        "spark_mb_s_median": round(total / 1e6 / statistics.median(spark_s), 1),
        "load_average_1m": round(os.getloadavg()[0], 1),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.ledgers} ledgers x {args.entries} entries x {args.entry_size} B = {result['payload_mb']} MB "
              f"(E{args.ensemble} WQ{args.write_quorum} AQ{args.ack_quorum})")
        print(f"plain client read : {result['client_mb_s_best']} MB/s best, {result['client_mb_s_median']} median")
        print(f"spark {args.master:<11} : {result['spark_mb_s_best']} MB/s best, {result['spark_mb_s_median']} median")
        print(f"(1-minute load average at the end: {result['load_average_1m']})")
    return 0


def write_ledgers(uri: str, args: argparse.Namespace) -> tuple[list[int], int]:
    ids, total = [], 0
    with BookKeeper(uri) as bk:
        for n in range(args.ledgers):
            lh = bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum,
                                  custom_metadata={"bench": b"spark_read"})
            futs = []
            for i in range(args.entries):
                p = (f"{n}:{i}:".encode() + os.urandom(16)) * (args.entry_size // 20 + 1)
                p = p[:args.entry_size]
                total += len(p)
                futs.append(lh.append_async(p))
                if len(futs) >= 5000:
                    for f in futs:
                        f.result()
                    futs = []
            for f in futs:
                f.result()
            lh.close()
            ids.append(lh.ledger_id)
    return ids, total


def client_read(uri: str, ids: list[int], total: int) -> float:
    t0 = time.perf_counter()
    got = 0
    with BookKeeper(uri) as bk:
        for lid in ids:
            rh = bk.open_ledger(lid, recovery=False)
            for e in rh.read(0, rh.last_add_confirmed):
                got += len(e.payload)
    elapsed = time.perf_counter() - t0
    assert got == total, (got, total)
    return elapsed


def spark_read(uri: str, ids: list[int], total: int, args: argparse.Namespace, tmp: Path) -> list[float]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    import zbk.spark

    spark = (SparkSession.builder.master(args.master).appName("zbk-spark-read-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").config("spark.local.dir", str(tmp / "spark"))
             .config("spark.python.authenticate.socketTimeout", "120s").getOrCreate())
    gateway = SparkContext._gateway
    jvm = getattr(gateway, "proc", None)
    try:
        spark.sparkContext.setLogLevel("ERROR")
        zbk.spark.register(spark)

        def once() -> float:
            t0 = time.perf_counter()
            df = (spark.read.format("zbk").option("metadata", uri).option("ledgers", ",".join(map(str, ids)))
                  .option("entries_per_partition", str(args.entries_per_partition)).load())
            got = df.selectExpr("sum(length(payload)) as n").collect()[0]["n"]
            elapsed = time.perf_counter() - t0
            assert got == total, (got, total)
            return elapsed

        once()  # warm-up: Python workers start
        return [once() for _ in range(args.runs)]
    finally:
        spark.stop()
        if gateway is not None:
            gateway.shutdown()
        if jvm is not None:
            _stop(jvm)


class LocalCluster:
    """Three bookie processes on loopback sharing an embedded metadata store."""

    def __init__(self, root: Path, n: int) -> None:
        self.root = root
        self.uri = f"sqlite:///{root}/meta.db"
        self.n = n
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> str:
        for i in range(self.n):
            argv = [sys.executable, "-m", "zbk.cli.main", "bookie", "--metadata", self.uri,
                    "--data-dir", str(self.root / f"bookie-{i}"), "--port", str(_free_port()),
                    "--http-port", str(_free_port())]
            with open(self.root / f"bookie-{i}.log", "ab") as log:
                self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                   stdin=subprocess.DEVNULL, start_new_session=True))
        self._wait_registered(60.0)
        return self.uri

    def _wait_registered(self, timeout_s: float) -> None:
        from zbk.metadata.registry import list_bookies
        from zbk.metadata.uri import open_store

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise SystemExit(f"a bookie exited with {p.returncode}; logs in {self.root}")
            if (self.root / "meta.db").exists():
                store = open_store(self.uri)
                try:
                    if len(list_bookies(store)) >= self.n:
                        return
                finally:
                    store.close()
            time.sleep(0.2)
        raise SystemExit(f"bookies did not register within {timeout_s}s; logs in {self.root}")

    def stop(self) -> None:
        for p in self.procs:
            _stop(p)


def _stop(proc: Any) -> None:
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
