"""The write path's pipelining and multi-ledger coalescing (MULTI_ADD), under the
deterministic simulation (tests/client/sim.py: real bookie cores; ``ZBK_SEED=<n>`` replays
a run).

* Several add requests are in flight to one bookie for one ledger; entries still confirm
  strictly in order, and an ensemble change in the middle of that resends every entry the
  failed bookie had not acknowledged to its replacement, in entry order.
* Adds of several ledgers to one bookie in the same event-loop turn travel in one MULTI_ADD;
  a part the bookie refuses (wrong password) fails only its own ledger.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from zbk.client.digest import make_digest, master_key
from zbk.client.handles import LedgerHandle
from zbk.errors import BookieUnavailableError, UnauthorizedError
from zbk.wire import messages as w
from zbk.wire.entry import build_entry, peek_entry_header
from zbk.wire.ops import AddFlag
from zbk.wire.status import Status

from . import sim
from .sim import Rule, SimCluster, WriteLog, check_persistence

PW = b"secret"
PLANTED = 1000  # the entry id another writer stored under another password


def payload(seed: int, lid: int, eid: int) -> bytes:
    return f"seed {seed} ledger {lid} entry {eid}".encode()


class SendLog:
    """Wraps a client transport's send(): what went to which bookie, and how many add
    requests were in flight to each bookie at most."""

    def __init__(self, transport: Any) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.in_flight: Counter[str] = Counter()
        self.max_in_flight: Counter[str] = Counter()
        inner = transport.send

        def send(bookie: str, msg: Any, timeout_s: float, callback: Any) -> None:
            self.sent.append((bookie, msg))
            self.in_flight[bookie] += 1
            self.max_in_flight[bookie] = max(self.max_in_flight[bookie], self.in_flight[bookie])

            def done(resp: Any) -> None:
                self.in_flight[bookie] -= 1
                callback(resp)

            inner(bookie, msg, timeout_s, done)

        transport.send = send


def received_entries(bookie: sim.BookieNode, lid: int) -> list[int]:
    """Records, in arrival order, the entry ids of ``lid`` that plain adds bring to ``bookie``."""
    seen: list[int] = []

    def match(msg: Any) -> bool:
        if isinstance(msg, w.AddRequest) and msg.ledger_id == lid and not msg.flags & AddFlag.RECOVERY_ADD:
            seen.extend(peek_entry_header(b)[1] for b in msg.entries)
        return False

    bookie.rules.append(Rule("delay", match))
    return seen


def test_pipelined_adds_with_an_ensemble_change_mid_flight() -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=4)
        writer = c.client("writer")
        lh: LedgerHandle = await writer.create_ledger(3, 3, 2, password=PW)
        lid = lh.ledger_id
        sends = SendLog(lh.ctx.transport)
        e0, e1, e2 = (c.bookie(b) for b in lh.md.last_ensemble)
        spare = c.bookie(next(b for b in c.bookies if b not in lh.md.last_ensemble))
        to_spare = received_entries(spare, lid)
        log = WriteLog()
        order: list[int] = []

        def append(n: int) -> None:
            for _ in range(n):
                log.append(lh, payload(seed, lid, lh.next_entry_id)).add_done_callback(
                    lambda f: order.append(f.result()) if not f.cancelled() and f.exception() is None else None)

        # e2 answers late: requests to it pile up, and AQ2 confirms through e0 and e1.
        e2.rules.append(Rule("delay_reply", lambda m: isinstance(m, w.AddRequest), seconds=0.2))
        for _ in range(10):
            append(7)
            await asyncio.sleep(0.003)
        assert sends.max_in_flight[e2.id] >= 5, sends.max_in_flight
        assert order == list(range(70))
        # Now e2 fails every add it processes, while requests are still in flight to it, and
        # e1 holds its answers: the next entries reach AQ only through e2's replacement.
        e2.add_status = Status.EIO
        e1.pause()
        for _ in range(10):
            append(7)
            await asyncio.sleep(0.003)
        await log.settle()
        e1.resume()
        await asyncio.sleep(1.0)
        assert not log.failed, log.failed
        assert order == list(range(140)), "entries confirm in entry order"
        assert lh.last_add_confirmed == 139
        md = lh.md
        assert len(md.fragments) == 2 and e2.id not in md.fragments[1][1] and spare.id in md.fragments[1][1]
        first = md.fragments[1][0]
        # Every entry of the new fragment reached the replacement, in entry order, once.
        assert first == 70
        assert to_spare == list(range(first, 140)), (first, to_spare)
        for eid in range(first, 140):
            assert spare.has_entry(lid, eid)
        # The LAC each stored entry carries never runs ahead of what was confirmed before it.
        for b in (e0, e1, spare):
            for eid, blob in b.entries(lid).items():
                assert peek_entry_header(blob)[2] < eid
        await lh.close()
        c.heal()
        assert await check_persistence(c, lid, PW, log) == []

    sim.run(scenario())


def test_adds_of_many_ledgers_share_one_message_and_a_wrong_password_fails_only_its_ledger() -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        writer = c.client("writer")
        handles: list[LedgerHandle] = [await writer.create_ledger(3, 3, 2, password=PW) for _ in range(5)]
        sends = SendLog(handles[0].ctx.transport)
        # Ledger 3 is known to every bookie under another password's master key (another
        # writer stored an entry of it there).
        bad = handles[3]
        planted = build_entry(bad.ledger_id, PLANTED, -1, b"not ours", make_digest("crc32c", b"another password"))
        for b in c.bookies.values():
            b.put_entry(bad.ledger_id, master_key(b"another password"), planted)
        logs = [WriteLog() for _ in handles]
        for _ in range(3):  # one event-loop turn: 3 entries to each of the 5 ledgers
            for h, log in zip(handles, logs, strict=True):
                log.append(h, payload(seed, h.ledger_id, h.next_entry_id))
        for log in logs:
            await log.settle()
        # One MULTI_ADD per bookie carried the whole turn, a part per ledger.
        assert len(sends.sent) == 3 and {b for b, _ in sends.sent} == set(c.bookies)
        for _, msg in sends.sent:
            assert isinstance(msg, w.MultiAddRequest)
            assert [p.ledger_id for p in msg.parts] == [h.ledger_id for h in handles]
            assert all(len(p.entries) == 3 for p in msg.parts)
        for i, log in enumerate(logs):
            if i == 3:
                assert not log.acked and all(isinstance(e, UnauthorizedError) for e in log.failed.values())
                assert len(log.failed) == 3
            else:
                assert sorted(log.acked) == [0, 1, 2] and not log.failed
        assert isinstance(bad.failed, UnauthorizedError)
        # The others go on writing (now without the refused ledger's part).
        for h, log in zip(handles, logs, strict=True):
            if h is not bad:
                log.append(h, payload(seed, h.ledger_id, h.next_entry_id))
        for log in logs:
            await log.settle()
        for i, h in enumerate(handles):
            if i != 3:
                assert h.last_add_confirmed == 3
                await h.close()
                assert await check_persistence(c, h.ledger_id, PW, logs[i]) == []
        assert all(list(b.entries(bad.ledger_id)) == [PLANTED] for b in c.bookies.values())

    sim.run(scenario())


def test_closing_the_client_with_adds_in_flight_fails_them_without_ensemble_changes() -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=4)
        writer = c.client("writer")
        handles: list[LedgerHandle] = [await writer.create_ledger(3, 3, 2, password=PW) for _ in range(3)]
        for b in c.bookies.values():
            b.pause()  # nothing answers: every add is in flight when the client closes
        futs = [h.append(payload(seed, h.ledger_id, 0)) for h in handles]
        await asyncio.sleep(0.01)
        writes = c.stats.metadata_writes
        await writer.close()
        await asyncio.sleep(1.0)
        for f in futs:
            assert f.done() and isinstance(f.exception(), BookieUnavailableError)
        assert c.stats.metadata_writes == writes and c.stats.ensemble_changes == 0

    sim.run(scenario())
