"""zbk.spark: a PySpark data source over zbk ledgers (docs/spark.md).

    import zbk.spark
    zbk.spark.register(spark)
    df = spark.read.format("zbk").option("metadata", URI).option("ledgers", "1,2,3").load()

Needs the ``spark`` extra (pyspark >= 4.0, pyarrow). Executors are Python workers: start
Spark with PYSPARK_PYTHON pointing at an interpreter that can import zbk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zbk.spark.source import ZbkDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ZbkDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Make ``format("zbk")`` available in ``spark`` (batch reads, streaming reads, writes)."""
    spark.dataSource.register(ZbkDataSource)
