"""Range reads: chunks of about ``limits.client_range_read_bytes`` each, several in flight
ahead of the entries handed out. Where WQ = E a chunk is one request to one bookie; where
WQ < E it is one request per bookie of the fragment, each for its stripe of the chunk.

A bookie answers a read request in one piece. One of 4,096 x 1 KiB entries keeps its threads
busy for milliseconds at a stretch while adds wait behind it; several smaller ones in flight
read as fast (docs/performance.md, "Reads beside writes: the size of a read request").
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Protocol, TypeVar

from zbk import limits
from zbk.metadata.ledger import LedgerMetadata

__all__ = ["entries_per_request", "read_ahead"]


class _Entry(Protocol):
    @property
    def payload(self) -> bytes: ...


E = TypeVar("E", bound=_Entry)  # a LedgerEntry (zbk.client.reading), which imports this module


async def read_ahead(md: LedgerMetadata, first: int, last: int,
                     read_chunk: Callable[[int, int, int], Awaitable[list[E]]],
                     read_one: Callable[[int], Awaitable[E | None]]) -> AsyncGenerator[E, None]:
    """Entries ``first..last`` in order. ``read_chunk(first, count, k)`` reads up to ``count``
    entries from ``first`` ([] when no bookie has ``first``), ``k`` being the chunk's place in
    the range (0 for the first; the rest of a chunk asked again keeps its place);
    ``read_one(entry_id)`` is the per-entry path for an entry no chunk brought (None: the
    range ends there).

    Up to ``limits.client_range_reads_in_flight`` chunks are asked for ahead, none across a
    fragment's end. A chunk answered short (the bookie's response limit, an entry it lacks)
    is asked for again from where the answer stopped, ahead of the chunks after it. Close the
    generator (``contextlib.aclosing``) to cancel the chunks still in flight."""
    ahead: deque[tuple[int, int, int, asyncio.Task[list[E]]]] = deque()  # (first, count, k, read)
    nxt = planned = first  # the next entry to hand out; the first entry no chunk covers yet
    chunks = 0  # asked for so far
    per_request = entries_per_request(limits.client_range_read_assumed_payload_bytes)
    try:
        while nxt <= last:
            while planned <= last and len(ahead) < limits.client_range_reads_in_flight:
                count = min(min(last, md.fragment_end(md.fragment_index(planned))) - planned + 1, per_request)
                ahead.append((planned, count, chunks, asyncio.ensure_future(read_chunk(planned, count, chunks))))
                planned += count
                chunks += 1
            start, count, k, task = ahead.popleft()
            batch = await task
            if batch:
                per_request = entries_per_request(sum(len(e.payload) for e in batch) // len(batch))
            else:  # the per-entry path: errors and speculation
                entry = await read_one(nxt)
                if entry is None:
                    return
                batch = [entry]
            for e in batch:
                yield e
            nxt += len(batch)
            if nxt < start + count:  # the rest of this chunk, before the chunks after it
                rest = start + count - nxt
                ahead.appendleft((nxt, rest, k, asyncio.ensure_future(read_chunk(nxt, rest, k))))
    finally:
        for _, _, _, task in ahead:
            if task.done():
                if not task.cancelled():
                    task.exception()  # read ahead, never needed: its error is not this read's
            else:
                task.cancel()


def entries_per_request(payload_bytes: int) -> int:
    """Entries of about ``payload_bytes`` each that make a request of about
    ``limits.client_range_read_bytes``."""
    per = limits.client_range_read_bytes // (payload_bytes + limits.client_range_read_entry_overhead_bytes)
    return max(1, min(limits.entries_per_read_request_max, per))
