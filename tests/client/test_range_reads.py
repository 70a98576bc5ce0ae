"""Range reads under the deterministic simulation (tests/client/sim.py; ``ZBK_SEED=<n>``
replays a run). Where every bookie holds every entry (WQ == E): requests of about
``limits.client_range_read_bytes``, several in flight ahead of the entries handed out, and
the entries still whole and in order when answers come back short, late or out of order, or
the range spans fragments; a reader that stops early leaves no read behind. Where WQ < E:
each chunk read as one stripe per bookie, every entry answered once, a stripe whose bookie
is down read from the next holder, and a bookie that refuses stripes still read."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from typing import Any

import pytest

from zbk import limits
from zbk.client.handles import LedgerHandle
from zbk.wire import messages as w
from zbk.wire.ops import ReadFlag
from zbk.wire.status import Status

from . import sim
from .sim import Rule, SimCluster
from .test_explicit_lac import reader, writer

N = 120
ENTRY = 100  # payload bytes


def payload(i: int) -> bytes:
    return f"{i:06d}".encode() * (ENTRY // 6) + b"x" * (ENTRY % 6)


class ReadLog:
    """The ranged reads a client sends: (bookie, first, count), the striped ones (bookie,
    first, count, stripe), (bookie, packed) of each and of each long poll, the entries
    answered to them, and the most in flight at once. Bookies in ``old`` answer a read or a
    long poll with a stripe or asking for packed entries as a bookie that predates those
    keys does (EBADREQ)."""

    def __init__(self, transport: Any, old: frozenset[str] = frozenset()) -> None:
        self.reads: list[tuple[str, int, int]] = []
        self.stripes: list[tuple[str, int, int, tuple[int, int] | None]] = []
        self.packed: list[tuple[str, bool]] = []
        self.polls: list[tuple[str, bool]] = []  # (bookie, packed) of each long poll
        self.polls_answered_with_several = 0
        self.old = old
        self.answered = self.cancelled = 0
        self.in_flight = self.most = 0
        inner = transport.request

        async def request(bookie: str, msg: Any, timeout_s: float) -> Any:
            if isinstance(msg, w.ReadRequest) and msg.flags & ReadFlag.LONG_POLL:
                self.polls.append((bookie, msg.packed))
                if msg.packed and bookie in old:
                    return w.ErrorResponse(rid=msg.rid, status=Status.EBADREQ)
                resp = await inner(bookie, msg, timeout_s)
                if len(getattr(resp, "entries", ())) > 1:
                    self.polls_answered_with_several += 1
                return resp
            if not isinstance(msg, w.ReadRequest) or msg.flags & ~ReadFlag.SPARSE:
                return await inner(bookie, msg, timeout_s)
            self.packed.append((bookie, msg.packed))
            if msg.flags:
                self.stripes.append((bookie, msg.first_entry_id, msg.count, msg.stripe))
            else:
                self.reads.append((bookie, msg.first_entry_id, msg.count))
            if (msg.stripe is not None or msg.packed) and bookie in old:
                return w.ErrorResponse(rid=msg.rid, status=Status.EBADREQ)
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            try:
                resp = await inner(bookie, msg, timeout_s)
                self.answered += len(getattr(resp, "entries", ()))
                return resp
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            finally:
                self.in_flight -= 1

        transport.request = request


@pytest.fixture
def small_requests(monkeypatch: pytest.MonkeyPatch) -> int:
    """Requests of a few entries, so that a short ledger takes many: the entries per request."""
    monkeypatch.setattr(limits, "client_range_read_bytes", 1_000)
    return 1_000 // (ENTRY + limits.client_range_read_entry_overhead_bytes)


async def written(c: SimCluster, e: int = 3, n: int = N, wq: int | None = None) -> LedgerHandle:
    lh, log, _ = await writer(c, 0, e, e if wq is None else wq, 2)
    for i in range(n):
        log.append(lh, payload(i))
    await asyncio.gather(*log.futures)
    await lh.close()
    return lh


async def read_all(c: SimCluster, lh: LedgerHandle,
                   old: frozenset[str] = frozenset()) -> tuple[list[tuple[int, bytes]], ReadLog]:
    rh, _ = await reader(c, lh)
    log = ReadLog(rh.ctx.transport, old)
    got = [(x.entry_id, x.payload) async for x in rh.read(0, lh.md.last_entry_id)]
    return got, log


def read_back(setup: Callable[[SimCluster, LedgerHandle], None] | None = None,
              old: Callable[[LedgerHandle], frozenset[str]] | None = None) -> ReadLog:
    """Write a ledger of N entries, ``setup`` the cluster, read the ledger back whole: the
    entries all there and in order. Returns the reads sent. ``old``: the bookies that
    predate the optional keys of ranged reads."""
    seed = sim.seed_from_env()

    async def scenario() -> ReadLog:
        c = SimCluster(seed, bookies=3)
        lh = await written(c)
        if setup is not None:
            setup(c, lh)
        got, log = await read_all(c, lh, old(lh) if old else frozenset())
        assert got == [(i, payload(i)) for i in range(N)]
        return log

    return sim.run(scenario())


def test_a_range_is_read_in_small_requests_several_in_flight(small_requests: int) -> None:
    log = read_back()
    assert max(count for _, _, count in log.reads) <= small_requests, log.reads
    assert 1 < log.most <= limits.client_range_reads_in_flight, log.most
    assert len({b for b, _, _ in log.reads}) == 3, "the chunks are spread over the bookies"
    chunks = [b for b, _, count in log.reads if count == small_requests]
    assert len(chunks) > 3 and all(a != b for a, b in itertools.pairwise(chunks)), \
        "consecutive chunks go to different bookies, though a chunk's size is a multiple of E"
    covered = sorted((first, count) for _, first, count in log.reads)
    assert [i for first, count in covered for i in range(first, first + count)] == list(range(N)), \
        "each entry asked for once"


def test_one_entry_ranges_ask_the_first_bookie_of_each_write_set() -> None:
    """read(e, e) one entry after another spreads over the bookies as read_entry does: each
    goes first to the first bookie of its entry's write set, however many ranges the handle
    read before."""
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        lh = await written(c, n=12)
        rh, _ = await reader(c, lh)
        log = ReadLog(rh.ctx.transport)
        for e in range(12):
            assert [x.payload async for x in rh.read(e, e)] == [payload(e)]
        assert log.reads == [(lh.md.write_set(e)[0], e, 1) for e in range(12)]

    sim.run(scenario())


def test_short_answers_are_asked_again_from_where_they_stopped(small_requests: int,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A bookie answers at most two entries a request (its response limit): each chunk's rest
    is asked for again, and the entries still come out whole and in order."""
    monkeypatch.setattr(limits, "read_response_bytes_max", 2 * (ENTRY + 40) - 1)
    log = read_back()
    assert len(log.reads) > N // 2, "answered two at a time"


def test_answers_out_of_order_still_hand_out_the_entries_in_order(small_requests: int) -> None:
    """The bookie that answers the first chunks is slow: the chunks after them come back first."""

    def slow_first_bookie(c: SimCluster, lh: LedgerHandle) -> None:
        slow = lh.md.write_set(0)[0]
        c.bookie(slow).rules.append(Rule("delay_reply", lambda m: isinstance(m, w.ReadRequest), seconds=0.5))

    assert read_back(slow_first_bookie).most > 1


def test_a_range_over_an_ensemble_change_asks_each_fragment_its_own_bookies(small_requests: int) -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=4)
        lh, log, _ = await writer(c, 0, 3, 3, 2)
        for i in range(N // 2):
            log.append(lh, payload(i))
        await asyncio.gather(*log.futures)
        c.bookie(lh.md.fragments[0][1][1]).crash()
        log.append(lh, payload(N // 2))
        await asyncio.sleep(30)  # its adds time out: the ensemble change replaces it
        for i in range(N // 2 + 1, N):
            log.append(lh, payload(i))
        await asyncio.gather(*log.futures)
        await lh.close()
        assert len(lh.md.fragments) == 2, lh.md.fragments
        got, reads = await read_all(c, lh)
        assert got == [(i, payload(i)) for i in range(N)]
        md = lh.md
        for bookie, first, count in reads.reads:
            frag = max(i for i, (start, _) in enumerate(md.fragments) if start <= first)
            assert first + count - 1 <= md.fragment_end(frag), (first, count, md.fragments)
            assert bookie in md.fragments[frag][1], (bookie, first, md.fragments)

    sim.run(scenario())


def test_a_reader_that_stops_early_leaves_no_read_behind(small_requests: int) -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        lh = await written(c)
        for b in lh.md.fragments[0][1]:  # the reads asked ahead past entry 20 are still waiting at the stop
            c.bookie(b).rules.append(Rule("delay_reply", lambda m: isinstance(m, w.ReadRequest)
                                          and m.first_entry_id > 20, seconds=5))
        rh, _ = await reader(c, lh)
        log = ReadLog(rh.ctx.transport)
        async with contextlib.aclosing(rh.read(0, N - 1)) as entries:
            async for e in entries:
                if e.entry_id == 20:
                    break
        at_close, t0 = log.in_flight, c.loop.time()
        # The reads asked ahead are cancelled: they unwind (through the tasks and wait_for,
        # a few loop turns) with no virtual time passing, so none ends by an answer.
        for _ in range(20):
            if not log.in_flight:
                break
            await asyncio.sleep(0)
        assert log.in_flight == 0, log.in_flight
        assert c.loop.time() == t0
        assert at_close and log.cancelled == at_close, (log.cancelled, at_close)
        assert log.most > 1

    sim.run(scenario())


def read_striped(setup: Callable[[SimCluster, LedgerHandle], None] | None = None,
                 old: Callable[[LedgerHandle], frozenset[str]] | None = None) -> tuple[LedgerHandle, ReadLog]:
    """As read_back, for an E3 WQ2 ledger: each bookie holds two stripes of three."""
    seed = sim.seed_from_env()

    async def scenario() -> tuple[LedgerHandle, ReadLog]:
        c = SimCluster(seed, bookies=3)
        lh = await written(c, wq=2)
        if setup is not None:
            setup(c, lh)
        rh, _ = await reader(c, lh)
        log = ReadLog(rh.ctx.transport, old(lh) if old else frozenset())
        got = [(x.entry_id, x.payload) async for x in rh.read(0, lh.md.last_entry_id)]
        assert got == [(i, payload(i)) for i in range(N)]
        return lh, log

    return sim.run(scenario())


def test_striped_ranges_bring_every_entry_once(small_requests: int) -> None:
    lh, log = read_striped()
    ensemble = lh.md.fragments[0][1]
    assert log.stripes and not log.reads
    for bookie, _, count, stripe in log.stripes:
        assert stripe is not None and stripe[0] == 3, stripe
        assert bookie == ensemble[stripe[1]], "a stripe is asked of the first bookie holding it"
        assert count <= small_requests
    assert log.answered == N, "no entry comes twice"
    assert log.most > 3, "several chunks in flight, each of three stripes"


def test_a_stripe_whose_bookie_is_down_is_read_from_the_next_holder(small_requests: int) -> None:
    def crash_one(c: SimCluster, lh: LedgerHandle) -> None:
        c.bookie(lh.md.fragments[0][1][1]).crash()

    lh, log = read_striped(crash_one)
    down = lh.md.fragments[0][1][1]
    assert any(b != down and s == (3, 1) for b, _, _, s in log.stripes), "stripe 1 read from its other holder"


def test_a_bookie_that_refuses_stripes_still_has_its_entries_read(small_requests: int) -> None:
    """A bookie older than the stripe keys answers EBADREQ: the client asks it again for
    every entry it holds in the chunk and keeps the stripe's."""
    lh, log = read_striped(old=lambda lh: frozenset({lh.md.fragments[0][1][0]}))
    old = lh.md.fragments[0][1][0]
    assert any(b == old and s is None for b, _, _, s in log.stripes)
    assert not any(b != old and s is None for b, _, _, s in log.stripes)
    assert all(packed for b, packed in log.packed if b != old)


def test_answers_come_packed_and_a_bookie_that_predates_them_is_asked_again(small_requests: int) -> None:
    """Ranged reads ask for packed answers; a bookie older than that key refuses it
    (EBADREQ) and is asked again without it, so every entry is still read, in order."""
    log = read_back(old=lambda lh: frozenset({lh.md.fragments[0][1][0]}))
    (old,) = log.old
    asked = log.packed
    assert any(packed for b, packed in asked if b != old), "the others are asked for packed answers"
    assert (old, True) in asked and (old, False) in asked, "the old one: refused, then asked without"


def test_a_tail_polls_for_packed_answers_and_a_bookie_that_predates_them_without() -> None:
    """The writer's entries come in bursts, so a long poll's answer often carries several;
    a bookie that refuses packed answers is polled again without, and the tail goes on."""
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        lh, log, _ = await writer(c, 0, 3, 3, 2)
        rh, _ = await reader(c, lh)
        old = lh.md.fragments[0][1][0]
        polls = ReadLog(rh.ctx.transport, frozenset({old}))
        seen: list[int] = []

        async def follow() -> None:
            async for e in rh.tail(0, poll_timeout_ms=1000):
                assert e.payload == payload(e.entry_id)
                seen.append(e.entry_id)
                if e.entry_id == N - 1:
                    return

        task = asyncio.create_task(follow())
        for i in range(N):
            log.append(lh, payload(i))
            if i % 10 == 9:
                await asyncio.sleep(0.05)
        await asyncio.gather(*log.futures)
        await lh.close()  # the last entry's LAC reaches the reader with the close
        await asyncio.wait_for(task, 60)
        assert seen == list(range(N))
        assert (old, True) in polls.polls and (old, False) in polls.polls, polls.polls
        assert [p for b, p in polls.polls if b == old].count(True) == 1, "refused once, then polled without"
        assert all(packed for b, packed in polls.polls if b != old), polls.polls
        assert polls.polls_answered_with_several > 0

    sim.run(scenario())
