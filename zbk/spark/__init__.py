"""zbk.spark: a PySpark data source over zbk ledgers (docs/spark.md).

    import zbk.spark
    zbk.spark.register(spark)
    df = spark.read.format("zbk").option("metadata", URI).option("ledgers", "1,2,3").load()

Needs the ``spark`` extra (pyspark >= 4.0, pyarrow). Executors are Python workers: start
Spark with PYSPARK_PYTHON pointing at an interpreter that can import zbk.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zbk.spark.source import ZbkDataSource

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["ZbkDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Make ``format("zbk")`` available in ``spark`` (batch reads, streaming reads, writes).

    A ``format("zbk")`` write without an explicit ``mode(...)`` then appends (Spark's
    default mode is refused for every Python data source).

    Args:
        spark: The session to register the data source in.
    """
    spark.dataSource.register(ZbkDataSource)
    _default_to_append()


def _default_to_append() -> None:
    """Spark's default save mode, ``errorifexists``, is refused for every Python data source,
    and means nothing for a write that always creates new ledgers: a ``format("zbk")`` write
    without an explicit ``mode(...)`` appends, so ``df.write.format("zbk")...save()`` works
    as API.md shows. An explicit mode is passed through unchanged (zbk refuses overwrite)."""
    import functools

    from pyspark.sql.readwriter import DataFrameWriter

    if getattr(DataFrameWriter, "_zbk_default_append", False):
        return
    orig_mode, orig_format, orig_save = DataFrameWriter.mode, DataFrameWriter.format, DataFrameWriter.save

    @functools.wraps(orig_mode)
    def mode(self: Any, saveMode: Any) -> Any:  # noqa: N803 - pyspark's parameter name
        if saveMode is not None:
            self._zbk_mode_set = True
        return orig_mode(self, saveMode)

    @functools.wraps(orig_format)
    def format_(self: Any, source: str) -> Any:
        self._zbk_format = source
        return orig_format(self, source)

    @functools.wraps(orig_save)
    def save(self: Any, path: Any = None, format: Any = None, mode: Any = None,  # noqa: A002
             partitionBy: Any = None, **options: Any) -> Any:  # noqa: N803
        fmt = format if format is not None else getattr(self, "_zbk_format", None)
        if fmt == "zbk" and mode is None and not getattr(self, "_zbk_mode_set", False):
            mode = "append"
        return orig_save(self, path, format, mode, partitionBy, **options)

    DataFrameWriter.mode = mode  # type: ignore[method-assign]
    DataFrameWriter.format = format_  # type: ignore[method-assign]
    DataFrameWriter.save = save  # type: ignore[method-assign]
    DataFrameWriter._zbk_default_append = True  # type: ignore[attr-defined]
