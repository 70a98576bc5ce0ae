"""Streaming reads: ``spark.readStream.format("zbk")`` tails the ledgers a selector matches.

Offsets are zbk.spark.offsets (per-ledger last entry id). Each trigger lists the ledger
metadata once: a closed ledger's end is its last entry (it finishes once delivered), an
open ledger's end is the LAC its last ensemble reports (read without fencing), and ledgers
that newly match the selector join from entry 0. ``maxEntriesPerTrigger`` caps the entries
of one micro-batch; Trigger.AvailableNow stops at what was available when the query began.

Exactly once: Spark logs (start, end] of a batch before running it and replays the same
range after a restart; the range names confirmed entries only, which never change, and
``partitions`` cuts it the same way every time.

The reader Spark keeps on the driver holds a client (for LAC reads) between triggers; the
copies pickled to executors hold only options (``__getstate__``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from zbk.client.sync import BookKeeper, SyncReadHandle
from zbk.errors import NoSuchLedgerError, ZbkError
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import LedgerStore
from zbk.metadata.store import MetadataStore
from zbk.metadata.uri import open_store
from zbk.spark import offsets
from zbk.spark.catalog import select_ledgers
from zbk.spark.options import ReadOptions
from zbk.spark.plan import LedgerRange, split
from zbk.spark.read import read_range
from zbk.spark.schema import arrow_schema

log = logging.getLogger(__name__)


class ZbkStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.arrow = arrow_schema(schema)
        self._reset()

    def _reset(self) -> None:
        self._store: MetadataStore | None = None
        self._bk: BookKeeper | None = None
        self._handles: dict[int, SyncReadHandle] = {}
        self._mds: dict[int, LedgerMetadata] = {}
        self._target: offsets.Offsets | None = None
        self._latest: offsets.Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"opts": self.opts, "arrow": self.arrow}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.opts = state["opts"]
        self.arrow = state["arrow"]
        self._reset()

    # -- offsets (driver) ------------------------------------------------------------------
    def initialOffset(self) -> dict[str, int]:
        if self.opts.starting_offsets == "earliest":
            return {}
        return offsets.encode(self._available())

    def latestOffset(self, start: dict[str, Any] | None = None,  # type: ignore[override]
                     limit: ReadLimit | None = None) -> dict[str, int]:
        available = self._available()
        if start is None:  # engines before Spark 4.2 give neither start nor limit
            return offsets.encode(available)
        begin = offsets.decode(start)
        if isinstance(limit, ReadMinRows) and sum(offsets.backlog(begin, available).values()) < limit.min_rows:
            return offsets.encode(begin)  # not enough yet: no new batch
        max_entries = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return offsets.encode(offsets.admit(begin, available, max_entries))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_entries_per_trigger
        return ReadMaxRows(n) if n is not None else ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, int] | None:
        return None if self._latest is None else offsets.encode(self._latest)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = self._available()

    def _available(self) -> offsets.Offsets:
        """Per matching ledger, the last entry a reader may see now (capped at the
        AvailableNow target, if any)."""
        mds = select_ledgers(self._metadata_store(), self.opts.selector, self.opts.password)
        out: offsets.Offsets = {}
        for md in mds:
            if md.is_closed:
                self._handles.pop(md.ledger_id, None)
                out[md.ledger_id] = md.last_entry_id
            else:
                try:
                    out[md.ledger_id] = self._lac(md)
                except NoSuchLedgerError:
                    if self.opts.selector.kind == "ids":
                        raise
                    continue  # deleted since the listing: it leaves the offsets
            self._mds[md.ledger_id] = md
        self._latest = dict(out)
        if self._target is not None:
            out = {lid: min(end, self._target[lid]) for lid, end in out.items() if lid in self._target}
        return out

    def _lac(self, md: LedgerMetadata) -> int:
        h = self._handles.get(md.ledger_id)
        if h is None or h.metadata.fragments != md.fragments:  # new, or its ensemble changed
            h = self._client().open_ledger(md.ledger_id, password=self.opts.password, recovery=False)
            self._handles[md.ledger_id] = h
        try:
            return h.read_last_add_confirmed()
        except ZbkError as e:  # unreachable bookies: no progress this trigger, not a failed query
            log.warning("ledger %d: LAC unknown this trigger: %s", md.ledger_id, e)
            return h.last_add_confirmed

    # -- planning (driver) -----------------------------------------------------------------
    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[LedgerRange]:  # type: ignore[override]
        out: list[LedgerRange] = []
        for lid, first, last in offsets.ranges(offsets.decode(start), offsets.decode(end)):
            out += split(self._ledger(lid), first, last, self.opts.entries_per_partition)
        return out

    def _ledger(self, ledger_id: int) -> LedgerMetadata:
        md = self._mds.get(ledger_id)
        if md is None:  # a restarted query replays a logged batch before listing anything
            md, _ = LedgerStore(self._metadata_store()).read(ledger_id)
            self._mds[ledger_id] = md
        return md

    # -- reading (executors) ---------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        assert isinstance(partition, LedgerRange), partition
        return read_range(self.opts, self.arrow, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: entries stay in their ledgers; ``end`` is in Spark's log."""

    def stop(self) -> None:
        self._handles.clear()
        if self._bk is not None:
            self._bk.close()
            self._bk = None
        if self._store is not None:
            self._store.close()
            self._store = None

    def _client(self) -> BookKeeper:
        if self._bk is None:
            self._bk = BookKeeper(self.opts.metadata)
        return self._bk

    def _metadata_store(self) -> MetadataStore:
        if self._store is None:
            self._store = open_store(self.opts.metadata)
        return self._store
