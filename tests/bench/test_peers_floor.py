"""bench/peers.py's floor writer (the same bookies without the client library): at the
throughput window it sends the entries in the requests the library would and confirms them
in order, against real bookies; and how its throughput is set against NATS's in the summary,
median and round by round."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import peers  # noqa: E402

from zbk.wire import messages as w  # noqa: E402
from zbk.wire.entry import parse_entry  # noqa: E402


def floor_args(servers: list[str], window: int) -> argparse.Namespace:
    return argparse.Namespace(servers=",".join(servers), window=window, size=100, warmup=0.2, seconds=1.0)


def test_floor_at_a_window_sends_the_library_s_requests_and_every_confirmed_entry_is_stored(
        bookies: Callable[..., Any]) -> None:
    started = [bookies(name=f"b{i}").start() for i in range(3)]
    ids = [b.bookie_id for b in started]
    r = peers.floor_worker(floor_args(ids, 1000))
    assert r["window"] == 1000 and r["entries_per_request"] == 500
    assert r["entries"] > 0 and r["entries"] % 500 == 0  # whole requests, each confirmed by two bookies
    # Warm-up and measured run write one ledger, entries 0 .. last_confirmed: its first and
    # last confirmed entries are each on at least two bookies, digest and LAC intact.
    digest = peers.RawLedger(b"zbk-floor").digest
    last = r["last_confirmed"]
    assert last + 1 >= r["entries"]
    for entry_id in (0, last):
        holders = 0
        for b in started:
            with b.connect() as c:
                resp = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=r["ledger_id"], first_entry_id=entry_id))
            if resp.status == 0:
                e = parse_entry(resp.entries[0], digest, ledger_id=r["ledger_id"], entry_id=entry_id)
                assert e.lac < entry_id and len(e.payload) == 100
                holders += 1
        assert holders >= 2, (entry_id, holders)


def test_floor_at_window_one_sends_each_entry_alone(bookies: Callable[..., Any]) -> None:
    ids = [bookies(name=f"b{i}").start().bookie_id for i in range(3)]
    r = peers.floor_worker(floor_args(ids, 1))
    assert r["window"] == 1 and r["entries_per_request"] == 1 and r["entries"] > 0


def run(system: str, window: int, rnd: int, rate: float) -> dict[str, Any]:
    return {"system": system, "window": window, "round": rnd, "entries_per_s": rate, "p50_ms": 1.0,
            "p95_ms": 2.0, "p99_ms": 3.0, "max_ms": 4.0, "server_cores": 1.0, "client_cores": 0.5,
            "server_cpu_us_per_entry": 20.0, "client_cpu_us_per_entry": 10.0, "bookie_add_mean_ms": 1.0,
            "bookie_fsync_mean_ms": 0.5, "bookie_entries_per_fsync": 1.0}


def test_summary_sets_the_floor_s_throughput_against_nats_by_median_and_by_round() -> None:
    runs = []
    for rnd, (z, n, f) in enumerate([(50_000, 20_000, 60_000), (45_000, 25_000, 70_000), (55_000, 22_000, 66_000)]):
        for system, rate in (("zbk", z), ("nats", n), (peers.FLOOR, f)):
            runs += [run(system, 1000, rnd, rate), run(system, 1, rnd, 700.0)]
    s = peers.summarize(runs, argparse.Namespace(throughput_window=1000, latency_window=1))
    assert s["ratios"]["floor_throughput_w1000"] == round(66_000 / 22_000, 3)
    assert s["round_ratios"]["floor_throughput"] == [3.0, 2.8, 3.0]
    assert s["round_ratios"]["throughput"] == [2.5, 1.8, 2.5]
    assert s[f"{peers.FLOOR}_w1000"]["client_cpu_us_per_entry"]["median"] == 10.0


def test_summary_without_a_floor_at_the_throughput_window_has_none() -> None:
    runs = [run(system, window, 0, 1000.0) for system in ("zbk", "nats") for window in (1000, 1)]
    s = peers.summarize(runs, argparse.Namespace(throughput_window=1000, latency_window=1))
    assert f"{peers.FLOOR}_w1000" not in s and "floor_throughput" not in s["round_ratios"]
