"""zbk against NATS JetStream, same durability, same workload, same machine, one run.

Starts a 3-node NATS JetStream cluster (file storage, ``sync_interval: always``, streams
of 3 replicas) and a 3-bookie zbk cluster (embedded sqlite metadata, journal fsynced) on
127.0.0.1, then drives the same workload at each in alternation, zbk then NATS, for
``--rounds`` rounds:

* throughput: ``--throughput-window`` (1,000) appends in flight, 1 KiB payloads;
* latency: ``--latency-window`` (1) append in flight (each waits for the previous one).

zbk writes ledgers of E3 WQ3 AQ2 (every bookie stores every entry; an append is confirmed
once two bookies have fsynced it), NATS a stream of R3 (a publish is acknowledged once a
quorum of two replicas has stored it, every store fsynced): the same durability. The zbk
load is `zbk bench`'s own code (zbk.cli.bench._bench); the NATS load is the same loop
around nats-py's ``publish_async``, connected to the stream leader's server (NATS's best
case: no extra hop). Both run on the event loop zbk's own programs choose
(zbk/eventloop.py: uvloop; ``ZBK_EVENT_LOOP=asyncio`` runs both on asyncio's loop). Each
measurement runs in a fresh client process after a short warm-up on the same ledger/stream
client. Every figure is the median of the rounds with min-max;
the ratios are zbk/NATS of the medians, and the throughput and CPU ratios are also given
round by round. CPU per entry is the servers' (or the client's) CPU over the whole worker
run, start-up and warm-up included, divided by the measured entries: an upper bound.
Prints a table and one JSON line, optionally
plots latency percentiles, and stops every process it started by PID (also on Ctrl-C).

``--floor`` adds a third run at each window in every round: zbk's floor, the same three
bookies written by the least a client can do (``floor_worker``: a synchronous loop of plain
DEALER sockets, no client library, no event loop). At window 1 it sends each entry to the
three bookies, waits for two EOK answers, and sends the next; at the throughput window it
sends the entries in the requests the library would (500 entries, two unconfirmed at once);
late answers are read and dropped. Whatever the real client costs comes on top of it, so
the floor's p50 is a lower bound for zbk's window-1 p50 on these bookies, printed against
the 0.7 x NATS target, and its throughput what these bookies give a client that costs next
to nothing, printed against NATS's.

    .venv/bin/python bench/peers.py --rounds 3 --seconds 8 --plot docs/img/peers_latency.png
    .venv/bin/python bench/peers.py --rounds 3 --seconds 8 --floor
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _procs import (  # noqa: E402
    NatsCluster,
    RawLedger,
    ZbkCluster,
    cpu_seconds,
    git_rev,
    install_signal_handlers,
    loadavg,
    median_range,
    pct,
    rss_bytes,
    run_json,
    set_gc_threshold,
)

from zbk import eventloop  # noqa: E402

SYSTEMS = ("zbk", "nats")
FLOOR = "zbk-floor"  # --floor: the same bookies without the client library (floor_worker)


# -- workers (each in its own process) ---------------------------------------------------------
def latency_report(lat: list[float], elapsed: float, size: int) -> dict[str, Any]:
    """The fields a worker reports for ``lat`` (one latency in seconds per confirmed append,
    sorted here) over ``elapsed`` seconds, as `zbk bench` reports them."""
    lat.sort()
    n = len(lat)
    return {"entries": n, "entry_size": size, "seconds": round(elapsed, 3), "entries_per_s": round(n / elapsed, 1),
            "mb_per_s": round(n * size / elapsed / 1e6, 2),
            "p50_ms": round(pct(lat, 0.50) * 1000, 3), "p95_ms": round(pct(lat, 0.95) * 1000, 3),
            "p99_ms": round(pct(lat, 0.99) * 1000, 3), "max_ms": round(lat[-1] * 1000, 3) if lat else 0.0}


def zbk_worker(args: argparse.Namespace) -> dict[str, Any]:
    from zbk.cli.bench import _bench

    def ns(seconds: float) -> argparse.Namespace:
        return argparse.Namespace(metadata=args.metadata, ensemble=3, write_quorum=3, ack_quorum=2,
                                  entry_size=args.size, entries=None, seconds=seconds, window=args.window,
                                  digest="crc32c", json=True, keep=False)

    if args.warmup > 0:
        eventloop.run(_bench(ns(args.warmup)))
    return eventloop.run(_bench(ns(args.seconds)))


def floor_worker(args: argparse.Namespace) -> dict[str, Any]:
    """E3 WQ3 AQ2 to the three bookies (``--servers``, their ids) through the raw protocol with
    nothing else in the client, on a ledger without metadata (RawLedger); every entry is built
    (header, digest) in the loop, as the client library builds it. At window 1 each entry
    goes alone and the next is sent after two EOK answers. At a larger window the entries go
    as the client library batches them at that window: requests of up to
    ``add_request_entries_max`` (500) entries, ``window`` // that many unconfirmed at once,
    each confirmed (every entry of it) by two EOK answers; late answers are read and
    dropped. What the library adds (an asyncio future and a pending entry per append, the
    event loop, acks per entry) is what the floor leaves out."""
    import collections

    import zmq

    from zbk import limits
    from zbk.client.raw import BookieConnection
    from zbk.wire.codec import decode_response

    ack_quorum = 2
    bookies = args.servers.split(",")
    ledger = RawLedger(b"zbk-floor")
    payload = os.urandom(args.size)
    ctx = zmq.Context()
    conns = [BookieConnection(b, ctx=ctx) for b in bookies]
    poller = zmq.Poller()
    for c in conns:
        poller.register(c.sock, zmq.POLLIN)
    events_opt, pollin = int(zmq.EVENTS), int(zmq.POLLIN)
    per_request = min(args.window, limits.client_add_request_entries_default)
    depth = max(1, args.window // per_request)
    state = {"eid": 0, "lac": -1}  # carried from the warm-up to the measured run
    # Request rid carries entries (rid - 1) * per_request onwards.
    inflight: dict[int, list[Any]] = {}  # rid -> [started, acks]
    order: collections.deque[int] = collections.deque()  # rids unconfirmed, oldest first

    def send_request() -> None:
        first = state["eid"]
        rid = first // per_request + 1
        state["eid"] += per_request
        started = time.perf_counter()
        frames = ledger.add_batch_frames(rid, first, per_request, state["lac"], payload)
        for c in conns:
            c.send_frames(frames)
        inflight[rid] = [started, 0]
        order.append(rid)

    def take_answers(lat: list[float]) -> None:
        events = poller.poll(10_000)
        if not events:
            raise RuntimeError(f"{len(inflight)} requests unconfirmed, no answer within 10 s")
        for sock, _ in events:
            while int(sock.get(events_opt)) & pollin:
                r = decode_response(sock.recv_multipart())
                req = inflight.get(r.rid)
                if req is None:  # the third bookie's answer to a confirmed request
                    continue
                if r.status != 0:
                    raise RuntimeError(f"request {r.rid}: status {r.status}")
                req[1] += 1
        # Entries confirm in order, as the library confirms them: a request once it and
        # every earlier one have two answers.
        now = time.perf_counter()
        while order and inflight[order[0]][1] >= ack_quorum:
            rid = order.popleft()
            started, _ = inflight.pop(rid)
            lat.extend([now - started] * per_request)
            state["lac"] = rid * per_request - 1

    def run(seconds: float) -> dict[str, Any]:
        lat: list[float] = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            while len(inflight) < depth:
                send_request()
            take_answers(lat)
        while inflight:
            take_answers(lat)
        return {**latency_report(lat, time.perf_counter() - t0, args.size),
                "ensemble": len(bookies), "write_quorum": len(bookies), "ack_quorum": ack_quorum,
                "window": args.window, "entries_per_request": per_request, "ledger_id": ledger.ledger_id,
                "last_confirmed": state["lac"]}

    try:
        if args.warmup > 0:
            run(args.warmup)
        return run(args.seconds)
    finally:
        for c in conns:
            c.close()
        ctx.term()


async def _nats_bench(args: argparse.Namespace) -> dict[str, Any]:
    """`zbk bench`'s loop (zbk/cli/bench.py) around JetStream publish_async."""
    import nats
    from nats.js.api import StorageType, StreamConfig

    from zbk.cli.bench import Window

    servers = dict(s.split("=", 1) for s in args.servers.split(","))
    name = f"BENCH{os.getpid()}"
    subject = f"bench.{os.getpid()}"
    admin = await nats.connect(servers=list(servers.values()), connect_timeout=5)
    try:
        ajs = admin.jetstream(timeout=30)
        await ajs.add_stream(StreamConfig(name=name, subjects=[subject], num_replicas=3,
                                          storage=StorageType.FILE))
        leader = None
        deadline = time.monotonic() + 30
        while leader is None:
            info = await ajs.stream_info(name)
            leader = info.cluster.leader if info.cluster else None
            if leader is None:
                if time.monotonic() > deadline:
                    raise RuntimeError("no stream leader elected")
                await asyncio.sleep(0.1)
        nc = await nats.connect(servers=[servers[leader]], connect_timeout=5, pending_size=64 * 1024 * 1024)
        try:
            js = nc.jetstream(timeout=30, publish_async_max_pending=max(args.window, 1) + 1)
            payload = os.urandom(args.size)

            async def run(seconds: float) -> dict[str, Any]:
                window = Window(args.window)  # the window zbk bench keeps, the same way
                record = window.lat.append
                errors = 0

                def finished(start: float, fut: asyncio.Future[Any]) -> None:
                    nonlocal errors
                    window.release()
                    if not fut.cancelled() and fut.exception() is None:
                        record(time.perf_counter() - start)
                    else:
                        errors += 1

                t0 = time.perf_counter()
                while time.perf_counter() - t0 < seconds:
                    if window.free <= 0:
                        await window.wait()
                    window.free -= 1
                    started = time.perf_counter()
                    fut = await js.publish_async(subject, payload)
                    fut.add_done_callback(functools.partial(finished, started))
                await window.wait(args.window)
                elapsed = time.perf_counter() - t0
                if errors:
                    raise RuntimeError(f"{errors} publishes failed")
                return {**latency_report(list(window.lat), elapsed, args.size), "replicas": 3, "window": args.window,
                        "stream_leader": leader}

            if args.warmup > 0:
                await run(args.warmup)
            report = await run(args.seconds)
            info = await js.stream_info(name)
            report["stream_messages"] = info.state.messages
        finally:
            await nc.close()
        await ajs.delete_stream(name)
    finally:
        await admin.close()
    return report


def worker_main(args: argparse.Namespace) -> int:
    if args.gc_threshold:
        set_gc_threshold(args.gc_threshold)
    cpu0 = time.process_time()
    if args.worker == "zbk":
        report = zbk_worker(args)
    elif args.worker == FLOOR:
        report = floor_worker(args)
    else:
        report = eventloop.run(_nats_bench(args))
    # Warm-up and setup included: an upper bound on the client's own CPU share.
    report["client_cpu_s"] = round(time.process_time() - cpu0, 2)
    print(json.dumps(report))
    return 0


# -- the orchestrator --------------------------------------------------------------------------
def measure(system: str, window: int, args: argparse.Namespace, zbk: ZbkCluster, nats: NatsCluster) -> dict[str, Any]:
    argv = [sys.executable, os.path.abspath(__file__), "--worker", system, "--window", str(window),
            "--seconds", str(args.seconds), "--warmup", str(args.warmup), "--size", str(args.size)]
    if args.gc_threshold:
        argv += ["--gc-threshold", args.gc_threshold]
    if system == "zbk":
        argv += ["--metadata", zbk.metadata]
        if args.profile_client:
            spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
            out = f"{args.profile_client}-w{window}-{int(time.time())}.txt"
            argv = [spy, "record", "--format", "raw", "--threads", "--rate", "200", "-o", out, "--", *argv]
    elif system == FLOOR:
        argv += ["--servers", ",".join(b.bookie_id for b in zbk.bookies)]
    else:
        argv += ["--servers", ",".join(f"{nd.name}={nd.url}" for nd in nats.nodes)]
    on_zbk = system in ("zbk", FLOOR)
    load_before = loadavg()
    before = [b.sums() for b in zbk.bookies] if on_zbk else []
    servers = [b.pid for b in zbk.bookies] if on_zbk else [nd.pid for nd in nats.nodes]
    cpu0 = sum(cpu_seconds(p) for p in servers)
    t0 = time.perf_counter()
    r = run_json(argv, timeout_s=args.seconds + 2 * args.warmup + 120)
    wall = time.perf_counter() - t0
    r["load_before"], r["load_after"] = load_before, loadavg()
    # CPU of the three servers over the whole worker run (setup and warm-up included), as
    # cores busy and as microseconds per measured entry (an upper bound).
    server_cpu = sum(cpu_seconds(p) for p in servers) - cpu0
    r["server_cores"] = round(server_cpu / wall, 2)
    r["client_cores"] = round(r["client_cpu_s"] / wall, 2)
    if r.get("entries"):
        r["server_cpu_us_per_entry"] = round(server_cpu / r["entries"] * 1e6, 1)
        r["client_cpu_us_per_entry"] = round(r["client_cpu_s"] / r["entries"] * 1e6, 1)
    r["worker_wall_s"] = round(wall, 2)
    if on_zbk:
        # Where an append's time goes inside the bookies (warm-up included): the bookie-side
        # add latency (request in -> response out) and the journal fsync, means over the run.
        d: dict[str, float] = {}
        for b, s0 in zip(zbk.bookies, before, strict=True):
            for k, v in b.sums().items():
                d[k] = d.get(k, 0.0) + v - s0[k]

        def mean(name: str, scale: float = 1.0) -> float:
            return round(d[f"{name}_sum"] / d[f"{name}_count"] * scale, 3) if d[f"{name}_count"] else 0.0

        r["bookie_add_mean_ms"] = mean("zbk_bookie_add_entry_seconds", 1000)
        r["bookie_fsync_mean_ms"] = mean("zbk_journal_fsync_seconds", 1000)
        r["bookie_entries_per_fsync"] = mean("zbk_journal_group_commit_entries")
    return r


def summarize(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    def figure(system: str, window: int, key: str) -> dict[str, float] | None:
        vals = [r[key] for r in runs if r["system"] == system and r["window"] == window and key in r]
        return median_range(vals) if vals else None

    tw, lw = args.throughput_window, args.latency_window
    out: dict[str, Any] = {}
    for s in SYSTEMS:
        out[s] = {f"entries_per_s_w{tw}": figure(s, tw, "entries_per_s"),
                  f"p50_ms_w{tw}": figure(s, tw, "p50_ms"), f"p99_ms_w{tw}": figure(s, tw, "p99_ms"),
                  f"entries_per_s_w{lw}": figure(s, lw, "entries_per_s"),
                  f"p50_ms_w{lw}": figure(s, lw, "p50_ms"), f"p95_ms_w{lw}": figure(s, lw, "p95_ms"),
                  f"p99_ms_w{lw}": figure(s, lw, "p99_ms"), f"max_ms_w{lw}": figure(s, lw, "max_ms")}
        for w in (tw, lw):
            for k in ("server_cores", "client_cores", "server_cpu_us_per_entry", "client_cpu_us_per_entry"):
                out[s][f"{k}_w{w}"] = figure(s, w, k)
        if s == "zbk":
            for w in (tw, lw):
                for k in ("bookie_add_mean_ms", "bookie_fsync_mean_ms", "bookie_entries_per_fsync"):
                    out[s][f"{k}_w{w}"] = figure(s, w, k)
    z, n = out["zbk"], out["nats"]
    thr = z[f"entries_per_s_w{tw}"]["median"] / n[f"entries_per_s_w{tw}"]["median"]
    p50 = z[f"p50_ms_w{lw}"]["median"] / n[f"p50_ms_w{lw}"]["median"]
    p99 = z[f"p99_ms_w{lw}"]["median"] / n[f"p99_ms_w{lw}"]["median"]
    cpu = z[f"server_cpu_us_per_entry_w{tw}"]["median"] / n[f"server_cpu_us_per_entry_w{tw}"]["median"]
    out["ratios"] = {f"throughput_w{tw}": round(thr, 3), f"p50_w{lw}": round(p50, 3), f"p99_w{lw}": round(p99, 3),
                     f"server_cpu_per_entry_w{tw}": round(cpu, 3)}
    # The same ratios round by round (zbk and NATS ran back to back in each round), for the
    # targets that speak of rounds.
    rounds = sorted({r["round"] for r in runs})

    def at_tw(system: str, k: int) -> dict[str, Any] | None:
        """``system``'s run of round ``k`` at the throughput window."""
        return next((r for r in runs if r["system"] == system and r["window"] == tw and r["round"] == k), None)

    per_round: dict[str, list[float]] = {"throughput": [], "server_cpu_per_entry": []}
    for k in rounds:
        zr, nr = at_tw("zbk", k), at_tw("nats", k)
        if zr and nr:
            per_round["throughput"].append(round(zr["entries_per_s"] / nr["entries_per_s"], 3))
            per_round["server_cpu_per_entry"].append(
                round(zr["server_cpu_us_per_entry"] / nr["server_cpu_us_per_entry"], 3))
    out["round_ratios"] = per_round
    thr_rounds = per_round["throughput"]
    out["targets"] = {f"throughput_w{tw} >= 2.0": thr >= 2.0, f"p50_w{lw} <= 0.7": p50 <= 0.7,
                      f"p99_w{lw} <= 1.0": p99 <= 1.0,
                      f"throughput_w{tw}: median of the rounds' ratios >= 2.5, none < 2.0":
                          bool(thr_rounds) and statistics.median(thr_rounds) >= 2.5 and min(thr_rounds) >= 2.0,
                      f"server_cpu_per_entry_w{tw} <= 0.5": cpu <= 0.5}
    if any(r["system"] == FLOOR and r["window"] == lw for r in runs):
        f = out[FLOOR] = {k: figure(FLOOR, lw, k) for k in ("entries_per_s", "p50_ms", "p95_ms", "p99_ms", "max_ms",
                                                             "server_cores", "client_cores", "bookie_add_mean_ms",
                                                             "bookie_fsync_mean_ms")}
        out["ratios"][f"floor_p50_w{lw}"] = round(f["p50_ms"]["median"] / n[f"p50_ms_w{lw}"]["median"], 3)
        out["ratios"][f"floor_p99_w{lw}"] = round(f["p99_ms"]["median"] / n[f"p99_ms_w{lw}"]["median"], 3)
    if any(r["system"] == FLOOR and r["window"] == tw for r in runs):
        # The floor's throughput against NATS's, round by round as the target is judged: what
        # the same bookies give a client that costs next to nothing.
        ft = out[f"{FLOOR}_w{tw}"] = {k: figure(FLOOR, tw, k) for k in (
            "entries_per_s", "p50_ms", "p99_ms", "server_cpu_us_per_entry", "client_cpu_us_per_entry")}
        out["ratios"][f"floor_throughput_w{tw}"] = round(
            ft["entries_per_s"]["median"] / n[f"entries_per_s_w{tw}"]["median"], 3)
        for k in rounds:
            fr, nr = at_tw(FLOOR, k), at_tw("nats", k)
            if fr and nr:
                per_round.setdefault("floor_throughput", []).append(round(fr["entries_per_s"] / nr["entries_per_s"], 3))
    return out


def fmt(f: dict[str, float], digits: int = 1) -> str:
    return f"{f['median']:,.{digits}f} ({f['min']:,.{digits}f}-{f['max']:,.{digits}f})"


def print_table(summary: dict[str, Any], args: argparse.Namespace) -> None:
    tw, lw = args.throughput_window, args.latency_window
    rows = [(f"entries/s, window {tw}", f"entries_per_s_w{tw}", 0), (f"p50 ms, window {tw}", f"p50_ms_w{tw}", 1),
            (f"p99 ms, window {tw}", f"p99_ms_w{tw}", 1), (f"entries/s, window {lw}", f"entries_per_s_w{lw}", 0),
            (f"p50 ms, window {lw}", f"p50_ms_w{lw}", 2), (f"p99 ms, window {lw}", f"p99_ms_w{lw}", 2),
            (f"servers' CPU us/entry, w {tw}", f"server_cpu_us_per_entry_w{tw}", 1),
            (f"client CPU us/entry, w {tw}", f"client_cpu_us_per_entry_w{tw}", 1)]
    print(f"\n{args.size} B entries; zbk E3 WQ3 AQ2 vs NATS JetStream R3 file sync=always; "
          f"median (min-max) of {args.rounds} rounds; load generators on {eventloop.chosen_name()}")
    print(f"{'':24} {'zbk':>28} {'NATS':>28}")
    for label, key, d in rows:
        print(f"{label:24} {fmt(summary['zbk'][key], d):>28} {fmt(summary['nats'][key], d):>28}")
    r = summary["ratios"]
    print(f"zbk/NATS: throughput x{r[f'throughput_w{tw}']:.2f} (target >= 2.0), p50 x{r[f'p50_w{lw}']:.2f} "
          f"(target <= 0.7), p99 x{r[f'p99_w{lw}']:.2f} (target <= 1.0), servers' CPU per entry "
          f"x{r[f'server_cpu_per_entry_w{tw}']:.2f} (target <= 0.5)")
    rr = summary.get("round_ratios", {})
    if rr.get("throughput"):
        t = rr["throughput"]
        print(f"  by round: throughput {', '.join(f'x{x:.2f}' for x in t)} (median x{statistics.median(t):.2f}, "
              f"target >= 2.5 with none below 2.0); servers' CPU per entry "
              f"{', '.join(f'x{x:.2f}' for x in rr['server_cpu_per_entry'])}")
    ft = summary.get(f"{FLOOR}_w{tw}")
    if ft:
        print(f"zbk floor (no client library), window {tw}: {fmt(ft['entries_per_s'], 0)} entries/s, "
              f"p50 {fmt(ft['p50_ms'], 1)} ms, p99 {fmt(ft['p99_ms'], 1)} ms; CPU us/entry: servers "
              f"{fmt(ft['server_cpu_us_per_entry'], 1)}, client {fmt(ft['client_cpu_us_per_entry'], 1)}")
        print(f"  floor/NATS: throughput x{r[f'floor_throughput_w{tw}']:.2f}, by round "
              f"{', '.join(f'x{x:.2f}' for x in rr.get('floor_throughput', []))}")
    f = summary.get(FLOOR)
    if f:
        target = 0.7 * summary["nats"][f"p50_ms_w{lw}"]["median"]
        print(f"zbk floor (no client library), window {lw}: {fmt(f['entries_per_s'], 0)} entries/s, "
              f"p50 {fmt(f['p50_ms'], 2)} ms, p99 {fmt(f['p99_ms'], 2)} ms; bookies' add {fmt(f['bookie_add_mean_ms'], 2)} ms, "
              f"fsync {fmt(f['bookie_fsync_mean_ms'], 2)} ms (means)")
        print(f"  floor/NATS: p50 x{r[f'floor_p50_w{lw}']:.2f}, p99 x{r[f'floor_p99_w{lw}']:.2f}; the p50 target "
              f"(0.7 x NATS) is {target:.2f} ms, the floor's p50 {f['p50_ms']['median']:.2f} ms")


def plot(summary: dict[str, Any], runs: list[dict[str, Any]], args: argparse.Namespace, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    keys = ["p50_ms", "p95_ms", "p99_ms", "max_ms"]
    colors = {"zbk": "tab:blue", "nats": "tab:orange", FLOOR: "tab:gray"}
    labels = {"zbk": "zbk E3 WQ3 AQ2", "nats": "NATS JetStream R3", FLOOR: "zbk floor (no client library)"}
    for ax, window in zip(axes[:2], (args.latency_window, args.throughput_window), strict=True):
        shown = [s for s in (*SYSTEMS, FLOOR) if any(r["system"] == s and r["window"] == window for r in runs)]
        width = 0.76 / len(shown)
        for i, s in enumerate(shown):
            mr = [median_range([r[k] for r in runs if r["system"] == s and r["window"] == window]) for k in keys]
            xs = [j + (i - (len(shown) - 1) / 2) * width for j in range(len(keys))]
            med = [m["median"] for m in mr]
            err = [[m["median"] - m["min"] for m in mr], [m["max"] - m["median"] for m in mr]]
            ax.bar(xs, med, width=width * 0.95, yerr=err, capsize=3, color=colors[s], label=labels[s])
        if window == args.latency_window and "nats" in shown:
            target = 0.7 * summary["nats"][f"p50_ms_w{window}"]["median"]
            ax.axhline(target, color="tab:red", linestyle="--", linewidth=1, label=f"p50 target {target:.2f} ms")
        ax.set_xticks(range(len(keys)), [k.removesuffix("_ms") for k in keys])
        ax.set_yscale("log")
        ax.set_ylabel("append latency, ms (log)")
        ax.set_title(f"latency, window {window}")
        ax.legend(fontsize=8)
    ax = axes[2]
    tw = args.throughput_window
    bars = [(s, summary[s][f"entries_per_s_w{tw}"]) for s in SYSTEMS]
    if f"{FLOOR}_w{tw}" in summary:
        bars.append((FLOOR, summary[f"{FLOOR}_w{tw}"]["entries_per_s"]))
    for i, (s, f) in enumerate(bars):
        ax.bar([i], [f["median"]], yerr=[[f["median"] - f["min"]], [f["max"] - f["median"]]], capsize=4,
               color=colors[s], width=0.6)
    ax.set_xticks(range(len(bars)), [{"zbk": "zbk", "nats": "NATS", FLOOR: "zbk floor"}[s] for s, _ in bars])
    ax.set_ylabel("entries/s")
    ax.set_title(f"throughput, window {tw}")
    fig.suptitle(f"{args.size} B entries, 3 replicas, fsync on; median and min-max of {args.rounds} rounds "
                 f"(bench/peers.py)", fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (at least 3 for the report)")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds of each run")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each run")
    ap.add_argument("--size", type=int, default=1024, help="payload bytes")
    ap.add_argument("--throughput-window", type=int, default=1000)
    ap.add_argument("--latency-window", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="zbk bookie config override")
    ap.add_argument("--nats-cpus", choices=["", "spread"], default="",
                    help="spread: each NATS server confined to one CPU, round-robin (to set against "
                         "zbk's --set actor_cpus=spread)")
    ap.add_argument("--gc-threshold", metavar="G0,G1,G2",
                    help="gc.set_threshold(G0, G1, G2) in every load generator (zbk's, the floor's and NATS's)")
    ap.add_argument("--floor", action="store_true",
                    help="also run zbk's floor at both windows: the same bookies, no client library")
    ap.add_argument("--plot", metavar="PNG", help="write a latency/throughput figure here")
    ap.add_argument("--json-out", metavar="FILE", help="also write the full report (every run) here")
    ap.add_argument("--max-seconds", type=float, default=900, help="bound on the whole run")
    ap.add_argument("--from-json", metavar="FILE", help="only print and plot a run saved with --json-out")
    ap.add_argument("--profile", metavar="FILE", help="run zbk bookie-0 under py-spy --gil (raw profile here)")
    ap.add_argument("--profile-client", metavar="PREFIX", help="run each zbk client under py-spy "
                    "(raw profile PREFIX-w<window>-<time>.txt)")
    # worker mode (internal)
    ap.add_argument("--worker", choices=(*SYSTEMS, FLOOR), help=argparse.SUPPRESS)
    ap.add_argument("--window", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--metadata", help=argparse.SUPPRESS)
    ap.add_argument("--servers", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker_main(args)
    if args.from_json:  # re-print and re-plot a saved run (--json-out) without running anything
        with open(args.from_json) as f:
            saved = json.load(f)
        for k in ("rounds", "seconds"):
            setattr(args, k, saved[k])
        args.size = saved["entry_size"]
        summary = summarize(saved["runs"], args)
        print_table(summary, args)
        if args.plot:
            plot(summary, saved["runs"], args, args.plot)
            print(f"plot: {args.plot}")
        return 0

    install_signal_handlers(args.max_seconds)
    settings = dict(s.split("=", 1) for s in args.set)
    started = time.time()
    runs: list[dict[str, Any]] = []
    nats = NatsCluster(3, spread_cpus=args.nats_cpus == "spread")
    zbk = ZbkCluster(3, settings=settings, profile=args.profile)
    try:
        nats.start()
        zbk.start()
        print(f"NATS {nats.urls}; zbk {[b.bookie_id for b in zbk.bookies]} ({zbk.metadata}); load {loadavg()}",
              flush=True)
        for rnd in range(args.rounds):
            for window in (args.throughput_window, args.latency_window):
                floor = (FLOOR,) if args.floor else ()
                for system in (*SYSTEMS, *floor):
                    r = measure(system, window, args, zbk, nats)
                    r.update(system=system, round=rnd)
                    runs.append(r)
                    extra = (f"  [bookie: add {r['bookie_add_mean_ms']:.2f} ms, fsync {r['bookie_fsync_mean_ms']:.2f} ms, "
                             f"{r['bookie_entries_per_fsync']:.0f} entries/fsync (means)]" if system != "nats" else "")
                    print(f"round {rnd + 1} {system:9} window {window:5}: {r['entries_per_s']:>9,.0f} entries/s  "
                          f"p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  max {r['max_ms']:7.2f} ms  "
                          f"cores: servers {r['server_cores']:.2f} client {r['client_cores']:.2f}  "
                          f"(load {r['load_before']}){extra}", flush=True)
        rss = {"zbk_bookies_mib": [round(rss_bytes(b.pid) / 2**20, 1) for b in zbk.bookies],
               "nats_servers_mib": [round(rss_bytes(nd.pid) / 2**20, 1) for nd in nats.nodes]}
    finally:
        zbk.stop()
        nats.stop()
    summary = summarize(runs, args)
    report = {"bench": "peers", "git": git_rev(), "rounds": args.rounds, "seconds": args.seconds,
              "entry_size": args.size, "event_loop": eventloop.chosen_name(), "zbk_settings": settings,
              "nats_cpus": args.nats_cpus, "load_end": loadavg(),
              "wall_s": round(time.time() - started, 1), "rss_end": rss, **summary}
    print_table(summary, args)
    if args.plot:
        plot(summary, runs, args, args.plot)
        print(f"plot: {args.plot}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({**report, "runs": runs}, f, indent=1)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
