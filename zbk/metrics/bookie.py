"""Bookie metrics (API.md "Metrics"). Labels are bounded: op and status names and journal
indexes only, never ledger ids or connections."""

from __future__ import annotations

from functools import cache
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from zbk.limits import LATENCY_BUCKETS

GROUP_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)

ADD_ENTRY_SECONDS = Histogram(
    "zbk_bookie_add_entry_seconds", "Time from receiving an add request to replying (one request may carry many entries)",
    ["status"], buckets=LATENCY_BUCKETS)
READ_ENTRY_SECONDS = Histogram(
    "zbk_bookie_read_entry_seconds", "Time from receiving a read request to replying", ["status"],
    buckets=LATENCY_BUCKETS)
REQUESTS_TOTAL = Counter("zbk_bookie_requests_total", "Requests answered, by operation and status", ["op", "status"])
ENTRIES_ADDED_TOTAL = Counter("zbk_bookie_entries_added_total", "Entries acknowledged by this bookie")
BAD_FRAMES_TOTAL = Counter("zbk_bookie_bad_frames_total", "Frames that could not be decoded", ["action"])
# Label journal: the journal's index in journal_dirs ("0" with one journal directory).
JOURNAL_FSYNC_SECONDS = Histogram("zbk_journal_fsync_seconds", "Journal group commit: write + fsync time",
                                  ["journal"], buckets=LATENCY_BUCKETS)
JOURNAL_GROUP_COMMIT_ENTRIES = Histogram("zbk_journal_group_commit_entries", "Entries made durable per journal fsync",
                                         ["journal"], buckets=GROUP_BUCKETS)
JOURNAL_QUEUE_DEPTH = Gauge("zbk_journal_queue_depth", "Batches waiting for the next journal commit", ["journal"])
ENTRYLOG_BYTES_WRITTEN = Counter("zbk_entrylog_bytes_written_total", "Bytes appended to entry logs")
LEDGERS = Gauge("zbk_bookie_ledgers", "Ledgers this bookie holds")
LIMBO_LEDGERS = Gauge("zbk_bookie_limbo_ledgers", "Ledgers in limbo (BP-46) on this bookie")
WRITABLE = Gauge("zbk_bookie_writable", "1 if the bookie accepts adds, 0 if read-only")
DISK_USAGE_RATIO = Gauge("zbk_bookie_disk_usage_ratio", "Used / total bytes of the fullest ledger or journal disk")
CHECKPOINTS_TOTAL = Counter("zbk_bookie_checkpoints_total", "Checkpoints completed (logs and index flushed, mark persisted)")
GC_RECLAIMED_BYTES = Counter("zbk_gc_reclaimed_bytes_total", "Bytes of entry logs reclaimed by garbage collection")
GC_COMPACTIONS = Counter("zbk_gc_compactions_total", "Entry log compactions", ["kind"])
GC_OVERREPLICATED_LEDGERS = Counter("zbk_gc_overreplicated_ledgers_total",
                                    "Local copies of ledgers that no fragment names any more, deleted by GC")
ADDS_HELD = Gauge("zbk_bookie_adds_held",
                  "Add requests held while the index's dirty pages are over their bound (IndexPressure)")

for _kind in ("minor", "major"):  # exported at 0 from the start, so rate() works before a first compaction
    GC_COMPACTIONS.labels(_kind)


@cache
def add_outcome(status: Any) -> tuple[Any, Any]:
    """(zbk_bookie_add_entry_seconds, zbk_bookie_requests_total{op="add"}) children for a
    status (zbk.wire.status.Status): ``labels()`` takes a lock and checks its arguments on
    every call, and the add path answers thousands of requests a second."""
    return ADD_ENTRY_SECONDS.labels(status.name), REQUESTS_TOTAL.labels("add", status.name)
