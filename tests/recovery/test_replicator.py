"""The Replicator against the embedded store and an in-memory transport: which entries a
replacement gets, digest checks, back-off and lock release on failure, racing writers; the
copier's ranged reads and what it reads on its own."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import pytest

from zbk import limits
from zbk.client.bookkeeper import ClientContext
from zbk.client.digest import make_digest
from zbk.config import ClientConfig
from zbk.errors import BookieUnavailableError
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import BookieRegistration, LedgerStore, register_bookie
from zbk.metadata.store import MetadataStore
from zbk.metadata.uri import open_store
from zbk.recovery import replicator as rep
from zbk.recovery.copier import unreadable
from zbk.recovery.underreplication import UnderReplicationRegistry
from zbk.wire import messages as w
from zbk.wire.entry import build_entry, parse_entry
from zbk.wire.ops import AddFlag, ReadFlag
from zbk.wire.status import Status

PW = b"secret"
LIVE = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", "127.0.0.1:4", "127.0.0.1:5"]
DEAD = "127.0.0.1:9"
ENTRIES = 20


def test_positions_held() -> None:
    md = LedgerMetadata(ledger_id=1, ensemble_size=3, write_quorum=2, ack_quorum=2, fragments=((0, ("a", "b", "c")),))
    # write set of e: positions e%3, (e+1)%3
    assert rep.positions_held(md, 0, 0, 5) == [0, 2, 3, 5]
    assert rep.positions_held(md, 1, 0, 5) == [0, 1, 3, 4]
    assert rep.positions_held(md, 2, 4, 8) == [4, 5, 7, 8]
    assert rep.positions_held(md, 2, 3, 2) == []
    for e in range(10):
        holders = [p for p in range(3) if e in rep.positions_held(md, p, 0, 9)]
        assert [md.fragments[0][1][p] for p in holders] == sorted(md.write_set(e))


class MemTransport:
    """Bookies as dicts of blobs, answering reads of one entry, of a range, and of a stripe;
    ``down`` bookies (and DEAD) never answer."""

    def __init__(self) -> None:
        self.held: dict[str, dict[tuple[int, int], bytes]] = {b: {} for b in LIVE}
        self.down: set[str] = set()
        self.answer_max = 1 << 30  # entries in one read answer (a bookie's response limit)
        self.requests = 0
        self.reads: list[tuple[str, int, int, tuple[int, int] | None]] = []  # (bookie, first, count, stripe)
        self._rid = 0

    def next_rid(self) -> int:
        self._rid += 1
        return self._rid

    def suspect(self, bookie: str, within_s: float = 5.0) -> bool:
        return False

    async def request(self, bookie: str, msg: Any, timeout_s: float) -> Any:
        self.requests += 1
        if bookie not in self.held or bookie in self.down:
            raise BookieUnavailableError(f"{bookie} is down")
        store = self.held[bookie]
        if isinstance(msg, w.ReadRequest):
            self.reads.append((bookie, msg.first_entry_id, msg.count, msg.stripe))
            blobs = []
            for e in range(msg.first_entry_id, msg.first_entry_id + msg.count):
                if msg.stripe is not None and e % msg.stripe[0] != msg.stripe[1]:
                    continue
                blob = store.get((msg.ledger_id, e))
                if blob is None and not msg.flags & ReadFlag.SPARSE:
                    break  # a plain range stops at the first entry missing
                if blob is not None:
                    blobs.append(blob)
            del blobs[self.answer_max:]
            return w.ReadResponse(rid=msg.rid, status=Status.EOK if blobs else Status.ENOENTRY,
                                  ledger_id=msg.ledger_id, first_entry_id=msg.first_entry_id, lac=-1,
                                  entries=tuple(blobs))
        assert isinstance(msg, w.AddRequest) and msg.flags == AddFlag.RECOVERY_ADD
        for raw in msg.entries:
            blob = bytes(raw)
            parsed = parse_entry(blob, make_digest("crc32c", PW), ledger_id=msg.ledger_id)
            store[(msg.ledger_id, parsed.entry_id)] = blob
        return w.AddResponse(rid=msg.rid, status=Status.EOK, ledger_id=msg.ledger_id, first_entry_id=0,
                             last_entry_id=0)

    async def close(self) -> None:
        pass


class Env:
    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        for b in LIVE:
            register_bookie(store, BookieRegistration(b), store.grant_lease(60))
        self.t = MemTransport()
        self.ctx = ClientContext(store, self.t, ClientConfig(), random.Random(7))
        self.registry = UnderReplicationRegistry(store, "worker")
        self.lease = store.grant_lease(60)
        self.replicator = rep.Replicator(self.ctx, self.registry, self.lease, grace_period_s=0.0,
                                         rng=random.Random(7))
        ensemble = (LIVE[0], DEAD, LIVE[1])
        md = LedgerMetadata(ledger_id=0, ensemble_size=3, write_quorum=2, ack_quorum=2, password=PW,
                            fragments=((0, ensemble),))
        md, version = LedgerStore(store).create(md)
        self.md = md.closed(ENTRIES - 1, ENTRIES)
        LedgerStore(store).write(self.md, version)
        dg = make_digest(self.md.digest, PW)
        for e in range(ENTRIES):
            blob = build_entry(self.md.ledger_id, e, e - 1, bytes([e]), dg, ledger_length=e + 1)
            for b in self.md.write_set(e):
                if b != DEAD:
                    self.t.held[b][(self.md.ledger_id, e)] = blob
        self.registry.mark(self.md.ledger_id, [DEAD])


@pytest.fixture
def env(sqlite_uri: str) -> Iterator[Env]:
    store = open_store(sqlite_uri)
    try:
        yield Env(store)
    finally:
        store.close()


def test_copies_the_dead_positions_entries_and_clears_the_mark(env: Env) -> None:
    assert asyncio.run(env.replicator.run_once())
    md, _ = LedgerStore(env.store).read(env.md.ledger_id)
    assert DEAD not in md.all_bookies()
    new = md.fragments[0][1][1]
    assert new in LIVE[2:]
    want = rep.positions_held(md, 1, 0, ENTRIES - 1)
    assert sorted(e for (_, e) in env.t.held[new]) == want
    assert env.registry.list() == [] and env.registry.lock_holder(md.ledger_id) is None


def test_failure_backs_off_and_releases_the_lock(env: Env) -> None:
    env.t.down = {LIVE[0]}  # the only other replica of some of the dead bookie's entries
    assert not asyncio.run(env.replicator.run_once())
    lid = env.md.ledger_id
    assert env.registry.lock_holder(lid) is None, "a failed attempt releases its lock"
    assert [m.ledger_id for m in env.registry.list()] == [lid], "the mark stays"
    assert LedgerStore(env.store).read(lid)[0].fragments == env.md.fragments, "no half-done metadata"
    before = env.t.requests
    assert not asyncio.run(env.replicator.run_once())
    assert env.t.requests == before, "backing off: not retried at once"
    env.t.down = set()
    env.replicator._backoff[lid].until = 0  # the back-off ran out
    assert asyncio.run(env.replicator.run_once())
    assert env.registry.list() == []


def test_bad_copy_is_not_propagated(env: Env) -> None:
    lid = env.md.ledger_id
    e = rep.positions_held(env.md, 1, 0, ENTRIES - 1)[0]
    survivor = next(b for b in env.md.write_set(e) if b != DEAD)
    blob = bytearray(env.t.held[survivor][(lid, e)])
    blob[-1] ^= 0xFF
    env.t.held[survivor][(lid, e)] = bytes(blob)
    assert not asyncio.run(env.replicator.run_once())
    assert [m.ledger_id for m in env.registry.list()] == [lid]


def test_locked_ledger_is_skipped(env: Env) -> None:
    other = UnderReplicationRegistry(env.store, "other-worker")
    assert other.try_lock(env.md.ledger_id, env.store.grant_lease(60))
    assert not asyncio.run(env.replicator.run_once())
    assert env.t.requests == 0


def test_copies_are_throttled(env: Env) -> None:
    # The first request goes at once; the next waits for the first one's 300 B at 200 B/s.
    env.replicator.rate = rep.RateLimiter(200)

    async def two_requests() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await env.replicator.rate.acquire(300)
        first = loop.time() - t0
        await env.replicator.rate.acquire(10)
        return first, loop.time() - t0

    first, both = asyncio.run(two_requests())
    assert first < 0.1 and 1.4 <= both < 2.5


def test_failure_after_a_grace_wait_still_backs_off(env: Env) -> None:
    lid = env.md.ledger_id
    b = env.replicator._backoff_of(lid)  # what a finished grace wait leaves: no failure, nothing to wait for
    b.reset()
    b.hold_until(0.0)
    env.t.down = {LIVE[0]}
    assert not asyncio.run(env.replicator.run_once())
    assert env.replicator._backoff[lid].delay_s == limits.replicator_backoff_s_min
    asyncio.run(env.replicator.run_once())  # still backing off: no attempt, no growth
    assert env.replicator._backoff[lid].delay_s == limits.replicator_backoff_s_min


def test_a_mark_another_worker_finished_after_our_listing_is_not_worked_again(env: Env) -> None:
    """Workers list the marks, then lock one ledger at a time: a mark another worker finished
    (and unlocked) since the listing is skipped, not repaired a second time. (A chaos run
    showed limbo repairs done twice, 50 ms apart, by one process's two workers.)"""
    lid = env.md.ledger_id
    stale = env.registry.list()
    other = rep.Replicator(env.ctx, UnderReplicationRegistry(env.store, "other-worker"), env.store.grant_lease(60),
                           grace_period_s=0.0, rng=random.Random(8))
    assert asyncio.run(other.run_once())
    assert env.registry.list() == []
    env.registry.mark_repair(lid, LIVE[0], "check")
    stale_repairs = env.registry.list_repairs()
    assert env.registry.clear_repair(stale_repairs[0])  # finished by someone else, too
    env.registry.list = lambda: stale  # type: ignore[method-assign]
    env.registry.list_repairs = lambda: stale_repairs  # type: ignore[method-assign]
    before = env.t.requests
    assert not asyncio.run(env.replicator.run_once())
    assert env.t.requests == before, "nothing is sent for marks that are gone"
    assert env.registry.lock_holder(lid) is None


def test_marks_of_bookies_registered_again_are_cleared_in_one_pass_without_locks(env: Env) -> None:
    """A bookie away longer than the recovery delay leaves a mark on each of its ledgers; once
    it registered again there is nothing to copy, and one pass clears them all without a
    lock or a metadata read per ledger. A mark that changed since the listing (the auditor
    named another loss) stays; the ledger that did lose a bookie is repaired as before."""
    returned = [100 + i for i in range(20)]
    for lid in returned:
        env.registry.mark(lid, [LIVE[1]])  # no such ledger even: the sweep reads no metadata
    listing = env.registry.list()
    changed = returned[0]
    env.registry.mark(changed, [LIVE[2], DEAD])  # named a real loss after the listing
    env.registry.list = lambda: listing  # type: ignore[method-assign]
    locks: list[int] = []
    real_try_lock = env.registry.try_lock

    def try_lock(lid: int, lease: int) -> bool:
        locks.append(lid)
        return real_try_lock(lid, lease)

    env.registry.try_lock = try_lock  # type: ignore[method-assign]
    assert asyncio.run(env.replicator.run_once())
    del env.registry.list
    left = [m.ledger_id for m in UnderReplicationRegistry(env.store, "reader").list()]
    assert left == [changed], "the changed mark stays; the others are cleared or repaired"
    assert locks == [env.md.ledger_id], "a lock only for the ledger that lost a bookie"
    assert DEAD not in LedgerStore(env.store).read(env.md.ledger_id)[0].all_bookies()


# --- the copier's reads ------------------------------------------------------------------------


def test_a_copy_reads_each_source_in_one_ranged_request_per_stripe(env: Env) -> None:
    """The dead bookie (position 1 of 3, WQ 2) held the ids with remainder 0 and 1: those of
    remainder 0 come from position 0, those of 1 from position 2, one request each."""
    assert asyncio.run(env.replicator.run_once())
    ensemble = env.md.fragments[0][1]
    assert sorted(env.t.reads) == [(ensemble[0], 0, 19, (3, 0)), (ensemble[2], 1, 19, (3, 1))], env.t.reads


def wq3_ledger(env: Env, n: int = ENTRIES) -> LedgerMetadata:
    """A closed E3 WQ3 ledger on LIVE[0..2], every entry on every bookie."""
    md = LedgerMetadata(ledger_id=7, ensemble_size=3, write_quorum=3, ack_quorum=2, password=PW,
                        fragments=((0, tuple(LIVE[:3])),)).closed(n - 1, n)
    dg = make_digest(md.digest, PW)
    for e in range(n):
        for b in LIVE[:3]:
            env.t.held[b][(md.ledger_id, e)] = build_entry(md.ledger_id, e, e - 1, bytes([e]), dg, ledger_length=e + 1)
    return md


def copy_to(env: Env, md: LedgerMetadata, target: str, entries: list[int]) -> None:
    asyncio.run(env.replicator.copier.copy(md, entries, target, avoid=set()))
    want = {e: env.t.held[LIVE[1]][(md.ledger_id, e)] for e in entries}
    assert {e: blob for (lid, e), blob in env.t.held[target].items() if lid == md.ledger_id} == want


def test_a_bad_copy_in_a_ranged_answer_is_read_from_another_replica(env: Env) -> None:
    md = wq3_ledger(env)
    source = md.write_set(5)[0]
    blob = bytearray(env.t.held[source][(md.ledger_id, 5)])
    blob[-1] ^= 0xFF
    env.t.held[source][(md.ledger_id, 5)] = bytes(blob)
    copy_to(env, md, LIVE[3], list(range(ENTRIES)))
    alone = [(b, first) for b, first, _, stripe in env.t.reads if stripe is None]
    assert {first for _, first in alone} == {5}, "only the bad copy is read on its own"
    assert any(b != source for b, _ in alone), env.t.reads


def test_a_source_that_does_not_answer_leaves_its_entries_to_the_other_replicas(env: Env) -> None:
    md = wq3_ledger(env)
    env.t.down = {LIVE[0]}
    copy_to(env, md, LIVE[3], list(range(ENTRIES)))


def test_a_short_answer_is_asked_again_from_where_it_stopped(env: Env) -> None:
    """A bookie's response limit cuts each answer to 3 entries: the stripe is asked again from
    the entry after the last one answered, never entry by entry."""
    md = wq3_ledger(env, n=60)
    env.t.answer_max = 3
    copy_to(env, md, LIVE[3], list(range(60)))
    assert all(stripe is not None for _, _, _, stripe in env.t.reads), "no read of one entry"
    assert len(env.t.reads) == 3 * 7, "each stripe of 20 asked for 3 at a time"


def test_unreadable_names_what_a_bookie_cannot_return(env: Env) -> None:
    md = wq3_ledger(env)
    bookie = LIVE[1]
    del env.t.held[bookie][(md.ledger_id, 4)]
    blob = bytearray(env.t.held[bookie][(md.ledger_id, 9)])
    blob[-1] ^= 0xFF
    env.t.held[bookie][(md.ledger_id, 9)] = bytes(blob)
    dg = make_digest(md.digest, PW)
    bad = asyncio.run(unreadable(env.ctx, bookie, md, list(range(ENTRIES)), dg))
    assert [e for e, _ in bad] == [4, 9], bad
    assert "ENOENTRY" in bad[0][1] and "bad copy" in bad[1][1], bad
    env.t.down = {bookie}
    with pytest.raises(BookieUnavailableError):
        asyncio.run(unreadable(env.ctx, bookie, md, list(range(ENTRIES)), dg))


def test_scattered_entries_are_not_read_with_the_entries_between_them(env: Env) -> None:
    """The periodic check's probes, a repair's missing entries: a ranged request covers only
    ids wanted, a run along one stripe at a time."""
    md = wq3_ledger(env, n=60)
    dg = make_digest(md.digest, PW)
    assert asyncio.run(unreadable(env.ctx, LIVE[1], md, [0, 3, 6, 7, 10, 30, 59], dg)) == []
    assert sorted((first, count) for _, first, count, _ in env.t.reads) == \
        [(0, 7), (7, 4), (30, 1), (59, 1)], env.t.reads
