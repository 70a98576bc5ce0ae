"""What an open LedgerHandle costs a client: bytes (tracemalloc), GC-tracked objects, and the
time of a full collection of the cyclic GC, with ``--handles`` writers open (default 10,000,
as in ``bench/scale.py --only ledgers``) and one entry written to each (docs/performance.md,
"Client cost").

No bookies: the handles' adds go to an in-process transport that answers every request EOK
from three bookies one event-loop turn later (after encoding the request and decoding the
answer, as the wire would). Metadata is decoded from its stored form, as a client reads it.
``--root DIR`` measures the zbk package under DIR instead (e.g. ``git archive REV zbk | tar
-x -C DIR``), for a before/after:

    .venv/bin/python bench/handle_memory.py
    .venv/bin/python bench/handle_memory.py --root /tmp/zbk-old
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import sys
import time
import tracemalloc
from typing import Any

BOOKIES = ("b0:1", "b1:1", "b2:1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--handles", type=int, default=10_000)
    ap.add_argument("--collections", type=int, default=7, help="full collections timed (median printed)")
    ap.add_argument("--root", help="import zbk from this directory")
    a = ap.parse_args()
    if a.root:
        sys.path.insert(0, a.root)
    from zbk.client.bookkeeper import ClientContext
    from zbk.client.handles import LedgerHandle
    from zbk.config import ClientConfig
    from zbk.metadata.ledger import LedgerMetadata
    from zbk.wire import messages as w
    from zbk.wire.codec import decode_response, encode
    from zbk.wire.status import Status

    class Answering:
        """Transport stand-in: every add is stored by every bookie it is sent to."""

        closed = False

        def __init__(self) -> None:
            self.rid = 0
            self.queue: list[tuple[Any, list[Any]]] = []

        def next_rid(self) -> int:
            self.rid += 1
            return self.rid

        def send_all(self, bookies: list[str], msg: Any, timeout_s: float, callbacks: list[Any]) -> None:
            encode(msg)
            if isinstance(msg, w.MultiAddRequest):
                resp = w.MultiAddResponse(rid=msg.rid, status=Status.EOK, statuses=(Status.EOK,) * len(msg.parts))
            else:
                resp = w.AddResponse(rid=msg.rid, status=Status.EOK, ledger_id=msg.ledger_id,
                                     first_entry_id=0, last_entry_id=0)
            frames = encode(resp)
            if not self.queue:
                asyncio.get_running_loop().call_soon(self.deliver)
            self.queue.extend((cb, frames) for cb in callbacks)

        def deliver(self) -> None:
            queue, self.queue = self.queue, []
            for cb, frames in queue:
                cb(decode_response([bytes(f) for f in frames]))

    async def run() -> dict[str, Any]:
        ctx = ClientContext(None, Answering(), ClientConfig(), random.Random(1))  # type: ignore[arg-type]
        payload = random.randbytes(1024)
        gc.collect()
        objects0 = len(gc.get_objects())
        tracemalloc.start()
        bytes0 = tracemalloc.get_traced_memory()[0]
        handles = []
        for i in range(a.handles):
            stored = LedgerMetadata(ledger_id=i + 1, ensemble_size=3, write_quorum=3, ack_quorum=2, password=b"pw",
                                    fragments=((0, BOOKIES),)).encode()
            handles.append(LedgerHandle(ctx, LedgerMetadata.decode(stored, ledger_id=i + 1), 0, b"pw"))
        for h in handles:
            await h.append(payload)
        gc.collect()
        bytes1 = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        objects1 = len(gc.get_objects())
        times = []
        for _ in range(a.collections):
            t = time.perf_counter()
            gc.collect()
            times.append(time.perf_counter() - t)
        n = len(handles)
        return {"handles": n, "bytes_per_handle": round((bytes1 - bytes0) / n),
                "gc_tracked_objects_per_handle": round((objects1 - objects0) / n, 2),
                "full_collection_ms": round(statistics.median(times) * 1000, 1),
                "full_collection_ms_min": round(min(times) * 1000, 1), "root": a.root or "."}

    r = asyncio.run(run())
    print(f"{r['handles']:,} open handles: {r['bytes_per_handle']:,} bytes and {r['gc_tracked_objects_per_handle']} "
          f"GC-tracked objects each; a full collection {r['full_collection_ms']} ms (min {r['full_collection_ms_min']})")
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
