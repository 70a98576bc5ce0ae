"""Reads past the LAC and tailing with one request per entry, under the deterministic
simulation (tests/client/sim.py; ``ZBK_SEED=<n>`` replays a run).

* ``read_unconfirmed`` returns entries beyond the LAC of an open ledger, ends early at the
  first entry no bookie has, and never returns entries past a closed ledger's end.
* A reader that keeps up with the writer sends one READ per entry (the long poll's answer
  carries the entry), not a poll and then a read.
"""

from __future__ import annotations

import asyncio

import pytest

from zbk.client.digest import make_digest, master_key
from zbk.client.handles import LedgerEntry, ReadHandle
from zbk.errors import NoSuchEntryError
from zbk.wire import messages as w
from zbk.wire.entry import build_entry

from . import sim
from .sim import SimCluster
from .test_explicit_lac import PW, follow, payload, reader, writer


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


@pytest.mark.parametrize("polled_entries", [True, False], ids=["one-request-per-entry", "control"])
def test_tailing_reader_sends_one_read_per_entry(polled_entries: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader keeps up with a writer appending every 50 ms (E3 WQ3): each new LAC comes
    back with its entry in the long poll's answer, so READ requests ~= entries. The control
    drops the entries of the answers (as tail() did before): then it takes two per entry,
    which shows that the count can tell the difference."""
    seed = sim.seed_from_env()
    n = 40
    if not polled_entries:
        monkeypatch.setattr(ReadHandle, "_polled_entries", lambda self, *a: [])

    async def scenario() -> int:
        c = SimCluster(seed, bookies=3)
        lh, log, _ = await writer(c, 0)
        await log.append(lh, payload(0))  # the bookies know the ledger: no ENOLEDGER polls
        rh, reads = await reader(c, lh)
        seen: dict[int, float] = {}
        task = asyncio.ensure_future(follow(rh, seen))
        for i in range(1, n):
            await asyncio.sleep(0.05)
            await log.append(lh, payload(i))
        await lh.close()
        await asyncio.wait_for(task, 10)
        assert sorted(seen) == list(range(n))
        return reads.count(w.ReadRequest)

    reads = sim.run(scenario())
    if polled_entries:
        # A poll per entry 0..n-2 (entry i arrives with LAC i-1), the last poll ending at
        # its timeout, and one read of the last entry once the close is seen.
        assert reads <= n + 1, reads
    else:
        assert reads >= 2 * (n - 2), reads
