"""The recording client and the checker end to end, on the client simulation
(tests/client/sim.py: the real client code against simulated bookies, in virtual time, no
processes): a run with lost messages, a recovery that fences the writer and a tailing
reader is green; a correlated power cut of journal-less bookies loses acknowledged entries
and is red. Randomized runs print ``ZBK_SEED=<n>``; set it to replay."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from pathlib import Path

from client import sim
from client.sim import NO_PROTECTION, SimCluster
from helpers.actorsim import BookieSettings

from zbk.client.bookkeeper import AsyncBookKeeper
from zbk.config import ClientConfig
from zbk.errors import ZbkError

from .checker import CheckResult, check
from .history import FinalState, History, HistoryRecorder
from .recorded import RecordingClient, RecordingReader, final_state

PW = b"faults"
FAST = ClientConfig(add_timeout_ms=500, read_timeout_ms=500)  # a lost message costs half a second


def payload(seed: int, ledger: int, entry: int) -> bytes:
    return f"seed {seed} ledger {ledger} entry {entry}".encode()


async def judged(c: SimCluster, rec: HistoryRecorder, path: Path) -> tuple[History, CheckResult]:
    """Heal, close what is open, read back the final state and check the history."""
    rec.close()
    c.heal(NO_PROTECTION)
    history = History.load([path])
    bk = c.client("collector")
    try:
        final = await final_state(bk, history.ledgers(), password=PW, recover=True)
    finally:
        await bk.close()
    final.save(path.with_suffix(".final.json"))
    assert FinalState.load(path.with_suffix(".final.json")) == final
    return history, check(history, final)


async def faulty_run(seed: int, path: Path) -> tuple[History, CheckResult]:
    """A writer pipelines appends while one bookie of its ensemble loses a share of its
    messages both ways (adds time out, the writer changes its ensemble); a standby tails the
    ledger; a recoverer fences and closes it mid-stream, so the writer's last appends fail.
    Afterwards a reader reads the whole ledger."""
    rng = random.Random(seed)
    c = SimCluster(seed, bookies=5)
    loop = asyncio.get_running_loop()
    rec = HistoryRecorder(path, clock=loop.time)
    writer = RecordingClient(c.client("w", config=FAST), rec, "w")
    lh = await writer.create_ledger(3, 2, 2, password=PW)
    lid = lh.ledger_id
    c.bookie(rng.choice(list(lh.handle.md.last_ensemble))).drop_rate = rng.choice([0.05, 0.2, 0.5])

    fence_at = asyncio.Event()

    async def write() -> None:
        """Appends in bursts; past a random point the recoverer is let loose, and from then
        on the writer appends until the fenced handle refuses (each run ends with one)."""
        futs: list[asyncio.Future[int]] = []
        n = rng.randint(50, 300)
        fence_after = rng.randint(10, n)
        try:
            for k in itertools.count():
                futs.append(lh.append(payload(seed, lid, k)))
                if k == fence_after:
                    fence_at.set()
                if k % 10 == 9 or k >= n:
                    await asyncio.sleep(rng.uniform(0, 0.05))
        except ZbkError:
            pass  # fenced: refused from now on (recorded as fail)
        await asyncio.gather(*futs, return_exceptions=True)
        with contextlib.suppress(ZbkError):
            await lh.close()

    async def follow(bk: AsyncBookKeeper) -> None:
        rh = await RecordingClient(bk, rec, "standby").open_ledger(lid, password=PW, recovery=False)
        with contextlib.suppress(ZbkError):
            async for _ in rh.tail(0, poll_timeout_ms=200):
                pass

    async def recover(bk: AsyncBookKeeper) -> None:
        await fence_at.wait()
        await asyncio.sleep(rng.uniform(0, 0.2))
        client = RecordingClient(bk, rec, "recoverer")
        while True:
            try:
                await client.open_ledger(lid, password=PW)
                return
            except ZbkError:
                await asyncio.sleep(0.5)

    standby, recoverer = c.client("standby", config=FAST), c.client("recoverer", config=FAST)
    await asyncio.wait_for(asyncio.gather(write(), follow(standby), recover(recoverer)), 600)
    reader = RecordingClient(c.client("reader"), rec, "reader")
    rh: RecordingReader = await reader.open_ledger(lid, password=PW, recovery=False)
    await rh.read_last_add_confirmed()
    if rh.handle.md.last_entry_id >= 0:
        async for _ in rh.read(0, rh.handle.md.last_entry_id):
            pass
    for bk in (writer.bk, standby, recoverer, reader.bk):
        await bk.close()
    return await judged(c, rec, path)


def test_a_faulty_run_recorded_by_the_client_is_green(tmp_path: Path) -> None:
    seed = sim.seed_from_env()
    outcomes: dict[str, int] = {}
    checked = {"lost": 0, "prefix": 0, "persistence": 0}
    for k in range(6):
        history, result = sim.run(faulty_run(seed + k, tmp_path / f"run{k}.jsonl"))
        assert result.ok, f"ZBK_SEED={seed + k}\n{result.table()}"
        for ev in history.events:
            if ev.kind == "append" and ev.type != "invoke":
                outcomes[ev.type] = outcomes.get(ev.type, 0) + 1
        for name in checked:
            checked[name] += result[name].checked
    # The runs exercised what the checker is for: acks, appends lost to the fence, refusals,
    # closed ledgers, readers.
    # Every run's final reader gives one view to judge; the standbys' tails add more, except
    # where the recoverer fenced the ledger before a standby's first poll returned anything.
    assert checked["lost"] > 0 and checked["prefix"] > 6 and checked["persistence"] == 6, checked
    assert outcomes.get("ok", 0) > 0 and outcomes.get("info", 0) > 0 and outcomes.get("fail", 0) > 0, outcomes


async def power_cut_run(seed: int, path: Path) -> tuple[History, CheckResult, int]:
    """Journal-less bookies (adds acknowledged before they are synced) all lose power at
    once after the writer's entries are acknowledged; they restart without BP-46's limbo,
    so the recovery finds nothing and closes the ledger empty."""
    # BP-46's pre-journal bookie: adds not journaled, fences not synced, no limbo at boot.
    c = SimCluster(seed, bookies=3, settings=BookieSettings(journal_write_data=False, journal_sync_data=False))
    rec = HistoryRecorder(path, clock=asyncio.get_running_loop().time)
    writer = RecordingClient(c.client("w"), rec, "w")
    lh = await writer.create_ledger(3, 3, 2, password=PW)
    acked = await asyncio.gather(*(lh.append(payload(seed, lh.ledger_id, k)) for k in range(20)))
    for b in c.bookies.values():
        b.crash()
    for b in c.bookies.values():
        b.restart(NO_PROTECTION)
    await writer.bk.close()
    history, result = await judged(c, rec, path)
    return history, result, max(acked)


def test_a_correlated_power_cut_of_journal_less_bookies_is_red(tmp_path: Path) -> None:
    seed = sim.seed_from_env()
    _, result, top = sim.run(power_cut_run(seed, tmp_path / "cut.jsonl"))
    assert top == 19
    assert result.red() == ["lost", "persistence"], result.table()
    assert [(c.kind, c.entry) for c in result["lost"].counterexamples] == [("beyond-close", e) for e in range(20)]
    assert [(c.kind, c.entry) for c in result["persistence"].counterexamples] == [("below-ack", 19)]
