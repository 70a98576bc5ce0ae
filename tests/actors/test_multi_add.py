"""MULTI_ADD inside the bookie: the accepted parts of one request travel the actors as one
unit (one AppendBatch, one Appended, one JournalAppend, one IndexPut, one reply), and every
part gets exactly the status an ADD_ENTRY of its own would get."""

from __future__ import annotations

from typing import Any

import pytest

from zbk.actors.base import ListOutbox, Reply
from zbk.actors.entrylogger import EntryLoggerCore
from zbk.actors.indexsyncer import IndexCore
from zbk.actors.journal import JournalCore
from zbk.actors.messages import (
    AppendBatch,
    Appended,
    IndexPut,
    JournalAppend,
    JournalMeta,
    Synced,
)
from zbk.actors.server import LedgerState, ServerCore
from zbk.client.digest import make_digest, master_key
from zbk.storage.entrylog import EntryLogWriter
from zbk.storage.entrylogformat import encode_records
from zbk.storage.journal import JournalWriter, RecordType, replay
from zbk.storage.ledgercache import LedgerCache
from zbk.wire import messages as w
from zbk.wire.codec import decode_response, encode
from zbk.wire.entry import build_entry
from zbk.wire.ops import AddFlag
from zbk.wire.status import Status

DIGEST = make_digest("crc32c", b"")
KEY, WRONG = master_key(b"a"), master_key(b"b")
PLAIN = AddFlag(0)


def blob(lid: int, eid: int, lac: int | None = None) -> bytes:
    return build_entry(lid, eid, eid - 1 if lac is None else lac, f"{lid}/{eid}".encode(), DIGEST)


def part(lid: int, eids: range, key: bytes = KEY, flags: AddFlag = PLAIN) -> w.AddRequest:
    return w.AddRequest(rid=0, ledger_id=lid, master_key=key, flags=flags, entries=[blob(lid, e) for e in eids])


def make(reply: Reply | None = None, **kw: Any) -> tuple[ServerCore, ListOutbox, list[tuple[bytes, list[Status]]]]:
    """A Server with ledgers 1 (plain), 2 (fenced) and 3 (limbo). Its replies are MULTI_ADD
    statuses, collected in the list returned, unless ``reply`` takes them."""
    replies: list[tuple[bytes, list[Status]]] = []

    def statuses(ident: bytes, frames: list[Any]) -> None:
        resp = decode_response([bytes(f) for f in frames])
        assert isinstance(resp, w.MultiAddResponse)
        replies.append((ident, list(resp.statuses)))

    ledgers = {
        1: LedgerState(master_key=KEY),
        2: LedgerState(master_key=KEY, fenced=True),
        3: LedgerState(master_key=KEY, fenced=True, limbo=True),  # BP-46 phase one
    }
    out = ListOutbox()
    core = ServerCore(ledgers=ledgers, journal_write_data=True, max_frame_bytes=1 << 20,
                      reply=reply or statuses, outbox=out, **kw)
    return core, out, replies


def multi(core: ServerCore, parts: list[w.AddRequest], rid: int = 7) -> None:
    req = w.MultiAddRequest(rid=rid, parts=parts)
    core.on_request(b"peer", encode(req), 0.0)


def test_parts_get_their_own_status_and_the_accepted_ones_travel_as_one_batch():
    core, out, replies = make()
    multi(core, [
        part(1, range(0, 3)),  # fine
        part(1, range(3, 4), key=WRONG),  # wrong master key: EUA
        part(2, range(0, 2)),  # fenced: EFENCED
        part(3, range(0, 1)),  # limbo (and fenced): EFENCED, never stored
        part(3, range(0, 2), flags=AddFlag.RECOVERY_ADD),  # recovery adds pass the fence
        part(9, range(5, 7)),  # new ledger: its master key is journaled first
        w.AddRequest(rid=0, ledger_id=10, master_key=KEY, flags=AddFlag(0), entries=[blob(11, 0)]),  # EBADREQ
    ])
    assert replies == []  # nothing answered before the accepted parts are indexed and fsynced
    metas = out.take("journal", JournalMeta)
    assert [r[:3] for r in metas[0].records] == [(int(RecordType.MASTER_KEY), 9, -1)]
    appends = out.take("entrylogger", AppendBatch)
    assert len(appends) == 1
    ab = appends[0]
    assert ab.ledger_ids == [1, 1, 1, 3, 3, 9, 9] and ab.entry_ids == [0, 1, 2, 0, 1, 5, 6]
    assert metas[0].batch_id == ab.batch_id

    core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, list(range(1, 8))), 0.0)
    assert replies == []  # located, not yet fsynced
    core.on_message(Synced([ab.batch_id, ab.batch_id]), 0.0)  # the master key and the entries, one commit
    assert len(replies) == 1
    core.on_tick(0.05)  # the held index update goes out with the tick
    puts = out.take("index", IndexPut)
    assert len(puts) == 1 and puts[0].ledger_ids == ab.ledger_ids and puts[0].locations == list(range(1, 8))
    ident, got = replies[0]
    assert ident == b"peer"
    assert got == [Status.EOK, Status.EUA, Status.EFENCED, Status.EFENCED, Status.EOK, Status.EOK, Status.EBADREQ]
    assert core.ledgers[1].last_entry_id == 2 and core.ledgers[1].lac == 1
    assert core.ledgers[9].last_entry_id == 6 and core.ledgers[9].master_key == KEY
    assert core.adds == {} and core.add_bytes == 0


def test_a_failed_append_fails_every_accepted_part_and_nothing_is_indexed():
    core, out, replies = make()
    multi(core, [part(1, range(0, 2)), part(2, range(0, 1)), part(4, range(0, 1))])
    ab = out.take("entrylogger", AppendBatch)[0]
    core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [], error="disk on fire"), 0.0)
    core.on_tick(0.05)
    assert out.take("index", IndexPut) == []
    assert replies[0][1] == [Status.EIO, Status.EFENCED, Status.EIO]


def test_read_only_refuses_every_part_and_nothing_is_sent():
    core, out, replies = make()
    core.set_forced_read_only(True)
    multi(core, [part(1, range(0, 1)), part(5, range(0, 1))])
    assert out.take("entrylogger") == [] and out.take("journal") == []
    assert replies[0][1] == [Status.EREADONLY, Status.EREADONLY]
    assert 5 not in core.ledgers  # a refused part creates nothing


def test_pending_bounds_refuse_parts_with_too_many_requests():
    one = len(blob(1, 0))
    core, out, replies = make(pending_add_bytes_max=2 * one)
    # The first part is always let through; the next fits; the third is over the byte bound.
    multi(core, [part(1, range(0, 1)), part(4, range(0, 1)), part(5, range(0, 1))])
    ab = out.take("entrylogger", AppendBatch)[0]
    assert ab.ledger_ids == [1, 4]
    core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [1, 2]), 0.0)
    core.on_message(Synced([ab.batch_id, ab.batch_id]), 0.0)
    assert replies[0][1] == [Status.EOK, Status.EOK, Status.ETOOMANYREQUESTS]
    assert 5 not in core.ledgers

    core, out, replies = make(pending_requests_max=1)
    multi(core, [part(1, range(0, 1))], rid=1)  # one request in flight now
    multi(core, [part(1, range(1, 2)), part(4, range(0, 1))], rid=2)
    assert replies[0][1] == [Status.ETOOMANYREQUESTS] * 2
    assert len(out.take("entrylogger", AppendBatch)) == 1


def test_entrylogger_journal_and_index_take_a_multi_ledger_batch(tmp_path):
    logs = EntryLogWriter([str(tmp_path / "ledgers")])
    el_out = ListOutbox()
    el = EntryLoggerCore(logs, outbox=el_out)
    lids, eids = [1, 1, 7, 9], [0, 1, 0, 4]
    blobs = [blob(lid, eid) for lid, eid in zip(lids, eids, strict=True)]
    el.on_message(AppendBatch(5, lids, eids, blobs, True), 0.0)
    ja = el_out.take("journal", JournalAppend)[0]
    appended = el_out.take("server", Appended)[0]
    assert ja.records == encode_records(lids, eids, blobs) and ja.count == 4
    assert appended.ledger_ids == lids and len(appended.locations) == 4
    for lid, eid, loc, b in zip(lids, eids, appended.locations, blobs, strict=True):
        assert bytes(logs.read(loc, lid, eid)) == b

    jw = JournalWriter(str(tmp_path / "journal"))
    jc_out = ListOutbox()
    jc = JournalCore(jw, outbox=jc_out, sync_data=True, group_bytes_max=1 << 20, group_wait_s=0.01)
    jc.on_message(ja, 0.0)
    jc.commit()
    assert jc_out.take("server", Synced)[0].batch_ids == [5]
    jw.close()
    recs = [(r.ledger_id, r.entry_id, bytes(r.payload)) for r, _ in replay(str(tmp_path / "journal"))
            if r.type == RecordType.ADD]
    assert recs == list(zip(lids, eids, blobs, strict=True))

    cache = LedgerCache([str(tmp_path / "index")])
    ic = IndexCore(cache, outbox=ListOutbox(), flush_interval_s=60, persist_marks=lambda marks: None)
    ic.on_message(IndexPut(lids, eids, appended.locations), 0.0)
    assert [cache.get(lid, eid) for lid, eid in zip(lids, eids, strict=True)] == appended.locations
    logs.close()


def test_a_new_ledgers_add_waits_for_the_sync_of_its_entries_not_only_of_its_master_key():
    """The master-key record and the entries' records reach the journal separately and can
    be fsynced by different group commits: the Synced of the first alone is not enough."""
    for request in ("add", "multi"):
        acks: list[Any] = []
        core, out, replies = make(reply=lambda ident, frames, acks=acks: acks.append(
            decode_response([bytes(f) for f in frames])))
        if request == "add":
            core.on_request(b"peer", encode(w.AddRequest(rid=7, ledger_id=20, master_key=KEY, flags=PLAIN,
                                                         entries=[blob(20, 0)])), 0.0)
        else:
            multi(core, [part(20, range(0, 1)), part(21, range(0, 1))])
        meta = out.take("journal", JournalMeta)[0]
        ab = out.take("entrylogger", AppendBatch)[0]
        core.on_message(Synced([meta.batch_id]), 0.0)  # a commit that held only the master key
        core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [1] * len(ab.entry_ids)), 0.0)
        assert acks == [], request  # indexed, master key durable, entries not yet fsynced
        core.on_message(Synced([ab.batch_id]), 0.0)
        assert len(acks) == 1 and acks[0].rid == 7, request


def test_observe_many_is_n_observes_of_a_histogram():
    from prometheus_client import CollectorRegistry, Histogram

    from zbk.actors.serverbase import _observe_many
    from zbk.limits import LATENCY_BUCKETS

    def samples(h: Histogram) -> dict[tuple[str, str], float]:
        return {(s.name, s.labels.get("le", "")): s.value for metric in h.collect() for s in metric.samples
                if not s.name.endswith("_created")}

    for value, n in ((0.0, 1), (0.0003, 7), (0.004, 1000), (0.25, 3), (1e9, 2)):
        many = Histogram("many_seconds", "", ["status"], buckets=LATENCY_BUCKETS, registry=CollectorRegistry())
        loop = Histogram("many_seconds", "", ["status"], buckets=LATENCY_BUCKETS, registry=CollectorRegistry())
        _observe_many(many.labels("EOK"), value, n)
        for _ in range(n):
            loop.labels("EOK").observe(value)
        got, want = samples(many), samples(loop)
        assert got.keys() == want.keys()
        for k in want:
            assert got[k] == pytest.approx(want[k]), (value, n, k)


def test_held_index_updates_go_out_before_anything_else_to_the_index_in_order():
    """Index updates of adds are held and sent as one IndexPut, always ahead of the next
    message to the IndexSyncer (a read's Lookup, a Checkpoint...), on the tick, or at a
    bound; so a read after an acknowledgement finds the entry (ordering argument 1)."""
    from zbk.actors.messages import Checkpoint, CheckpointReady, Lookup
    from zbk.wire.codec import encode

    core, out, _ = make(reply=lambda ident, frames: None)
    for eid in range(3):  # three one-entry adds to ledger 1, each located and fsynced
        core.on_request(b"peer", encode(w.AddRequest(rid=eid, ledger_id=1, master_key=KEY, flags=AddFlag(0),
                                                     entries=[blob(1, eid)])), 0.0)
        ab = out.take("entrylogger", AppendBatch)[0]
        core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [100 + eid]), 0.0)
        core.on_message(Synced([ab.batch_id]), 0.0)
    assert out.take("index") == []  # held
    core.on_request(b"peer", encode(w.ReadRequest(rid=9, ledger_id=1, first_entry_id=0, count=3)), 0.0)
    sent = out.take("index")
    assert [type(m) for m in sent] == [IndexPut, Lookup]
    assert (sent[0].ledger_ids, sent[0].entry_ids, sent[0].locations) == ([1, 1, 1], [0, 1, 2], [100, 101, 102])
    # A checkpoint's message follows the updates held before it, as a read does.
    core.on_request(b"peer", encode(w.AddRequest(rid=5, ledger_id=1, master_key=KEY, flags=AddFlag(0),
                                                 entries=[blob(1, 3)])), 0.0)
    ab = out.take("entrylogger", AppendBatch)[0]
    core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [103]), 0.0)
    core.on_message(CheckpointReady(1, ((1, 500),)), 0.0)
    sent = out.take("index")
    assert [type(m) for m in sent] == [IndexPut, Checkpoint] and sent[0].locations == [103]
    core.on_tick(1.0)
    assert out.take("index") == []  # nothing held: nothing sent


def test_held_index_updates_go_out_at_the_bound():
    from zbk import limits
    from zbk.wire.codec import encode

    core, out, _ = make(reply=lambda ident, frames: None)
    n = 0
    eid = 0
    while n < limits.server_held_index_entries_max:
        eids = list(range(eid, eid + 512))
        core.on_request(b"peer", encode(w.AddRequest(rid=eid, ledger_id=1, master_key=KEY, flags=AddFlag(0),
                                                     entries=[blob(1, e) for e in eids])), 0.0)
        ab = out.take("entrylogger", AppendBatch)[0]
        assert out.take("index") == []
        core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, eids), 0.0)
        eid += 512
        n += 512
    puts = out.take("index", IndexPut)
    assert len(puts) == 1 and puts[0].entry_ids == list(range(n)) and core.held_puts == []


@pytest.mark.parametrize("mixed", [False, True], ids=["one-entry-parts", "with-a-two-entry-part"])
def test_one_entry_parts_of_known_ledgers_are_checked_as_add_entry_checks_them(mixed):
    """With thousands of ledgers every part holds one entry of a ledger the bookie knows: the
    Server takes those on a fast path. Each check of ADD_ENTRY still applies to them: a wrong
    key, a blob of another ledger or a garbled one, a fenced ledger (recovery adds
    pass), read-only; and the ack waits for the fsync unless every accepted part is
    DEFERRED_SYNC. Every status is compared with that of the same part sent alone. When
    every part has one entry the Server reads them from the decoder's columns
    (PackedParts.ones); one part of two entries takes it through the part objects."""
    good = len(blob(1, 0))
    cases = [
        part(1, range(0, 1)),  # fine
        part(1, range(1, 2), key=WRONG),  # EUA
        w.AddRequest(rid=0, ledger_id=1, master_key=KEY, flags=PLAIN, entries=[blob(4, 0)]),  # EBADREQ
        w.AddRequest(rid=0, ledger_id=1, master_key=KEY, flags=PLAIN, entries=[b"\x01" * good]),  # EBADREQ
        part(2, range(0, 1)),  # fenced: EFENCED
        part(2, range(0, 1), flags=AddFlag.RECOVERY_ADD),  # recovery add: EOK
        part(1, range(1, 2), flags=AddFlag.DEFERRED_SYNC),  # EOK
    ]
    if mixed:
        cases.append(part(1, range(2, 4)))  # EOK
    alone: list[Status] = []
    for c in cases:
        acks: list[Any] = []
        core, out, replies = make(reply=lambda ident, frames, acks=acks: acks.append(
            decode_response([bytes(f) for f in frames])))
        core.on_request(b"peer", encode(w.AddRequest(rid=3, ledger_id=c.ledger_id, master_key=c.master_key,
                                                     flags=c.flags, entries=c.entries)), 0.0)
        for ab in out.take("entrylogger", AppendBatch):
            core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [1]), 0.0)
            core.on_message(Synced([ab.batch_id]), 0.0)
        alone.append(acks[0].status)
    assert alone == [Status.EOK, Status.EUA, Status.EBADREQ, Status.EBADREQ, Status.EFENCED, Status.EOK, Status.EOK,
                     *([Status.EOK] if mixed else [])]

    core, out, replies = make()
    multi(core, cases)
    ab = out.take("entrylogger", AppendBatch)[0]
    assert ab.ledger_ids == [1, 2, 1, *([1, 1] if mixed else [])]
    assert ab.entry_ids == [0, 0, 1, *([2, 3] if mixed else [])]
    core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, list(range(1, len(ab.entry_ids) + 1))), 0.0)
    assert replies == []  # the plain parts wait for the fsync
    core.on_message(Synced([ab.batch_id]), 0.0)
    assert replies[0][1] == alone
    assert core.ledgers[1].last_entry_id == (3 if mixed else 1)
    assert core.ledgers[1].lac == (2 if mixed else 0)

    # Only DEFERRED_SYNC parts: acknowledged once appended, as an ADD_ENTRY of them would be.
    core, out, replies = make()
    multi(core, [part(1, range(0, 1), flags=AddFlag.DEFERRED_SYNC), part(1, range(1, 2), flags=AddFlag.DEFERRED_SYNC)])
    ab = out.take("entrylogger", AppendBatch)[0]
    core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [1, 2]), 0.0)
    assert replies and replies[0][1] == [Status.EOK, Status.EOK]

    # Read-only: every part refused, the fast path included.
    core, out, replies = make()
    core.set_forced_read_only(True)
    multi(core, [part(1, range(0, 1)), part(1, range(1, 2))])
    assert replies[0][1] == [Status.EREADONLY, Status.EREADONLY] and out.take("entrylogger") == []


def test_a_multi_add_that_advances_the_lac_answers_the_long_polls_waiting_for_it():
    """A long poll on ledger 1 waits for a LAC above 0; a MULTI_ADD whose part carries LAC 1
    (entry 3) starts its read once admitted, since every earlier add of the ledger is
    appended, before its own append and fsync (that LAC is the writer's, acknowledged by a
    quorum already), and one carrying LAC 0 does not. Entry 1 came before the ledger was
    first polled, so the Server does not hold it (zbk/actors/tailcache.py): the read is a
    lookup by the IndexSyncer."""
    from zbk.actors.messages import Lookup
    from zbk.wire.ops import ReadFlag

    core, out, replies = make()
    core.ledgers[1].lac = 0

    def add(eid: int, lac: int, woken: bool) -> None:
        one = w.AddRequest(rid=0, ledger_id=1, master_key=KEY, flags=PLAIN, entries=[blob(1, eid, lac)])
        multi(core, [one, part(4, range(eid, eid + 1))])
        assert [lk.ledger_id for lk in out.take("index", Lookup)] == ([1] if woken else [])
        assert core.long_polls == (0 if woken else 1)
        ab = out.take("entrylogger", AppendBatch)[0]
        core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [1, 2]), 0.0)
        assert out.take("index", Lookup) == []
        core.on_message(Synced([ab.batch_id, ab.batch_id]), 0.0)
        assert out.take("index", Lookup) == []

    multi(core, [part(1, range(1, 2)), part(4, range(0, 1))])  # LAC 0, before any poll
    ab = out.take("entrylogger", AppendBatch)[0]
    core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [1, 2]), 0.0)
    core.on_message(Synced([ab.batch_id, ab.batch_id]), 0.0)
    core.on_request(b"reader", encode(w.ReadRequest(rid=5, ledger_id=1, first_entry_id=1, count=1,
                                                    flags=ReadFlag.LONG_POLL, previous_lac=0,
                                                    timeout_ms=10_000)), 0.0)
    assert core.long_polls == 1 and out.take("index", Lookup) == []
    add(2, 0, woken=False)
    add(3, 1, woken=True)
    assert core.ledgers[1].lac == 1 and core.ledgers[1].last_entry_id == 3


def test_ledgers_of_one_password_share_one_master_key_object():
    """New ledgers keep the bookie's one object of their key's value (and the states a bookie
    boots with are shared likewise), not the decoder's copy of each part's key; another key
    stays apart and a wrong key is still refused."""
    core, out, replies = make()
    other = master_key(b"other")
    multi(core, [part(20, range(0, 1)), part(21, range(0, 1)), part(22, range(0, 1), key=other)])
    ab = out.take("entrylogger", AppendBatch)[0]
    core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [1, 2, 3]), 0.0)
    core.on_message(Synced([ab.batch_id, ab.batch_id]), 0.0)
    assert replies[-1][1] == [Status.EOK] * 3
    states = core.ledgers
    assert states[20].master_key == states[21].master_key == KEY and states[22].master_key == other
    assert states[20].master_key is states[21].master_key is states[1].master_key
    assert states[22].master_key is not states[20].master_key
    multi(core, [part(21, range(1, 2), key=WRONG), part(22, range(1, 2), key=KEY)], rid=8)
    assert replies[-1][1] == [Status.EUA, Status.EUA]

    booted = ServerCore(ledgers={1: LedgerState(master_key=KEY[:1] + KEY[1:]), 2: LedgerState(master_key=KEY[:1] + KEY[1:]),
                                 3: LedgerState()}, journal_write_data=True, max_frame_bytes=1 << 20,
                        reply=lambda ident, frames: None, outbox=ListOutbox())
    assert booted.ledgers[1].master_key is booted.ledgers[2].master_key and booted.ledgers[3].master_key is None
