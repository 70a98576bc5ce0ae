"""Server actor: the request frontend of a bookie.

Owns the ROUTER socket (through its loop), the in-memory state of every ledger (master
key, fenced, limbo, LAC, long-poll waiters) and the table of requests in flight. It
decodes and validates requests, enforces fencing / master key / limbo / read-only, routes
the work to the other actors and replies. It never touches a disk.

Rules it enforces (docs/protocol.md):
- a wrong master key is EUA and nothing is stored or fenced; the key is checked on every
  add, fencing read, WRITE_LAC and WRITE_CLOSE, and on plain reads that carry one;
- work in flight is bounded (requests waiting for another actor, long polls, and the bytes
  of adds not yet acknowledged): beyond the bounds a request is answered ETOOMANYREQUESTS
  at once, so a flood costs memory proportional to the bounds, not to the flood;
- a plain add to a fenced ledger is EFENCED; a RECOVERY_ADD is accepted;
- fencing (FENCE flag on READ_ENTRY / READ_LAC) is journaled and fsynced before the reply,
  and creates the ledger here if this bookie has never seen it (BP-46);
- a limbo ledger never answers an explicit negative: ENOENTRY / ENOLEDGER become EUNKNOWN;
- an add is acknowledged only once it is indexed (so every later read finds it) and, with
  journal_write_data on, its journal record is fsynced.
"""

from __future__ import annotations

import hmac
import logging
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from zbk import limits
from zbk.actors.base import Outbox
from zbk.actors.messages import (
    AppendBatch,
    Appended,
    Checkpoint,
    CheckpointDone,
    CheckpointReady,
    DeleteLedgers,
    EntryList,
    ForceJournal,
    HeaderUpdate,
    IndexPressure,
    IndexPut,
    JournalMeta,
    ListEntries,
    LiveCheck,
    LocalLedgersRequest,
    Lookup,
    ReadResult,
    Relocate,
    Synced,
    WriteClose,
)
from zbk.metrics import bookie as m
from zbk.storage.journal import RecordType
from zbk.wire import messages as w
from zbk.wire.codec import decode_request, encode, encode_multi_add_statuses
from zbk.wire.entry import check_structure, peek_entry_header
from zbk.wire.errors import FrameError
from zbk.wire.status import Status

log = logging.getLogger(__name__)
_SHARED_KEYS_MAX = 65536  # distinct master keys ServerCore.shared_key keeps
Reply = Callable[[bytes, list[Any]], None]


@dataclass(slots=True)
class LedgerState:
    master_key: bytes | None = None
    fenced: bool = False
    limbo: bool = False
    lac: int = -1  # highest LAC piggybacked on an acknowledged add, or set explicitly
    last_entry_id: int = -1  # highest entry id acknowledged here
    # Long polls waiting for the LAC to pass theirs; None when there are none (an empty list
    # per ledger was 56 bytes of each of 100,000 ledgers' state).
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
    # different group commits, so the ack waits for the Synced of each (2), not the first.
    syncs: int = 1
    failed: Status | None = None
    # MULTI_ADD (one PendingAdd for the whole request): the accepted parts as (part index,
    # ledger id, entry ids (the entry id itself for a part of one entry: no list per part),
    # max LAC), and every part's status so far (refused parts are set already; accepted ones
    # are EOK until the request completes). None for ADD_ENTRY.
    parts: list[tuple[int, int, int | list[int], int]] | None = None
    statuses: bytearray | None = None


@dataclass(slots=True)
class PendingRead:
    ident: bytes
    req: Any  # ReadRequest or ReadLacRequest or ListEntriesRequest
    started: float


@dataclass(slots=True)
class AdminState:
    """Set by an operator through the admin API."""

    force_read_only: bool = False


class ServerCore:
    name = "server"

    def __init__(self, *, ledgers: dict[int, LedgerState], journal_write_data: bool, max_frame_bytes: int,
                 reply: Reply, read_only: bool = False, read_only_mode_enabled: bool = True,
                 on_state_change: Callable[[bool], None] | None = None, tick_interval_s: float = 0.05,
                 pending_requests_max: int = limits.server_pending_requests_max,
                 pending_add_bytes_max: int = limits.server_pending_add_bytes_max) -> None:
        self.ledgers = ledgers
        # Master keys by value, so that ledgers of one password share one bytes object: a
        # MULTI_ADD compares a key per part, and with thousands of ledgers a key object of
        # each ledger's own was one more cold object per entry (performance issue #8).
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
        self.reply = reply
        self.outbox: Outbox | None = None
        self.tick_interval_s: float | None = tick_interval_s
        self.disk_full = read_only
        self.admin = AdminState()
        self.read_only_mode_enabled = read_only_mode_enabled
        self.on_state_change = on_state_change
        self.seq = 0
        self.adds: dict[int, PendingAdd] = {}
        self.meta_waiters: dict[int, PendingRead] = {}
        self.reads: dict[int, PendingRead] = {}
        self.disk_usage = (0, 0)
        self.polling: set[int] = set()  # ledgers with long-poll waiters
        self.pending_requests_max = pending_requests_max
        self.pending_add_bytes_max = pending_add_bytes_max
        self.long_polls = 0  # waiters over all ledgers
        self.add_bytes = 0  # entry bytes of the adds in self.adds
        self.last_checkpoint: tuple[int, int] | None = None
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
    # IndexSyncer did not read (Bookie.stop). Why: at low rates each add woke the IndexSyncer
    # thread for one slot (~65 us of CPU per add on this project's 2-core VM, a tenth of a
    # bookie's CPU per window-1 add).
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
        assert self.outbox is not None
        self.held_puts, self.held_put_entries = [], 0
        if len(held) == 1:
            a = held[0]
            self.outbox.send("index", IndexPut(a.ledger_id, a.entry_ids, a.locations, a.ledger_ids))
            return
        lids: list[int] = []
        eids: list[int] = []
        locs: list[int] = []
        for a in held:
            lids.extend(a.ledger_ids if a.ledger_ids is not None else [a.ledger_id] * len(a.entry_ids))
            eids.extend(a.entry_ids)
            locs.extend(a.locations)
        self.outbox.send("index", IndexPut(-1, eids, locs, lids))

    def _to_index(self, msg: Any) -> None:
        self.send_held_puts()
        assert self.outbox is not None
        self.outbox.send("index", msg)

    # -- requests from the network ----------------------------------------------------------
    def on_request(self, ident: bytes, frames: list[Any], now: float) -> None:
        try:
            req = decode_request(frames, max_frame_bytes=self.max_frame_bytes)
        except FrameError as e:
            if e.rid is None:
                m.BAD_FRAMES_TOTAL.labels("dropped").inc()
                return
            m.BAD_FRAMES_TOTAL.labels("answered").inc()
            self.reply(ident, encode(w.ErrorResponse(rid=e.rid, status=e.status)))
            return
        if self.index_pressure and type(req) in _ADDS:
            self._hold(ident, req, now)
            return
        self._dispatch(ident, req, now)

    def _dispatch(self, ident: bytes, req: Any, now: float) -> None:
        if type(req) is w.MultiAddRequest:
            self._on_multi_add(ident, req, now)
            return
        if self._overloaded(req):
            self._refuse(ident, req)
            return
        handler = self._handlers.get(type(req))
        assert handler is not None, f"no handler for {type(req).__name__}"
        handler(self, ident, req, now)

    def _refuse(self, ident: bytes, req: Any) -> None:
        """Answer ETOOMANYREQUESTS (every part of a MULTI_ADD) without doing anything."""
        if type(req) is w.MultiAddRequest:
            m.REQUESTS_TOTAL.labels("add", "ETOOMANYREQUESTS").inc(len(req.parts))
            self._reply_multi(ident, req.rid, bytearray([int(Status.ETOOMANYREQUESTS)]) * len(req.parts))
            return
        m.REQUESTS_TOTAL.labels(_OP_NAMES[type(req)], "ETOOMANYREQUESTS").inc()
        self.reply(ident, encode(w.ErrorResponse(rid=req.rid, status=Status.ETOOMANYREQUESTS)))

    # MULTI_ADD (client-side coalescing, performance issue #8) ------------------------------
    # Each part is checked exactly as an ADD_ENTRY would be (_admit_add) and gets its own
    # status; the accepted parts then travel the actors as ONE unit: one AppendBatch with a
    # ledger id per entry, one Appended, one group of journal records, one IndexPut, and one
    # MultiAddResponse once all of them are indexed and (if any part needs it) fsynced.
    # The request counts as one pending request; its parts' bytes count against the byte
    # bound one by one (a part beyond it is ETOOMANYREQUESTS, the others go on).
    def _on_multi_add(self, ident: bytes, req: w.MultiAddRequest, now: float) -> None:
        parts = req.parts
        statuses = bytearray(len(parts))
        if self.in_flight >= self.pending_requests_max:
            self._refuse(ident, req)
            return
        accepted: list[tuple[int, int, int | list[int], int]] = []
        lids: list[int] = []
        eids: list[int] = []
        blobs: list[bytes] = []
        meta: list[tuple[int, int, int, bytes]] = []
        need_sync = False
        nbytes = 0
        bytes_max = self.pending_add_bytes_max
        # The fast path below takes a one-entry part (every part, with thousands of ledgers)
        # of a ledger known here, keyed and not fenced, when every check _admit_add makes
        # passes; anything else, refusals included, goes through _admit_add itself.
        fast = not self.read_only
        ledgers_get, compare, sync_one = self.ledgers.get, hmac.compare_digest, self.journal_write_data
        eid_max = limits.entry_id_max
        # Per part: (ledger id, master key, flags, its entry if it has exactly one, else
        # None, the part object or None), read from the decoder's columns when every part
        # has one entry (no object per part; built only for _admit_add), from the part
        # objects otherwise (each built once).
        rows: Iterable[tuple[int, bytes | None, int, Any, w.AddRequest | None]]
        if type(parts) is w.PackedParts and parts.ones:
            rows = zip(parts.ledger_ids, parts.keys, parts.flags, parts.entries, repeat(None, len(parts)), strict=True)
        else:
            rows = ((p.ledger_id, p.master_key, int(p.flags), p.entries[0] if len(p.entries) == 1 else None, p)
                    for p in parts)
        for i, (lid, key, flags, blob, part) in enumerate(rows):
            one = blob is not None
            if one:
                pb = len(blob)
            else:  # a part of several entries: a row of the part objects, which carries it
                assert part is not None
                pb = _blob_bytes(part)
            if self.add_bytes + nbytes > 0 and self.add_bytes + nbytes + pb > bytes_max:
                m.REQUESTS_TOTAL.labels("add", "ETOOMANYREQUESTS").inc()
                statuses[i] = int(Status.ETOOMANYREQUESTS)
                continue
            if one and fast:
                state = ledgers_get(lid)
                if (state is not None and not state.fenced and state.master_key is not None and key is not None
                        and compare(state.master_key, key)):
                    checked = check_structure(blob)
                    if checked.__class__ is tuple and checked[1] == lid and 0 <= checked[2] <= eid_max:
                        eid = checked[2]
                        if sync_one and not need_sync and not flags & _DEFERRED_SYNC:
                            need_sync = True
                        nbytes += pb
                        accepted.append((i, lid, eid, checked[3]))
                        lids.append(lid)
                        eids.append(eid)
                        blobs.append(bytes(blob))
                        continue
            if part is None:
                part = parts[i]
            admitted = self._admit_add(part, meta)
            if isinstance(admitted, Status):
                m.REQUESTS_TOTAL.labels("add", admitted.name).inc()
                statuses[i] = int(admitted)
                continue
            entry_ids, max_lac, sync = admitted
            need_sync = need_sync or sync
            nbytes += pb
            accepted.append((i, lid, entry_ids[0] if one else entry_ids, max_lac))
            if one:
                lids.append(lid)
                eids.append(entry_ids[0])
                blobs.append(bytes(blob))
            else:
                lids.extend([lid] * len(entry_ids))
                eids.extend(entry_ids)
                blobs.extend([bytes(b) for b in part.entries])
        if not accepted:
            self._reply_multi(ident, req.rid, statuses)
            return
        batch = self._next()
        assert self.outbox is not None
        if meta:  # the master keys of the request's new ledgers: durable before the ack
            self.outbox.send("journal", JournalMeta(batch, meta))
            need_sync = True
        self.add_bytes += nbytes
        self.adds[batch] = PendingAdd(ident, req.rid, -1, eids, -1, now, need_sync, nbytes,
                                      syncs=self._syncs(bool(meta)), parts=accepted, statuses=statuses)
        self.outbox.send("entrylogger", AppendBatch(batch, -1, eids, blobs, self.journal_write_data, lids))

    def _reply_multi(self, ident: bytes, rid: int, statuses: bytearray) -> None:
        self.reply(ident, encode_multi_add_statuses(rid, statuses))

    @property
    def in_flight(self) -> int:
        """Requests accepted and not yet answered (waiting for another actor, or polling)."""
        return len(self.adds) + len(self.reads) + len(self.meta_waiters) + self.long_polls

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
        """``key`` as the one object of its value this bookie keeps (up to _SHARED_KEYS_MAX
        distinct keys; beyond that a ledger keeps its own)."""
        shared = self.keys.get(key)
        if shared is not None:
            return shared
        key = bytes(key)
        if len(self.keys) < _SHARED_KEYS_MAX:
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

    # ADD_ENTRY ---------------------------------------------------------------------------
    def _admit_add(self, req: w.AddRequest,
                   meta: list[tuple[int, int, int, bytes]]) -> tuple[list[int], int, bool] | Status:
        """The checks of an add (read-only, master key, fencing, entry headers). Refused: the
        status to answer, and nothing changed. Accepted: (entry ids, max LAC, whether the ack
        waits for the journal fsync); a new ledger's state is created and its master-key
        record appended to ``meta`` (the caller journals ``meta`` before the entries)."""
        if self.read_only:  # recovery adds too: a full disk takes no more writes (limbo repair is local)
            return Status.EREADONLY
        lid = req.ledger_id
        state = self.ledgers.get(lid)
        if not self._check_key(state, req.master_key):
            return Status.EUA
        flags = int(req.flags)  # int ops: IntFlag's & is Python code
        if state is not None and state.fenced and not flags & _RECOVERY_ADD:
            return Status.EFENCED  # a limbo ledger is fenced too (BP-46 phase one)
        entry_ids: list[int] = []
        max_lac = -1
        for blob in req.entries:
            checked = check_structure(blob)  # peek_entry_header without its exception
            if isinstance(checked, str):
                return Status.EBADREQ
            _, b_lid, eid, lac, _, _ = checked
            if b_lid != lid or not 0 <= eid <= limits.entry_id_max:
                return Status.EBADREQ
            entry_ids.append(eid)
            if lac > max_lac:
                max_lac = lac
        if state is None or state.master_key is None:
            self._ensure_ledger(lid, req.master_key, meta)
        # DEFERRED_SYNC: acknowledged once appended; durable after the next group commit,
        # and certainly after a FORCE_LEDGER (which queues behind this add's records).
        return entry_ids, max_lac, self.journal_write_data and not (flags & _DEFERRED_SYNC)

    def _on_add(self, ident: bytes, req: w.AddRequest, now: float) -> None:
        meta: list[tuple[int, int, int, bytes]] = []
        admitted = self._admit_add(req, meta)
        if isinstance(admitted, Status):
            self._error(ident, req, admitted)
            return
        entry_ids, max_lac, need_sync = admitted
        lid = req.ledger_id
        batch = self._next()
        assert self.outbox is not None
        if meta:
            # The master key of a new ledger must be durable before its first add is acked.
            # It goes straight to the journal; the add's own records follow it through the
            # EntryLogger, and one commit covers everything received before it.
            self.outbox.send("journal", JournalMeta(batch, meta))
            need_sync = True
        nbytes = _blob_bytes(req)
        self.add_bytes += nbytes
        self.adds[batch] = PendingAdd(ident, req.rid, lid, entry_ids, max_lac, now, need_sync, nbytes,
                                      syncs=self._syncs(bool(meta)))
        self.outbox.send("entrylogger", AppendBatch(batch, lid, entry_ids, [bytes(b) for b in req.entries], self.journal_write_data))

    def _syncs(self, meta: bool) -> int:
        """How many Synced an add batch gets: one per journal message sent under its id."""
        return int(meta) + int(self.journal_write_data)

    def _on_appended(self, msg: Appended, now: float) -> None:
        p = self.adds.get(msg.batch_id)
        assert p is not None, msg.batch_id
        if msg.error:
            p.failed = Status.EIO
            if msg.no_space and self.read_only_mode_enabled:
                was = self.read_only
                self.disk_full = True
                self._state_changed(was)
                p.failed = Status.EREADONLY
        else:
            self._hold_put(msg)
        p.appended = True
        self._maybe_complete_add(msg.batch_id, p, now)

    def _maybe_complete_add(self, batch: int, p: PendingAdd, now: float) -> None:
        if not p.appended or (p.need_sync and not p.synced and p.failed is None):
            return
        del self.adds[batch]
        self.add_bytes -= p.nbytes
        if p.parts is not None:
            self._complete_multi(p, now)
            return
        status = p.failed or Status.EOK
        if status == Status.EOK:
            state = self.ledgers[p.ledger_id]
            last = max(p.entry_ids)
            if last > state.last_entry_id:
                state.last_entry_id = last
            if p.max_lac > state.lac:
                self._advance_lac(p.ledger_id, state, p.max_lac, now)
            m.ENTRIES_ADDED_TOTAL.inc(len(p.entry_ids))
        seconds, requests = m.add_outcome(status)
        seconds.observe(max(0.0, now - p.started))
        requests.inc()
        self.reply(p.ident, encode(w.AddResponse(rid=p.rid, status=status, ledger_id=p.ledger_id,
                                                 first_entry_id=p.entry_ids[0], last_entry_id=p.entry_ids[-1])))

    def _complete_multi(self, p: PendingAdd, now: float) -> None:
        """Every accepted part of a MULTI_ADD gets what its ADD_ENTRY would have got."""
        assert p.parts is not None and p.statuses is not None
        status = p.failed or Status.EOK
        code, ok = int(status), status == Status.EOK
        statuses, ledgers = p.statuses, self.ledgers
        if ok:  # the accepted parts' statuses are EOK (0) already
            for _, lid, entry_ids, max_lac in p.parts:
                state = ledgers[lid]
                last = entry_ids if isinstance(entry_ids, int) else max(entry_ids)
                if last > state.last_entry_id:
                    state.last_entry_id = last
                if max_lac > state.lac:
                    state.lac = max_lac
                    if state.waiters:  # long polls waiting for this LAC
                        self._advance_lac(lid, state, max_lac, now)
        else:
            for i, _, _, _ in p.parts:
                statuses[i] = code
        seconds, requests = m.add_outcome(status)
        _observe_many(seconds, max(0.0, now - p.started), len(p.parts))
        requests.inc(len(p.parts))
        if ok:
            m.ENTRIES_ADDED_TOTAL.inc(len(p.entry_ids))
        self._reply_multi(p.ident, p.rid, statuses)

    def _on_synced(self, msg: Synced, now: float) -> None:
        for batch in msg.batch_ids:
            p = self.adds.get(batch)
            if p is not None:
                p.syncs -= 1
                if p.syncs <= 0:
                    p.synced = True
                    self._maybe_complete_add(batch, p, now)
                continue
            waiter = self.meta_waiters.pop(batch, None)
            if waiter is not None:
                self._after_meta_synced(waiter, now)

    # READ_ENTRY / READ_LAC with fencing ---------------------------------------------------
    def _fence_then(self, ident: bytes, req: Any, now: float) -> bool:
        """Fence the ledger if asked. Returns True if the request continues now, False if it
        waits for the fence record to be fsynced (or was answered with an error)."""
        lid = req.ledger_id
        state = self.ledgers.get(lid)
        if not self._check_key(state, req.master_key):
            self._error(ident, req, Status.EUA)
            return False
        if state is not None and state.fenced:
            return True
        records: list[tuple[int, int, int, bytes]] = []
        state = self._ensure_ledger(lid, req.master_key, records)
        state.fenced = True
        records.append((int(RecordType.FENCE), lid, -1, b""))
        assert self.outbox is not None
        self._to_index(HeaderUpdate(lid, fenced=True))
        batch = self._next()
        self.meta_waiters[batch] = PendingRead(ident, req, now)
        self.outbox.send("journal", JournalMeta(batch, records))
        # A fenced ledger's per-ledger entry log can be rotated (BP-32).
        self.outbox.send("entrylogger", WriteClose(lid))
        return False

    def _after_meta_synced(self, waiter: PendingRead, now: float) -> None:
        req = waiter.req
        if isinstance(req, w.ReadRequest):
            self._start_read(waiter.ident, req, waiter.started)
        elif isinstance(req, w.ReadLacRequest):
            self._reply_lac(waiter.ident, req)
        else:  # WriteLac / Force: plain acknowledgement
            self._ok(waiter.ident, req)

    def _key_refused(self, ident: bytes, req: Any) -> bool:
        """A plain read may carry the master key; if it does, it must be the right one."""
        if req.master_key is None or self._check_key(self.ledgers.get(req.ledger_id), req.master_key):
            return False
        self._error(ident, req, Status.EUA)
        return True

    def _on_read(self, ident: bytes, req: w.ReadRequest, now: float) -> None:
        if req.flags & w.ReadFlag.FENCE:
            if not self._fence_then(ident, req, now):
                return
        elif self._key_refused(ident, req):
            return
        state = self.ledgers.get(req.ledger_id)
        if req.flags & w.ReadFlag.LONG_POLL and state is not None and state.lac <= req.previous_lac:
            timeout = min(req.timeout_ms, limits.long_poll_timeout_ms_max) / 1000.0
            if state.waiters is None:
                state.waiters = []
            state.waiters.append(LongPoll(ident, req, now + timeout, now))
            self.long_polls += 1
            self.polling.add(req.ledger_id)
            return
        self._start_read(ident, req, now)

    def _start_read(self, ident: bytes, req: w.ReadRequest, started: float) -> None:
        lid = req.ledger_id
        state = self.ledgers.get(lid)
        first, count = req.first_entry_id, req.count
        if req.flags & w.ReadFlag.LONG_POLL:
            first = req.previous_lac + 1
            count = max(0, min(count, (state.lac if state else -1) - req.previous_lac))
            if count == 0:
                self._reply_read(ident, req, [], lid_known=state is not None, started=started)
                return
        if state is None:
            # Never seen: an explicit negative, unless we can not be sure (no limbo state
            # can exist for an unknown ledger: phase one creates the state of every ledger).
            self._reply_read(ident, req, [], lid_known=False, started=started)
            return
        ctx = self._next()
        self.reads[ctx] = PendingRead(ident, req, started)
        self._to_index(Lookup(ctx, lid, first, count, limits.read_response_bytes_max,
                              sparse=bool(req.flags & w.ReadFlag.SPARSE)))

    def _on_read_result(self, msg: ReadResult, now: float) -> None:
        p = self.reads.pop(msg.ctx)
        if msg.error:
            # The entries before the damaged one, and EIO for the damaged one: the status of
            # a read response is that of the first entry not returned (docs/protocol.md).
            self._finish_read(p.ident, p.req, Status.EIO, msg.blobs, p.started, now)
            return
        self._reply_read(p.ident, p.req, msg.blobs, lid_known=msg.ledger_known or msg.ledger_id in self.ledgers,
                         started=p.started, now=now)

    def _reply_read(self, ident: bytes, req: w.ReadRequest, blobs: Sequence[bytes | memoryview], *, lid_known: bool,
                    started: float, now: float | None = None) -> None:
        state = self.ledgers.get(req.ledger_id)
        if blobs:
            status = Status.EOK
        elif state is not None and state.limbo:
            status = Status.EUNKNOWN  # BP-46: we may have lost it, so we can not say "absent"
        else:
            status = Status.ENOENTRY if lid_known else Status.ENOLEDGER
        self._finish_read(ident, req, status, blobs, started, now if now is not None else started)

    def _finish_read(self, ident: bytes, req: w.ReadRequest, status: Status, blobs: Sequence[bytes | memoryview],
                     started: float, now: float) -> None:
        state = self.ledgers.get(req.ledger_id)
        lac = state.lac if state else -1
        m.READ_ENTRY_SECONDS.labels(status.name).observe(max(0.0, now - started))
        m.REQUESTS_TOTAL.labels("read", status.name).inc()
        first = req.previous_lac + 1 if req.flags & w.ReadFlag.LONG_POLL else req.first_entry_id
        self.reply(ident, encode(w.ReadResponse(rid=req.rid, status=status, ledger_id=req.ledger_id,
                                                first_entry_id=first, lac=lac, entries=blobs)))

    def _advance_lac(self, lid: int, state: LedgerState, lac: int, now: float) -> None:
        state.lac = lac
        if state.waiters:
            ready = [wt for wt in state.waiters if wt.req.previous_lac < lac]
            state.waiters = [wt for wt in state.waiters if wt.req.previous_lac >= lac] or None
            self.long_polls -= len(ready)
            if not state.waiters:
                self.polling.discard(lid)
            for wt in ready:
                self._start_read(wt.ident, wt.req, wt.started)

    def _on_read_lac(self, ident: bytes, req: w.ReadLacRequest, now: float) -> None:
        if req.flags & w.ReadFlag.FENCE:
            if not self._fence_then(ident, req, now):
                return
        elif self._key_refused(ident, req):
            return
        self._reply_lac(ident, req)

    def _reply_lac(self, ident: bytes, req: w.ReadLacRequest) -> None:
        state = self.ledgers.get(req.ledger_id)
        if state is None:
            status, lac = Status.ENOLEDGER, -1
        else:
            status, lac = Status.EOK, state.lac
        m.REQUESTS_TOTAL.labels("read_lac", status.name).inc()
        self.reply(ident, encode(w.ReadLacResponse(rid=req.rid, status=status, ledger_id=req.ledger_id, lac=lac)))

    # Other ops ------------------------------------------------------------------------------
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

    def _on_write_lac(self, ident: bytes, req: w.WriteLacRequest, now: float) -> None:
        state = self._known(ident, req, req.master_key)
        if state is None:
            return
        if req.lac > state.lac:
            self._advance_lac(req.ledger_id, state, req.lac, now)
        assert self.outbox is not None
        self._to_index(HeaderUpdate(req.ledger_id, explicit_lac=state.lac))
        batch = self._next()
        self.meta_waiters[batch] = PendingRead(ident, req, now)
        self.outbox.send("journal", JournalMeta(batch, [(int(RecordType.EXPLICIT_LAC), req.ledger_id, state.lac, b"")]))

    def _on_force(self, ident: bytes, req: w.ForceLedgerRequest, now: float) -> None:
        # FORCE_LEDGER carries no master key (it only waits for durability, changes nothing).
        if req.ledger_id not in self.ledgers:
            self._error(ident, req, Status.ENOLEDGER)
            return
        batch = self._next()
        self.meta_waiters[batch] = PendingRead(ident, req, now)
        assert self.outbox is not None
        self.outbox.send("entrylogger", ForceJournal(batch, flush_logs=not self.journal_write_data))

    def _on_write_close(self, ident: bytes, req: w.WriteCloseRequest, now: float) -> None:
        if self._known(ident, req, req.master_key) is None:
            return
        assert self.outbox is not None
        self.outbox.send("entrylogger", WriteClose(req.ledger_id))
        self._ok(ident, req)

    def _on_info(self, ident: bytes, req: w.BookieInfoRequest, now: float) -> None:
        used, total = self.disk_usage
        m.REQUESTS_TOTAL.labels("bookie_info", "EOK").inc()
        self.reply(ident, encode(w.BookieInfoResponse(
            rid=req.rid, status=Status.EOK, free_bytes=max(0, total - used), total_bytes=total,
            state="readonly" if self.read_only else "writable", ledgers=len(self.ledgers),
            limbo_ledgers=sum(1 for s in self.ledgers.values() if s.limbo))))

    def _on_list_entries(self, ident: bytes, req: w.ListEntriesRequest, now: float) -> None:
        state = self.ledgers.get(req.ledger_id)
        if state is None:
            self._error(ident, req, Status.ENOLEDGER)
            return
        ctx = self._next()
        self.reads[ctx] = PendingRead(ident, req, now)
        self._to_index(ListEntries(ctx, req.ledger_id))

    def _on_clear_limbo(self, ident: bytes, req: w.ClearLimboRequest, now: float) -> None:
        """BP-46 phase two finished for this ledger here (the repairer recovered it and
        copied every entry this bookie lacked): clear limbo, journaled and fsynced before
        the answer, so a restart never brings back a limbo the repairer saw cleared."""
        state = self._known(ident, req, req.master_key)
        if state is None:
            return
        if not state.limbo:
            self._ok(ident, req)
            return
        batch = self._next()
        self.meta_waiters[batch] = PendingRead(ident, req, now)
        self._clear_limbo(req.ledger_id, state, batch)

    def _clear_limbo(self, lid: int, state: LedgerState, batch: int) -> None:
        state.limbo = False
        assert self.outbox is not None
        self._to_index(HeaderUpdate(lid, limbo=False))
        # A LIMBO record with entry id 0 clears limbo at replay (1 sets it).
        self.outbox.send("journal", JournalMeta(batch, [(int(RecordType.LIMBO), lid, 0, b"")]))
        self._publish_counts()

    def _on_entry_list(self, msg: EntryList, now: float) -> None:
        p = self.reads.pop(msg.ctx)
        state = self.ledgers.get(msg.ledger_id)
        status = Status.EOK
        if msg.error:
            status = Status.EIO  # a damaged index: no list is better than a wrong one
        elif not msg.ranges and state is not None and state.limbo:
            status = Status.EUNKNOWN
        m.REQUESTS_TOTAL.labels("list_entries", status.name).inc()
        self.reply(p.ident, encode(w.ListEntriesResponse(rid=p.req.rid, status=status, ledger_id=msg.ledger_id,
                                                         entry_ranges=tuple(msg.ranges))))

    _handlers: dict[type, Callable[..., None]] = {
        w.AddRequest: _on_add,
        w.ReadRequest: _on_read,
        w.ReadLacRequest: _on_read_lac,
        w.WriteLacRequest: _on_write_lac,
        w.ForceLedgerRequest: _on_force,
        w.WriteCloseRequest: _on_write_close,
        w.BookieInfoRequest: _on_info,
        w.ListEntriesRequest: _on_list_entries,
        w.ClearLimboRequest: _on_clear_limbo,
    }

    # -- index backpressure -------------------------------------------------------------------
    def _hold(self, ident: bytes, req: Any, now: float) -> None:
        """Keep an add until the index is back under its bound (IndexPressure), in arrival
        order; refuse it when the held adds are at their bounds."""
        size = sum(map(_blob_bytes, req.parts)) if type(req) is w.MultiAddRequest else _blob_bytes(req)
        if (len(self.held) >= limits.server_held_adds_max
                or (self.held and self.held_bytes + size > limits.server_held_add_bytes_max)):
            self._refuse(ident, req)
            return
        self.held.append((ident, req, now, size))
        self.held_bytes += size
        m.ADDS_HELD.set(len(self.held))

    def _on_index_pressure(self, on: bool, now: float) -> None:
        self.index_pressure = on
        while self.held and not self.index_pressure:
            ident, req, _, size = self.held.popleft()
            self.held_bytes -= size
            self._dispatch(ident, req, now)
        m.ADDS_HELD.set(len(self.held))

    # -- messages from the other actors ----------------------------------------------------
    def on_message(self, msg: Any, now: float) -> None:
        if isinstance(msg, IndexPressure):
            self._on_index_pressure(msg.on, now)
        elif isinstance(msg, Appended):
            self._on_appended(msg, now)
        elif isinstance(msg, Synced):
            self._on_synced(msg, now)
        elif isinstance(msg, ReadResult):
            self._on_read_result(msg, now)
        elif isinstance(msg, EntryList):
            self._on_entry_list(msg, now)
        elif isinstance(msg, CheckpointReady):
            self._to_index(Checkpoint(msg.cp_id, msg.mark))
        elif isinstance(msg, CheckpointDone):
            self.last_checkpoint = msg.mark
        elif isinstance(msg, tuple) and msg and msg[0] == "admin":
            self._on_admin(msg)
        elif isinstance(msg, (DeleteLedgers, LocalLedgersRequest, LiveCheck, Relocate)):
            self._on_gc_message(msg, now)
        else:
            raise AssertionError(f"server: unexpected message {msg!r}")

    def _on_admin(self, msg: tuple[Any, ...]) -> None:
        if msg[1] == "read_only":
            self.set_forced_read_only(bool(msg[2]))
        elif msg[1] == "clear_limbo":
            state = self.ledgers.get(msg[2])
            if state is not None and state.limbo:
                self._clear_limbo(msg[2], state, self._next())  # nobody waits for its fsync
        else:
            raise AssertionError(msg)

    def on_tick(self, now: float) -> None:
        """Send the held index updates; expire long polls: answer them with the current LAC
        and no entries."""
        self.send_held_puts()
        for lid in list(self.polling):
            state = self.ledgers[lid]
            keep = []
            for wt in state.waiters or ():
                if wt.deadline <= now:
                    # Nothing new in time: "entry previous_lac+1 is not here (yet)", with the LAC.
                    self._reply_read(wt.ident, wt.req, [], lid_known=True, started=wt.started, now=now)
                else:
                    keep.append(wt)
            self.long_polls -= len(state.waiters or ()) - len(keep)
            state.waiters = keep or None
            if not keep:
                self.polling.discard(lid)

    # -- garbage collection (zbk/actors/gc.py) ----------------------------------------------
    # GC messages only pass through: they go on to the IndexSyncer on the Server->IndexSyncer
    # pipe, so that they are ordered after every HeaderUpdate / IndexPut sent before them.
    def _on_gc_message(self, msg: Any, now: float) -> None:
        if isinstance(msg, DeleteLedgers):
            msg = DeleteLedgers(self._drop_ledgers(msg.ledger_ids, now))
            if not msg.ledger_ids:
                return
        self._to_index(msg)

    def _drop_ledgers(self, ledger_ids: list[int], now: float) -> list[int]:
        """Forget ledgers deleted in metadata; returns those dropped. A ledger with an add in
        flight is kept (the add's completion needs its state): the next GC run drops it."""
        busy = {p.ledger_id for p in self.adds.values()}
        for p in self.adds.values():
            if p.parts is not None:
                busy.update(part[1] for part in p.parts)
        dropped: list[int] = []
        for lid in ledger_ids:
            if lid in busy:
                log.info("server: ledger %d deleted in metadata but an add is in flight; kept for now", lid)
                continue
            state = self.ledgers.pop(lid, None)
            if state is not None:
                self.long_polls -= len(state.waiters or ())
                for wt in state.waiters or ():  # long polls on a deleted ledger end now
                    self._finish_read(wt.ident, wt.req, Status.ENOLEDGER, [], wt.started, now)
                self.polling.discard(lid)
            dropped.append(lid)
        self._publish_counts()
        return dropped


_ADDS = (w.AddRequest, w.MultiAddRequest)  # what IndexPressure holds
_OP_NAMES: dict[type, str] = {
    w.AddRequest: "add", w.ReadRequest: "read", w.ReadLacRequest: "read_lac", w.WriteLacRequest: "write_lac",
    w.ForceLedgerRequest: "force_ledger", w.WriteCloseRequest: "write_close", w.BookieInfoRequest: "bookie_info",
    w.ListEntriesRequest: "list_entries", w.ClearLimboRequest: "clear_limbo",
}


_RECOVERY_ADD = int(w.AddFlag.RECOVERY_ADD)
_DEFERRED_SYNC = int(w.AddFlag.DEFERRED_SYNC)


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
