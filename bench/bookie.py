"""One-bookie add benchmark: adds/s, request latency and entries per fsync, journal fsync on.

Starts a real bookie process (`zbk bookie`) on loopback with embedded metadata, drives it
with client processes sending pipelined ADD_ENTRY batches of 1 KiB entries (entries are
built before the clock starts, so the figure is the bookie's, not the entry builder's),
reads zbk_journal_group_commit_entries from the bookie's /metrics, prints a table and a
JSON line, and stops the bookie by PID.

    .venv/bin/python bench/bookie.py --seconds 10 --clients 1 --batch 100 --window 8

``--journals N`` gives the bookie N journal directories (``journal_dirs``), all in the
benchmark's temporary directory, hence on one disk: the figure then shows what parallel
journal threads cost or gain on one device, not what journals on separate disks give.
Each client's ledgers (``--ledgers``, consecutive ids) spread over the journals by id.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _procs import cpu_seconds, free_port, metric_total  # noqa: E402


def client(bookie: str, idx: int, seconds: float, batch: int, window: int, size: int, ledgers: int,
           q: mp.Queue) -> None:  # type: ignore[type-arg]
    from zbk.client.digest import make_digest, master_key
    from zbk.client.raw import BookieConnection
    from zbk.wire import messages as w
    from zbk.wire.codec import encode
    from zbk.wire.entry import build_entry

    dg, mk = make_digest("crc32c", b"bench"), master_key(b"bench")
    payload = os.urandom(size)
    per_ledger = 4096
    prebuilt = {lid: [build_entry(lid, e, e - 1, payload, dg) for e in range(per_ledger)]
                for lid in range(idx * ledgers + 1, idx * ledgers + ledgers + 1)}
    lids = list(prebuilt)
    next_eid = dict.fromkeys(lids, 0)
    lat: list[float] = []
    sent_at: dict[int, tuple[float, int]] = {}
    acked = 0
    with BookieConnection(bookie, timeout_s=30) as c:
        sock = c.sock
        end = time.perf_counter() + seconds
        k = 0

        def send_one() -> None:
            nonlocal k
            lid = lids[k % len(lids)]
            k += 1
            first = next_eid[lid]
            # Entry ids grow forever; the blob for id e is reused from e % per_ledger, which is
            # fine for the bookie (it reads only the header) but the id must be the real one.
            if first + batch > per_ledger:
                first = 0
                next_eid[lid] = 0
            next_eid[lid] += batch
            rid = c.next_rid()
            sent_at[rid] = (time.perf_counter(), batch)
            sock.send_multipart(encode(w.AddRequest(rid=rid, ledger_id=lid, master_key=mk, flags=w.AddFlag(0),
                                                    entries=prebuilt[lid][first:first + batch])), copy=False)

        for _ in range(window):
            send_one()
        while sent_at:
            r = c.recv()
            t0, n = sent_at.pop(r.rid)
            assert r.status == 0, r
            now = time.perf_counter()
            lat.append(now - t0)
            acked += n
            if now < end:
                send_one()
    q.put((acked, lat))


def scrape(http_port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
    return {name: metric_total(text, name) for name in ("zbk_journal_group_commit_entries_sum",
                                                        "zbk_journal_group_commit_entries_count",
                                                        "zbk_bookie_entries_added_total")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--batch", type=int, default=100, help="entries per ADD_ENTRY request")
    ap.add_argument("--window", type=int, default=8, help="requests in flight per client")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--ledgers", type=int, default=4, help="ledgers per client")
    ap.add_argument("--journals", type=int, default=1,
                    help="journal directories of the bookie (journal_dirs), all under one temporary directory")
    ap.add_argument("--set", action="append", default=[], help="bookie config override")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", metavar="FILE", help="run the bookie under py-spy, writing a raw (collapsed) profile")
    args = ap.parse_args()

    root = tempfile.mkdtemp(prefix="zbk-bench-")
    port, http_port = free_port(), free_port()
    argv = [sys.executable, "-m", "zbk.cli.main", "bookie", "--metadata", f"sqlite:///{root}/meta.db",
            "--data-dir", f"{root}/data", "--port", str(port), "--http-port", str(http_port)]
    if args.journals > 1:
        dirs = [f"{root}/data/journal"] + [f"{root}/journal-{i}" for i in range(1, args.journals)]
        argv += ["--set", "journal_dirs=" + ",".join(dirs)]
    for s in args.set:
        argv += ["--set", s]
    if args.profile:
        spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
        argv = [spy, "record", "--format", "raw", "--threads", "--gil", "--rate", "200", "-o", args.profile, "--", *argv]
    log = open(os.path.join(root, "bookie.log"), "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                scrape(http_port)
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit(f"bookie did not start; see {root}/bookie.log") from None
                time.sleep(0.1)
        before = scrape(http_port)
        cpu_before = cpu_seconds(proc.pid)
        ctx = mp.get_context("spawn")
        q: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        procs = [ctx.Process(target=client, args=(f"127.0.0.1:{port}", i, args.seconds, args.batch,
                                                                     args.window, args.size, args.ledgers, q))
                 for i in range(args.clients)]
        t0 = time.perf_counter()
        for p in procs:
            p.start()
        results = [q.get(timeout=args.seconds + 120) for _ in procs]
        elapsed = time.perf_counter() - t0
        for p in procs:
            p.join(30)
        cpu_used = cpu_seconds(proc.pid) - cpu_before
        after = scrape(http_port)
    finally:
        if args.profile:  # py-spy writes its profile on SIGINT; the bookie stops cleanly on it too
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(root, ignore_errors=True)
    acked = sum(a for a, _ in results)
    lats = sorted(x for _, lat in results for x in lat)
    commits = after["zbk_journal_group_commit_entries_count"] - before["zbk_journal_group_commit_entries_count"]
    entries = after["zbk_journal_group_commit_entries_sum"] - before["zbk_journal_group_commit_entries_sum"]
    # Clients prebuild entries before their clock starts; the bookie-side rate uses its own counters.
    rate = acked / args.seconds if args.seconds else 0.0

    def pct(p: float) -> float:
        return lats[min(len(lats) - 1, int(p * len(lats)))] * 1000 if lats else 0.0

    report = {"adds_per_s": round(rate), "entries_acked": acked, "journals": args.journals, "entry_bytes": args.size,
              "batch": args.batch, "window": args.window, "clients": args.clients,
              "request_p50_ms": round(pct(0.50), 3),
              "request_p99_ms": round(pct(0.99), 3), "fsyncs": int(commits),
              "entries_per_fsync": round(entries / commits, 1) if commits else 0.0,
              "wall_s": round(elapsed, 1), "load": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    if not args.profile:  # under py-spy the PID is py-spy's
        # Bookie CPU (all threads, user + system) per 100,000 acknowledged entries: less noisy
        # than adds/s on a shared machine. The bookie idles while clients start and prebuild.
        report["bookie_cpu_s"] = round(cpu_used, 2)
        report["cpu_s_per_100k_adds"] = round(cpu_used / acked * 100_000, 2) if acked else 0.0
    if args.json:
        print(json.dumps(report))
    else:
        for k, v in report.items():
            print(f"{k:>20}: {v}")
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
