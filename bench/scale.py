"""How cost grows: zbk throughput, latency, memory and rates as the load scales.

Sections (``--only NAME``, repeatable; default all; each starts its own bookies on
127.0.0.1 with embedded sqlite metadata, journal fsynced, and stops them by PID):

``sizes``    3 bookies, ledgers of E3 WQ3 AQ2 driven by `zbk bench`'s own code
             (zbk.cli.bench._bench): throughput and p99 at window 1,000, p50/p99 at
             window 1, for entries of 100 B, 1 KiB and 64 KiB (sizes alternate each round).
``ledgers``  add throughput and p99 vs concurrently written ledgers (1, 100, 10,000):
             (a) through the client: 3 bookies, E3 WQ3 AQ2, 1,000 appends in flight in
                 total, round-robin over the N ledgers (one client process; the ledgers
                 are created once, then the N values alternate each round);
             (b) one bookie, raw protocol: pipelined ADD_ENTRY requests of ``--batch``
                 entries each, round-robin over the N ledgers, the same request shape for
                 every N, so what differs is only how many ledgers the bookie keeps hot.
``many``     one bookie: RSS and add latency (window 1, one entry per request) on an empty
             bookie, then while 100,000 ledgers are written (10 chunks of 10,000, one
             request per ledger), then after a checkpoint; latency to ledger 1 and to
             random ledgers among the 100,000.
``read``     one bookie, raw protocol: one ledger of ``--read-entries`` 1 KiB entries read
             back by ranged READ_ENTRY requests (4,096 entries each, a few in flight);
             also the client's ``read()`` of the same range (digest-checked).
``create``   3 bookies: ledger create + close rate (E3 WQ3 AQ2), one at a time and 16 at
             a time.

Every figure is the median of ``--rounds`` (min-max), next to the load average at the time.
Prints a table per section and one JSON line; ``--plots DIR`` writes PNG figures.

    .venv/bin/python bench/scale.py --only sizes --rounds 3 --plots docs/img
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import random
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _procs import (  # noqa: E402
    ZbkCluster,
    cpu_seconds,
    git_rev,
    install_signal_handlers,
    loadavg,
    median_range,
    pct,
    rss_bytes,
    run_json,
    wait_idle,
)

from zbk import eventloop  # noqa: E402

SECTIONS = ("sizes", "ledgers", "many", "read", "create")
SIZES = (100, 1024, 65536)
LEDGER_COUNTS = (1, 100, 10_000)
MANY_LEDGERS = 100_000
MANY_CHUNK = 10_000
PASSWORD = b"zbk-scale"


# ================================ workers (each in its own process) ============================
def w_bench(a: argparse.Namespace) -> dict[str, Any]:
    """`zbk bench` (zbk/cli/bench.py) on one ledger, after a short warm-up."""
    from zbk.cli.bench import _bench

    def ns(seconds: float) -> argparse.Namespace:
        return argparse.Namespace(metadata=a.metadata, ensemble=3, write_quorum=3, ack_quorum=2, entry_size=a.size,
                                  entries=None, seconds=seconds, window=a.window, digest="crc32c", json=True,
                                  keep=False)

    if a.warmup > 0:
        eventloop.run(_bench(ns(a.warmup)))
    return eventloop.run(_bench(ns(a.seconds)))


async def _multi(a: argparse.Namespace) -> dict[str, Any]:
    """`zbk bench`'s loop over many ledgers: ``window`` appends in flight in total, appended
    round-robin to N ledgers. Creates max(N) ledgers once, then runs every N in every round."""
    from zbk.client.bookkeeper import AsyncBookKeeper

    counts = [int(x) for x in a.counts.split(",")]
    payload = os.urandom(a.size)
    runs: list[dict[str, Any]] = []
    async with AsyncBookKeeper(a.metadata) as bk:
        t0 = time.perf_counter()
        handles: list[Any] = []
        sem = asyncio.Semaphore(32)

        async def create() -> None:
            async with sem:
                handles.append(await bk.create_ledger(3, 3, 2, password=PASSWORD))

        await asyncio.gather(*(create() for _ in range(max(counts))))
        create_s = time.perf_counter() - t0
        # One entry to every ledger first: a bookie learns of a ledger at its first add
        # (ledger state, master key journaled, index file at the next checkpoint); that is
        # creation cost, measured in the create and many sections, not here.
        t0 = time.perf_counter()
        touch = asyncio.Semaphore(100)

        async def first(h: Any) -> None:
            async with touch:
                await h.append(payload)

        await asyncio.gather(*(first(h) for h in handles))
        touch_s = time.perf_counter() - t0
        pids = [int(x) for x in a.pids.split(",")] if a.pids else []
        if a.gc_freeze:  # docs/contributors.md, "Many open ledgers": what an application can do
            gc.collect()
            gc.freeze()

        async def run(n: int, seconds: float) -> dict[str, Any]:
            lat: list[float] = []
            window = asyncio.Semaphore(a.window)
            done = 0
            hs = handles[:n]

            def finished(start: float, fut: asyncio.Future[int]) -> None:
                nonlocal done
                window.release()
                if fut.exception() is None:
                    lat.append(time.perf_counter() - start)
                    done += 1

            k = 0
            load = loadavg()
            cpu0, scpu0 = time.process_time(), sum(cpu_seconds(p) for p in pids)
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                await window.acquire()
                fut = hs[k % n].append(payload)
                k += 1
                fut.add_done_callback(functools.partial(finished, time.perf_counter()))
            for _ in range(a.window):
                await window.acquire()
            elapsed = time.perf_counter() - t0
            client_cores = (time.process_time() - cpu0) / elapsed
            bookie_cores = (sum(cpu_seconds(p) for p in pids) - scpu0) / elapsed
            lat.sort()
            return {"ledgers": n, "entries": done, "seconds": round(elapsed, 3),
                    "client_cores": round(client_cores, 2), "bookie_cores": round(bookie_cores, 2),
                    "entries_per_s": round(done / elapsed, 1), "p50_ms": round(pct(lat, 0.5) * 1000, 3),
                    "p99_ms": round(pct(lat, 0.99) * 1000, 3), "max_ms": round(lat[-1] * 1000, 3) if lat else 0.0,
                    "load": load}

        order = list(counts)
        loop = asyncio.get_running_loop()
        for rnd in range(a.rounds):
            for n in order:
                # Every run starts on idle bookies: the checkpoint of 10,000 ledgers' index
                # pages written by the run before is that run's cost, not this one's, and
                # the first run waits out the checkpoint that creates the new ledgers' index
                # files (tens of seconds for 10,000; measured in the many section).
                waited = await loop.run_in_executor(None, wait_idle, pids)
                if a.warmup > 0:
                    await run(n, a.warmup)
                print(json.dumps({"measuring": n}), file=sys.stderr, flush=True)  # bench/threads.py waits for it
                r = await run(n, a.seconds)
                r.update(round=rnd, settle_s=round(waited, 1))
                runs.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
            order.reverse()  # A B C C B A ...: no N always runs right after the same other one
    return {"runs": runs, "create_s": round(create_s, 2), "touch_s": round(touch_s, 2), "settle_s": runs[0]["settle_s"] if runs else None, "created": max(counts), "window": a.window,
            "entry_size": a.size}


def w_raw_add(a: argparse.Namespace) -> dict[str, Any]:
    """Pipelined raw ADD_ENTRY requests to one bookie: ``batch`` entries per request,
    ledgers ``first_lid .. first_lid + ledgers - 1`` round-robin (or at random with
    ``--random``), ``window`` requests in flight; for ``seconds`` or ``requests`` requests.
    Entries carry the dummy digest (a bookie never checks digests) and are built as sent,
    for every N alike."""
    from zbk.client.digest import make_digest, master_key
    from zbk.client.raw import BookieConnection
    from zbk.wire import messages as w
    from zbk.wire.codec import encode
    from zbk.wire.entry import build_entry

    dg, mk = make_digest("dummy", b""), master_key(PASSWORD)
    payload = os.urandom(a.size)
    n = a.ledgers
    next_eid = [a.start_eid] * n
    rng = random.Random(7)
    lat: list[float] = []
    sent_at: dict[int, tuple[float, int]] = {}
    acked = sent = 0
    with BookieConnection(a.bookie, timeout_s=60) as c:
        sock = c.sock
        end = time.perf_counter() + a.seconds if a.seconds else float("inf")
        k = 0

        def send_one() -> None:
            nonlocal k, sent
            i = rng.randrange(n) if a.random else k % n
            k += 1
            lid, first = a.first_lid + i, next_eid[i]
            next_eid[i] = first + a.batch
            entries = [build_entry(lid, e, e - 1, payload, dg) for e in range(first, first + a.batch)]
            rid = c.next_rid()
            sent_at[rid] = (time.perf_counter(), a.batch)
            sent += 1
            sock.send_multipart(encode(w.AddRequest(rid=rid, ledger_id=lid, master_key=mk, flags=w.AddFlag(0),
                                                    entries=entries)), copy=False)

        def more() -> bool:
            return time.perf_counter() < end and (not a.requests or sent < a.requests)

        pids = [int(x) for x in a.pids.split(",")] if a.pids else []
        scpu0 = sum(cpu_seconds(p) for p in pids)
        t0 = time.perf_counter()
        for _ in range(a.window):
            if more():
                send_one()
        while sent_at:
            r = c.recv()
            t_sent, cnt = sent_at.pop(r.rid)
            if r.status != 0:
                raise RuntimeError(f"add failed: {r}")
            now = time.perf_counter()
            lat.append(now - t_sent)
            acked += cnt
            if more():
                send_one()
        elapsed = time.perf_counter() - t0
        bookie_cpu = sum(cpu_seconds(p) for p in pids) - scpu0
    lat.sort()
    return {"entries": acked, "requests": len(lat), "seconds": round(elapsed, 3),
            "bookie_cores": round(bookie_cpu / elapsed, 2),
            "bookie_us_per_request": round(bookie_cpu / len(lat) * 1e6, 1) if lat else 0.0,
            "entries_per_s": round(acked / elapsed, 1), "requests_per_s": round(len(lat) / elapsed, 1),
            "p50_ms": round(pct(lat, 0.5) * 1000, 3), "p99_ms": round(pct(lat, 0.99) * 1000, 3),
            "max_ms": round(lat[-1] * 1000, 3) if lat else 0.0, "ledgers": n, "batch": a.batch,
            "window": a.window}


def w_raw_read(a: argparse.Namespace) -> dict[str, Any]:
    """Ranged READ_ENTRY requests over entries 0..last of one ledger, over and over,
    ``window`` requests in flight, ``count`` entries per request.

    Replies are received frame by frame (recv(copy=False), Frame.more, Frame.buffer) rather
    than with recv_multipart, which costs this reader ~1 us more per frame (one frame per
    entry): the reader is a single Python thread like the bookie's Server, and should not
    be what limits a figure about the bookie. Its own CPU per entry is reported too."""
    import zmq

    from zbk.client.raw import BookieConnection
    from zbk.wire import messages as w
    from zbk.wire.codec import decode_response, encode

    received = nbytes = 0
    in_flight: dict[int, int] = {}
    pids = [int(x) for x in a.pids.split(",")] if a.pids else []
    with BookieConnection(a.bookie, timeout_s=60) as c:
        nxt = 0
        scpu0 = sum(cpu_seconds(p) for p in pids)
        t0, ccpu0 = time.perf_counter(), time.process_time()
        end = t0 + a.seconds
        recv_frame = c.sock.recv
        c.sock.setsockopt(zmq.RCVTIMEO, 60_000)

        def recv() -> Any:
            frame = recv_frame(0, False)
            frames = [frame.buffer]
            while frame.more:
                frame = recv_frame(0, False)
                frames.append(frame.buffer)
            return decode_response(frames)

        def send_one() -> None:
            nonlocal nxt
            if nxt > a.last:
                nxt = 0
            cnt = min(a.count, a.last - nxt + 1)
            rid = c.next_rid()
            in_flight[rid] = cnt
            c.sock.send_multipart(encode(w.ReadRequest(rid=rid, ledger_id=a.first_lid, first_entry_id=nxt,
                                                       count=cnt)), copy=False)
            nxt += cnt

        for _ in range(a.window):
            send_one()
        while in_flight:
            r = recv()
            want = in_flight.pop(r.rid)
            if r.status != 0 or len(r.entries) != want:
                raise RuntimeError(f"read returned status {r.status}, {len(r.entries)} of {want} entries")
            received += want
            nbytes += sum(len(e) for e in r.entries)
            if time.perf_counter() < end:
                send_one()
        elapsed, reader_cpu = time.perf_counter() - t0, time.process_time() - ccpu0
        bookie_cpu = sum(cpu_seconds(p) for p in pids) - scpu0
    return {"entries": received, "seconds": round(elapsed, 3), "entries_per_s": round(received / elapsed, 1),
            "mb_per_s": round(nbytes / elapsed / 1e6, 1), "window": a.window, "count": a.count,
            "bookie_cpu_s_per_100k": round(bookie_cpu / received * 1e5, 3) if received and pids else None,
            "bookie_cores": round(bookie_cpu / elapsed, 2) if pids else None,
            "reader_cpu_s_per_100k": round(reader_cpu / received * 1e5, 3) if received else None,
            "reader_cores": round(reader_cpu / elapsed, 2)}


async def _client_read(a: argparse.Namespace) -> dict[str, Any]:
    """Write ``entries`` entries to a new E1 WQ1 AQ1 ledger on the single bookie, close it,
    then time ``read(0, last)`` through the client (rounds times)."""
    from zbk.client.bookkeeper import AsyncBookKeeper

    payload = os.urandom(a.size)
    out: list[dict[str, Any]] = []
    async with AsyncBookKeeper(a.metadata) as bk:
        lh = await bk.create_ledger(1, 1, 1, password=PASSWORD)
        sem = asyncio.Semaphore(1000)
        for _ in range(a.entries):
            await sem.acquire()
            lh.append(payload).add_done_callback(lambda f: sem.release())
        await lh.close()
        for _ in range(a.rounds):
            rh = await bk.open_ledger(lh.ledger_id, password=PASSWORD, recovery=False)
            load = loadavg()
            t0 = time.perf_counter()
            n = 0
            async for _e in rh.read(0, a.entries - 1):
                n += 1
            elapsed = time.perf_counter() - t0
            out.append({"entries": n, "seconds": round(elapsed, 3), "entries_per_s": round(n / elapsed, 1),
                        "load": load})
    return {"runs": out}


async def _create(a: argparse.Namespace) -> dict[str, Any]:
    """create_ledger + close (E3 WQ3 AQ2), ``concurrency`` at a time, for ``seconds``."""
    from zbk.client.bookkeeper import AsyncBookKeeper

    lat: list[float] = []
    async with AsyncBookKeeper(a.metadata) as bk:
        end = time.perf_counter() + a.seconds

        async def loop() -> None:
            while time.perf_counter() < end:
                t = time.perf_counter()
                lh = await bk.create_ledger(3, 3, 2, password=PASSWORD)
                await lh.close()
                lat.append(time.perf_counter() - t)

        t0 = time.perf_counter()
        await asyncio.gather(*(loop() for _ in range(a.concurrency)))
        elapsed = time.perf_counter() - t0
    lat.sort()
    return {"ledgers": len(lat), "seconds": round(elapsed, 3), "per_s": round(len(lat) / elapsed, 1),
            "p50_ms": round(pct(lat, 0.5) * 1000, 2), "p99_ms": round(pct(lat, 0.99) * 1000, 2),
            "concurrency": a.concurrency}


WORKERS = {"bench": w_bench, "multi": lambda a: eventloop.run(_multi(a)), "raw-add": w_raw_add,
           "raw-read": w_raw_read, "client-read": lambda a: eventloop.run(_client_read(a)),
           "create": lambda a: eventloop.run(_create(a))}


def worker(kind: str, timeout_s: float, **kw: Any) -> dict[str, Any]:
    argv = [sys.executable, os.path.abspath(__file__), "--worker", kind]
    for k, v in kw.items():
        if isinstance(v, bool):
            if v:
                argv.append(f"--{k.replace('_', '-')}")
        else:
            argv += [f"--{k.replace('_', '-')}", str(v)]
    load = loadavg()
    r = run_json(argv, timeout_s)
    r.setdefault("load", load)
    return r


def settings(a: argparse.Namespace) -> dict[str, str]:
    """Bookie config overrides (--set KEY=VALUE) for every bookie the sections start."""
    return dict(kv.split("=", 1) for kv in a.set)


def profile_path(a: argparse.Namespace, section: str) -> str | None:
    """With --profile PREFIX: bookie-0 of the section runs under py-spy (--gil), writing here."""
    return f"{a.profile}-{section}.txt" if a.profile else None


def fig(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    return median_range([r[key] for r in runs])


def fmt(f: dict[str, float], digits: int = 0) -> str:
    return f"{f['median']:,.{digits}f} ({f['min']:,.{digits}f}-{f['max']:,.{digits}f})"


# ================================ sections =====================================================
def section_sizes(a: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with ZbkCluster(3, settings=settings(a), profile=profile_path(a, "sizes")) as zc:
        for rnd in range(a.rounds):
            for size in SIZES:
                for window in (1000, 1):
                    r = worker("bench", a.seconds + 180, metadata=zc.metadata, size=size, window=window,
                               seconds=a.seconds, warmup=1.0)
                    r.update(round=rnd, size=size)
                    runs.append(r)
                    print(f"  sizes round {rnd + 1} {size:>6} B window {window:>4}: {r['entries_per_s']:>9,.0f}/s "
                          f"{r['mb_per_s']:6.1f} MB/s p50 {r['p50_ms']:7.2f} p99 {r['p99_ms']:7.2f} ms "
                          f"(load {r['load']})", flush=True)
    out: dict[str, Any] = {}
    for size in SIZES:
        thr = [r for r in runs if r["size"] == size and r["window"] == 1000]
        lat = [r for r in runs if r["size"] == size and r["window"] == 1]
        out[str(size)] = {"entries_per_s_w1000": fig(thr, "entries_per_s"), "mb_per_s_w1000": fig(thr, "mb_per_s"),
                          "p50_ms_w1000": fig(thr, "p50_ms"), "p99_ms_w1000": fig(thr, "p99_ms"),
                          "p50_ms_w1": fig(lat, "p50_ms"), "p99_ms_w1": fig(lat, "p99_ms"),
                          "load": [r["load"] for r in thr + lat]}
    print("\nentry size | entries/s w1000 | MB/s w1000 | p99 ms w1000 | p50 ms w1 | p99 ms w1")
    for size in SIZES:
        o = out[str(size)]
        print(f"{size:>10} | {fmt(o['entries_per_s_w1000'])} | {fmt(o['mb_per_s_w1000'], 1)} | "
              f"{fmt(o['p99_ms_w1000'], 1)} | {fmt(o['p50_ms_w1'], 2)} | {fmt(o['p99_ms_w1'], 2)}")
    return {"summary": out, "runs": runs}


def section_ledgers(a: argparse.Namespace) -> dict[str, Any]:
    counts = ",".join(str(n) for n in LEDGER_COUNTS)
    levels = a.levels.split(",")
    multi: dict[str, Any] = {"runs": [], "create_s": None}
    raw: list[dict[str, Any]] = []
    # (a) through the client
    if "client" in levels:
        with ZbkCluster(3, settings=settings(a), profile=profile_path(a, "ledgers-client")) as zc:
            multi = worker("multi", a.rounds * len(LEDGER_COUNTS) * (a.seconds + 151) + 600, metadata=zc.metadata,
                           pids=",".join(str(b.pid) for b in zc.bookies), counts=counts, gc_freeze=a.gc_freeze, window=1000, size=1024, seconds=a.seconds, warmup=1.0, rounds=a.rounds)
        for r in multi["runs"]:
            print(f"  client {r['ledgers']:>6} ledgers round {r['round'] + 1}: {r['entries_per_s']:>9,.0f}/s "
                  f"p50 {r['p50_ms']:7.1f} p99 {r['p99_ms']:7.1f} ms, cores: client {r['client_cores']:.2f} "
                  f"bookies {r['bookie_cores']:.2f} (load {r['load']})", flush=True)
    # (b) one bookie, raw protocol, same request shape
    if "raw" in levels:
        with ZbkCluster(1, settings=settings(a), profile=profile_path(a, "ledgers-raw")) as zc:
            b = zc.bookies[0]
            for n in LEDGER_COUNTS:  # every ledger known to the bookie first (see _multi)
                worker("raw-add", 600, bookie=b.bookie_id, first_lid=1_000_000 * (1 + LEDGER_COUNTS.index(n)),
                       ledgers=n, batch=1, window=a.raw_window, size=1024, requests=n, start_eid=0)
            order = list(LEDGER_COUNTS)
            for rnd in range(a.rounds):
                for n in order:
                    # As in (a): each run starts on an idle bookie, the first one once the
                    # checkpoint has created the new ledgers' index files.
                    waited = wait_idle([b.pid])
                    r = worker("raw-add", a.seconds + 180, bookie=b.bookie_id,
                               first_lid=1_000_000 * (1 + LEDGER_COUNTS.index(n)), ledgers=n, batch=a.batch,
                               window=a.raw_window, size=1024, seconds=a.seconds, start_eid=(rnd + 1) * 2**20,
                               pids=b.pid)
                    r.update(round=rnd, rss_mib=round(rss_bytes(b.pid) / 2**20, 1), settle_s=round(waited, 1))
                    raw.append(r)
                    print(f"  raw    {n:>6} ledgers round {rnd + 1}: {r['entries_per_s']:>9,.0f}/s "
                          f"({r['requests_per_s']:,.0f} req/s) p50 {r['p50_ms']:7.1f} p99 {r['p99_ms']:7.1f} ms "
                          f"bookie {r['bookie_us_per_request']:.0f} us CPU/request, {r['bookie_cores']:.2f} cores, "
                          f"rss {r['rss_mib']} MiB (load {r['load']})", flush=True)
                order.reverse()
    out: dict[str, Any] = {}
    for lvl, runs in (("client", multi["runs"]), ("raw", raw)):
        if not runs:
            continue
        out[lvl] = {}
        for n in LEDGER_COUNTS:
            rr = [r for r in runs if r["ledgers"] == n]
            out[lvl][str(n)] = {"entries_per_s": fig(rr, "entries_per_s"), "p50_ms": fig(rr, "p50_ms"),
                                "p99_ms": fig(rr, "p99_ms"), "bookie_cores": fig(rr, "bookie_cores"),
                                "load": [r["load"] for r in rr]}
            if lvl == "raw":
                out[lvl][str(n)]["bookie_us_per_request"] = fig(rr, "bookie_us_per_request")
            else:
                out[lvl][str(n)]["client_cores"] = fig(rr, "client_cores")
        base = out[lvl]["1"]["entries_per_s"]["median"]
        for n in LEDGER_COUNTS:
            out[lvl][str(n)]["vs_1_ledger"] = round(out[lvl][str(n)]["entries_per_s"]["median"] / base, 3)
    print("\nlevel  | ledgers | entries/s | p50 ms | p99 ms | vs 1 ledger")
    for lvl in out:
        for n in LEDGER_COUNTS:
            o = out[lvl][str(n)]
            print(f"{lvl:6} | {n:>7} | {fmt(o['entries_per_s'])} | {fmt(o['p50_ms'], 1)} | {fmt(o['p99_ms'], 1)} | "
                  f"x{o['vs_1_ledger']:.2f}")
    return {"summary": out, "client_create_s": multi["create_s"], "client_touch_s": multi.get("touch_s"),
            "client_settle_s": multi.get("settle_s"),
            "client_runs": multi["runs"], "raw_runs": raw,
            "raw_batch": a.batch, "raw_window": a.raw_window}


def section_many(a: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {"chunks": []}
    with ZbkCluster(1, settings=settings(a), profile=profile_path(a, "many")) as zc:
        b = zc.bookies[0]

        def probe(tag: str) -> dict[str, Any]:
            out: dict[str, Any] = {}
            for mode, kw in (("ledger1", {"first_lid": 1, "ledgers": 1}),
                             ("random", {"first_lid": 10_000_000, "ledgers": max(1, filled), "random": True})):
                if mode == "random" and not filled:
                    continue
                r = worker("raw-add", 200, bookie=b.bookie_id, batch=1, window=1, size=1024, seconds=a.probe_seconds,
                           start_eid=probe_eid[mode], **kw)
                probe_eid[mode] += 2**20
                out[mode] = r
                print(f"  probe {tag:>14} {mode:8}: add p50 {r['p50_ms']:.2f} p99 {r['p99_ms']:.2f} ms "
                      f"({r['entries_per_s']:,.0f}/s at window 1; load {r['load']})", flush=True)
            out["rss_mib"] = round(rss_bytes(b.pid) / 2**20, 1)
            return out

        filled = 0
        probe_eid = {"ledger1": 0, "random": 2**24}
        res["rss_start_mib"] = round(rss_bytes(b.pid) / 2**20, 1)
        res["probe_empty"] = probe("empty")
        while filled < MANY_LEDGERS:
            # seconds=0: the chunk's requests, however long they take (the worker's default of
            # --seconds stopped a chunk that met a 6.5 s stall after 32 of its 10,000 ledgers,
            # and the section went on counting ledgers it had not created).
            r = worker("raw-add", 600, bookie=b.bookie_id, first_lid=10_000_000 + filled, ledgers=MANY_CHUNK,
                       batch=a.many_batch, window=32, size=1024, requests=MANY_CHUNK, start_eid=0, seconds=0)
            if r["requests"] != MANY_CHUNK:
                raise RuntimeError(f"a fill chunk created {r['requests']} of {MANY_CHUNK} ledgers")
            filled += MANY_CHUNK
            r.update(ledgers_total=filled, rss_mib=round(rss_bytes(b.pid) / 2**20, 1))
            res["chunks"].append(r)
            print(f"  fill {filled:>7} ledgers: {r['requests_per_s']:,.0f} new ledgers/s, {r['entries_per_s']:,.0f} "
                  f"entries/s, p99 {r['p99_ms']:.1f} ms, bookie RSS {r['rss_mib']} MiB (load {r['load']})", flush=True)
        res["probe_full"] = probe(f"{filled} ledgers")
        # Let a checkpoint (flush_interval_ms, 10 s) write every index file, then look again.
        time.sleep(12)
        res["rss_after_checkpoint_mib"] = round(rss_bytes(b.pid) / 2**20, 1)
        res["probe_after_checkpoint"] = probe("after ckpt")
        res["rss_max_mib"] = max([c["rss_mib"] for c in res["chunks"]] + [res["rss_after_checkpoint_mib"],
                                                                          res["probe_after_checkpoint"]["rss_mib"]])
        metrics = b.metrics()
        res["bookie_ledgers_metric"] = next((float(ln.split()[-1]) for ln in metrics.splitlines()
                                             if ln.startswith("zbk_bookie_ledgers ")), None)
    print(f"\nbookie RSS: start {res['rss_start_mib']} MiB, max {res['rss_max_mib']} MiB with {filled:,} ledgers; "
          f"add p50/p99 empty {res['probe_empty']['ledger1']['p50_ms']:.2f}/{res['probe_empty']['ledger1']['p99_ms']:.2f}"
          f" ms, full (random ledger) {res['probe_full']['random']['p50_ms']:.2f}/"
          f"{res['probe_full']['random']['p99_ms']:.2f} ms")
    return res


def section_read(a: argparse.Namespace) -> dict[str, Any]:
    res: dict[str, Any] = {}
    with ZbkCluster(1, settings=settings(a), profile=profile_path(a, "read")) as zc:
        b = zc.bookies[0]
        fill = worker("raw-add", 600, bookie=b.bookie_id, first_lid=1, ledgers=1, batch=500, window=8, size=1024,
                      requests=a.read_entries // 500, start_eid=0)
        last = fill["entries"] - 1
        print(f"  wrote {fill['entries']:,} entries ({fill['entries_per_s']:,.0f}/s)", flush=True)
        raw: list[dict[str, Any]] = []
        for rnd in range(a.rounds):
            for window in (1, 4):
                r = worker("raw-read", a.seconds + 120, bookie=b.bookie_id, first_lid=1, last=last, count=4096,
                           window=window, seconds=a.seconds, pids=str(b.pid))
                r["round"] = rnd
                raw.append(r)
                print(f"  raw read round {rnd + 1} window {window}: {r['entries_per_s']:>9,.0f} entries/s "
                      f"{r['mb_per_s']:6.1f} MB/s; CPU-s per 100k entries: bookie {r['bookie_cpu_s_per_100k']} "
                      f"({r['bookie_cores']} cores), reader {r['reader_cpu_s_per_100k']} ({r['reader_cores']} cores)"
                      f" (load {r['load']})", flush=True)
        res["raw"] = {str(w): {"entries_per_s": fig([r for r in raw if r["window"] == w], "entries_per_s"),
                               "mb_per_s": fig([r for r in raw if r["window"] == w], "mb_per_s"),
                               "bookie_cpu_s_per_100k": fig([r for r in raw if r["window"] == w],
                                                            "bookie_cpu_s_per_100k"),
                               "load": [r["load"] for r in raw if r["window"] == w]} for w in (1, 4)}
        res["raw_runs"] = raw
        cl = worker("client-read", 600, metadata=zc.metadata, entries=a.client_read_entries, size=1024,
                    rounds=a.rounds)
        for r in cl["runs"]:
            print(f"  client read(): {r['entries_per_s']:>9,.0f} entries/s (load {r['load']})", flush=True)
        res["client"] = {"entries_per_s": fig(cl["runs"], "entries_per_s"), "entries": a.client_read_entries,
                         "runs": cl["runs"]}
    print(f"\nrange read, one bookie: raw window 1 {fmt(res['raw']['1']['entries_per_s'])}, window 4 "
          f"{fmt(res['raw']['4']['entries_per_s'])} entries/s (bookie CPU-s per 100k entries: window 1 "
          f"{fmt(res['raw']['1']['bookie_cpu_s_per_100k'], 3)}, window 4 {fmt(res['raw']['4']['bookie_cpu_s_per_100k'], 3)});"
          f" client read() {fmt(res['client']['entries_per_s'])}")
    return res


def section_create(a: argparse.Namespace) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    with ZbkCluster(3, settings=settings(a), profile=profile_path(a, "create")) as zc:
        for rnd in range(a.rounds):
            for conc in (1, 16):
                r = worker("create", a.seconds + 120, metadata=zc.metadata, concurrency=conc, seconds=a.seconds)
                r["round"] = rnd
                runs.append(r)
                print(f"  create+close round {rnd + 1} x{conc:>2}: {r['per_s']:,.0f}/s p50 {r['p50_ms']:.1f} "
                      f"p99 {r['p99_ms']:.1f} ms (load {r['load']})", flush=True)
    out: dict[str, dict[str, Any]] = {str(c): {"per_s": fig([r for r in runs if r["concurrency"] == c], "per_s"),
                    "p50_ms": fig([r for r in runs if r["concurrency"] == c], "p50_ms"),
                    "p99_ms": fig([r for r in runs if r["concurrency"] == c], "p99_ms"),
                    "load": [r["load"] for r in runs if r["concurrency"] == c]} for c in (1, 16)}
    print(f"\nledger create+close: 1 at a time {fmt(out['1']['per_s'])}/s, 16 at a time {fmt(out['16']['per_s'])}/s")
    return {"summary": out, "runs": runs}


# ================================ plots ========================================================
def plot_all(results: dict[str, Any], plots: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(plots, exist_ok=True)
    written: list[str] = []

    def errs(fs: list[dict[str, float]]) -> list[list[float]]:
        return [[f["median"] - f["min"] for f in fs], [f["max"] - f["median"] for f in fs]]

    if "sizes" in results:
        s = results["sizes"]["summary"]
        sizes = [int(k) for k in s]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        f = [s[str(z)]["entries_per_s_w1000"] for z in sizes]
        ax1.errorbar(sizes, [x["median"] for x in f], yerr=errs(f), marker="o", capsize=3, label="entries/s")
        ax1.set_xscale("log")
        ax1.set_yscale("log")
        ax1.set_xlabel("entry payload, bytes")
        ax1.set_ylabel("entries/s (window 1,000)")
        ax1b = ax1.twinx()
        f = [s[str(z)]["mb_per_s_w1000"] for z in sizes]
        ax1b.errorbar(sizes, [x["median"] for x in f], yerr=errs(f), marker="s", capsize=3, color="tab:green",
                      label="MB/s")
        ax1b.set_ylabel("MB/s", color="tab:green")
        ax1.set_title("throughput vs entry size (E3 WQ3 AQ2)")
        for key, lab in (("p99_ms_w1000", "p99, window 1,000"), ("p99_ms_w1", "p99, window 1"),
                         ("p50_ms_w1", "p50, window 1")):
            f = [s[str(z)][key] for z in sizes]
            ax2.errorbar(sizes, [x["median"] for x in f], yerr=errs(f), marker="o", capsize=3, label=lab)
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        ax2.set_xlabel("entry payload, bytes")
        ax2.set_ylabel("append latency, ms")
        ax2.set_title("latency vs entry size")
        ax2.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(plots, "scale_entry_size.png")
        fig.savefig(path, dpi=110)
        written.append(path)
    if "ledgers" in results:
        s = results["ledgers"]["summary"]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        for lvl, lab in (("client", "client, 3 bookies E3 WQ3 AQ2, window 1,000"),
                         ("raw", f"one bookie, raw, {results['ledgers']['raw_batch']}-entry requests")):
            if lvl not in s:
                continue
            ns = [int(k) for k in s[lvl]]
            f = [s[lvl][str(n)]["entries_per_s"] for n in ns]
            ax1.errorbar(ns, [x["median"] for x in f], yerr=errs(f), marker="o", capsize=3, label=lab)
            f = [s[lvl][str(n)]["p99_ms"] for n in ns]
            ax2.errorbar(ns, [x["median"] for x in f], yerr=errs(f), marker="o", capsize=3, label=lab)
        for ax in (ax1, ax2):
            ax.set_xscale("log")
            ax.set_xlabel("concurrently written ledgers")
            ax.legend(fontsize=8)
        ax1.set_ylabel("entries/s")
        ax1.set_ylim(bottom=0)
        ax1.set_title("add throughput vs ledgers (1 KiB)")
        ax2.set_ylabel("p99 add latency, ms")
        ax2.set_ylim(bottom=0)
        ax2.set_title("p99 vs ledgers")
        fig.tight_layout()
        path = os.path.join(plots, "scale_ledgers.png")
        fig.savefig(path, dpi=110)
        written.append(path)
    if "many" in results:
        m = results["many"]
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
        xs = [0] + [c["ledgers_total"] for c in m["chunks"]]
        ax1.plot(xs, [m["rss_start_mib"]] + [c["rss_mib"] for c in m["chunks"]], marker="o", label="bookie RSS")
        ax1.axhline(400, color="red", linestyle="--", label="target 400 MiB")
        ax1.set_xlabel("ledgers on the bookie")
        ax1.set_ylabel("RSS, MiB")
        ax1.set_ylim(bottom=0)
        ax1.set_title("one bookie: RSS vs ledgers")
        ax1.legend(fontsize=8)
        labels, p50, p99 = [], [], []
        for tag, key in (("empty", "probe_empty"), ("100k", "probe_full"), ("100k, ckpt", "probe_after_checkpoint")):
            for mode in ("ledger1", "random"):
                if mode in m[key]:
                    labels.append(f"{tag}\n{'ledger 1' if mode == 'ledger1' else 'random'}")
                    p50.append(m[key][mode]["p50_ms"])
                    p99.append(m[key][mode]["p99_ms"])
        x = range(len(labels))
        ax2.bar([i - 0.2 for i in x], p50, width=0.4, label="p50")
        ax2.bar([i + 0.2 for i in x], p99, width=0.4, label="p99")
        ax2.set_xticks(list(x), labels, fontsize=7)
        ax2.set_ylabel("add latency (window 1), ms")
        ax2.set_title("add latency, empty vs 100,000 ledgers")
        ax2.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(plots, "scale_100k_ledgers.png")
        fig.savefig(path, dpi=110)
        written.append(path)
    return written


# ================================ main =========================================================
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=SECTIONS, help="run only this section (repeatable)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=6.0, help="measured seconds per run")
    ap.add_argument("--batch", type=int, default=10, help="ledgers (b): entries per raw request")
    ap.add_argument("--raw-window", type=int, default=32, help="ledgers (b): raw requests in flight")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="bookie config override")
    ap.add_argument("--levels", default="client,raw", help="ledgers: which levels to run (client,raw)")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="ledgers (a): gc.freeze() in the client once its ledgers are open (docs/contributors.md)")
    ap.add_argument("--many-batch", type=int, default=1, help="many: entries per ledger while filling")
    ap.add_argument("--probe-seconds", type=float, default=4.0)
    ap.add_argument("--read-entries", type=int, default=200_000)
    ap.add_argument("--client-read-entries", type=int, default=50_000)
    ap.add_argument("--plots", metavar="DIR", help="write PNG figures here (e.g. docs/img)")
    ap.add_argument("--json-out", metavar="FILE", help="also write the full report here")
    ap.add_argument("--profile", metavar="PREFIX", help="run bookie-0 of each section under py-spy --gil, "
                    "writing a raw (collapsed) profile to PREFIX-<section>.txt")
    ap.add_argument("--max-seconds", type=float, default=900, help="bound on the whole run")
    ap.add_argument("--from-json", metavar="FILE", action="append", help="only plot runs saved with --json-out")
    # worker mode (internal)
    ap.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
    for name, typ in (("metadata", str), ("bookie", str), ("size", int), ("window", int), ("warmup", float),
                      ("counts", str), ("pids", str), ("first-lid", int), ("ledgers", int), ("start-eid", int), ("requests", int),
                      ("last", int), ("count", int), ("entries", int), ("concurrency", int)):
        ap.add_argument(f"--{name}", type=typ, help=argparse.SUPPRESS)
    ap.add_argument("--random", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(WORKERS[a.worker](a)))
        return 0

    results: dict[str, Any] = {}
    if a.from_json:  # re-plot saved runs (--json-out files; later files win per section)
        for path in a.from_json:
            with open(path) as f:
                saved = json.load(f)
            results.update({k: v for k, v in saved.items() if k in SECTIONS})
        for p in plot_all(results, a.plots or "."):
            print(f"plot: {p}")
        return 0
    install_signal_handlers(a.max_seconds)
    sections = a.only or list(SECTIONS)
    started = time.time()
    for name in sections:
        print(f"== {name} (load {loadavg()})", flush=True)
        t = time.time()
        results[name] = globals()[f"section_{name}"](a)
        results[name]["wall_s"] = round(time.time() - t, 1)
    report = {"bench": "scale", "git": git_rev(), "rounds": a.rounds, "seconds": a.seconds, "load_end": loadavg(),
              "bookie_settings": settings(a), "gc_freeze": a.gc_freeze,
              "wall_s": round(time.time() - started, 1), **results}
    if a.plots:
        for p in plot_all(results, a.plots):
            print(f"plot: {p}")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
