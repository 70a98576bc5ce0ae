"""Fixtures for the Spark data source tests: real bookies and one local Spark.

* ``zbk_cluster`` (session): three real bookie processes on loopback sharing an embedded
  (sqlite) metadata store; stopped by PID at the end, even when a test fails.
* ``spark`` (session): a local[2] SparkSession bound to 127.0.0.1 with the UI off and the
  ``zbk`` format registered; its JVM is stopped by PID at the end.

Tests share the cluster; each one isolates itself with its own custom metadata tag
(``app``), so the order of tests does not matter.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from helpers.bookie import BookieProcess
from helpers.procs import stop_process

pytest.importorskip("pyspark", reason="needs the spark extra (pip install -e '.[spark]')")


@dataclass
class ZbkCluster:
    uri: str
    bookies: list[BookieProcess]


@pytest.fixture(scope="session")
def zbk_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZbkCluster]:
    root = tmp_path_factory.mktemp("spark-zbk")
    uri = f"sqlite:///{root}/meta.db"
    # No test here kills a bookie; a long registration lease keeps a bookie whose keep-alive
    # is late on a saturated machine from vanishing from the writable list meanwhile.
    bookies = [BookieProcess(root, uri, name=f"b{i}", settings={"registration_ttl_s": 30}) for i in range(3)]
    try:
        for b in bookies:
            b.start(wait=False)
        for b in bookies:
            b.wait_ready()
        yield ZbkCluster(uri, bookies)
    finally:
        for b in bookies:
            b.stop()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # Loopback only, and Python workers that can import zbk (this interpreter).
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    import zbk.spark

    scratch = tmp_path_factory.mktemp("spark-local")
    session = (SparkSession.builder.master("local[2]").appName("zbk-spark-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.local.dir", str(scratch / "local"))
               .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.streaming.pollingDelay", "50ms")
               # A loaded machine can take longer than the 15 s default to start a worker.
               .config("spark.python.authenticate.socketTimeout", "120s")
               .getOrCreate())
    gateway = SparkContext._gateway
    jvm = getattr(gateway, "proc", None)
    try:
        session.sparkContext.setLogLevel("ERROR")
        zbk.spark.register(session)
        yield session
    finally:
        try:
            session.stop()
        finally:
            if gateway is not None:
                gateway.shutdown()
            if jvm is not None:
                stop_process(jvm, timeout_s=20.0)
            SparkContext._gateway = None
            SparkContext._jvm = None


@pytest.fixture
def app() -> str:
    """A custom metadata value no other test uses."""
    return f"t{uuid.uuid4().hex[:10]}"
