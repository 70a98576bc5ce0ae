"""The history recorder: every line is on disk as soon as it is recorded, threads never
interleave or lose lines, futures complete their appends, and the file format reads back
exactly as written."""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import json
import threading
from pathlib import Path

import pytest

from .history import Event, History, HistoryRecorder, Seen, digest


def test_each_line_is_flushed_as_it_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    rec = HistoryRecorder(path)
    op = rec.invoke("w", "append", ledger=3, entry=0, payload=b"abc")
    # Not closed: a workload killed now leaves this line behind.
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0]) == {"type": "invoke", "op": 0, "process": "w", "kind": "append",
                                    "time": json.loads(lines[0])["time"], "ledger": 3, "entry": 0,
                                    "digest": digest(b"abc"), "len": 3}
    rec.ok(op, entry=0)
    assert len(path.read_text().splitlines()) == 2
    rec.close()


def test_a_history_is_never_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    HistoryRecorder(path).close()
    with pytest.raises(FileExistsError):
        HistoryRecorder(path)


def test_concurrent_threads_write_whole_lines_in_time_order(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    threads, per_thread = 8, 300
    with HistoryRecorder(path) as rec:
        def work(i: int) -> None:
            for k in range(per_thread):
                op = rec.invoke(f"p{i}", "append", ledger=i, entry=k, payload=f"{i}/{k}".encode())
                if k % 3:
                    rec.ok(op, entry=k)
                else:
                    rec.info(op, TimeoutError())

        ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert rec.pending == 0
    events = History.load([path]).events
    assert len(events) == 2 * threads * per_thread
    assert sorted({e.op for e in events}) == list(range(threads * per_thread))
    times = [e.time for e in events]
    assert times == sorted(times)
    for i in range(threads):
        mine = [e for e in events if e.process == f"p{i}" and e.type == "invoke"]
        assert [e.entry for e in mine] == list(range(per_thread))  # each thread's order kept
        assert all(e.digest == digest(f"{i}/{e.entry}".encode()) for e in mine)


def test_an_append_future_completes_its_operation() -> None:
    """asyncio and concurrent futures alike: ok with the id, info on any error or cancel."""
    buf = io.StringIO()
    rec = HistoryRecorder(buf)
    cf: concurrent.futures.Future[int] = concurrent.futures.Future()
    rec.watch_append(rec.invoke("w", "append", ledger=1, entry=0, payload=b"a"), cf)
    cf.set_result(0)
    cf2: concurrent.futures.Future[int] = concurrent.futures.Future()
    rec.watch_append(rec.invoke("w", "append", ledger=1, entry=1, payload=b"b"), cf2)
    cf2.set_exception(ConnectionError("reset"))

    async def futures() -> None:
        loop = asyncio.get_running_loop()
        f1, f2 = loop.create_future(), loop.create_future()
        rec.watch_append(rec.invoke("w", "append", ledger=1, entry=2, payload=b"c"), f1)
        rec.watch_append(rec.invoke("w", "append", ledger=1, entry=3, payload=b"d"), f2)
        f1.set_result(2)
        f2.cancel()
        await asyncio.sleep(0)  # done callbacks run on the next turn of the loop

    asyncio.run(futures())
    done = [json.loads(x) for x in buf.getvalue().splitlines() if '"invoke"' not in x]
    assert [(d["type"], d.get("entry"), d.get("error")) for d in done] == [
        ("ok", 0, None), ("info", None, "ConnectionError: reset"), ("ok", 2, None), ("info", None, "cancelled")]


def test_completions_after_close_are_counted_not_written(tmp_path: Path) -> None:
    rec = HistoryRecorder(tmp_path / "h.jsonl")
    op = rec.invoke("w", "close", ledger=1)
    rec.close()
    rec.ok(op, last=4)
    assert rec.dropped == 1
    assert [e.type for e in History.load([tmp_path / "h.jsonl"]).events] == ["invoke"]


def test_a_create_learns_its_ledger_on_ok(tmp_path: Path) -> None:
    with HistoryRecorder(tmp_path / "h.jsonl") as rec:
        op = rec.invoke("w", "create")
        rec.ok(op, ledger=12)
    inv, ok = History.load([tmp_path / "h.jsonl"]).events
    assert (inv.ledger, ok.ledger) == (None, 12)


def test_every_field_reads_back_as_written(tmp_path: Path) -> None:
    with HistoryRecorder(tmp_path / "h.jsonl", clock=lambda: 7.5) as rec:
        op = rec.invoke("r", "tail", ledger=2, first=4, view="r/0")
        rec.info(op, "ZbkTimeoutError: no answer", entries=[(4, b"x"), (5, b"yy")])
        op = rec.invoke("r", "open", ledger=2)
        rec.ok(op, last=9, closed=True)
    events = History.load([tmp_path / "h.jsonl"]).events
    assert events[1] == Event("info", 0, "r", "tail", 7.5, ledger=2, error="ZbkTimeoutError: no answer",
                              entries=(Seen(4, digest(b"x"), 1), Seen(5, digest(b"yy"), 2)))
    assert events[3] == Event("ok", 1, "r", "open", 7.5, ledger=2, last=9, closed=True)
    assert events[0].to_json() == {
        "type": "invoke", "op": 0, "process": "r", "kind": "tail", "time": 7.5, "ledger": 2, "first": 4, "view": "r/0"}


def test_a_recorder_of_nothing_takes_every_call() -> None:
    """A workload records unconditionally; without a history it passes None."""
    rec = HistoryRecorder(None)
    op = rec.invoke("w", "append", ledger=1, entry=0, payload=b"a")
    rec.ok(op, entry=0)
    rec.ok(op, entry=0)  # not even a second completion is noticed: nothing is kept
    rec.close()
    assert (rec.pending, rec.dropped) == (0, 0)
