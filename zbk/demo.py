"""The README's main job: a local cluster on embedded metadata plus a sample workload.

Starts bookie processes (real `zbk bookie` processes on loopback ports, embedded sqlite
metadata in a temporary directory), writes ledgers of 1 KiB entries replicated to every
bookie, reads them back from each, verifies every byte, prints the figures and stops
everything by PID.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from zbk.client.digest import make_digest, master_key
from zbk.client.raw import BookieConnection
from zbk.errors import ZbkError
from zbk.metadata.registry import list_bookies
from zbk.metadata.uri import open_store
from zbk.wire import messages as w
from zbk.wire.entry import build_entry, parse_entry


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(root: str, uri: str, i: int) -> tuple[subprocess.Popen[bytes], str]:
    port, http = _free_port(), _free_port()
    log = open(os.path.join(root, f"bookie-{i}.log"), "wb")
    proc = subprocess.Popen([sys.executable, "-m", "zbk.cli.main", "bookie", "--metadata", uri,
                             "--data-dir", os.path.join(root, f"bookie-{i}"), "--port", str(port),
                             "--http-port", str(http)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    return proc, f"127.0.0.1:{port}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bookies", type=int, default=3)
    ap.add_argument("--ledgers", type=int, default=4)
    ap.add_argument("--entries", type=int, default=5000, help="entries per ledger")
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="zbk-demo-")
    uri = f"sqlite:///{root}/meta.db"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        ids = []
        for i in range(args.bookies):
            p, bid = _start(root, uri, i)
            procs.append(p)
            ids.append(bid)
        store = open_store(uri)
        deadline = time.monotonic() + 60
        while len(list_bookies(store)) < args.bookies:
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                print(f"bookies did not come up; logs in {root}", file=sys.stderr)
                return 1
            time.sleep(0.2)
        print(f"cluster: metadata {uri}")
        for b in list_bookies(store):
            print(f"  bookie {b.bookie_id}  http {b.http_url}/metrics")
        dg, mk = make_digest("crc32c", b"demo"), master_key(b"demo")
        payload = os.urandom(1024)
        conns = [BookieConnection(b) for b in ids]
        t0 = time.perf_counter()
        total = 0
        for lid in range(1, args.ledgers + 1):
            for first in range(0, args.entries, 200):
                blobs = [build_entry(lid, e, e - 1, payload, dg) for e in range(first, min(first + 200, args.entries))]
                for c in conns:  # write to every bookie, wait for all (write quorum = ack quorum = N)
                    c.send(w.AddRequest(rid=first + 1, ledger_id=lid, master_key=mk, flags=w.AddFlag(0), entries=blobs))
                for c in conns:
                    r = c.recv()
                    if r.status != 0:
                        raise ZbkError(f"add failed on {c.bookie_id}: {r.status!r}")
                total += len(blobs)
        wrote = time.perf_counter() - t0
        t0 = time.perf_counter()
        checked = 0
        for c in conns:
            for lid in range(1, args.ledgers + 1):
                e = 0
                while e < args.entries:
                    r = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=lid, first_entry_id=e, count=1000))
                    for blob in r.entries:
                        parsed = parse_entry(blob, dg)
                        assert parsed.entry_id == e and bytes(parsed.payload) == payload
                        e += 1
                        checked += 1
                    if not r.entries:
                        raise ZbkError(f"{c.bookie_id}: ledger {lid} entry {e} missing ({r.status!r})")
        read = time.perf_counter() - t0
        mb = total * 1024 / 1e6
        print(f"wrote {total} entries x {len(ids)} replicas ({mb:.1f} MB each) in {wrote:.2f}s: "
              f"{total / wrote:,.0f} entries/s fully replicated")
        print(f"read back and verified {checked} copies in {read:.2f}s: {checked / read:,.0f} entries/s")
        for c in conns:
            c.close()
        store.close()
        return 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
