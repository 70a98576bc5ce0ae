"""The add dispatcher: one message per bookie for the adds of all a client's handles.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any, TypeVar

from zbk import limits
from zbk.client import metrics as cm
from zbk.client.adds import Batch, PendingAdd
from zbk.client.context import HandleContext, WriteSet
from zbk.client.writing import LedgerHandle
from zbk.errors import (
    ZbkError,
)
from zbk.wire import messages as w
from zbk.wire.status import Status

# Named as the module this code was split from: log configuration and output stay as they were.
log = logging.getLogger("zbk.client.handles")
T = TypeVar("T")


class AddDispatcher:
    """Sends the adds of every LedgerHandle of one client, batched per bookie.

    Handles with new entries (or entries to resend) wake it; once per event-loop turn it asks
    each of them for what each bookie still lacks, and sends ONE message per bookie: an
    ADD_ENTRY when a single ledger has entries for that bookie, a MULTI_ADD carrying a part
    per ledger otherwise (split at the request limits). So 10,000 ledgers written at once
    make a few large requests per turn rather than one tiny request per ledger and entry.
    Requests go out through the transport's callback path: no task, future or timer wheel
    entry per request beyond one timeout handle. Requests are pipelined: a handle sends a
    new batch while up to ``add_batches_in_flight_max`` earlier ones are unconfirmed, and
    past that its new entries wait to go out together (LedgerHandle._may_send_batch); a
    handle's entries still confirm in order, since confirmation needs every earlier entry
    confirmed (LedgerHandle._advance).

    Bookies are numbered per client (``bit``): entries track the bookies they were sent to
    and acknowledged by as bit masks.
    """

    def __init__(self, ctx: HandleContext) -> None:
        self.ctx = ctx
        self._dirty: dict[LedgerHandle, None] = {}  # insertion-ordered set
        self._scheduled = False
        self._bits: dict[str, int] = {}
        self._bookies: dict[int, list[str]] = {}  # bit mask -> its bookies (cached)
        self._rotations: dict[tuple[tuple[str, ...], int], tuple[WriteSet, ...]] = {}

    def bit(self, bookie: str) -> int:
        """The bit of ``bookie`` in PendingAdd.acked and PendingAdd.sent (assigned at first use)."""
        b = self._bits.get(bookie)
        if b is None:
            b = self._bits[bookie] = 1 << len(self._bits)
        return b

    def rotations(self, ensemble: Sequence[str], write_quorum: int) -> tuple[WriteSet, ...]:
        """The write sets of ``ensemble`` (entry id modulo its size) as LedgerHandle._write_set
        gives them. Shared by every handle on that ensemble: with thousands of ledgers on a
        few bookies, their entries all look up the same few tuples."""
        key = (tuple(ensemble), write_quorum)
        rot = self._rotations.get(key)
        if rot is None:
            if len(self._rotations) >= limits.client_rotations_cached_max:
                self._rotations.clear()
            e = len(ensemble)
            rot = self._rotations[key] = tuple(
                self.write_set_of([ensemble[(i + k) % e] for k in range(write_quorum)]) for i in range(e))
        return rot

    def write_set_of(self, bookies: Sequence[str]) -> WriteSet:
        """``bookies`` as a write set: ((bookie, bit), ...) and the mask of their bits."""
        bit = self.bit
        pairs = tuple((b, bit(b)) for b in bookies)
        mask = 0
        for _, m in pairs:
            mask |= m
        return pairs, mask

    def bookies_of(self, mask: int) -> list[str]:
        """The bookies whose bits are in ``mask``."""
        out = self._bookies.get(mask)
        if out is None:
            out = self._bookies[mask] = [b for b, bit in self._bits.items() if mask & bit]
        return out

    def wake(self, handle: LedgerHandle) -> None:
        self._dirty[handle] = None
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        dirty, self._dirty = self._dirty, {}
        by_bookie: dict[str, Batch[LedgerHandle]] = {}
        fresh: dict[int, Batch[LedgerHandle]] = {}
        for h in dirty:
            h._collect(by_bookie, fresh)
        same: list[tuple[Batch[LedgerHandle], list[str]]] = []
        if len(fresh) == 1 and not by_bookie:  # one entry per handle, one write set (WQ == E)
            ((mask, batch),) = fresh.items()
            same.append((batch, self.bookies_of(mask)))
        else:
            for mask, batch in fresh.items():  # into each of the set's bookies' batches
                for bookie in self.bookies_of(mask):
                    mine = by_bookie.get(bookie)
                    if mine is None:
                        mine = by_bookie[bookie] = Batch()
                    mine.extend(batch)
            # Bookies that get the very same adds (every bookie of the write sets when WQ ==
            # E, the common case) share their messages: built and encoded once, sent to each.
            for bookie, batch in by_bookie.items():
                for other, bookies in same[-4:]:
                    if (len(other.ents) == len(batch.ents) and other.ents == batch.ents and other.ends == batch.ends
                            and other.hs == batch.hs):
                        bookies.append(bookie)
                        break
                else:
                    same.append((batch, [bookie]))
        n_max = self.ctx.config.add_request_entries_max
        for batch, bookies in same:
            for msg in _pack(batch, n_max):
                self._send(bookies, msg)

    def _send(self, bookies: list[str], batch: Batch[LedgerHandle]) -> None:
        """Send ``batch`` to each of ``bookies`` (one message, one rid: rids are per bookie)."""
        t = self.ctx.transport
        rid = t.next_rid()
        msg: w.AddRequest | w.MultiAddRequest
        hs, ends, ents = batch.hs, batch.ends, batch.ents
        if len(hs) == 1:
            msg = hs[0]._add_request(rid, ents)
        else:
            # The parts as columns (PackedParts), which the encoder packs with one C-level
            # map: no AddRequest per part (thousands per second with many ledgers).
            counts = [1] * len(hs) if len(ents) == len(hs) else [b - a for a, b in pairwise([0, *ends])]
            msg = w.MultiAddRequest(rid=rid, parts=w.PackedParts(
                [h.ledger_id for h in hs], counts, [h._add_flags for h in hs], [h.master_key for h in hs],
                [a.blob for a in ents]))
        answered = self._answered
        timeout_s = self.ctx.add_timeout_s
        send_all = getattr(t, "send_all", None)
        if send_all is not None:
            # A writer's adds fail at once on a bookie whose connection was lost (its ensemble
            # change is the way on); a recovery's write-back waits for a reconnection as its
            # reads do: right after every bookie restarted, it has no spare to change to.
            send_all(bookies, msg, timeout_s, [functools.partial(answered, b, batch) for b in bookies],
                     fail_if_lost=not any([h.recovery for h in hs]))
            return
        send = getattr(t, "send", None)
        for bookie in bookies:
            done = functools.partial(answered, bookie, batch)
            if send is not None:
                send(bookie, msg, timeout_s, done)
            else:  # a transport with request() only (test fakes): one task per request
                self.ctx.spawn(_request_then(t, bookie, msg, timeout_s, done))

    def _answered(self, bookie: str, batch: Batch[LedgerHandle], resp: Any) -> None:
        hs = batch.hs
        if isinstance(resp, BaseException):
            for h, adds in zip(hs, batch.parts(), strict=True):
                h._add_failed(bookie, adds, resp)
            return
        now = time.monotonic()
        lat: list[float] = []
        ents = batch.ents
        if isinstance(resp, w.MultiAddResponse) and len(hs) > 1 and len(resp.statuses) == len(hs):
            statuses: Sequence[Status] = resp.statuses
        else:
            if isinstance(resp, w.ErrorResponse) or (isinstance(resp, w.AddResponse) and len(hs) == 1):
                status = resp.status
            else:  # an answer that does not fit the request: unknown, for every part
                log.warning("%s answered an add request with %s", bookie, type(resp).__name__)
                status = Status.EBADREQ
            statuses = [status] * len(hs)
        if len(ents) == len(hs) and len(hs) > 1:
            # A part of one entry each (many ledgers, the common MULTI_ADD): EOK inline, and
            # the handle's _advance called only when the entry reached AQ acks with this
            # answer: otherwise its first pending entry still has fewer (it never keeps AQ
            # acks past an _advance), and nothing could be confirmed. So one call per entry,
            # at the second of three answers, instead of three. Anything else goes through
            # _add_answered.
            bit = self.bit(bookie)
            eok = Status.EOK
            for h, a, status in zip(hs, ents, statuses, strict=True):
                if status == eok:
                    was = a.acked
                    if a.sent & bit and not was & bit:  # not re-routed away from this bookie meanwhile
                        a.acked = was | bit
                        if was.bit_count() + 1 == h.md.ack_quorum:
                            h._advance(now, lat)
                else:
                    h._add_answered(bookie, [a], status, now, lat)
        else:
            for h, adds, status in zip(hs, batch.parts(), statuses, strict=True):
                h._add_answered(bookie, adds, status, now, lat)
        if lat:
            cm.ADD_ENTRY_SECONDS.observe_many(lat)


def _blob_size(a: PendingAdd) -> int:
    return len(a.blob)


async def _request_then(t: Any, bookie: str, msg: Any, timeout_s: float, done: Callable[[Any], None]) -> None:
    try:
        resp = await t.request(bookie, msg, timeout_s)
    except ZbkError as e:
        done(e)
        return
    done(resp)


def _pack(batch: Batch[LedgerHandle], n_max: int = limits.entries_per_add_request_max) -> list[Batch[LedgerHandle]]:
    """One bookie's batch as messages within the request limits (``n_max`` entries, bytes,
    parts); a part too large for one request is split across messages, in entry order.

    The client's ``n_max`` (ClientConfig.add_request_entries_max, 500) is below the
    protocol's 4,096 on purpose: a writer with 1,000 appends in flight then has two requests
    in flight per bookie, so the bookie journals one while the client takes the answer to
    the other and builds the next, instead of each side idling while the other works
    (docs/performance.md, "What limits throughput at window 1,000")."""
    bytes_max = limits.frame_bytes_max_default // 2
    parts_max = limits.ledgers_per_multi_add_max
    if len(batch.ents) <= n_max and batch.nbytes <= bytes_max and len(batch.hs) <= parts_max:
        return [batch]
    if len(batch.ents) == len(batch.hs):
        return _pack_ones(batch, min(n_max, parts_max), bytes_max)
    out: list[Batch[LedgerHandle]] = [Batch()]
    for h, adds in zip(batch.hs, batch.parts(), strict=True):
        total = sum([len(a.blob) for a in adds])
        chunks = [adds] if len(adds) <= n_max and total <= bytes_max else add_batches(adds, _blob_size, bytes_max, n_max)
        for chunk in chunks:
            c_size = total if chunk is adds else sum([len(a.blob) for a in chunk])
            cur = out[-1]
            if cur.hs and (len(cur.ents) + len(chunk) > n_max or cur.nbytes + c_size > bytes_max
                           or len(cur.hs) >= parts_max):
                cur = Batch()
                out.append(cur)
            cur.add(h, chunk)
    return [m for m in out if m.hs]


def _pack_ones(batch: Batch[LedgerHandle], n_max: int, bytes_max: int) -> list[Batch[LedgerHandle]]:
    """_pack of a batch whose parts have one entry each (many ledgers): its entries cut by
    add_batches, each chunk with its handles' slice, no list per part."""
    out: list[Batch[LedgerHandle]] = []
    start = 0
    for chunk in add_batches(batch.ents, _blob_size, bytes_max, n_max):
        end = start + len(chunk)
        b: Batch[LedgerHandle] = Batch()
        b.hs, b.ents, b.ends = batch.hs[start:end], chunk, list(range(1, len(chunk) + 1))
        b.nbytes = sum([len(a.blob) for a in chunk])
        out.append(b)
        start = end
    return out


def add_batches(items: list[T], size: Callable[[T], int], bytes_max: int,
                n_max: int = limits.entries_per_add_request_max) -> list[list[T]]:
    """Split ``items`` into ADD_ENTRY requests of at most ``n_max`` entries and about
    ``bytes_max`` bytes (an entry larger than that goes alone)."""
    out: list[list[T]] = []
    start = total = 0
    for i, item in enumerate(items):
        n = size(item)
        if i > start and (i - start >= n_max or total + n > bytes_max):
            out.append(items[start:i])
            start, total = i, 0
        total += n
    if start < len(items):
        out.append(items[start:])
    return out
