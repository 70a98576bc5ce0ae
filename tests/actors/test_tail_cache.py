"""The Server's cache of the newest entries of long-polled ledgers (zbk/actors/tailcache.py).

* A long poll woken by the add that raises its ledger's LAC is answered at once, from
  memory, with every entry up to that LAC: no lookup by the IndexSyncer.
* Only what this bookie appended is answered from memory: entries from before the ledger
  was first polled, an add whose append failed, entries pushed out by the bounds, and a
  ledger no longer polled all go to the IndexSyncer, as before.
* The cache itself: contiguous answers, its bounds per ledger and in all, expiry, drops.
"""

from __future__ import annotations

from typing import Any

from zbk.actors.base import ListOutbox
from zbk.actors.messages import AppendBatch, Appended, DeleteLedgers, Lookup, Synced
from zbk.actors.server import LedgerState, ServerCore
from zbk.actors.tailcache import TailCache
from zbk.client.digest import make_digest, master_key
from zbk.limits import server_tail_entries_max, server_tail_idle_s
from zbk.wire import messages as w
from zbk.wire.codec import decode_response, encode
from zbk.wire.entry import build_entry
from zbk.wire.ops import AddFlag, ReadFlag
from zbk.wire.status import Status

DIGEST = make_digest("crc32c", b"")
KEY = master_key(b"a")
LID = 1


def blob(eid: int, lac: int) -> bytes:
    return build_entry(LID, eid, lac, f"entry {eid}".encode(), DIGEST)


class Bookie:
    """A ServerCore with ledger 1, whose other actors are played by the test."""

    def __init__(self) -> None:
        self.out = ListOutbox()
        self.replies: list[Any] = []
        self.core = ServerCore(ledgers={LID: LedgerState(master_key=KEY)}, journal_write_data=True,
                               max_frame_bytes=1 << 24, outbox=self.out,
                               reply=lambda _ident, frames: self.replies.append(
                                   decode_response([bytes(f) for f in frames])))
        self.rid = 0

    def add(self, eid: int, lac: int, *, fail: bool = False, now: float = 0.0) -> None:
        """Entry ``eid`` carrying ``lac``, appended (or failing to be) and fsynced."""
        self.rid += 1
        req = w.AddRequest(rid=self.rid, ledger_id=LID, master_key=KEY, flags=AddFlag(0), entries=[blob(eid, lac)])
        self.core.on_request(b"writer", encode(req), now)
        (ab,) = self.out.take("entrylogger", AppendBatch)
        self.core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [0] * len(ab.entry_ids),
                                      error="I/O error" if fail else ""), now)
        self.core.on_message(Synced([ab.batch_id]), now)

    def poll(self, previous_lac: int, *, now: float = 0.0, timeout_ms: int = 1000) -> None:
        self.rid += 1
        req = w.ReadRequest(rid=self.rid, ledger_id=LID, first_entry_id=previous_lac + 1, count=4096,
                            flags=ReadFlag.LONG_POLL, previous_lac=previous_lac, timeout_ms=timeout_ms)
        self.core.on_request(b"reader", encode(req), now)

    def reads(self) -> list[w.ReadResponse]:
        got = [r for r in self.replies if isinstance(r, w.ReadResponse)]
        self.replies = [r for r in self.replies if not isinstance(r, w.ReadResponse)]
        return got

    def lookups(self) -> list[Lookup]:
        return self.out.take("index", Lookup)


def test_a_woken_long_poll_is_answered_from_memory_with_every_entry_up_to_the_lac() -> None:
    b = Bookie()
    b.add(0, -1)
    b.poll(-1)  # the LAC is -1: the poll waits
    assert b.reads() == [] and b.core.long_polls == 1
    b.add(1, -1)  # carries no new LAC: still waiting
    assert b.reads() == [] and b.core.long_polls == 1
    b.add(2, 1)  # LAC 1: entry 0 came before the first poll, so the index answers
    assert [lk.first_entry_id for lk in b.lookups()] == [0] and b.reads() == []
    b.core.reads.clear()
    b.poll(1)
    b.add(3, 2)
    (resp,) = b.reads()  # entry 2, from memory
    assert resp.status == Status.EOK and resp.first_entry_id == 2 and resp.lac == 2
    assert [bytes(e) for e in resp.entries] == [blob(2, 1)]
    b.add(4, 3)
    b.add(5, 4)
    b.add(6, 5)
    b.poll(2)  # behind the LAC: answered at once, with entries 3 to 5
    (resp,) = b.reads()
    assert resp.first_entry_id == 3 and resp.lac == 5
    assert [bytes(e) for e in resp.entries] == [blob(3, 2), blob(4, 3), blob(5, 4)]
    assert b.lookups() == [] and b.core.long_polls == 0


def test_the_lac_an_add_carries_counts_once_every_earlier_add_of_its_ledger_is_appended() -> None:
    b = Bookie()
    b.add(0, -1)
    b.add(1, 0)
    b.poll(1)
    # Entry 3 carries LAC 2 while entry 2 is still on its way to the entry log: the LAC
    # waits for entry 3's own append (after entry 2's), so the poll's answer has entry 2.
    for eid in (2, 3):
        b.rid += 1
        b.core.on_request(b"writer", encode(w.AddRequest(rid=b.rid, ledger_id=LID, master_key=KEY, flags=AddFlag(0),
                                                         entries=[blob(eid, eid - 1)])), 0.0)
    first, second = b.out.take("entrylogger", AppendBatch)
    assert b.core.ledgers[LID].lac == 1 and b.reads() == []
    for ab in (first, second):
        b.core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [0]), 0.0)
    (resp,) = b.reads()
    assert resp.first_entry_id == 2 and [bytes(e) for e in resp.entries] == [blob(2, 1)] and resp.lac == 2
    # With every earlier add appended, the next add's LAC counts as soon as it is admitted.
    b.poll(2)
    b.rid += 1
    b.core.on_request(b"writer", encode(w.AddRequest(rid=b.rid, ledger_id=LID, master_key=KEY, flags=AddFlag(0),
                                                     entries=[blob(4, 3)])), 0.0)
    (resp,) = b.reads()
    assert resp.first_entry_id == 3 and [bytes(e) for e in resp.entries] == [blob(3, 2)] and resp.lac == 3
    assert b.lookups() == []


def test_an_entry_whose_append_failed_is_not_answered_from_memory() -> None:
    b = Bookie()
    b.add(0, -1)
    b.poll(0)
    b.add(1, 0, fail=True)  # EIO here; the writer has it confirmed by the other bookies
    b.add(2, 1)  # LAC 1: entry 1 is not in this bookie's memory, so the index is asked
    assert b.reads() == []
    assert [(lk.first_entry_id, lk.count) for lk in b.lookups()] == [(1, 1)]


def test_the_cache_holds_copies_not_views_into_the_request_frames() -> None:
    """The add path hands the entry logger views into the request's frame; an entry kept
    here outlives the request, and as a view it would keep the whole frame (up to an add
    request's size) alive while the cache's byte bound counted only the entry."""
    b = Bookie()
    b.add(0, -1)
    b.poll(0)  # watched from now on
    b.rid += 1
    entries = [blob(eid, 0) for eid in (1, 2, 3)]
    add = w.AddRequest(rid=b.rid, ledger_id=LID, master_key=KEY, flags=AddFlag(0), entries=entries)
    b.core.on_request(b"writer", encode(add), 0.0)
    b.rid += 1
    multi = w.MultiAddRequest(rid=b.rid, parts=[w.add_part(LID, KEY, AddFlag(0), [blob(4, 0)])])
    b.core.on_request(b"writer", encode(multi), 0.0)
    for ab in b.out.take("entrylogger", AppendBatch):
        assert any(type(x) is memoryview for x in ab.blobs)  # what makes the copies necessary
        b.core.on_message(Appended(ab.batch_id, ab.ledger_ids, ab.entry_ids, [0] * len(ab.entry_ids)), 0.0)
        b.core.on_message(Synced([ab.batch_id]), 0.0)
    held = b.core.tail.take(LID, 1, 4, 1 << 20)
    assert held == [*entries, blob(4, 0)]
    assert all(type(x) is bytes for x in held)


def test_a_ledger_no_longer_polled_is_forgotten_and_a_deleted_one_at_once() -> None:
    b = Bookie()
    b.add(0, -1)
    b.poll(0, timeout_ms=1000)
    b.add(1, 0)
    b.add(2, 1)
    assert len(b.reads()) == 1 and LID in b.core.tail
    b.core.on_tick(1.0 + server_tail_idle_s - 0.01)
    assert LID in b.core.tail
    b.core.on_tick(1.0 + server_tail_idle_s)
    assert LID not in b.core.tail and b.core.tail.nbytes == 0
    b.poll(0, now=20.0)  # a poll after the expiry: the index answers
    assert b.reads() == [] and [lk.first_entry_id for lk in b.lookups()] == [1]
    b.core.reads.clear()
    b.add(3, 2, now=20.0)
    assert LID in b.core.tail and b.core.tail.nbytes > 0
    b.core.on_message(DeleteLedgers([LID]), 20.0)
    assert LID not in b.core.tail and b.core.tail.nbytes == 0


def test_entries_past_the_bound_of_a_ledger_go_to_the_index() -> None:
    b = Bookie()
    b.add(0, -1)
    b.poll(0)
    n = server_tail_entries_max + 10
    for eid in range(1, n + 1):
        b.add(eid, eid - 1)
    assert len(b.reads()) == 1  # the first poll, woken by entry 2 (LAC 1)
    b.poll(5)  # entry 6 was pushed out: the index answers
    assert b.reads() == [] and [lk.first_entry_id for lk in b.lookups()] == [6]
    b.core.reads.clear()
    first_held = n - server_tail_entries_max + 1
    b.poll(first_held - 1)
    (resp,) = b.reads()
    assert resp.first_entry_id == first_held and len(resp.entries) == n - 1 - first_held + 1


# -- the cache alone ------------------------------------------------------------------------
def test_take_answers_a_contiguous_run_within_its_bounds() -> None:
    c = TailCache(entries_max=8, bytes_max=1 << 20)
    c.put(LID, 0, b"x")  # not watched: ignored
    assert LID not in c and c.nbytes == 0
    c.watch(LID, until=10.0)
    for eid in (3, 4, 5, 7):
        c.put(LID, eid, bytes(100))
    assert c.take(LID, 3, 10, 1 << 20) == [bytes(100)] * 3  # stops at the missing 6
    assert c.take(LID, 2, 10, 1 << 20) == []
    assert c.take(LID, 3, 2, 1 << 20) == [bytes(100)] * 2
    assert c.take(LID, 3, 10, 250) == [bytes(100)] * 2  # the byte bound
    assert c.take(LID, 3, 10, 10) == [bytes(100)]  # at least one
    assert c.take(2, 0, 10, 1 << 20) == []
    c.put(LID, 7, bytes(50))  # the same entry again: the newer copy, counted once
    assert c.take(LID, 7, 1, 1 << 20) == [bytes(50)] and c.nbytes == 350


def test_the_bounds_push_out_the_oldest_and_empty_a_ledger_that_does_not_fit() -> None:
    c = TailCache(entries_max=3, bytes_max=1000)
    c.watch(1, until=10.0)
    c.watch(2, until=10.0)
    for eid in range(5):
        c.put(1, eid, bytes(100))
    assert c.take(1, 0, 10, 1 << 20) == [] and len(c.take(1, 2, 10, 1 << 20)) == 3 and c.nbytes == 300
    c.put(2, 0, bytes(600))
    c.put(2, 1, bytes(200))  # 1,100 bytes in all: ledger 2 is emptied, not left with a hole
    assert c.take(2, 0, 10, 1 << 20) == [] and c.take(2, 1, 10, 1 << 20) == [] and c.nbytes == 300
    c.put(2, 2, bytes(200))  # fits again
    assert c.take(2, 2, 10, 1 << 20) == [bytes(200)] and c.nbytes == 500


def test_a_watch_is_extended_by_each_poll_and_ends_after_the_last() -> None:
    c = TailCache(entries_max=3, bytes_max=1000)
    c.watch(1, until=5.0)
    c.watch(1, until=3.0)  # an earlier end does not shorten it
    c.put(1, 0, b"a")
    c.expire(4.9)
    assert 1 in c and len(c) == 1
    c.expire(5.0)
    assert 1 not in c and not c and c.nbytes == 0


def test_each_ledger_is_forgotten_at_its_own_end_however_the_watches_interleave() -> None:
    c = TailCache(entries_max=3, bytes_max=1000)
    c.watch(1, until=5.0)
    c.watch(2, until=8.0)
    c.watch(1, until=9.0)  # extended past ledger 2's end
    c.watch(3, until=2.0)
    c.expire(2.0)
    assert (1 in c, 2 in c, 3 in c) == (True, True, False)
    c.expire(7.9)
    assert (1 in c, 2 in c) == (True, True)
    c.expire(8.0)
    assert (1 in c, 2 in c) == (True, False)
    c.watch(4, until=8.5)
    c.expire(8.5)
    assert (1 in c, 4 in c) == (True, False)
    c.expire(9.0)
    assert not c
    c.watch(5, until=20.0)
    c.expire(19.0)
    assert 5 in c
    c.expire(20.0)
    assert not c
