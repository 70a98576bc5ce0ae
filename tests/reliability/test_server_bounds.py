"""The Server's bounds on work in flight, and master keys on every request that carries
one, driven without sockets (ServerCore with a recording outbox and reply)."""

from __future__ import annotations

from typing import Any

from zbk.actors.base import ListOutbox
from zbk.actors.messages import AppendBatch, Appended, JournalMeta, Synced
from zbk.actors.server import LedgerState, ServerCore
from zbk.client.digest import make_digest, master_key
from zbk.wire import messages as w
from zbk.wire.codec import decode_response, encode
from zbk.wire.entry import build_entry
from zbk.wire.ops import AddFlag, ReadFlag
from zbk.wire.status import Status

MK = master_key(b"pw")
OTHER = master_key(b"not the password")
DIGEST = make_digest("crc32c", b"pw")
NO_FLAGS = AddFlag(0)


class Harness:
    def __init__(self, **kw: Any) -> None:
        self.replies: list[Any] = []
        self.out = ListOutbox()
        self.core = ServerCore(ledgers={}, journal_write_data=True, max_frame_bytes=1 << 22,
                               reply=lambda ident, frames: self.replies.append(decode_response(frames)),
                               outbox=self.out, **kw)
        self.rid = 0

    def send(self, msg_type: type, **fields: Any) -> int:
        self.rid += 1
        self.core.on_request(b"client", encode(msg_type(rid=self.rid, **fields)), now=0.0)
        return self.rid

    def add(self, lid: int, eids: list[int], key: bytes = MK, size: int = 10, flags: AddFlag = NO_FLAGS) -> int:
        blobs = [build_entry(lid, e, e - 1, b"x" * size, DIGEST) for e in eids]
        return self.send(w.AddRequest, ledger_id=lid, master_key=key, flags=flags, entries=blobs)

    def answer(self, rid: int) -> Any:
        found = [r for r in self.replies if r.rid == rid]
        assert len(found) == 1, (rid, self.replies)
        return found[0]

    def complete_adds(self) -> None:
        """Play the EntryLogger and the journal for every add sent so far."""
        for msg in self.out.take("entrylogger", AppendBatch):
            self.core.on_message(Appended(msg.batch_id, msg.ledger_ids, msg.entry_ids, [1 << 40] * len(msg.entry_ids)),
                                 0.0)
            self.core.on_message(Synced([msg.batch_id]), 0.0)
        for msg in self.out.take("journal", JournalMeta):
            self.core.on_message(Synced([msg.batch_id]), 0.0)


def test_adds_beyond_the_pending_bound_are_too_many_requests_until_some_complete() -> None:
    h = Harness(pending_requests_max=5)
    rids = [h.add(1, [e]) for e in range(5)]
    assert h.replies == []  # all five in flight
    shed = h.add(1, [5])
    assert isinstance(h.answer(shed), w.ErrorResponse) and h.answer(shed).status == Status.ETOOMANYREQUESTS
    h.complete_adds()
    assert [h.answer(r).status for r in rids] == [Status.EOK] * 5
    assert h.core.in_flight == 0
    again = h.add(1, [5])
    h.complete_adds()
    assert h.answer(again).status == Status.EOK


def test_long_polls_count_against_the_bound_and_release_it() -> None:
    h = Harness(pending_requests_max=3)
    h.core.ledgers[7] = LedgerState(master_key=MK, lac=4)
    polls = [h.send(w.ReadRequest, ledger_id=7, first_entry_id=0, flags=ReadFlag.LONG_POLL, previous_lac=4,
                    timeout_ms=10_000) for _ in range(3)]
    assert h.replies == [] and h.core.in_flight == 3
    shed = h.send(w.ReadLacRequest, ledger_id=7)
    assert h.answer(shed).status == Status.ETOOMANYREQUESTS
    h.core.on_tick(now=11.0)  # the polls time out: answered, and no longer counted
    assert [h.answer(r).status for r in polls] == [Status.ENOENTRY] * 3
    assert h.core.in_flight == 0
    assert h.answer(h.send(w.ReadLacRequest, ledger_id=7)).status == Status.EOK


def test_bytes_of_unacknowledged_adds_are_bounded() -> None:
    h = Harness(pending_add_bytes_max=10_000)
    first = h.add(1, [0], size=6_000)  # always accepted when nothing is in flight
    shed = h.add(1, [1], size=6_000)  # 12 kB > 10 kB
    assert h.answer(shed).status == Status.ETOOMANYREQUESTS
    small = h.add(2, [0], size=1_000)  # fits beside the first
    h.complete_adds()
    assert h.answer(first).status == Status.EOK and h.answer(small).status == Status.EOK
    assert h.core.add_bytes == 0
    retry = h.add(1, [1], size=6_000)
    h.complete_adds()
    assert h.answer(retry).status == Status.EOK


def test_master_key_is_checked_on_every_request_that_carries_one() -> None:
    h = Harness()
    h.complete_adds()
    ok = h.add(3, [0, 1])
    h.complete_adds()
    assert h.answer(ok).status == Status.EOK
    state = h.core.ledgers[3]
    cases = {
        "add": h.add(3, [2], key=OTHER),
        "recovery add": h.add(3, [2], key=OTHER, flags=AddFlag.RECOVERY_ADD),
        "fencing read": h.send(w.ReadRequest, ledger_id=3, first_entry_id=0, flags=ReadFlag.FENCE, master_key=OTHER),
        "fencing read_lac": h.send(w.ReadLacRequest, ledger_id=3, flags=ReadFlag.FENCE, master_key=OTHER),
        "plain read with a key": h.send(w.ReadRequest, ledger_id=3, first_entry_id=0, master_key=OTHER),
        "read_lac with a key": h.send(w.ReadLacRequest, ledger_id=3, master_key=OTHER),
        "long poll with a key": h.send(w.ReadRequest, ledger_id=3, first_entry_id=0, flags=ReadFlag.LONG_POLL,
                                       master_key=OTHER, previous_lac=5, timeout_ms=1000),
        "write_lac": h.send(w.WriteLacRequest, ledger_id=3, master_key=OTHER, lac=1),
        "write_close": h.send(w.WriteCloseRequest, ledger_id=3, master_key=OTHER),
    }
    for what, rid in cases.items():
        assert h.answer(rid).status == Status.EUA, what
    assert not state.fenced and state.last_entry_id == 1, "a refused request changed the ledger"
    assert h.out.take("entrylogger", AppendBatch) == [] and h.out.take("journal") == []
    # The right key, or none on a plain read, is served.
    plain = h.send(w.ReadLacRequest, ledger_id=3)
    keyed = h.send(w.ReadLacRequest, ledger_id=3, master_key=MK)
    assert h.answer(plain).status == Status.EOK and h.answer(keyed).status == Status.EOK
