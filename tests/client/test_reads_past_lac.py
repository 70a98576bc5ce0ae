"""Reads past the LAC and tailing with one request per entry, under the deterministic
simulation (tests/client/sim.py; ``ZBK_SEED=<n>`` replays a run).

* ``read_unconfirmed`` returns entries beyond the LAC of an open ledger, ends early at the
  first entry no bookie has, and never returns entries past a closed ledger's end.
* A reader that keeps up with the writer sends one READ per entry and bookie polled (the
  long poll's answer carries the entry), not a poll and then a read.
* Two bookies polled at once: a slow one no longer sets when the reader sees an entry, a
  failing one is left for the next, and a consumer that stops following polls no more.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from zbk.client.digest import make_digest, master_key
from zbk.client.handles import LedgerEntry, LedgerHandle, ReadHandle
from zbk.config import ClientConfig
from zbk.errors import NoSuchEntryError
from zbk.wire import messages as w
from zbk.wire.entry import build_entry
from zbk.wire.ops import ReadFlag
from zbk.wire.status import Status

from . import sim
from .sim import SimCluster, WriteLog
from .test_explicit_lac import PW, Requests, follow, payload, reader, writer


@pytest.mark.parametrize("e,wq", [(3, 3), (3, 2)])
def test_read_unconfirmed_returns_entries_past_the_lac(e: int, wq: int) -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        lh, log, _ = await writer(c, 0, e, wq, 2)
        for i in range(10):
            await log.append(lh, payload(i))
        rh, _ = await reader(c, lh)
        assert rh.last_add_confirmed == 8  # entry 9 carried LAC 8
        with pytest.raises(NoSuchEntryError):
            [x async for x in rh.read(0, 9)]

        async def unconfirmed(first: int, last: int) -> list[LedgerEntry]:
            return [x async for x in rh.read_unconfirmed(first, last)]

        assert [x.payload for x in await unconfirmed(0, 9)] == [payload(i) for i in range(10)]
        assert [x.entry_id for x in await unconfirmed(5, 100)] == [5, 6, 7, 8, 9]  # ends early
        assert await unconfirmed(10, 20) == []
        with pytest.raises(NoSuchEntryError):
            await unconfirmed(3, 2)
        # An entry that only the last bookie of its write set has, never acknowledged (as a
        # writer that failed while sending it leaves one): returned, since a bookie has it.
        blob = build_entry(lh.ledger_id, 10, 9, payload(10), make_digest("crc32c", PW),
                           ledger_length=lh.pushed_length + len(payload(10)))
        c.bookie(lh.md.write_set(10)[-1]).put_entry(lh.ledger_id, master_key(PW), blob)
        got = await unconfirmed(8, 12)
        assert [(x.entry_id, x.payload) for x in got] == [(i, payload(i)) for i in (8, 9, 10)]
        assert rh.last_add_confirmed == 8  # reading past the LAC does not move it

    sim.run(scenario())


def test_read_unconfirmed_does_not_cut_a_closed_ledger_short_of_its_recovered_end() -> None:
    """Entries a closed ledger does not include (written past the point recovery closed
    it at) are never returned, even if a bookie holds them."""
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        lh, log, _ = await writer(c, 0)
        for i in range(5):
            await log.append(lh, payload(i))
        await lh.close()
        # A stray copy of entry 5 on every bookie (as a writer fenced mid-add leaves one).
        stray = build_entry(lh.ledger_id, 5, 4, b"stray", make_digest("crc32c", PW), ledger_length=100)
        for b in c.bookies.values():
            b.put_entry(lh.ledger_id, master_key(PW), stray)
        rh, _ = await reader(c, lh)
        assert [x.entry_id async for x in rh.read_unconfirmed(0, 10)] == [0, 1, 2, 3, 4]
        assert [x.entry_id async for x in rh.read_unconfirmed(5, 10)] == []

    sim.run(scenario())


async def follow_while_writing(rh: ReadHandle, lh: LedgerHandle, log: WriteLog, n: int) -> None:
    """Tail ``rh`` while the writer appends entries 1..n-1 one every 50 ms, then closes;
    every entry is seen."""
    seen: dict[int, float] = {}
    task = asyncio.ensure_future(follow(rh, seen))
    for i in range(1, n):
        await asyncio.sleep(0.05)
        await log.append(lh, payload(i))
    await lh.close()
    await asyncio.wait_for(task, 10)
    assert sorted(seen) == list(range(n))


def long_polls(reads: Requests) -> list[str]:
    """The bookies of the long polls sent, in order."""
    return [b for b, m in reads.sent if isinstance(m, w.ReadRequest) and m.flags & ReadFlag.LONG_POLL]


@pytest.mark.parametrize("polls,polled_entries", [(1, True), (2, True), (1, False)],
                         ids=["one-poll", "two-polls", "control"])
def test_tailing_reader_sends_one_read_per_entry_and_polled_bookie(polls: int, polled_entries: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader keeps up with a writer appending every 50 ms (E3 WQ3): each new LAC comes
    back with its entry in the long poll's answer, so READ requests ~= entries per bookie
    polled at once (``tail_long_polls``). The control drops the entries of the answers (as
    tail() did before): then it takes two per entry, which shows that the count can tell
    the difference."""
    seed = sim.seed_from_env()
    n = 40
    if not polled_entries:
        monkeypatch.setattr(ReadHandle, "_polled_entries", lambda self, *a: [])

    async def scenario() -> tuple[int, int]:
        c = SimCluster(seed, bookies=3)
        lh, log, _ = await writer(c, 0)
        await log.append(lh, payload(0))  # the bookies know the ledger: no ENOLEDGER polls
        rh, reads = await reader(c, lh, ClientConfig(tail_long_polls=polls))
        await follow_while_writing(rh, lh, log, n)
        return reads.count(w.ReadRequest), len(set(long_polls(reads)))

    reads, polled = sim.run(scenario())
    assert polled == polls
    if polled_entries:
        # Per bookie polled: a poll per entry 0..n-2 (entry i arrives with LAC i-1), the
        # last poll ending at its timeout; and one read of the last entry once the close is seen.
        assert reads <= polls * n + 1, reads
    else:
        assert reads >= 2 * (n - 2), reads


@pytest.mark.parametrize("polls", [1, 2])
def test_a_slow_bookie_delays_a_reader_that_polls_only_it(polls: int) -> None:
    """The first bookie of the ensemble answers everything up to 200 ms late; the writer
    (AQ2) does not wait for it. Polling it alone, the reader sees each entry as late as that
    bookie learns its LAC; polling it and the next bookie at once, as soon as the fast one does:
    within the 50 ms until the next add brings the LAC, plus the simulation's hops."""
    seed = sim.seed_from_env()
    n = 30

    async def scenario() -> list[float]:
        c = SimCluster(seed, bookies=3)
        lh, log, _ = await writer(c, 0)
        await log.append(lh, payload(0))
        c.bookie(lh.md.last_ensemble[0]).delay_s = 0.2
        rh, _ = await reader(c, lh, ClientConfig(tail_long_polls=polls))
        seen: dict[int, float] = {}
        confirmed: dict[int, float] = {}
        task = asyncio.ensure_future(follow(rh, seen))
        for i in range(1, n):
            await asyncio.sleep(0.05)
            await log.append(lh, payload(i))
            confirmed[i] = asyncio.get_running_loop().time()
        await lh.close()
        await asyncio.wait_for(task, 10)
        assert sorted(seen) == list(range(n))
        # The last entry is seen at the close; the others by the LAC of the add after them.
        return [seen[i] - confirmed[i] for i in range(1, n - 1)]

    lags = sim.run(scenario())
    if polls == 2:
        assert max(lags) <= 0.08, lags
    else:
        assert sum(lags) / len(lags) > 0.08, lags


@pytest.mark.parametrize("bad", [0, 1])
def test_a_polled_bookie_that_fails_is_left_for_the_next_ones(bad: int) -> None:
    """One of the two bookies polled answers every read with an error: the reader moves on
    to the bookies after it and does not poll it again, whichever of the two it was."""
    seed = sim.seed_from_env()
    n = 20

    async def scenario() -> tuple[int, str, list[str]]:
        c = SimCluster(seed, bookies=3)
        lh, log, _ = await writer(c, 0)
        await log.append(lh, payload(0))
        failing = lh.md.last_ensemble[bad]
        c.bookie(failing).read_status = Status.EIO
        rh, reads = await reader(c, lh, ClientConfig(tail_long_polls=2))
        await follow_while_writing(rh, lh, log, n)
        polled = long_polls(reads)
        return sum(1 for b in polled if b == failing), failing, polled

    to_failing, failing, polled = sim.run(scenario())
    assert to_failing == 1, (failing, polled)


def test_a_tail_given_up_polls_no_more() -> None:
    """A consumer that stops following, between two entries (aclose) or while the polls
    wait (its task cancelled), sends no poll after that; the answers to the polls that were
    waiting come (at their timeout) and go nowhere."""
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        lh, log, _ = await writer(c, 0)
        for i in range(4):
            await log.append(lh, payload(i))
        rh, reads = await reader(c, lh, ClientConfig(tail_long_polls=3))

        def polls() -> int:
            return len(long_polls(reads))

        agen = rh.tail(0)
        got = [(await agen.__anext__()).entry_id for _ in range(3)]
        assert got == [0, 1, 2]
        await agen.aclose()
        before = polls()
        await asyncio.sleep(3)  # past the polls' 1 s timeout: every bookie has answered
        assert polls() == before

        agen = rh.tail(3)  # entry 3 waits for the LAC of an add that never comes
        waiting = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0.5)
        assert polls() == before + 3
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        await agen.aclose()
        await asyncio.sleep(3)
        assert polls() == before + 3
        await lh.close()

    sim.run(scenario())
