"""The Server's add path: ADD_ENTRY and MULTI_ADD, from admission to acknowledgement.

An add is acknowledged only once it is indexed (so every later read finds it) and, with
journal_write_data on, its journal records are fsynced (one Synced per journal message
sent under its batch id: per journal its ledgers belong to, zbk/actors/journals.py).
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable
from itertools import repeat
from typing import Any

from zbk import limits
from zbk.actors.journals import journals_touched
from zbk.actors.messages import (
    AppendBatch,
    Appended,
    Synced,
)
from zbk.actors.serverbase import PendingAdd, _blob_bytes, _observe_many
from zbk.actors.serverreads import ServerReads
from zbk.metrics import bookie as m
from zbk.wire import messages as w
from zbk.wire.codec import encode
from zbk.wire.entry import check_structure
from zbk.wire.status import Status

_RECOVERY_ADD = int(w.AddFlag.RECOVERY_ADD)
_DEFERRED_SYNC = int(w.AddFlag.DEFERRED_SYNC)


class ServerAdds(ServerReads):
    # MULTI_ADD (the adds of many ledgers in one request, coalesced by the client) ----------
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
        blobs: list[w.Blob] = []
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
                        blobs.append(blob)
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
                blobs.append(blob)
            else:
                lids.extend([lid] * len(entry_ids))
                eids.extend(entry_ids)
                blobs.extend(part.entries)
        if not accepted:
            self._reply_multi(ident, req.rid, statuses)
            return
        batch = self._next()
        syncs = journals_touched(lids, self.journals) if self.journal_write_data else 0
        if meta:  # the master keys of the request's new ledgers: durable before the ack
            syncs += self._journal_meta(batch, meta)
            need_sync = True
        self.add_bytes += nbytes
        p = self.adds[batch] = PendingAdd(ident, req.rid, -1, eids, -1, now, need_sync, nbytes,
                                          syncs=syncs, parts=accepted, statuses=statuses)
        tail = self.tail
        if tail:
            p.tail = [row for row in zip(lids, eids, blobs, strict=True) if row[0] in tail] or None
        unappended = self.unappended
        self._raise_lacs(p, now, behind=unappended)
        for lid in set(lids):
            unappended.setdefault(lid, {})[batch] = None
        self.outbox.send("entrylogger", AppendBatch(batch, lids, eids, blobs, self.journal_write_data))

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
        syncs = int(self.journal_write_data)  # one ledger: one journal
        if meta:
            # The master key of a new ledger must be durable before its first add is acked.
            # It goes straight to the journal; the add's own records follow it through the
            # EntryLogger, and one commit covers everything received before it.
            syncs += self._journal_meta(batch, meta)
            need_sync = True
        nbytes = _blob_bytes(req)
        self.add_bytes += nbytes
        blobs = list(req.entries)
        p = self.adds[batch] = PendingAdd(ident, req.rid, lid, entry_ids, max_lac, now, need_sync, nbytes,
                                          syncs=syncs)
        if lid in self.tail:
            p.tail = [(lid, eid, blob) for eid, blob in zip(entry_ids, blobs, strict=True)]
        self._raise_lacs(p, now, behind=self.unappended)
        self.unappended.setdefault(lid, {})[batch] = None
        self.outbox.send("entrylogger", AppendBatch(batch, [lid] * len(entry_ids), entry_ids, blobs,
                                                  self.journal_write_data))

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
            if p.tail is not None:
                put = self.tail.put
                for lid, eid, blob in p.tail:
                    put(lid, eid, blob)
            self._raise_lacs(p, now)
        p.appended = True
        self._maybe_complete_add(msg.batch_id, p, now)
        unappended, fenced_reads = self.unappended, self.fenced_reads
        for lid in ((p.ledger_id,) if p.parts is None else {part[1] for part in p.parts}):
            batches = unappended[lid]
            del batches[msg.batch_id]
            if not batches:
                del unappended[lid]
            if lid in fenced_reads:
                self._start_fenced_reads(lid)

    def _raise_lacs(self, p: PendingAdd, now: float, behind: dict[int, Any] | None = None) -> None:
        """Raise each ledger's LAC to the one the add's entries carry, once every add of the
        ledger admitted before it is appended: when the add is admitted if they all are (the
        common case: called then with ``behind``, the ledgers with an add still on its way
        to the entry log, which are left out), else when it is appended.

        That LAC is the writer's: every entry up to it was acknowledged by an ack quorum
        already, so it waits neither for this add's own append nor for its fsync, and a
        tailing reader's long poll is answered that much sooner. The entries up to it that
        this bookie holds came before this add on the writer's connection, so they are
        appended, and a read finds them (reads go behind the held index updates); one it
        lacks, the reader takes from another replica."""
        ledgers = self.ledgers
        if p.parts is None:
            lid = p.ledger_id
            state = ledgers.get(lid)
            if state is not None and p.max_lac > state.lac and (behind is None or lid not in behind):
                self._advance_lac(lid, state, p.max_lac, now)
            return
        for _, lid, _, max_lac in p.parts:
            state = ledgers.get(lid)
            if state is not None and max_lac > state.lac and (behind is None or lid not in behind):
                self._advance_lac(lid, state, max_lac, now)

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
            for _, lid, entry_ids, _ in p.parts:
                state = ledgers[lid]
                last = entry_ids if isinstance(entry_ids, int) else max(entry_ids)
                if last > state.last_entry_id:
                    state.last_entry_id = last
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
