"""The Server actor's state and the helpers its request paths share.

``ServerBase`` holds the in-memory state of every ledger and of the requests in flight
(set up by its constructor, which ``ServerCore`` keeps), the read-only state, the bounds
on work in flight, the index updates held for the IndexSyncer, and the error replies.
The request paths build on it: reads and long polls (zbk/actors/serverreads.py), adds
(zbk/actors/serveradds.py), and the rest with the message dispatch (zbk/actors/server.py).
"""

from __future__ import annotations

import hmac
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zbk import limits
from zbk.actors.base import Outbox, Reply
from zbk.actors.journals import journal_names, split_by_journal
from zbk.actors.messages import (
    Appended,
    HeaderUpdate,
    IndexPut,
    JournalMeta,
)
from zbk.actors.tailcache import TailCache
from zbk.metrics import bookie as m
from zbk.storage.journal import RecordType
from zbk.wire import messages as w
from zbk.wire.codec import encode, encode_multi_add_statuses
from zbk.wire.entry import peek_entry_header
from zbk.wire.errors import FrameError
from zbk.wire.status import Status

# Named as the module this code was split from: log configuration and output stay as they were.
log = logging.getLogger("zbk.actors.server")


@dataclass(slots=True)
class LedgerState:
    master_key: bytes | None = None
    fenced: bool = False
    limbo: bool = False
    lac: int = -1  # highest LAC piggybacked on an acknowledged add, or set explicitly
    last_entry_id: int = -1  # highest entry id acknowledged here
    # Long polls waiting for the LAC to pass theirs; None when there are none (an empty list
    # per ledger would be 56 bytes of each of 100,000 ledgers' state).
    waiters: list[LongPoll] | None = None


@dataclass(slots=True)
class LongPoll:
    ident: bytes
    req: w.ReadRequest
    deadline: float
    started: float


@dataclass(slots=True)
class PendingAdd:
    ident: bytes
    rid: int
    ledger_id: int
    entry_ids: list[int]
    max_lac: int
    started: float
    need_sync: bool
    nbytes: int = 0  # bytes of entry blobs, counted against pending_add_bytes_max
    appended: bool = False
    synced: bool = False
    # Synced messages still to come for this batch id: a new ledger's master-key record
    # (JournalMeta, straight from the Server) and the entries' records (JournalAppend,
    # through the EntryLogger) are pended separately in the journal and may be committed by
    # different group commits, so the ack waits for the Synced of each (2), not the first;
    # with several journals, one of each per journal the batch's ledgers belong to.
    syncs: int = 1
    failed: Status | None = None
    # MULTI_ADD (one PendingAdd for the whole request): the accepted parts as (part index,
    # ledger id, entry ids (the entry id itself for a part of one entry: no list per part),
    # max LAC), and every part's status so far (refused parts are set already; accepted ones
    # are EOK until the request completes). None for ADD_ENTRY.
    parts: list[tuple[int, int, int | list[int], int]] | None = None
    statuses: bytearray | None = None
    # The entries of long-polled ledgers, (ledger id, entry id, blob), for the tail cache
    # once they are appended; None when no ledger of the add is polled.
    tail: list[tuple[int, int, w.Blob]] | None = None


@dataclass(slots=True)
class PendingRead:
    ident: bytes
    req: Any  # ReadRequest or ReadLacRequest or ListEntriesRequest
    started: float


@dataclass(slots=True)
class AdminState:
    """Set by an operator through the admin API."""

    force_read_only: bool = False



class ServerBase:
    def __init__(self, *, ledgers: dict[int, LedgerState], journal_write_data: bool, max_frame_bytes: int,
                 reply: Reply, outbox: Outbox, read_only: bool = False, read_only_mode_enabled: bool = True,
                 on_state_change: Callable[[bool], None] | None = None, tick_interval_s: float = 0.05,
                 pending_requests_max: int = limits.server_pending_requests_max,
                 pending_add_bytes_max: int = limits.server_pending_add_bytes_max, journals: int = 1) -> None:
        self.ledgers = ledgers
        self.journals = journals  # every ledger's records go to journal ledger_id % journals
        self.journal_names = journal_names(journals)
        # Master keys by value, so that ledgers of one password share one bytes object: a
        # MULTI_ADD compares a key per part, and with thousands of ledgers a key object of
        # each ledger's own would be one more cold object to reach per entry.
        self.keys: dict[bytes, bytes] = {}
        for state in ledgers.values():
            if state.master_key is not None:
                state.master_key = self.shared_key(state.master_key)
        # IndexPressure (zbk/actors/messages.py): adds held while the index is over its bound
        self.index_pressure = False
        self.held: deque[tuple[bytes, Any, float, int]] = deque()  # (ident, request, when, entry bytes)
        self.held_bytes = 0
        self.journal_write_data = journal_write_data
        self.max_frame_bytes = max_frame_bytes
        self.reply: Reply = reply
        self.outbox: Outbox = outbox
        self.tick_interval_s: float | None = tick_interval_s
        self.disk_full = read_only
        self.admin = AdminState()
        self.read_only_mode_enabled = read_only_mode_enabled
        self.on_state_change = on_state_change
        self.seq = 0
        self.adds: dict[int, PendingAdd] = {}
        self.meta_waiters: dict[int, PendingRead] = {}
        self.reads: dict[int, PendingRead] = {}
        # Per ledger, the batch ids of its adds not yet appended, oldest first: batch ids
        # grow with admission and deleting keys keeps the order, so the first key is the
        # oldest. Kept for every add, so a read of a fenced ledger finds at once whether an
        # add admitted before it is still on its way (zbk/actors/serverreads.py, _start_read).
        self.unappended: dict[int, dict[int, None]] = {}
        # The reads of fenced ledgers waiting for those adds, per ledger: (the newest batch
        # id admitted before the read, the read). Later adds (recovery adds) never hold it.
        self.fenced_reads: dict[int, list[tuple[int, PendingRead]]] = {}
        self.fenced_waiting = 0  # reads in fenced_reads, over all ledgers
        self.disk_usage = (0, 0)
        self.polling: set[int] = set()  # ledgers with long-poll waiters
        self.tail = TailCache(entries_max=limits.server_tail_entries_max, bytes_max=limits.server_tail_bytes_max)
        self.pending_requests_max = pending_requests_max
        self.pending_add_bytes_max = pending_add_bytes_max
        self.long_polls = 0  # waiters over all ledgers
        self.add_bytes = 0  # entry bytes of the adds in self.adds
        self.last_checkpoint: tuple[tuple[int, int], ...] | None = None  # every journal's mark
        # Index updates of acknowledged adds not yet sent (see _hold_put): Appended messages
        # whose locations go to the IndexSyncer as one IndexPut with the next message to it.
        self.held_puts: list[Appended] = []
        self.held_put_entries = 0
        self._publish_counts()

    # -- state ------------------------------------------------------------------------------
    @property
    def read_only(self) -> bool:
        return self.disk_full or self.admin.force_read_only

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _publish_counts(self) -> None:
        m.LEDGERS.set(len(self.ledgers))
        m.LIMBO_LEDGERS.set(sum(1 for s in self.ledgers.values() if s.limbo))
        m.WRITABLE.set(0 if self.read_only else 1)

    def set_disk_usage(self, used: int, total: int, *, threshold: float, warn_threshold: float) -> None:
        """Disk checker reading (from the loop): over threshold -> read-only; writable again
        only below the warn threshold (hysteresis, so a bookie does not flap)."""
        self.disk_usage = (used, total)
        ratio = used / total if total else 0.0
        m.DISK_USAGE_RATIO.set(ratio)
        was = self.read_only
        if ratio >= threshold and self.read_only_mode_enabled:
            if not self.disk_full:
                log.warning("disk usage %.3f >= %.3f: bookie turns read-only", ratio, threshold)
            self.disk_full = True
        elif ratio < warn_threshold and self.disk_full:
            log.warning("disk usage %.3f < %.3f: bookie writable again", ratio, warn_threshold)
            self.disk_full = False
        self._state_changed(was)

    def set_forced_read_only(self, value: bool) -> None:
        was = self.read_only
        self.admin.force_read_only = value
        self._state_changed(was)

    def _state_changed(self, was: bool) -> None:
        if was != self.read_only:
            m.WRITABLE.set(0 if self.read_only else 1)
            if self.on_state_change:
                self.on_state_change(self.read_only)

    # -- index updates, held and sent together ------------------------------------------------
    # An add's locations need not reach the IndexSyncer before the add is acknowledged: they
    # must reach it before anything that reads or persists the index. Every message to the
    # IndexSyncer goes on one pipe, through _to_index, which first sends the held updates;
    # so a Lookup, ListEntries, Checkpoint or GC message finds every update sent before it,
    # exactly as when each went out at once (ordering arguments 1 and 2 of messages.py hold
    # unchanged). The Server's tick (50 ms), and a bound in entries, send them otherwise;
    # the loop's teardown sends what is left, and the bookie's stop applies what its
    # IndexSyncer did not read (Bookie.stop). Why: at low rates each add would wake the
    # IndexSyncer thread for one slot, a thread hand-over that costs far more CPU than the
    # slot itself.
    def _hold_put(self, msg: Appended) -> None:
        self.held_puts.append(msg)
        self.held_put_entries += len(msg.entry_ids)
        if self.held_put_entries >= limits.server_held_index_entries_max:
            self.send_held_puts()

    def send_held_puts(self) -> None:
        """Send the held index updates as one IndexPut (on the pipe to the IndexSyncer)."""
        held = self.held_puts
        if not held:
            return
        self.held_puts, self.held_put_entries = [], 0
        if len(held) == 1:
            a = held[0]
            self.outbox.send("index", IndexPut(a.ledger_ids, a.entry_ids, a.locations))
            return
        lids: list[int] = []
        eids: list[int] = []
        locs: list[int] = []
        for a in held:
            lids.extend(a.ledger_ids)
            eids.extend(a.entry_ids)
            locs.extend(a.locations)
        self.outbox.send("index", IndexPut(lids, eids, locs))

    def _to_index(self, msg: Any) -> None:
        self.send_held_puts()
        self.outbox.send("index", msg)


    def _journal_meta(self, batch: int, records: list[tuple[int, int, int, bytes]]) -> int:
        """Journal ``records`` (fence, master key, limbo, explicit LAC; never empty) under
        ``batch``: one JournalMeta to each journal their ledgers belong to. Returns how many
        were sent, which is how many Synced the batch gets for them."""
        if self.journals == 1:
            self.outbox.send(self.journal_names[0], JournalMeta(batch, records))
            return 1
        groups = split_by_journal([rec[1] for rec in records], self.journals)
        for j, positions in groups:
            self.outbox.send(self.journal_names[j], JournalMeta(batch, [records[i] for i in positions]))
        return len(groups)

    def _refuse(self, ident: bytes, req: Any) -> None:
        """Answer ETOOMANYREQUESTS (every part of a MULTI_ADD) without doing anything."""
        if type(req) is w.MultiAddRequest:
            m.REQUESTS_TOTAL.labels("add", "ETOOMANYREQUESTS").inc(len(req.parts))
            self._reply_multi(ident, req.rid, bytearray([int(Status.ETOOMANYREQUESTS)]) * len(req.parts))
            return
        m.REQUESTS_TOTAL.labels(_OP_NAMES[type(req)], "ETOOMANYREQUESTS").inc()
        self.reply(ident, encode(w.ErrorResponse(rid=req.rid, status=Status.ETOOMANYREQUESTS)))

    def _reply_multi(self, ident: bytes, rid: int, statuses: bytearray) -> None:
        self.reply(ident, encode_multi_add_statuses(rid, statuses))

    @property
    def in_flight(self) -> int:
        """Requests accepted and not yet answered (waiting for another actor, or polling)."""
        return len(self.adds) + len(self.reads) + len(self.meta_waiters) + self.long_polls + self.fenced_waiting

    def _overloaded(self, req: Any) -> bool:
        if self.in_flight >= self.pending_requests_max:
            return True
        # One add is always let through when none is in flight, so that the byte bound can
        # never refuse every add (a request is at most max_frame_bytes anyway).
        return (isinstance(req, w.AddRequest) and self.add_bytes > 0
                and self.add_bytes + _blob_bytes(req) > self.pending_add_bytes_max)

    def _error(self, ident: bytes, req: Any, status: Status) -> None:
        """Answer ``req`` with ``status`` in the response type of its op."""
        m.REQUESTS_TOTAL.labels(_OP_NAMES[type(req)], status.name).inc()
        rid, lid = req.rid, getattr(req, "ledger_id", 0)
        resp: Any
        if isinstance(req, w.AddRequest):
            first, last = _entry_bounds(req)
            resp = w.AddResponse(rid=rid, status=status, ledger_id=lid, first_entry_id=first, last_entry_id=last)
        elif isinstance(req, w.ReadRequest):
            state = self.ledgers.get(lid)
            resp = w.ReadResponse(rid=rid, status=status, ledger_id=lid, first_entry_id=req.first_entry_id,
                                  lac=state.lac if state else -1)
        elif isinstance(req, w.ReadLacRequest):
            resp = w.ReadLacResponse(rid=rid, status=status, ledger_id=lid, lac=-1)
        elif isinstance(req, w.WriteLacRequest):
            resp = w.WriteLacResponse(rid=rid, status=status, ledger_id=lid)
        elif isinstance(req, w.ForceLedgerRequest):
            resp = w.ForceLedgerResponse(rid=rid, status=status, ledger_id=lid)
        elif isinstance(req, w.WriteCloseRequest):
            resp = w.WriteCloseResponse(rid=rid, status=status, ledger_id=lid)
        elif isinstance(req, w.ListEntriesRequest):
            resp = w.ListEntriesResponse(rid=rid, status=status, ledger_id=lid)
        elif isinstance(req, w.ClearLimboRequest):
            resp = w.ClearLimboResponse(rid=rid, status=status, ledger_id=lid)
        else:
            resp = w.ErrorResponse(rid=rid, status=status)
        self.reply(ident, encode(resp))

    def _check_key(self, state: LedgerState | None, key: bytes | None) -> bool:
        if state is None or state.master_key is None:
            return True
        return key is not None and hmac.compare_digest(state.master_key, key)

    def shared_key(self, key: bytes) -> bytes:
        """``key`` as the one object of its value this bookie keeps (up to limits.server_shared_keys_max
        distinct keys; beyond that a ledger keeps its own)."""
        shared = self.keys.get(key)
        if shared is not None:
            return shared
        key = bytes(key)
        if len(self.keys) < limits.server_shared_keys_max:
            self.keys[key] = key
        return key

    def _ensure_ledger(self, lid: int, key: bytes, records: list[tuple[int, int, int, bytes]]) -> LedgerState:
        """The ledger's state, created (with its master key journaled) if new here."""
        state = self.ledgers.get(lid)
        if state is not None and state.master_key is not None:
            return state
        key = self.shared_key(key)  # only a key the ledger keeps joins the shared ones
        if state is None:
            state = self.ledgers[lid] = LedgerState(master_key=key)
            m.LEDGERS.set(len(self.ledgers))
        else:
            state.master_key = key
        records.append((int(RecordType.MASTER_KEY), lid, -1, key))
        self._to_index(HeaderUpdate(lid, master_key=key))
        return state

    def _ok(self, ident: bytes, req: Any) -> None:
        self._error(ident, req, Status.EOK)

    def _known(self, ident: bytes, req: Any, key: bytes | None) -> LedgerState | None:
        """The ledger's state if it exists here and ``key`` is its master key; otherwise the
        request is answered (ENOLEDGER / EUA) and None returned."""
        state = self.ledgers.get(req.ledger_id)
        if state is None:
            self._error(ident, req, Status.ENOLEDGER)
            return None
        if not self._check_key(state, key):
            self._error(ident, req, Status.EUA)
            return None
        return state


_ADDS = (w.AddRequest, w.MultiAddRequest)  # what IndexPressure holds
_OP_NAMES: dict[type, str] = {
    w.AddRequest: "add", w.ReadRequest: "read", w.ReadLacRequest: "read_lac", w.WriteLacRequest: "write_lac",
    w.ForceLedgerRequest: "force_ledger", w.WriteCloseRequest: "write_close", w.BookieInfoRequest: "bookie_info",
    w.ListEntriesRequest: "list_entries", w.ClearLimboRequest: "clear_limbo",
}



def _observe_many(hist: Any, value: float, n: int) -> None:
    """``n`` times ``hist.observe(value)`` on a labelled prometheus_client Histogram: one
    increment of the sum and of the bucket instead of n observe() calls, each of which takes
    two locks (the parts of a MULTI_ADD are observed as one request each, ~1.5 us a call).
    Reads the client's internals; any other Histogram gets the n calls."""
    try:
        bounds, buckets, total = hist._upper_bounds, hist._buckets, hist._sum
    except AttributeError:
        for _ in range(n):
            hist.observe(value)
        return
    total.inc(value * n)
    for i, bound in enumerate(bounds):
        if value <= bound:
            buckets[i].inc(n)
            break


def _blob_bytes(req: w.AddRequest) -> int:
    return sum(map(len, req.entries))


def _entry_bounds(req: w.AddRequest) -> tuple[int, int]:
    """First and last entry ids of an add batch, or (0, 0) if its blobs are unreadable."""
    try:
        return peek_entry_header(req.entries[0])[1], peek_entry_header(req.entries[-1])[1]
    except (FrameError, IndexError):
        return 0, 0
