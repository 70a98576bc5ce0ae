"""The actor simulation itself (tests/helpers/actorsim.py): its crash model, and its boot
against the bookie's own (zbk/bookie/boot.py), so that the two cannot drift apart."""

from __future__ import annotations

import copy
import itertools
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.actorsim import (
    MK,
    PASSWORD,
    BookieSettings,
    Sim,
    SimDisk,
    blob,
    ledger_states,
    open_storage,
    phase_one,
    publish_limbo_marks,
)

from zbk.bookie.boot import BookieBoot
from zbk.config import BookieConfig, EntryLogConfig, JournalConfig
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.memory import MemoryMetadataStore
from zbk.metadata.registry import LedgerStore
from zbk.recovery.underreplication import UnderReplicationRegistry
from zbk.wire import messages as w
from zbk.wire.status import Status

ME = "b1:3181"


def _write(disk: SimDisk, path: Path, data: bytes, *, at: int | None = None) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if at is None:
            os.lseek(fd, 0, os.SEEK_END)
            disk.write(fd, data)
        else:
            disk.pwrite(fd, data, at)
    except BaseException:
        os.close(fd)
        raise
    return fd


def test_power_loss_undoes_every_write_since_the_last_fsync(tmp_path: Path) -> None:
    disk = SimDisk()
    f = tmp_path / "f"
    fd = _write(disk, f, b"durable-")
    disk.fsync(fd)
    disk.write(fd, b"appended")
    disk.pwrite(fd, b"XX", 2)
    disk.truncate(fd, 4)
    disk.pwrite(fd, b"grown", 20)
    os.close(fd)
    fresh = tmp_path / "fresh"
    os.close(_write(disk, fresh, b"never synced"))
    assert f.read_bytes() != b"durable-"
    disk.lose_power(tmp_path)
    assert f.read_bytes() == b"durable-"
    assert fresh.read_bytes() == b"", "a file never fsynced comes back empty"
    with pytest.raises(OSError, match="dead"):
        disk.write(0, b"x")


def test_kill_keeps_what_was_written_and_writes_nothing_more(tmp_path: Path) -> None:
    disk = SimDisk()
    f = tmp_path / "f"
    fd = _write(disk, f, b"written, not synced")
    disk.kill()
    with pytest.raises(OSError):
        disk.write(fd, b" more")
    with pytest.raises(OSError):
        disk.fsync(fd)
    os.close(fd)
    assert f.read_bytes() == b"written, not synced"
    disk.revive()
    disk.lose_power(tmp_path)  # still not durable: a later power loss takes it
    assert f.read_bytes() == b""


def test_a_deleted_files_writes_are_not_undone_on_the_file_that_reuses_its_inode(tmp_path: Path) -> None:
    disk = SimDisk()
    for i in range(20):  # tmpfs and ext4 hand a freed inode number out again soon
        old = tmp_path / f"old{i}"
        os.close(_write(disk, old, b"o" * 100))
        os.unlink(old)
        new = tmp_path / f"new{i}"
        fd = _write(disk, new, b"n" * 10)
        disk.fsync(fd)
        os.close(fd)
    disk.lose_power(tmp_path)
    assert all((tmp_path / f"new{i}").read_bytes() == b"n" * 10 for i in range(20))


def _md(lid: int, ensemble: tuple[str, ...], **kw: Any) -> LedgerMetadata:
    return LedgerMetadata(ledger_id=lid, ensemble_size=3, write_quorum=3, ack_quorum=2, password=PASSWORD,
                          fragments=((0, ensemble),), **kw)


def _store() -> MemoryMetadataStore:
    """Ledgers 1-3 and 6 name this bookie (3 CLOSED, with more entries than it holds); 4
    does not; 5 is not in the metadata."""
    store = MemoryMetadataStore()
    ledgers = LedgerStore(store)
    mine = (ME, "b2:3181", "b3:3181")
    for lid in (1, 2, 6):
        ledgers.create(_md(lid, mine), allocate_id=False)
    ledgers.create(_md(3, mine, state="CLOSED", last_entry_id=30, length=1), allocate_id=False)
    ledgers.create(_md(4, ("b2:3181", "b3:3181", "b4:3181")), allocate_id=False)
    return store


def _bookie_state(states: dict[int, Any], cache: Any) -> dict[int, tuple[Any, ...]]:
    return {lid: (st.master_key, st.fenced, st.limbo, st.lac, st.last_entry_id, tuple(cache.entry_ids(lid)))
            for lid, st in sorted(states.items())}


@pytest.mark.parametrize("journal_write_data", [True, False])
def test_the_simulations_boot_is_the_bookies(tmp_path: Path, journal_write_data: bool) -> None:
    """A bookie killed in the middle of adds, fences, explicit LACs and checkpoints, booted
    twice from copies of what survived: by the simulation (open_storage, phase_one,
    publish_limbo_marks, ledger_states) and by zbk's BookieBoot.boot. The Server would start
    with the same state, the index holds the same entries, the same repair marks appear."""
    acked: set[tuple[int, int]] = set()
    sim = Sim(tmp_path / "run", random.Random(7), acked,
              settings=BookieSettings(journal_write_data=journal_write_data, flush_interval_s=0.05))
    def add(lid: int, eid: int) -> Callable[[int], w.AddRequest]:
        return lambda rid: w.AddRequest(rid=rid, ledger_id=lid, master_key=MK, flags=w.AddFlag(0),
                                        entries=[blob(lid, eid)])

    for eid in range(20):
        for lid in (1, 2, 3, 4, 5):
            sim.send(add(lid, eid), lambda resp: None)
        if eid == 10:
            sim.send(lambda rid: w.ReadRequest(rid=rid, ledger_id=2, first_entry_id=0, flags=w.ReadFlag.FENCE,
                                               master_key=MK), lambda resp: None)
            sim.send(lambda rid: w.WriteLacRequest(rid=rid, ledger_id=1, master_key=MK, lac=15),
                     lambda resp: None)
        for _ in range(sim.rng.randrange(1, 30)):
            sim.step()
    sim.crash()  # kill -9, with whatever was in flight
    report: dict[str, Any] = {}
    states: dict[str, dict[int, tuple[Any, ...]]] = {}
    marks: dict[str, list[tuple[int, str]]] = {}
    for who in ("simulation", "bookie"):
        root = tmp_path / who
        shutil.copytree(tmp_path / "run", root)
        store = _store()
        if who == "simulation":
            disk = SimDisk()
            st = open_storage(root, BookieSettings(journal_write_data=journal_write_data), disk)
            # A brand-new cookie: BookieBoot.boot runs phase one (as for a replaced disk).
            report[who] = (st.unclean, st.replayed, phase_one(st.cache, store, ME))
            publish_limbo_marks(st.cache, store, ME)
            states[who] = _bookie_state(ledger_states(st.cache, st.logs), st.cache)
            for close in (st.logs.close, st.journal.close, st.cache.close):
                close()
        else:
            cfg = BookieConfig(bookie_id=ME, data_dir=str(root), metadata_uri=store.uri,
                               journal=JournalConfig(write_data=journal_write_data, max_size_mb=1,
                                                     pre_alloc_size_mb=0),
                               entry_log=EntryLogConfig(size_limit_mb=1))
            bookie = BookieBoot(cfg, store=store)
            r = bookie.boot()
            assert r.cookie_fixed
            report[who] = (r.unclean, r.replayed_records, r.phase_one_ledgers)
            states[who] = _bookie_state(bookie._ledger_states(), bookie.cache)
            for close in (bookie.logs.close, bookie.journal.close, bookie.cache.close):
                close()
        marks[who] = sorted((m.ledger_id, m.why) for m in UnderReplicationRegistry(store, ME).list_repairs())
        store.close()
    assert report["simulation"] == report["bookie"]
    assert report["bookie"][0] and report["bookie"][2] == 3  # unclean; ledgers 1, 2 and 6 marked
    assert states["simulation"] == states["bookie"]
    assert states["bookie"][2][1] and all(states["bookie"][lid][2] for lid in (1, 2, 6))  # fenced, limbo
    assert marks["simulation"] == marks["bookie"] == [(1, "limbo"), (2, "limbo"), (3, "unclean"), (6, "limbo")]
    if journal_write_data:
        assert all(states["bookie"][lid][5] for lid in (1, 2, 3, 4, 5)), "replay restored the journaled adds"


def _server_state(server: Any) -> dict[str, Any]:
    return {k: copy.deepcopy(v) for k, v in vars(server).items() if k not in ("reply", "outbox", "on_state_change")}


def test_the_server_ticks_left_out_are_those_that_would_do_nothing(tmp_path: Path) -> None:
    """BookieCores leaves out the Server's ticks while ``server_has_tick_work()`` is false,
    on the premise that ServerCore.on_tick then sends nothing, answers nothing and changes
    nothing. Checked at every such step of a run of adds, fences, explicit LACs, long polls
    and checkpoints, with a tick now and one far later. And the ticks that remain keep the
    Server's 50 ms grid: each comes a whole number of intervals after the one before (within
    the 1 ms step the simulation advances by), and every long poll that expires is answered
    at the first of them at or after its deadline."""
    rng = random.Random(int(os.environ.get("ZBK_SEED", "23")))
    sim = Sim(tmp_path, rng, set(), settings=BookieSettings(flush_interval_s=0.05), keep_delivered=False)
    cores, server = sim.bookie, sim.server
    expired: list[tuple[float, float, Any]] = []  # (deadline, answered at, response)
    ticks: list[float] = []
    real_tick = server.on_tick

    def counted_tick(now: float) -> None:
        ticks.append(now)
        real_tick(now)

    server.on_tick = counted_tick  # type: ignore[method-assign]

    def add(lid: int, eid: int) -> Callable[[int], w.AddRequest]:
        return lambda rid: w.AddRequest(rid=rid, ledger_id=lid, master_key=MK, flags=w.AddFlag(0),
                                        entries=[blob(lid, eid)])

    def long_poll(timeout_ms: int) -> None:
        deadline = sim.now + timeout_ms / 1000.0
        # Ledger 3 has entries 0 and 1 only (its LAC is 0): a poll past 5 can only expire.
        sim.send(lambda rid: w.ReadRequest(rid=rid, ledger_id=3, first_entry_id=6, flags=w.ReadFlag.LONG_POLL,
                                           previous_lac=5, timeout_ms=timeout_ms),
                 lambda resp: expired.append((deadline, sim.now, resp)))

    checked = 0
    for eid in range(2):
        sim.send(add(3, eid), lambda resp: None)
    for eid in range(40):
        for lid in (1, 2):
            sim.send(add(lid, eid), lambda resp: None)
        if eid % 5 == 2:
            long_poll(rng.randrange(1, 300))
        if eid == 20:
            sim.send(lambda rid: w.ReadRequest(rid=rid, ledger_id=2, first_entry_id=0, flags=w.ReadFlag.FENCE,
                                               master_key=MK), lambda resp: None)
            sim.send(lambda rid: w.WriteLacRequest(rid=rid, ledger_id=1, master_key=MK, lac=30), lambda resp: None)
        for _ in range(rng.randrange(1, 120)):
            sim.step()
            if not cores.server_has_tick_work():
                before, sent = _server_state(server), sum(map(len, cores.pipes.values()))
                for now in (sim.now, sim.now + 3600.0):
                    real_tick(now)
                assert not sim.replies and sum(map(len, cores.pipes.values())) == sent
                assert _server_state(server) == before
                checked += 1
    sim.settle()
    assert checked > 100
    interval = server.tick_interval_s
    assert len(ticks) > 20
    for before, at in itertools.pairwise(ticks):
        k = max(1, round((at - before) / interval))
        assert -1e-6 <= at - before - k * interval <= 0.001 + 1e-6, (before, at)
    assert len(expired) == 8
    for deadline, answered, resp in expired:
        assert isinstance(resp, w.ReadResponse) and resp.status == Status.ENOENTRY and not resp.entries, resp
        assert deadline - 1e-9 <= answered <= deadline + 0.05 + 0.001 + 1e-9, (answered, deadline)
