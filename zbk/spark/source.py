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
    @classmethod
    def name(cls) -> str:
        return "zbk"

    def schema(self) -> StructType:
        return default_schema(read_options(self.options).extra_columns)

    def reader(self, schema: StructType) -> DataSourceReader:
        check_schema(schema)
        return ZbkBatchReader(read_options(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        check_schema(schema)
        return ZbkStreamReader(read_options(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise BadRequestError('format zbk only appends: ledgers are immutable; use .mode("append")')
        check_write_schema(schema)
        return ZbkWriter(write_options(self.options), uuid.uuid4().hex)
