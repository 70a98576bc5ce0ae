"""Batch reads: ``spark.read.format("zbk")``.

Planning (driver): select the ledgers, check the password, find each one's readable end
(a closed ledger's last entry; an open ledger's LAC, asked of its last ensemble without
fencing), cut ``0..end`` into LedgerRanges. Reading (executors): zbk.spark.read.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from zbk.client.sync import BookKeeper
from zbk.errors import NoSuchLedgerError
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.uri import open_store
from zbk.spark.catalog import select_ledgers
from zbk.spark.options import ReadOptions
from zbk.spark.plan import LedgerRange, split
from zbk.spark.read import read_range
from zbk.spark.schema import arrow_schema


class ZbkBatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.arrow = arrow_schema(schema)

    def partitions(self) -> list[LedgerRange]:  # type: ignore[override]
        return plan_batch(self.opts)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        assert isinstance(partition, LedgerRange), partition
        return read_range(self.opts, self.arrow, partition)


def plan_batch(opts: ReadOptions) -> list[LedgerRange]:
    store = open_store(opts.metadata)
    try:
        selected = select_ledgers(store, opts.selector, opts.password)
    finally:
        store.close()
    ranges: list[LedgerRange] = []
    open_ones = [md for md in selected if not md.is_closed]
    ends = readable_ends(opts, open_ones) if open_ones else {}
    for md in selected:
        if not md.is_closed and md.ledger_id not in ends:
            continue  # deleted since the listing
        md, end = ends.get(md.ledger_id, (md, md.last_entry_id))
        ranges += split(md, 0, end, opts.entries_per_partition)
    return ranges


def readable_ends(opts: ReadOptions, mds: list[LedgerMetadata]) -> dict[int, tuple[LedgerMetadata, int]]:
    """For each open ledger: (its metadata as just read, the last entry a reader may see:
    the LAC its last ensemble reports, or the last entry if it closed meanwhile). A ledger
    deleted since the listing is left out, unless it was named by id."""
    out: dict[int, tuple[LedgerMetadata, int]] = {}
    with BookKeeper(opts.metadata) as bk:
        for md in mds:
            try:
                rh = bk.open_ledger(md.ledger_id, password=opts.password, recovery=False)
            except NoSuchLedgerError:
                if opts.selector.kind == "ids":
                    raise
                continue
            end = rh.read_last_add_confirmed()
            out[md.ledger_id] = (rh.metadata, rh.metadata.last_entry_id if rh.metadata.is_closed else end)
    return out
