"""The Server's read path: READ_ENTRY and READ_LAC with fencing, and long polls.

A fencing read journals the FENCE record and answers once it is fsynced; a long poll
(READ_ENTRY with LONG_POLL) waits in its ledger's state until the LAC passes the one it
names or its deadline (ServerCore.on_tick) ends it with the current LAC and no entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zbk import limits
from zbk.actors.messages import (
    HeaderUpdate,
    Lookup,
    ReadResult,
    WriteClose,
)
from zbk.actors.serverbase import LedgerState, LongPoll, PendingRead, ServerBase
from zbk.metrics import bookie as m
from zbk.storage.journal import RecordType
from zbk.wire import messages as w
from zbk.wire.codec import encode
from zbk.wire.status import Status


class ServerReads(ServerBase):
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
        self._to_index(HeaderUpdate(lid, fenced=True))
        batch = self._next()
        self.meta_waiters[batch] = PendingRead(ident, req, now)
        self._journal_meta(batch, records)  # one ledger: one journal, one Synced
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
        if req.flags & w.ReadFlag.LONG_POLL and state is not None:
            timeout = min(req.timeout_ms, limits.long_poll_timeout_ms_max) / 1000.0
            # A followed ledger: keep its newest entries to answer the next polls with.
            self.tail.watch(req.ledger_id, now + timeout + limits.server_tail_idle_s)
            if state.lac <= req.previous_lac:
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
        if state is not None and state.fenced and lid in self.unappended:
            # An add admitted before the fence is acknowledged once it is appended and
            # synced, fence or not. A read answered before it is appended would tell a
            # recoverer the entry is not here (an explicit negative) and let it close the
            # ledger below an entry this bookie then acknowledges. So a read of a fenced
            # ledger waits for the adds admitted before it; adds admitted after it (the
            # fence admits recovery adds only) never hold it.
            newest = next(reversed(self.unappended[lid]))
            self.fenced_reads.setdefault(lid, []).append((newest, PendingRead(ident, req, started)))
            self.fenced_waiting += 1
            return
        self._read_now(ident, req, started)

    def _read_now(self, ident: bytes, req: w.ReadRequest, started: float) -> None:
        lid = req.ledger_id
        state = self.ledgers.get(lid)
        first, count = req.first_entry_id, req.count
        if req.flags & w.ReadFlag.LONG_POLL:
            first = req.previous_lac + 1
            count = max(0, min(count, (state.lac if state else -1) - req.previous_lac))
            if count == 0:
                self._reply_read(ident, req, [], lid_known=state is not None, started=started)
                return
            blobs = self.tail.take(lid, first, count, limits.read_response_bytes_max)
            if blobs:
                self._reply_read(ident, req, blobs, lid_known=True, started=started)
                return
        if state is None:
            # Never seen: an explicit negative, unless we can not be sure (no limbo state
            # can exist for an unknown ledger: phase one creates the state of every ledger).
            self._reply_read(ident, req, [], lid_known=False, started=started)
            return
        ctx = self._next()
        self.reads[ctx] = PendingRead(ident, req, started)
        self._to_index(Lookup(ctx, lid, first, count, limits.read_response_bytes_max,
                              sparse=bool(req.flags & w.ReadFlag.SPARSE), stripe=req.stripe))

    def _start_fenced_reads(self, lid: int) -> None:
        """Start the reads of ``lid`` whose adds admitted before them are all appended now."""
        batches = self.unappended.get(lid)
        oldest = next(iter(batches)) if batches else None
        ready: list[PendingRead] = []
        still: list[tuple[int, PendingRead]] = []
        for newest, r in self.fenced_reads.pop(lid):
            if oldest is None or newest < oldest:
                ready.append(r)
            else:
                still.append((newest, r))
        if still:
            self.fenced_reads[lid] = still
        self.fenced_waiting -= len(ready)
        for r in ready:
            self._read_now(r.ident, r.req, r.started)

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
                                                first_entry_id=first, lac=lac, entries=blobs,
                                                packed=req.packed and len(blobs) > 1)))

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
