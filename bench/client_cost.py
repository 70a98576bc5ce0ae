"""Client cost of appends: CPU seconds per 100,000 entries in the client and in the bookies,
next to entries/s, for 1 and for many concurrently written ledgers (docs/performance.md,
"How cost grows" and "Client cost").

3 bookies (loopback, embedded metadata, journal fsynced), E3 WQ3 AQ2 ledgers, 1 KiB
entries, ``--window`` appends in flight in total, round-robin over N ledgers (as
``bench/scale.py --only ledgers``). Each measurement runs in a fresh client process, once the
bookies are idle (so the checkpoint creating the new ledgers' index files is not in it), after
a 1 s warm-up; CPU is user+system time of the client process and of the three bookie
processes over the measured seconds (wall-clock rates are noisy on a shared machine; CPU
per entry much less so).

``--client-root DIR`` runs the clients from another tree of the zbk package, alternating with
this one (A/B against the same bookies), e.g. the client before a change:

    mkdir -p /tmp/zbk-old && git archive <rev> zbk | tar -x -C /tmp/zbk-old
    .venv/bin/python bench/client_cost.py --counts 1,10000 --rounds 2 --client-root /tmp/zbk-old

``--gc-threshold G0,G1,G2`` also runs this tree's clients with ``gc.set_threshold(G0, G1,
G2)`` (the cyclic GC's defaults are 700, 10, 10), alternating with the defaults:

    .venv/bin/python bench/client_cost.py --counts 1 --seconds 8 --rounds 4 --gc-threshold 20000,20,10

The clients run on the event loop zbk's own programs choose (zbk/eventloop.py: uvloop, or
asyncio's loop with ``ZBK_EVENT_LOOP=asyncio``); ``--event-loop asyncio`` (or ``uvloop``)
also runs them on that loop, alternating:

    .venv/bin/python bench/client_cost.py --counts 1,10000 --seconds 8 --rounds 4 --event-loop asyncio

``--profile PREFIX`` records the measured part of every client run with py-spy (the client
with ``--gil``; bookie-0 with ``--gil`` per thread, to ``PREFIX...-bookie0.txt``; raw;
summarize with bench/profile_top.py). Every run also reports the client's cyclic GC:
collections and CPU seconds per generation, and their share of the client's CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _procs import (  # noqa: E402
    ZbkCluster,
    cpu_seconds,
    install_signal_handlers,
    loadavg,
    pct,
    run_json,
    set_gc_threshold,
    wait_idle,
)

PASSWORD = b"zbk-client-cost"


async def _measure(a: argparse.Namespace) -> list[dict[str, Any]]:
    from zbk.client.bookkeeper import AsyncBookKeeper

    counts = [int(x) for x in a.counts.split(",")]
    payload = os.urandom(1024)
    pids = [int(x) for x in a.pids.split(",")]
    out: list[dict[str, Any]] = []
    if a.gc_threshold:
        set_gc_threshold(a.gc_threshold)
    async with AsyncBookKeeper(a.metadata) as bk:
        sem = asyncio.Semaphore(32)
        handles: list[Any] = []

        async def create() -> None:
            async with sem:
                handles.append(await bk.create_ledger(3, 3, 2, password=PASSWORD))

        await asyncio.gather(*(create() for _ in range(max(counts))))
        touch = asyncio.Semaphore(100)

        async def first(h: Any) -> None:  # a bookie learns of a ledger at its first add
            async with touch:
                await h.append(payload)

        await asyncio.gather(*(first(h) for h in handles))
        # Requests the client sends (one per message, to every bookie of its write set) and
        # the entries in them: how well the batching fills at each ledger count.
        sent = [0, 0]
        disp = bk.ctx.adds
        send = disp._send

        def counted(bookies: list[str], batch: Any) -> None:
            sent[0] += 1
            sent[1] += len(batch.ents)
            send(bookies, batch)

        disp._send = counted  # type: ignore[method-assign]

        async def run(n: int, seconds: float, profile: str) -> dict[str, Any]:
            window = asyncio.Semaphore(a.window)
            lat: list[float] = []
            done = 0

            def finished(start: float, fut: asyncio.Future[int]) -> None:
                nonlocal done
                window.release()
                if fut.exception() is None:
                    lat.append(time.perf_counter() - start)
                    done += 1

            spies = []
            if profile:  # the client (--gil) and bookie-0 (per thread)
                for pid, path, extra in ((os.getpid(), profile, ["--gil"]),
                                         (pids[0], profile.replace(".txt", "-bookie0.txt"), ["--gil", "--threads"])):
                    spies.append(subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(pid),
                                                   "--format", "raw", *extra, "--rate", "250", "-o", path,
                                                   "--duration", str(int(seconds))],
                                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                await asyncio.sleep(0.5)
            gc_s = [0.0, 0.0, 0.0]  # CPU seconds (this thread) in collections of each generation
            gc_n = [0, 0, 0]
            gc_t0 = 0.0

            def gc_timer(phase: str, info: dict[str, int]) -> None:
                nonlocal gc_t0
                if phase == "start":
                    gc_t0 = time.thread_time()
                else:
                    gc_s[info["generation"]] += time.thread_time() - gc_t0
                    gc_n[info["generation"]] += 1

            gc.callbacks.append(gc_timer)
            load = loadavg()
            sent[0] = sent[1] = 0
            cpu0, bcpu0 = time.process_time(), sum(cpu_seconds(p) for p in pids)
            t0 = time.perf_counter()
            k = 0
            hs = handles[:n]
            while time.perf_counter() - t0 < seconds:
                await window.acquire()
                fut = hs[k % n].append(payload)
                k += 1
                fut.add_done_callback(functools.partial(finished, time.perf_counter()))
            for _ in range(a.window):
                await window.acquire()
            elapsed = time.perf_counter() - t0
            gc.callbacks.remove(gc_timer)
            client_s, bookie_s = time.process_time() - cpu0, sum(cpu_seconds(p) for p in pids) - bcpu0
            for spy in spies:
                spy.wait()
            lat.sort()
            return {"ledgers": n, "entries_per_s": round(done / elapsed), "client_cpu_s_per_100k": round(client_s / done * 1e5, 2),
                    "bookie_cpu_s_per_100k": round(bookie_s / done * 1e5, 2), "p50_ms": round(pct(lat, 0.5) * 1000, 1),
                    "p99_ms": round(pct(lat, 0.99) * 1000, 1), "load": load,
                    "requests_per_s": round(sent[0] / elapsed), "entries_per_request": round(sent[1] / max(1, sent[0]), 1),
                    # the client's cyclic GC: collections and seconds per generation, and its
                    # share of the client's CPU
                    "gc_collections": gc_n, "gc_s": [round(x, 3) for x in gc_s],
                    "gc_share_of_client_cpu": round(sum(gc_s) / client_s, 3) if client_s else 0.0}

        loop = asyncio.get_running_loop()
        for n in counts:
            # As bench/scale.py: start on idle bookies, so the checkpoint that creates the new
            # ledgers' index files (creation cost) and the previous run's checkpoint are not
            # counted in this run.
            await loop.run_in_executor(None, wait_idle, pids)
            await run(n, 1.0, "")
            r = await run(n, a.seconds, f"{a.profile}-{n}.txt" if a.profile else "")
            print(json.dumps(r), file=sys.stderr, flush=True)
            out.append(r)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", default="1,10000", help="ledger counts, comma-separated")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--client-root", help="also run clients from this tree (a copy of the zbk package's parent)")
    ap.add_argument("--gc-threshold", metavar="G0,G1,G2",
                    help="also run this tree's clients with gc.set_threshold(G0, G1, G2), alternating")
    ap.add_argument("--event-loop", choices=("uvloop", "asyncio"),
                    help="also run this tree's clients on that event loop (zbk/eventloop.py), alternating")
    ap.add_argument("--profile", metavar="PREFIX", help="py-spy the measured part of each client run")
    ap.add_argument("--loop", help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--metadata", help=argparse.SUPPRESS)
    ap.add_argument("--pids", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        try:  # the loop zbk's programs run on; a tree from before zbk/eventloop.py ran on asyncio's
            from zbk.eventloop import loop_factory
        except ImportError:
            print(json.dumps({"runs": asyncio.run(_measure(a))}))
            return 0
        with asyncio.Runner(loop_factory=loop_factory(a.loop)) as runner:
            print(json.dumps({"runs": runner.run(_measure(a))}))
        return 0
    install_signal_handlers(3600)
    print(f"load {loadavg()}", flush=True)
    variants: list[tuple[str, str | None, str, str]] = [("this", None, "", "")]
    if a.client_root:
        variants.append(("other", a.client_root, "", ""))
    if a.gc_threshold:
        variants.append(("gc", None, a.gc_threshold, ""))
    if a.event_loop:
        variants.append((a.event_loop, None, "", a.event_loop))
    results: list[dict[str, Any]] = []
    with ZbkCluster(3) as zc:
        for rnd in range(a.rounds):
            for name, root, gc_threshold, loop in (variants if rnd % 2 == 0 else variants[::-1]):
                # The worker imports zbk from ``root`` when given (PYTHONPATH for it alone).
                pre = [] if root is None else ["-c", f"import sys; sys.path.insert(0, {root!r}); sys.argv = sys.argv[1:]; "
                                                     f"import runpy; runpy.run_path(sys.argv[0], run_name='__main__')"]
                argv = [sys.executable, *pre, os.path.abspath(__file__), "--worker", "--metadata", zc.metadata,
                        "--pids", ",".join(str(b.pid) for b in zc.bookies), "--counts", a.counts,
                        "--seconds", str(a.seconds), "--window", str(a.window)]
                if gc_threshold:
                    argv += ["--gc-threshold", gc_threshold]
                if loop:
                    argv += ["--loop", loop]
                if a.profile:
                    argv += ["--profile", f"{a.profile}-{name}-r{rnd}"]
                for r in run_json(argv, 1800)["runs"]:
                    r.update(client=name, round=rnd)
                    results.append(r)
                    print(json.dumps(r), flush=True)
    print(f"load {loadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
