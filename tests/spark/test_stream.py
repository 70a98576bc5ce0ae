"""Streaming reads on local Spark against real bookies: tailing, joining ledgers, and
exactly-once across a restart from the checkpoint."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from zbk.client.sync import BookKeeper, SyncLedgerHandle
from zbk.spark.options import read_options
from zbk.spark.schema import default_schema
from zbk.spark.stream import ZbkStreamReader

from .conftest import ZbkCluster
from .util import RestartingQuery, append_all, client_read, payload, wait_for

MAX_PER_TRIGGER = 700


def test_stream_tails_new_entries_and_restarts_from_checkpoint_without_duplicates(
        spark: Any, zbk_cluster: ZbkCluster, app: str, tmp_path: Path) -> None:
    uri = zbk_cluster.uri
    out, ckpt = tmp_path / "out", tmp_path / "checkpoint"
    written: dict[tuple[int, int], bytes] = {}  # everything ever appended to a matching ledger

    def append(lh: SyncLedgerHandle, n: int) -> None:
        first = lh.last_add_confirmed + 1
        batch = [payload(f"{app}-{lh.ledger_id}", first + i) for i in range(n)]
        append_all(lh, batch)
        written.update({(lh.ledger_id, first + i): p for i, p in enumerate(batch)})

    def start(**trigger: Any) -> Any:
        return (spark.readStream.format("zbk").option("metadata", uri).option("ledgers", f"meta:app={app}")
                .option("maxEntriesPerTrigger", str(MAX_PER_TRIGGER)).option("entries_per_partition", "500").load()
                .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt))
                .trigger(**trigger).start())

    def output() -> Any:
        return spark.read.schema("ledger_id long, entry_id long, payload binary").parquet(str(out))

    def output_count() -> int:
        return output().count() if (out / "_spark_metadata").exists() else 0

    with BookKeeper(uri) as bk:
        def visible() -> dict[tuple[int, int], bytes]:
            """What a plain reader sees now of the matching ledgers (up to each LAC)."""
            seen: dict[tuple[int, int], bytes] = {}
            for lid in {lid for lid, _ in written}:
                seen.update(client_read(bk, lid))
            return seen

        a = bk.create_ledger(3, 2, 2, custom_metadata={"app": app.encode()})
        b = bk.create_ledger(3, 3, 2, custom_metadata={"app": app.encode()})
        other = bk.create_ledger(3, 2, 2, custom_metadata={"app": b"someone-else"})
        append(a, 1000)
        append(b, 600)
        append_all(other, [b"not mine"] * 50)
        other.close()

        q = RestartingQuery(lambda: start(processingTime="200 milliseconds"))

        def caught_up(n: int) -> bool:
            q.check()
            return output_count() >= n

        try:
            first_view = visible()
            assert len(first_view) == 999 + 599  # each open ledger's last entry is not yet confirmed
            wait_for(lambda: caught_up(len(first_view)), 120, "the stream to catch up with 2 open ledgers")
            # Appended while the query runs: more entries on an open ledger, and a new matching
            # ledger that is written and closed (it joins, is read whole, and finishes).
            append(a, 800)
            c = bk.create_ledger(3, 2, 2, custom_metadata={"app": app.encode()})
            append(c, 400)
            c.close()
            second_view = visible()
            assert len(second_view) == 1799 + 599 + 400
            wait_for(lambda: caught_up(len(second_view)), 120, "the stream to see the new entries")
            sizes = [p["numInputRows"] for p in q.query.recentProgress]
            assert sizes and max(sizes) <= MAX_PER_TRIGGER
        finally:
            q.stop()

        # While the query is down: more entries, and both open ledgers close (their last
        # entries become readable). The restarted query resumes at its checkpointed offsets.
        append(b, 300)
        a.close()
        b.close()
        assert visible() == written

    q = RestartingQuery(lambda: start(availableNow=True))
    try:
        q.run_to_end(180)
    finally:
        q.stop()

    t = output().toArrow()
    keys = list(zip(t.column("ledger_id").to_pylist(), t.column("entry_id").to_pylist(), strict=True))
    assert len(keys) == len(set(keys)), "duplicate rows after the restart"
    assert dict(zip(keys, t.column("payload").to_pylist(), strict=True)) == written  # no gaps, no strangers


def test_stream_reader_offsets_follow_lacs_and_replays_are_identical(zbk_cluster: ZbkCluster, app: str) -> None:
    """The reader without the Spark engine: what latestOffset admits, what partitions
    plans for (start, end], and that a fresh reader (a restarted query) plans and reads
    the same range identically."""
    opts = read_options({"metadata": zbk_cluster.uri, "ledgers": f"meta:app={app}", "entries_per_partition": "25"})
    schema = default_schema()
    r = ZbkStreamReader(opts, schema)
    fresh = ZbkStreamReader(opts, schema)

    def read(reader: ZbkStreamReader, start: dict[str, int], end: dict[str, int]) -> list[tuple[int, int, bytes]]:
        rows = []
        for part in reader.partitions(start, end):
            for batch in reader.read(part):
                d = batch.to_pydict()
                rows += list(zip(d["ledger_id"], d["entry_id"], d["payload"], strict=True))
        return rows

    try:
        assert r.initialOffset() == {}
        with BookKeeper(zbk_cluster.uri) as bk:
            a = bk.create_ledger(3, 2, 2, custom_metadata={"app": app.encode()})
            append_all(a, [payload(app, i) for i in range(100)])  # LAC 98: entry 99 not yet confirmed
            la = str(a.ledger_id)
            first = r.latestOffset({}, ReadMaxRows(60))
            assert first == {la: 59}
            second = r.latestOffset(first, ReadAllAvailable())
            assert second == {la: 98}
            assert r.getDefaultReadLimit() == ReadAllAvailable()
            parts = r.partitions(first, second)
            assert [(p.first, p.last) for p in parts] == [(60, 84), (85, 98)]
            rows = read(r, first, second)
            assert rows == [(a.ledger_id, i, payload(app, i)) for i in range(60, 99)]
            # A restarted query: a new reader, nothing cached, the same logged offsets.
            restored = pickle.loads(pickle.dumps(fresh))
            assert restored.partitions(first, second) == parts and read(restored, first, second) == rows

            # A matching ledger appears (written and closed); the open one closes.
            b = bk.create_ledger(3, 3, 3, custom_metadata={"app": app.encode()})
            append_all(b, [payload(app, 1000 + i) for i in range(10)])
            b.close()
            a.close()
            lb = str(b.ledger_id)
            third = r.latestOffset(second, ReadAllAvailable())
            assert third == {la: 99, lb: 9}
            assert read(r, second, third) == [(a.ledger_id, 99, payload(app, 99))] + \
                [(b.ledger_id, i, payload(app, 1000 + i)) for i in range(10)]
            assert r.latestOffset(third, ReadMaxRows(5)) == third  # both finished: nothing new

            # AvailableNow: a ledger that appears after the query began is not waited for.
            r.prepareForTriggerAvailableNow()
            c = bk.create_ledger(3, 2, 2, custom_metadata={"app": app.encode()})
            c.append(b"late")
            c.close()
            assert r.latestOffset(third, ReadAllAvailable()) == third
            assert fresh.latestOffset(third, ReadAllAvailable()) == {**third, str(c.ledger_id): 0}
    finally:
        r.stop()
        fresh.stop()


def test_stream_reader_starting_offsets_latest(zbk_cluster: ZbkCluster, app: str) -> None:
    with BookKeeper(zbk_cluster.uri) as bk:
        old = bk.create_ledger(3, 2, 2, custom_metadata={"app": app.encode()})
        append_all(old, [b"old"] * 20)
        old.close()
        opts = read_options({"metadata": zbk_cluster.uri, "ledgers": f"meta:app={app}",
                             "starting_offsets": "latest", "maxEntriesPerTrigger": "7"})
        r = ZbkStreamReader(opts, default_schema())
        try:
            start = r.initialOffset()
            assert start == {str(old.ledger_id): 19}
            assert r.getDefaultReadLimit() == ReadMaxRows(7)
            new = bk.create_ledger(3, 2, 2, custom_metadata={"app": app.encode()})
            append_all(new, [b"new"] * 20)
            new.close()
            assert r.latestOffset(start, ReadMaxRows(7)) == {**start, str(new.ledger_id): 6}
        finally:
            r.stop()
