"""Power cuts of real bookies under the ledger client, judged by the history checker.

Each bookie runs on its own power-loss layer (powercluster.py); writers pipeline appends
through zbk's asyncio client, recorded (powerworkload.py); after the faults every ledger is
closed or recovered, read back, and the history is judged against that final state
(checker.py). The history and the final state are kept in the test's directory, so
``python -m tests.faults.checker HISTORY FINAL`` judges them again.

* a seeded run: one bookie at a time loses its power at random moments, sometimes with a
  torn write, and restarts on what survived; nothing acknowledged may be lost;
* a bookie running without the journal (BP-46) comes back in limbo: it never answers
  NoSuchEntry for an entry it was written of a ledger open at the cut, the client recovers
  and reads every acknowledged entry while it is in limbo, and phase two (autorecovery)
  refills it and clears the limbo;
* a correlated cut of every bookie of one ensemble at once, default settings: nothing lost;
* the check can fail: without journal fsync, the same correlated cut loses acknowledged
  entries and the checker's verdict is red.

Randomized tests print ``ZBK_SEED=<n>``; set it to replay the choices (cut moments,
victims, tears, ledger lengths); the timing of a real cluster is not replayed.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
from bookie.util import seeded_rng
from helpers.wait import wait_until
from recovery.replicas import unreadable_on

from zbk.client.bookkeeper import AsyncBookKeeper
from zbk.client.digest import make_digest
from zbk.client.raw import BookieConnection
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import LedgerStore
from zbk.metadata.uri import open_store
from zbk.recovery.underreplication import UnderReplicationRegistry
from zbk.wire import messages as w
from zbk.wire.entry import parse_entry
from zbk.wire.status import Status

from .checker import CheckResult
from .history import HistoryRecorder
from .powercluster import PowerCluster
from .powerworkload import CLIENT, PASSWORD, Writers, judge, payload, read_all, recover_all
from .recorded import RecordingClient

# Test-scale files, so that a run rotates and trims journals and rolls entry logs, and
# checkpoints every half second; durability settings are the defaults (journal on and
# fsynced, index_flush_syncfs on).
SETTINGS: dict[str, object] = {"journal_max_size_mb": 1, "entry_log_size_limit_mb": 2, "flush_interval_ms": 500}
SEEDED_CUTS = 8


@pytest.fixture
def power_cluster(tmp_path: Path) -> Iterator[Callable[[int, dict[str, object]], PowerCluster]]:
    """``power_cluster(n, settings)``: n bookies on layers; all stopped and unmounted at teardown."""
    made: list[PowerCluster] = []

    def make(n: int, settings: dict[str, object]) -> PowerCluster:
        c = PowerCluster(tmp_path / f"c{len(made)}", n, settings)
        made.append(c)
        return c.start()

    try:
        yield make
    finally:
        errors = []
        for c in made:
            try:
                c.stop()
            except Exception as e:  # noqa: BLE001 - the others must still be stopped
                errors.append(e)
        if errors:
            raise errors[0]


def _stamp(t0: float, what: str) -> None:
    print(f"[{time.monotonic() - t0:6.1f} s] {what}")


def _report(result: CheckResult, history: Path, writers: Writers, cluster: PowerCluster) -> None:
    print(f"{writers.acked_total} appends acknowledged on {len(writers.acked)} ledgers; "
          f"ledgers given up by their writers: {writers.failures or 'none'}")
    for cut in cluster.cuts:
        print(f"cut {cut}")
    print(result.table())
    print(f"replay the verdict: python -m tests.faults.checker {history} {history.with_suffix('.final.json')}")


@pytest.mark.slow
def test_seeded_power_cuts_of_one_bookie_at_a_time_lose_nothing_acknowledged(power_cluster, tmp_path):
    rng = seeded_rng()
    cluster = power_cluster(4, SETTINGS)
    path = tmp_path / "history.jsonl"

    async def run() -> tuple[Writers, CheckResult]:
        t0 = time.monotonic()
        with HistoryRecorder(path) as rec:
            writers = Writers(cluster.uri, rng.randrange(1 << 30), rec, writers=3, ledgers_each=2,
                              ledger_entries=(300, 2500))
            writers.start()
            await writers.wait_acks(500, timeout_s=60)
            for n in range(SEEDED_CUTS):
                await asyncio.sleep(rng.uniform(1.0, 5.0))
                # A bookie that ledgers are being written to (an idle one would lose nothing).
                victim = rng.choice(sorted({b for e in writers.ensembles().values() for b in e} or cluster.ids))
                before = writers.acks
                # Cuts land before, during and after checkpoints, journal rotations and trims.
                await asyncio.to_thread(cluster.cut, [victim], torn=rng.random() < 0.5, rng=rng)
                _stamp(t0, f"cut {n}: {victim} after {before} acks")
                await asyncio.sleep(rng.uniform(0.0, 2.0))  # down for a while: ensembles change
                await asyncio.to_thread(cluster.restart, [victim])
                _stamp(t0, f"{victim} is back")
            await asyncio.sleep(2.0)
            await writers.finish()
            _stamp(t0, "writers finished")
            left = await recover_all(cluster.uri, rec, writers.acked)
            assert not left, f"ledgers that could not be recovered: {sorted(left)}\n{cluster.logs()}"
            _stamp(t0, "every ledger closed")
        _, _, result = await judge(cluster.uri, path)
        _stamp(t0, "judged")
        return writers, result

    writers, result = asyncio.run(run())
    _report(result, path, writers, cluster)
    assert len(cluster.cuts) == SEEDED_CUTS
    assert writers.acked_total > 1000, "too little was written for the cuts to matter"
    assert result.ok, f"checker: red on {result.red()}"
    assert result["lost"].checked == writers.acked_total


# BP-46: adds skip the journal; and no checkpoint in the run, so that a cut takes every
# entry a bookie was written since it booted (entry logs and index are never synced).
NO_JOURNAL: dict[str, object] = {"journal_write_data": False, "flush_interval_ms": 600_000}
PRE_CLOSED = 2  # ledgers written and closed before the cut (phase one: "unclean" repair marks)
PRE_CLOSED_ENTRIES = 300


def _most_used(ensembles: dict[int, tuple[str, ...]]) -> str:
    counts: dict[str, int] = {}
    for ensemble in ensembles.values():
        for b in ensemble:
            counts[b] = counts.get(b, 0) + 1
    return max(sorted(counts), key=lambda b: counts[b])


def _answers_of(bookie: str, md: LedgerMetadata, acked: list[int], seed: int) -> dict[str, list[int]]:
    """What ``bookie`` answers, read by read, for each of ``acked`` that ``md`` assigns to it:
    status name -> entry ids ("EOK-wrong" for a copy that is not the payload written)."""
    digest = make_digest(md.digest, md.password)
    out: dict[str, list[int]] = {}
    with BookieConnection(bookie, timeout_s=10) as c:
        for e in sorted(acked):
            if bookie not in md.write_set(e):
                continue
            r = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=md.ledger_id, first_entry_id=e))
            status = Status(r.status).name
            if r.status == Status.EOK:
                got = parse_entry(bytes(r.entries[0]), digest, ledger_id=md.ledger_id, entry_id=e)
                if bytes(got.payload) != payload(seed, md.ledger_id, e):
                    status = "EOK-wrong"
            out.setdefault(status, []).append(e)
    return out


@pytest.mark.slow
def test_a_bookie_without_journal_comes_back_in_limbo_and_never_denies_an_acknowledged_entry(power_cluster,
                                                                                             tmp_path):
    """BP-46 through a real power cut. Ledgers still open at the cut are in limbo on the
    victim when it is back: for each entry it was written it answers the entry or EUNKNOWN,
    never NoSuchEntry. Closed ones are not in limbo (BP-46 phase one: their end is fixed),
    but each that lacks entries has an "unclean" repair mark. Phase two (autorecovery)
    recovers the limbo ledgers, refills the victim and clears its limbo; the client reads
    every acknowledged entry, and the victim alone serves all it should hold."""
    rng = seeded_rng()
    seed = rng.randrange(1 << 30)
    cluster = power_cluster(4, NO_JOURNAL)
    path = tmp_path / "history.jsonl"
    answers: dict[int, dict[str, list[int]]] = {}  # open ledgers at the cut: status -> entries
    closed_answers: dict[int, dict[str, list[int]]] = {}  # the same for the ledgers closed before it

    async def run() -> tuple[Writers, str, CheckResult]:
        t0 = time.monotonic()
        with HistoryRecorder(path) as rec:
            closed: list[int] = []
            async with AsyncBookKeeper(cluster.uri, config=CLIENT) as bk:
                pre = RecordingClient(bk, rec, "pre")
                for _ in range(PRE_CLOSED):
                    lh = await pre.create_ledger(3, 2, 2, password=PASSWORD)
                    await asyncio.gather(*(lh.append(payload(seed, lh.ledger_id, e)) for e in range(PRE_CLOSED_ENTRIES)))
                    await lh.close()
                    closed.append(lh.ledger_id)
            # From here to the cut, ledgers are only created and written, never closed.
            writers = Writers(cluster.uri, seed, rec, writers=2, ledgers_each=2, ledger_entries=(10**6, 10**6),
                              replace_failed=False)
            writers.start()
            await writers.wait_acks(rng.randint(1500, 4000), timeout_s=60)
            victim = _most_used(writers.ensembles())
            await asyncio.to_thread(cluster.cut, [victim], torn=rng.random() < 0.5, rng=rng)
            _stamp(t0, f"cut {victim} after {writers.acks} acks")
            # Phase one puts in limbo at least the open ledgers with the victim now, and at
            # most those with it once it is back (a writer may pick it again meanwhile).
            at_cut = await _open_with(cluster.uri, victim, writers.acked)
            await asyncio.to_thread(cluster.restart, [victim])
            _stamp(t0, f"{victim} is back")
            after = await _open_with(cluster.uri, victim, writers.acked)
            limbo = cluster.limbo_ledgers(victim)
            assert at_cut and len(at_cut) <= limbo <= len(after), (sorted(at_cut), limbo, sorted(after))
            assert cluster.metric(victim, "zbk_bookie_limbo_ledgers") == limbo
            assert f"{limbo} ledger(s) in limbo" in cluster.bookies[cluster.index(victim)].log.read_text()
            for lid in writers.acked:
                md = await asyncio.to_thread(_metadata, cluster.uri, lid)
                answers[lid] = await asyncio.to_thread(_answers_of, victim, md, list(writers.acked[lid]), seed)
            marks = await asyncio.to_thread(_repair_marks, cluster.uri, victim)
            for lid in closed:
                md = await asyncio.to_thread(_metadata, cluster.uri, lid)
                closed_answers[lid] = await asyncio.to_thread(_answers_of, victim, md,
                                                              list(range(PRE_CLOSED_ENTRIES)), seed)
                if set(closed_answers[lid]) - {"EOK"}:
                    assert marks.get(lid) == "unclean", f"closed ledger {lid} lacks entries, marks {marks}"

            await writers.finish()
            _stamp(t0, "writers finished")
            # The client recovers the ledgers its writers gave up, and reads every entry back,
            # while the victim is still in limbo: its EUNKNOWN answers are neither a copy nor
            # a denial, so recovery and reads go to the other replicas.
            left = await recover_all(cluster.uri, rec, writers.acked)
            assert not left, f"ledgers that could not be recovered: {sorted(left)}\n{cluster.logs()}"
            read = await read_all(cluster.uri, rec, [*closed, *writers.acked], "limbo-reader")
            acked = {**dict.fromkeys(closed, range(PRE_CLOSED_ENTRIES)), **writers.acked}
            unread = {lid: sorted(set(eids) - read[lid])[:5] for lid, eids in acked.items()}
            assert not any(unread.values()), f"acknowledged entries not read back: {unread}"
            assert cluster.limbo_ledgers(victim) == limbo, "limbo cleared before phase two"
            _stamp(t0, "recovered and read back with the victim in limbo")
            # Phase two: autorecovery refills the victim and clears its limbo.
            ar = cluster.start_autorecovery(lost_bookie_recovery_delay_s=60, lease_ttl_s=3)
            await asyncio.to_thread(wait_until, lambda: _repaired(cluster, victim), timeout_s=90, interval_s=0.3,
                                    message="phase two to repair every limbo ledger")
            assert ar.metric("zbk_replicator_limbo_ledgers_repaired_total") == limbo
            _stamp(t0, "phase two done")
        _, final, result = await judge(cluster.uri, path)
        _stamp(t0, "judged")
        # The victim alone now serves every entry the closed ledgers assign to it.
        for lid in final.ledgers:
            md = await asyncio.to_thread(_metadata, cluster.uri, lid)
            if victim in md.all_bookies():
                assert await asyncio.to_thread(unreadable_on, victim, md) == [], f"ledger {lid}"
        return writers, victim, result

    writers, victim, result = asyncio.run(run())
    _report(result, path, writers, cluster)
    print(f"{victim} after the cut, for the acknowledged entries assigned to it: open ledgers "
          f"{_totals(answers)}, closed ledgers {_totals(closed_answers)}")
    assert _totals(answers).get("EUNKNOWN", 0) > 0, "the cut lost nothing on the victim: limbo was not exercised"
    denied = {lid: {s: e[:5] for s, e in per.items() if s not in ("EOK", "EUNKNOWN")} for lid, per in answers.items()}
    assert not any(denied.values()), f"the victim denied or corrupted acknowledged entries: {denied}"
    assert "EOK-wrong" not in _totals(closed_answers), closed_answers
    assert result.ok, f"checker: red on {result.red()}"


def _totals(answers: dict[int, dict[str, list[int]]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for per in answers.values():
        for status, eids in per.items():
            out[status] = out.get(status, 0) + len(eids)
    return out


async def _open_with(uri: str, bookie: str, ledgers: Iterable[int]) -> set[int]:
    """Those of ``ledgers`` that are not closed and have ``bookie`` in an ensemble."""
    out = set()
    for lid in list(ledgers):
        md = await asyncio.to_thread(_metadata, uri, lid)
        if not md.is_closed and bookie in md.all_bookies():
            out.add(lid)
    return out


def _repair_marks(uri: str, bookie: str) -> dict[int, str]:
    """ledger -> why, of the in-place repair marks of ``bookie``."""
    store = open_store(uri)
    try:
        return {m.ledger_id: m.why for m in UnderReplicationRegistry(store, "test").list_repairs()
                if m.bookie_id == bookie}
    finally:
        store.close()


def _metadata(uri: str, lid: int) -> LedgerMetadata:
    store = open_store(uri)
    try:
        return LedgerStore(store).read(lid)[0]
    finally:
        store.close()


def _repaired(cluster: PowerCluster, victim: str) -> bool:
    store = open_store(cluster.uri)
    try:
        marks = UnderReplicationRegistry(store, "test").list_repairs()
    finally:
        store.close()
    return not marks and cluster.limbo_ledgers(victim) == 0


def _correlated_run(cluster: PowerCluster, path: Path, rng: random.Random, *, acks: int, torn: bool,
                    recover_attempts: int) -> tuple[Writers, tuple[str, ...], set[int], CheckResult]:
    """Writers run; once ``acks`` appends are acknowledged, every bookie of one ledger's
    ensemble loses its power at the same instant; they restart, writing goes on a moment,
    then every ledger is closed or recovered and the history judged."""

    async def run() -> tuple[Writers, tuple[str, ...], set[int], CheckResult]:
        t0 = time.monotonic()
        with HistoryRecorder(path) as rec:
            writers = Writers(cluster.uri, rng.randrange(1 << 30), rec, writers=2, ledgers_each=2,
                              ledger_entries=(500, 3000))
            writers.start()
            await writers.wait_acks(acks, timeout_s=60)
            ensembles = writers.ensembles()
            ensemble = ensembles[rng.choice(sorted(ensembles))]
            # Right after a burst of acknowledgements: whatever was acknowledged and not yet
            # durable is in the volatile layers now.
            await asyncio.to_thread(cluster.cut, ensemble, torn=torn, rng=rng)
            _stamp(t0, f"cut {', '.join(ensemble)} after {writers.acks} acks")
            await asyncio.to_thread(cluster.restart, ensemble)
            _stamp(t0, "they are back")
            await asyncio.sleep(2.0)
            await writers.finish()
            _stamp(t0, "writers finished")
            left = await recover_all(cluster.uri, rec, writers.acked, attempts=recover_attempts)
            _stamp(t0, "recoveries done")
        _, _, result = await judge(cluster.uri, path)
        _stamp(t0, "judged")
        return writers, ensemble, left, result

    return asyncio.run(run())


@pytest.mark.slow
def test_a_correlated_cut_of_a_whole_ensemble_loses_nothing_acknowledged(power_cluster, tmp_path):
    rng = seeded_rng()
    cluster = power_cluster(4, SETTINGS)
    path = tmp_path / "history.jsonl"
    writers, ensemble, left, result = _correlated_run(cluster, path, rng, acks=rng.randint(2000, 6000),
                                                      torn=rng.random() < 0.5, recover_attempts=3)
    _report(result, path, writers, cluster)
    assert sorted(c["bookie"] for c in cluster.cuts) == sorted(ensemble)
    assert not left, f"ledgers that could not be recovered: {sorted(left)}\n{cluster.logs()}"
    assert result.ok, f"checker: red on {result.red()}"


@pytest.mark.slow
def test_without_journal_fsync_a_correlated_cut_loses_acknowledged_entries_and_the_checker_sees_it(
        power_cluster, tmp_path):
    """The checks can fail: bookies that acknowledge adds before they are durable lose them
    all in a cut of the whole ensemble (no checkpoint either: nothing written since boot is
    durable), and the checker's verdict is red."""
    rng = seeded_rng()
    cluster = power_cluster(3, {"journal_sync_data": False, "flush_interval_ms": 600_000})
    path = tmp_path / "history.jsonl"
    # Recovery cannot succeed (every bookie is in limbo and lost the entries): one attempt.
    writers, _, left, result = _correlated_run(cluster, path, rng, acks=3000, torn=False, recover_attempts=1)
    _report(result, path, writers, cluster)
    lost = result["lost"]
    assert not result.ok and not lost.ok, "a cut without journal fsync lost nothing: the checks cannot fail"
    assert lost.kinds() <= {"missing", "beyond-close", "ledger-missing"}, lost.kinds()
    print(f"{len(lost.counterexamples)} of {lost.checked} acknowledged entries lost; "
          f"{len(left)} ledger(s) could not be recovered")
