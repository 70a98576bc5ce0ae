"""The least a bookie can do for an add, for bench/openloop.py's ``server-floor`` system.

One thread and one ROUTER socket. At each wake-up it takes every add request that is
ready, appends each entry to one file as a length-prefixed record with its CRC32C (as a
journal record), writes them with one write(), syncs with one fsync() and then answers
each request. It has no actors, no entry log, no index and no checks beyond decoding the
request. Each of openloop's servers is one such process. Written to by the no-library
writer (``--systems server-floor``), it is the floor of the server side at a fixed rate:
what any single-threaded Python server on this machine pays per add with the same wire
protocol and the same durability. It is not a bookie.

    python bench/_floor_server.py --port PORT --dir DIR   (READY on stdout once bound; SIGTERM stops it)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

import crc32c
import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from zbk.wire import messages as w  # noqa: E402
from zbk.wire.codec import decode_request, encode  # noqa: E402
from zbk.wire.entry import check_structure  # noqa: E402
from zbk.wire.status import Status  # noqa: E402


def serve(port: int, directory: str, stop: threading.Event) -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"tcp://127.0.0.1:{port}")
    fd = os.open(os.path.join(directory, "journal"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    events, pollin = int(zmq.EVENTS), int(zmq.POLLIN)
    print("READY", flush=True)
    try:
        while not stop.is_set():
            if not router.poll(100):
                continue
            records: list[bytes] = []
            answers: list[tuple[bytes, list[Any]]] = []
            while int(router.get(events)) & pollin:
                ident, *frames = router.recv_multipart()
                req = decode_request(frames)
                if not isinstance(req, w.AddRequest) or not req.entries:
                    continue
                ids = []
                for blob in req.entries:
                    s = check_structure(blob)
                    if isinstance(s, str):
                        raise ValueError(s)
                    ids.append(s[2])
                    b = bytes(blob)
                    records.append(len(b).to_bytes(4, "little") + crc32c.crc32c(b).to_bytes(4, "little") + b)
                answers.append((ident, encode(w.AddResponse(rid=req.rid, status=Status.EOK, ledger_id=req.ledger_id,
                                                            first_entry_id=ids[0], last_entry_id=ids[-1]))))
            if records:
                os.write(fd, b"".join(records))
                os.fsync(fd)
            for ident, reply in answers:
                router.send_multipart([ident, *reply])
    finally:
        os.close(fd)
        router.close(0)
        ctx.term()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--dir", required=True)
    args = ap.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    serve(args.port, args.dir, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
