"""Executor side of reads: one LedgerRange -> Arrow record batches, straight from bookies.

Each task opens its own synchronous client (nothing is shared with the driver; the reader
object Spark pickles holds only options). The ledger is opened without recovery, so a
reader never fences a live writer; entries are read from each entry's write set in
replica order (bookies that recently failed to answer last), digests checked, and never
beyond the range planned on the driver, which ends at the ledger's LAC (or last entry).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from zbk import limits
from zbk.client.sync import BookKeeper
from zbk.metadata.ledger import LedgerMetadata
from zbk.spark.options import ReadOptions
from zbk.spark.plan import LedgerRange
from zbk.spark.schema import record_batch


def read_range(opts: ReadOptions, schema: pa.Schema, part: LedgerRange) -> Iterator[pa.RecordBatch]:
    want_bookies = "bookies" in schema.names
    with BookKeeper(opts.metadata) as bk:
        rh = bk.open_ledger(part.ledger_id, password=opts.password, recovery=False)
        md = rh.metadata
        first = part.first
        payloads: list[bytes] = []
        for e in rh.read(part.first, part.last):
            assert e.entry_id == first + len(payloads), (part, e.entry_id)
            payloads.append(e.payload)
            if len(payloads) >= limits.spark_batch_rows_max:
                yield _batch(schema, part, first, payloads, md, want_bookies)
                first += len(payloads)
                payloads = []
        if payloads:
            yield _batch(schema, part, first, payloads, md, want_bookies)
            first += len(payloads)
        assert first == part.last + 1, (part, first)


def _batch(schema: pa.Schema, part: LedgerRange, first: int, payloads: list[bytes], md: LedgerMetadata,
           want_bookies: bool) -> pa.RecordBatch:
    bookies = None
    if want_bookies:
        bookies = [md.fragment_for(first + i)[1] for i in range(len(payloads))]
    return record_batch(schema, part.ledger_id, first, payloads, part.closed, bookies)
