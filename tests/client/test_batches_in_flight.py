"""A writer's batches in flight (``ClientConfig.add_batches_in_flight_max``), under the
deterministic simulation (tests/client/sim.py: real bookie cores; ``ZBK_SEED=<n>`` replays
a run).

* A writer appending faster than its bookies answer keeps at most that many batches of new
  entries unconfirmed: the appends made meanwhile go out together in the next request, so
  far fewer requests than entries reach each bookie, and every entry still confirms, in
  order, and is readable.
* A writer whose earlier appends are all confirmed sends each append at once, alone: an
  idle writer's latency is not traded for batching.
* With the limit at 0 every append goes out at once, in a request of its own.
* A batch that waited carries the LAC its writer had when it went out, not the one it had
  when the entries were appended: a bookie learns the LAC from the adds, and a tailing
  reader's long poll is answered by that batch rather than by a later one. Every copy of
  an entry is the same blob, digest-checked by readers.
* A bookie failing while appends are held back: the ensemble change sends them with the
  rest, and nothing waits for a batch that will never be confirmed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from zbk.client.handles import LedgerHandle
from zbk.config.client import ClientConfig
from zbk.wire import messages as w
from zbk.wire.entry import parse_entry, peek_entry_header
from zbk.wire.status import Status

from . import sim
from .sim import Rule, SimCluster, WriteLog, check_persistence
from .test_sim_pipelining import SendLog

PW = b"secret"


def _entries_per_request(sends: SendLog, bookie: str) -> list[int]:
    return [len(m.entries) for b, m in sends.sent if b == bookie and isinstance(m, w.AddRequest)]


async def _append_at_a_rate(lh: LedgerHandle, log: WriteLog, order: list[int], n: int, gap_s: float) -> None:
    """``n`` appends, one every ``gap_s`` (an open-loop writer: none waits for the others)."""

    def done(f: asyncio.Future[int]) -> None:
        if not f.cancelled() and f.exception() is None:
            order.append(f.result())

    for _ in range(n):
        log.append(lh, f"{lh.ledger_id}/{lh.next_entry_id}".encode()).add_done_callback(done)
        await asyncio.sleep(gap_s)


def _slow_answers(c: SimCluster, seconds: float) -> None:
    """Every bookie answers its adds ``seconds`` late."""
    for b in c.bookies.values():
        b.rules.append(Rule("delay_reply", lambda m: isinstance(m, w.AddRequest), seconds=seconds))


def _run_at_a_rate(limit: int) -> tuple[list[int], int]:
    """100 appends, one per ms, to bookies that answer 10 ms late, with ``limit`` batches in
    flight: (entries of each request to the first bookie, most requests in flight to it)."""
    seed = sim.seed_from_env()
    out: dict[str, Any] = {}

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        writer = c.client("writer", config=ClientConfig(add_batches_in_flight_max=limit))
        lh: LedgerHandle = await writer.create_ledger(3, 3, 3, password=PW)
        sends = SendLog(lh.ctx.transport)
        _slow_answers(c, 0.010)
        log, order = WriteLog(), list[int]()
        await _append_at_a_rate(lh, log, order, 100, 0.001)
        await log.settle()
        assert not log.failed, log.failed
        assert order == list(range(100)), "entries confirm in entry order"
        await lh.close()
        assert await check_persistence(c, lh.ledger_id, PW, log) == []
        first = lh.md.last_ensemble[0]
        out["sizes"], out["in_flight"] = _entries_per_request(sends, first), sends.max_in_flight[first]

    sim.run(scenario())
    return out["sizes"], out["in_flight"]


def test_a_busy_writer_keeps_two_batches_in_flight_and_sends_the_rest_together() -> None:
    sizes, in_flight = _run_at_a_rate(2)
    assert sum(sizes) == 100
    assert in_flight <= 2, in_flight
    # About 10 entries are appended per round trip; at most two requests cover them.
    assert len(sizes) <= 30, sizes
    assert max(sizes) >= 4, sizes


def test_one_batch_in_flight_sends_everything_appended_during_a_round_trip_together() -> None:
    sizes, in_flight = _run_at_a_rate(1)
    assert sum(sizes) == 100 and in_flight == 1
    assert len(sizes) <= 15, sizes


def test_without_a_limit_every_append_is_its_own_request() -> None:
    sizes, in_flight = _run_at_a_rate(0)
    assert sizes == [1] * 100
    assert in_flight >= 9, in_flight


def test_a_batch_that_waited_carries_the_lac_confirmed_meanwhile() -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        writer = c.client("writer")
        lh: LedgerHandle = await writer.create_ledger(3, 3, 3, password=PW)
        carried: list[tuple[int, int, list[bytes]]] = []  # (the writer's LAC at the send, first entry, blobs)
        transport = lh.ctx.transport
        inner = transport.send

        def send(bookie: str, msg: Any, timeout_s: float, callback: Any) -> None:
            if isinstance(msg, w.AddRequest) and bookie == lh.md.last_ensemble[0]:
                carried.append((lh.lac, peek_entry_header(msg.entries[0])[1], [bytes(b) for b in msg.entries]))
            inner(bookie, msg, timeout_s, callback)

        transport.send = send  # type: ignore[method-assign]
        _slow_answers(c, 0.010)
        log, order = WriteLog(), list[int]()
        await _append_at_a_rate(lh, log, order, 100, 0.001)
        await log.settle()
        assert not log.failed and order == list(range(100))
        waited = 0
        for lac, first, blobs in carried:
            lacs = [peek_entry_header(b)[2] for b in blobs]
            assert max(lacs) == lac, (first, lacs, lac)  # the LAC at the send, on its last entry
            waited += lacs[0] < lac
            for i, b in enumerate(blobs):  # each entry intact under the ledger's digest
                assert parse_entry(b, lh.digest, ledger_id=lh.ledger_id, entry_id=first + i).payload.tobytes() == \
                    f"{lh.ledger_id}/{first + i}".encode()
        assert waited >= 5, carried  # batches that waited while their writer's LAC moved on
        # Every bookie got the same copy of each entry.
        held = [c.bookie(b).entries(lh.ledger_id) for b in lh.md.last_ensemble]
        assert all(sorted(h) == list(range(100)) for h in held)
        assert all(bytes(held[0][eid]) == bytes(h[eid]) for h in held[1:] for eid in range(100))
        await lh.close()
        assert await check_persistence(c, lh.ledger_id, PW, log) == []

    sim.run(scenario())


def test_an_idle_writer_sends_each_append_at_once_and_alone() -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        writer = c.client("writer")  # the default: two batches in flight
        lh: LedgerHandle = await writer.create_ledger(3, 3, 2, password=PW)
        sends = SendLog(lh.ctx.transport)
        loop = asyncio.get_running_loop()
        for i in range(20):
            t0 = loop.time()
            fut = lh.append(f"entry {i}".encode())
            await asyncio.sleep(0)  # the dispatcher's turn
            assert len(sends.sent) == 3 * (i + 1), "sent in the turn of the append"
            assert await fut == i
            assert loop.time() - t0 < 0.1
        for b in lh.md.last_ensemble:
            assert _entries_per_request(sends, b) == [1] * 20

    sim.run(scenario())


def test_appends_held_back_when_a_bookie_fails_go_to_its_replacement() -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=4)
        writer = c.client("writer", config=ClientConfig(add_batches_in_flight_max=1))
        lh: LedgerHandle = await writer.create_ledger(3, 3, 3, password=PW)
        lid = lh.ledger_id
        e0, e1, e2 = (c.bookie(b) for b in lh.md.last_ensemble)
        spare = c.bookie(next(b for b in c.bookies if b not in lh.md.last_ensemble))
        log, order = WriteLog(), list[int]()
        await _append_at_a_rate(lh, log, order, 10, 0.001)
        await log.settle()
        # AQ3: with e2 silent, the batch in flight is never confirmed, and the appends made
        # meanwhile are held back until the ensemble change replaces e2.
        e2.add_status = Status.EIO
        e1.rules.append(Rule("delay_reply", lambda m: isinstance(m, w.AddRequest), seconds=0.05))
        await _append_at_a_rate(lh, log, order, 30, 0.001)
        await log.settle()
        assert not log.failed, log.failed
        assert order == list(range(40))
        assert len(lh.md.fragments) == 2 and spare.id in lh.md.fragments[1][1] and e2.id not in lh.md.fragments[1][1]
        for eid in range(lh.md.fragments[1][0], 40):
            assert spare.has_entry(lid, eid)
        assert e0.has_entry(lid, 39)
        await lh.close()
        assert await check_persistence(c, lid, PW, log) == []

    sim.run(scenario())
