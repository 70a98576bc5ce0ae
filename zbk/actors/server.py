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

import logging
from collections.abc import Callable
from typing import Any

from zbk import limits
from zbk.actors.base import Reply
from zbk.actors.messages import (
    Appended,
    BookieStatus,
    Checkpoint,
    CheckpointDone,
    CheckpointReady,
    DeleteLedgers,
    EntryList,
    ForceJournal,
    HeaderUpdate,
    IndexPressure,
    ListEntries,
    LiveCheck,
    LocalLedgersRequest,
    ReadResult,
    Relocate,
    SetReadOnly,
    StatusRequest,
    Synced,
    WriteClose,
)
from zbk.actors.serveradds import ServerAdds
from zbk.actors.serverbase import (
    _ADDS,
    AdminState,
    LedgerState,
    LongPoll,
    PendingAdd,
    PendingRead,
    _blob_bytes,
)
from zbk.actors.serverreads import ServerReads
from zbk.metrics import bookie as m
from zbk.storage.journal import RecordType
from zbk.wire import messages as w
from zbk.wire.codec import decode_request, encode
from zbk.wire.errors import FrameError
from zbk.wire.status import Status

__all__ = ["AdminState", "LedgerState", "LongPoll", "PendingAdd", "PendingRead", "Reply", "ServerCore"]

log = logging.getLogger(__name__)


class ServerCore(ServerAdds):
    name = "server"

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


    def _on_write_lac(self, ident: bytes, req: w.WriteLacRequest, now: float) -> None:
        state = self._known(ident, req, req.master_key)
        if state is None:
            return
        if req.lac > state.lac:
            self._advance_lac(req.ledger_id, state, req.lac, now)
        self._to_index(HeaderUpdate(req.ledger_id, explicit_lac=state.lac))
        batch = self._next()
        self.meta_waiters[batch] = PendingRead(ident, req, now)
        self._journal_meta(batch, [(int(RecordType.EXPLICIT_LAC), req.ledger_id, state.lac, b"")])

    def _on_force(self, ident: bytes, req: w.ForceLedgerRequest, now: float) -> None:
        # FORCE_LEDGER carries no master key (it only waits for durability, changes nothing).
        if req.ledger_id not in self.ledgers:
            self._error(ident, req, Status.ENOLEDGER)
            return
        batch = self._next()
        self.meta_waiters[batch] = PendingRead(ident, req, now)
        self.outbox.send("entrylogger", ForceJournal(batch, req.ledger_id, flush_logs=not self.journal_write_data))

    def _on_write_close(self, ident: bytes, req: w.WriteCloseRequest, now: float) -> None:
        if self._known(ident, req, req.master_key) is None:
            return
        self.outbox.send("entrylogger", WriteClose(req.ledger_id))
        self._ok(ident, req)

    def _on_info(self, ident: bytes, req: w.BookieInfoRequest, now: float) -> None:
        s = self.status()
        m.REQUESTS_TOTAL.labels("bookie_info", "EOK").inc()
        self.reply(ident, encode(w.BookieInfoResponse(
            rid=req.rid, status=Status.EOK, free_bytes=max(0, s.disk_total_bytes - s.disk_used_bytes),
            total_bytes=s.disk_total_bytes, state="readonly" if s.read_only else "writable", ledgers=s.ledgers,
            limbo_ledgers=s.limbo_ledgers)))

    def status(self) -> BookieStatus:
        """What BOOKIE_INFO and the admin API report (a copy: it may go to another thread)."""
        used, total = self.disk_usage
        return BookieStatus(read_only=self.read_only, ledgers=len(self.ledgers),
                            limbo_ledgers=sum(1 for s in self.ledgers.values() if s.limbo),
                            disk_used_bytes=used, disk_total_bytes=total)

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
        self._to_index(HeaderUpdate(lid, limbo=False))
        # A LIMBO record with entry id 0 clears limbo at replay (1 sets it).
        self._journal_meta(batch, [(int(RecordType.LIMBO), lid, 0, b"")])
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
        w.AddRequest: ServerAdds._on_add,
        w.ReadRequest: ServerReads._on_read,
        w.ReadLacRequest: ServerReads._on_read_lac,
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
            self._to_index(Checkpoint(msg.cp_id, msg.marks))
        elif isinstance(msg, CheckpointDone):
            self.last_checkpoint = msg.marks
        elif isinstance(msg, SetReadOnly):
            self.set_forced_read_only(msg.read_only)
        elif isinstance(msg, StatusRequest):
            msg.answer.set_result(self.status())
        elif isinstance(msg, (DeleteLedgers, LocalLedgersRequest, LiveCheck, Relocate)):
            self._on_gc_message(msg, now)
        else:
            raise AssertionError(f"server: unexpected message {msg!r}")

    def on_tick(self, now: float) -> None:
        """Send the held index updates; expire long polls: answer them with the current LAC
        and no entries; forget the newest entries of ledgers no longer polled."""
        self.send_held_puts()
        if self.tail:
            self.tail.expire(now)
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
            self.tail.drop(lid)
            dropped.append(lid)
        self._publish_counts()
        return dropped
