"""The ``zbk`` PySpark data source (Python Data Source API, pyspark >= 4.0).

Spark creates the DataSource from the options on the driver, then asks it for a batch
reader, a stream reader or a writer; each is pickled to the executors, so each holds only
its parsed options (zbk.spark.options) and opens clients lazily where it runs.
"""

from __future__ import annotations

import uuid

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceWriter
from pyspark.sql.types import StructType

from zbk.errors import BadRequestError
from zbk.spark.batch import ZbkBatchReader
from zbk.spark.options import read_options, write_options
from zbk.spark.schema import check_schema, default_schema
from zbk.spark.stream import ZbkStreamReader
from zbk.spark.write import ZbkWriter, check_write_schema


class ZbkDataSource(DataSource):
    """The ``zbk`` data source: ledgers as DataFrames (docs/spark.md has the options).

    Spark makes it from a ``format("zbk")`` read or write with its ``option(...)`` values
    (``self.options``); `zbk.spark.register` registers it. Every method checks the options
    first: an unknown option or a malformed value is a `BadRequestError`, a malformed
    metadata URI a `ConfigError`.
    """

    @classmethod
    def name(cls) -> str:
        """The format name, as in ``spark.read.format("zbk")``.

        Returns:
            ``"zbk"``.
        """
        return "zbk"

    def schema(self) -> StructType:
        """The schema of a read without ``.schema(...)``.

        Returns:
            ``ledger_id``, ``entry_id``, ``payload``, then the ``extra_columns`` asked for
            (``closed``, ``bookies``).

        Raises:
            BadRequestError: An unknown or malformed read option.
        """
        return default_schema(read_options(self.options).extra_columns)

    def reader(self, schema: StructType) -> DataSourceReader:
        """The batch reader of the selected ledgers.

        Args:
            schema: The columns to read: any of the five the source has, in any order.

        Returns:
            A reader that plans partitions on the driver and reads them on executors.

        Raises:
            BadRequestError: An unknown column, a column of the wrong type, or an unknown
                or malformed read option.
        """
        check_schema(schema)
        return ZbkBatchReader(read_options(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """The streaming reader of the selected ledgers (new entries, new ledgers).

        Args:
            schema: The columns to read: any of the five the source has, in any order.

        Returns:
            A reader whose offsets are, per ledger, the last entry id delivered.

        Raises:
            BadRequestError: An unknown column, a column of the wrong type, or an unknown
                or malformed read option.
        """
        check_schema(schema)
        return ZbkStreamReader(read_options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """The writer of a DataFrame into new ledgers (one per non-empty partition).

        Args:
            schema: The DataFrame's columns; ``payload`` (binary or string) is written.
            overwrite: Whether Spark asks for an overwrite; refused.

        Returns:
            A writer whose tasks each create, fill and close a ledger; readers see a
            job's ledgers once it committed, and the ledgers of a failed job are deleted.

        Raises:
            BadRequestError: An overwrite, no ``payload`` column or one of another type,
                or an unknown or malformed write option.
        """
        if overwrite:
            raise BadRequestError('format zbk only appends: ledgers are immutable; use .mode("append")')
        check_write_schema(schema)
        return ZbkWriter(write_options(self.options), uuid.uuid4().hex)
