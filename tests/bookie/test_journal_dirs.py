"""Several journal directories on one bookie: one journal per directory, ledgers assigned by
id, every journal replayed after kill -9, and the cookie's journal list (expansion accepted,
removal and reordering refused). The cookie rules first, in-process; then real bookies."""

from __future__ import annotations

import dataclasses
import os
import random
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from zbk import limits
from zbk.bookie.cookiecheck import added_journal_dirs, check_cookies
from zbk.config import BookieConfig
from zbk.errors import ConfigError, CookieMismatchError, ZbkError
from zbk.metadata.registry import read_cookie as read_meta_cookie
from zbk.metadata.uri import open_store
from zbk.storage.cookie import read_cookie, write_cookie
from zbk.storage.journal import list_segments, replay
from zbk.storage.markers import read_last_mark
from zbk.wire import messages as w
from zbk.wire.codec import encode
from zbk.wire.status import Status

from .util import MK, add, check_payloads, entry, read, seeded_rng

# -- the cookie's journal list (zbk/bookie/cookiecheck.py) ------------------------------------


def test_journal_dirs_may_only_be_appended() -> None:
    assert added_journal_dirs(["/a"], ["/a", "/b", "/c"]) == ["/b", "/c"]
    assert added_journal_dirs(["/a", "/b"], ["/a", "/b"]) == []
    with pytest.raises(CookieMismatchError, match=r"journal directories \['/b'\] were removed"):
        added_journal_dirs(["/a", "/b"], ["/a"])
    with pytest.raises(CookieMismatchError, match="reordered"):
        added_journal_dirs(["/a", "/b"], ["/b", "/a"])
    with pytest.raises(CookieMismatchError, match="reordered"):
        added_journal_dirs(["/a", "/b"], ["/a", "/c", "/b"])  # inserted, not appended: positions move
    with pytest.raises(CookieMismatchError, match="reordered"):
        added_journal_dirs(["/a"], ["/c", "/a"])


def test_journal_dirs_are_distinct_and_bounded(tmp_path: Path) -> None:
    base = dict(metadata_uri=f"sqlite:///{tmp_path}/meta.db", data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="names a directory twice"):
        BookieConfig(**base, journal_dirs=(f"{tmp_path}/j", f"{tmp_path}/x/../j")).validate()  # type: ignore[arg-type]
    many = tuple(f"{tmp_path}/j{i}" for i in range(limits.journal_dirs_max + 1))
    with pytest.raises(ConfigError, match=f"at most {limits.journal_dirs_max}"):
        BookieConfig(**base, journal_dirs=many).validate()  # type: ignore[arg-type]
    assert len(BookieConfig(**base, journal_dirs=many[:-1]).validate().journal_dirs) == limits.journal_dirs_max  # type: ignore[arg-type]


def _cfg(tmp_path: Path, journals: list[str], **kw: Any) -> BookieConfig:
    return BookieConfig(metadata_uri=f"sqlite:///{tmp_path}/meta.db", data_dir=str(tmp_path / "b"), port=4999,
                        journal_dirs=tuple(str(tmp_path / j) for j in journals), **kw).validate()


def _dirs(cfg: BookieConfig) -> list[str]:
    return [*cfg.journal_dirs, *cfg.ledger_dirs, *cfg.index_dirs]


def test_an_added_empty_journal_dir_updates_the_cookie_everywhere(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/meta.db")
    try:
        one = _cfg(tmp_path, ["j0"])
        for d in _dirs(one):
            os.makedirs(d)
        assert check_cookies(one, store) is True  # brand new: phase one runs (and finds nothing)
        first = read_meta_cookie(store, one.bookie_id)
        assert first is not None and first[0].journal_dirs == one.journal_dirs
        two = _cfg(tmp_path, ["j0", "j1"])
        assert check_cookies(two, store) is False, "an expansion is no cookie fix: no phase one"
        found = read_meta_cookie(store, two.bookie_id)
        assert found is not None
        cookie = found[0]
        assert cookie.journal_dirs == two.journal_dirs and cookie.incarnation == first[0].incarnation
        assert all(read_cookie(d) == cookie for d in _dirs(two))
        assert check_cookies(two, store) is False  # and it now simply matches
    finally:
        store.close()


def test_an_expansion_interrupted_before_the_metadata_is_done_again(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/meta.db")
    try:
        one = _cfg(tmp_path, ["j0"])
        for d in _dirs(one):
            os.makedirs(d)
        check_cookies(one, store)
        old = read_cookie(one.journal_dirs[0])
        assert old is not None
        two = _cfg(tmp_path, ["j0", "j1"])
        expanded = dataclasses.replace(old, journal_dirs=two.journal_dirs)
        # The crash came after the new cookie reached some directories (the new one too).
        for d in (two.journal_dirs[1], two.journal_dirs[0], two.index_dirs[0]):
            write_cookie(d, expanded)
        assert check_cookies(two, store) is False
        found = read_meta_cookie(store, two.bookie_id)
        assert found is not None and found[0] == expanded
        assert all(read_cookie(d) == expanded for d in _dirs(two))
    finally:
        store.close()


def test_journal_dir_changes_the_cookie_refuses_even_with_auto_fix(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path}/meta.db")
    try:
        two = _cfg(tmp_path, ["j0", "j1"])
        for d in _dirs(two):
            os.makedirs(d)
        check_cookies(two, store)
        for journals, match in ((["j0"], "were removed"), (["j1", "j0"], "reordered")):
            for fix in (False, True):
                with pytest.raises(CookieMismatchError, match=match):
                    check_cookies(_cfg(tmp_path, journals, auto_fix_cookie=fix), store)
        (tmp_path / "j2").mkdir()
        (tmp_path / "j2" / "0000000000000001.jnl").write_bytes(b"someone else's records")
        for fix in (False, True):
            with pytest.raises(CookieMismatchError, match="new to this bookie but not empty"):
                check_cookies(_cfg(tmp_path, ["j0", "j1", "j2"], auto_fix_cookie=fix), store)
        # An added journal directory beside another mismatch is no plain expansion.
        os.unlink(os.path.join(two.index_dirs[0], "COOKIE"))
        three = _cfg(tmp_path, ["j0", "j1", "j3"])
        with pytest.raises(CookieMismatchError, match="no cookie"):
            check_cookies(three, store)
        assert check_cookies(dataclasses.replace(three, auto_fix_cookie=True), store) is True  # fixed: phase one
        assert all(read_cookie(d) is not None and read_cookie(d).journal_dirs == three.journal_dirs  # type: ignore[union-attr]
                   for d in _dirs(three))
    finally:
        store.close()


# -- real bookies ------------------------------------------------------------------------------

def _journals(bk: Any, *names: str) -> list[Path]:
    """Configure ``bk`` with these journal directories (beside its data dir); returns them."""
    paths = [bk.root / f"{bk.data_dir.name}-{n}" if n != "default" else bk.data_dir / "journal" for n in names]
    bk.settings["journal_dirs"] = ",".join(str(p) for p in paths)
    return paths


def _log_from(bk: Any, offset: int) -> str:
    with open(bk.log, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _log_size(bk: Any) -> int:
    return os.path.getsize(bk.log) if os.path.exists(bk.log) else 0


def _multi(c: Any, shape: list[tuple[int, list[int]]]) -> int:
    parts = [w.AddRequest(rid=0, ledger_id=lid, master_key=MK, flags=w.AddFlag(0), entries=[entry(lid, e) for e in eids])
             for lid, eids in shape]
    rid = c.next_rid()
    c.sock.send_multipart(encode(w.MultiAddRequest(rid=rid, parts=parts)), copy=False)
    return rid


def _read_all(bk: Any, acked: dict[int, int]) -> None:
    with bk.connect(timeout_s=30) as c:
        for lid, last in acked.items():
            seen: list[int] = []
            while len(seen) < last + 1:
                resp = read(c, lid, len(seen), count=1000)
                assert resp.entries, f"ledger {lid}: entry {len(seen)} of 0..{last} missing ({resp.status!r})"
                seen += check_payloads(resp, lid)


def _write_until_killed(bk: Any, rng: random.Random, next_eid: dict[int, int], acked: dict[int, int],
                        kill_after: int) -> int:
    """Pipelined ADD_ENTRYs to single ledgers and MULTI_ADDs over ledgers of both journals;
    kill -9 once ``kill_after`` entries were acknowledged. Returns the entries acknowledged."""
    got = 0
    pending: dict[int, list[tuple[int, list[int]]]] = {}
    killed = False
    ledgers = list(next_eid)
    with bk.connect(timeout_s=5) as c:
        while True:
            while not killed and len(pending) < 32:
                chosen = rng.sample(ledgers, rng.randrange(2, 8)) if rng.random() < 0.3 else [rng.choice(ledgers)]
                shape = []
                for lid in chosen:
                    shape.append((lid, list(range(next_eid[lid], next_eid[lid] + rng.randrange(1, 6)))))
                    next_eid[lid] = shape[-1][1][-1] + 1
                if len(shape) == 1:
                    rid = c.next_rid()
                    lid, eids = shape[0]
                    c.send(w.AddRequest(rid=rid, ledger_id=lid, master_key=MK, flags=w.AddFlag(0),
                                        entries=[entry(lid, e) for e in eids]))
                else:
                    rid = _multi(c, shape)
                pending[rid] = shape
            try:
                resp = c.recv(timeout_s=2 if killed else 10)
            except ZbkError:
                assert killed, "bookie stopped answering before it was killed"
                return got
            shape = pending.pop(resp.rid)
            statuses = list(resp.statuses) if isinstance(resp, w.MultiAddResponse) else [resp.status]
            assert statuses == [Status.EOK] * len(shape), resp
            for lid, eids in shape:
                acked[lid] = max(acked[lid], eids[-1])
                got += len(eids)
            if not killed and got >= kill_after:
                bk.kill9()
                killed = True


def test_two_journals_survive_kill9_with_every_acknowledged_entry_readable(bookies) -> None:
    """Checkpoints run (every 300 ms, 1 MiB segments) while adds and MULTI_ADDs over the
    ledgers of both journals are in flight; kill -9 at random points, restart, repeat: every
    acknowledged entry reads back, both journals keep their own mark, and a journal's
    segments hold only its own ledgers."""
    rng = seeded_rng()
    bk = bookies(settings={"flush_interval_ms": 300, "journal_max_size_mb": 1, "entry_log_size_limit_mb": 2})
    j0, j1 = _journals(bk, "j0", "j1")
    bk.start()
    assert bk.proc is not None
    threads = {Path(f"/proc/{bk.proc.pid}/task/{t}/comm").read_text().strip()
               for t in os.listdir(f"/proc/{bk.proc.pid}/task")}
    assert {"zbk-journal-0", "zbk-journal-1"} <= threads and "zbk-journal" not in threads, threads
    next_eid = dict.fromkeys(range(20), 0)
    acked = dict.fromkeys(range(20), -1)
    total = rounds = 0
    while total < 6000:
        total += _write_until_killed(bk, rng, next_eid, acked, rng.randrange(500, 2500))
        rounds += 1
        for i, d in enumerate((j0, j1)):  # every record left in a journal is of its own ledgers
            ledgers = {rec.ledger_id for rec, _ in replay(str(d), read_last_mark(str(bk.data_dir / "index"), journal=i))}
            assert all(lid % 2 == i for lid in ledgers), (i, sorted(ledgers))
        bk.start()
        for lid in next_eid:  # unacknowledged ids are written again
            next_eid[lid] = acked[lid] + 1
    _read_all(bk, acked)
    index = bk.data_dir / "index"
    assert (index / "lastMark").exists() and (index / "lastMark.1").exists()
    assert len(list_segments(str(j0))) <= 4 and len(list_segments(str(j1))) <= 4, "checkpoints did not trim both"
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{bk.http_port}/metrics", timeout=10).read().decode()
    for label in ("0", "1"):
        assert f'zbk_journal_fsync_seconds_count{{journal="{label}"}}' in metrics
    print(f"rounds={rounds} acked={total}")
    assert bk.stop() == 0


def test_replay_covers_both_journals_with_their_meta_records(bookies) -> None:
    """No checkpoint after boot (flush interval of an hour): after kill -9 everything comes
    back from the two journals' replay, adds, a fence and a MULTI_ADD alike."""
    bk = bookies(settings={"flush_interval_ms": 3_600_000})
    j0, j1 = _journals(bk, "j0", "j1")
    bk.start()
    acked = {10: 4, 11: 4, 20: 0, 21: 1, 22: 0, 23: 1}
    with bk.connect() as c:
        assert add(c, 10, list(range(5))).status == Status.EOK
        assert add(c, 11, list(range(5))).status == Status.EOK
        rid = _multi(c, [(20, [0]), (21, [0, 1]), (22, [0]), (23, [0, 1])])
        resp = c.recv()
        assert resp.rid == rid and list(resp.statuses) == [Status.EOK] * 4
        fence = c.call(w.ReadLacRequest(rid=c.next_rid(), ledger_id=13, flags=w.ReadFlag.FENCE, master_key=MK))
        assert fence.status in (Status.EOK, Status.ENOENTRY, Status.ENOLEDGER), fence
        assert c.call(w.ForceLedgerRequest(rid=c.next_rid(), ledger_id=11)).status == Status.EOK
    bk.kill9()
    index = str(bk.data_dir / "index")
    records = [[(rec.type.name, rec.ledger_id) for rec, _ in replay(str(d), read_last_mark(index, journal=i))]
               for i, d in enumerate((j0, j1))]
    assert {lid for _, lid in records[0]} == {10, 20, 22}
    assert {lid for _, lid in records[1]} == {11, 13, 21, 23}
    assert ("FENCE", 13) in records[1]
    size = _log_size(bk)
    bk.start()
    log = _log_from(bk, size)
    for d, recs in ((j0, records[0]), (j1, records[1])):
        assert f"journal replay: {d}: {len(recs)} records" in log, log
    _read_all(bk, acked)
    with bk.connect() as c:
        assert add(c, 13, [0]).status == Status.EFENCED, "the fence journaled in journal 1 came back"
    assert bk.stop() == 0


def test_adding_a_journal_dir_expands_the_cookie_and_keeps_the_data(bookies) -> None:
    """A bookie with its one default journal is killed with records only in that journal; it
    restarts with a second journal directory: accepted, the cookie updated locally and in
    metadata (same incarnation), every entry there, the odd ledgers now journaled in the new
    directory; and it survives a kill -9 in its new shape."""
    bk = bookies(settings={"flush_interval_ms": 3_600_000})
    bk.start()
    acked = dict.fromkeys(range(6), 9)
    with bk.connect() as c:
        for lid in acked:
            assert add(c, lid, list(range(10))).status == Status.EOK
    bk.kill9()
    store = open_store(bookies.metadata_uri)
    before = read_meta_cookie(store, bk.bookie_id)
    assert before is not None and before[0].journal_dirs == (str(bk.data_dir / "journal"),)
    j0, j1 = _journals(bk, "default", "j1")
    size = _log_size(bk)
    bk.start()
    log = _log_from(bk, size)
    assert "(expansion)" in log and "cookie_fixed=False" in log, log
    after = read_meta_cookie(store, bk.bookie_id)
    assert after is not None and after[0].journal_dirs == (str(j0), str(j1))
    assert after[0].incarnation == before[0].incarnation
    for d in (j0, j1, bk.data_dir / "ledgers", bk.data_dir / "index"):
        assert read_cookie(str(d)) == after[0], d
    _read_all(bk, acked)
    with bk.connect() as c:
        for lid in acked:
            assert add(c, lid, [10, 11]).status == Status.EOK
            acked[lid] = 11
    bk.kill9()
    index = str(bk.data_dir / "index")
    new = {rec.ledger_id for rec, _ in replay(str(j1), read_last_mark(index, journal=1))}
    assert new == {1, 3, 5}
    bk.start()
    _read_all(bk, acked)
    assert bk.stop() == 0
    store.close()


def test_removing_reordering_or_losing_a_journal_dir_is_refused(bookies) -> None:
    bk = bookies()
    j0, j1 = _journals(bk, "j0", "j1")
    bk.start()
    with bk.connect() as c:
        for lid in (1, 2):
            assert add(c, lid, [0, 1, 2]).status == Status.EOK
    assert bk.stop() == 0
    for journals, why in ((("j0",), "were removed"), (("j1", "j0"), "reordered")):
        for fix in (False, True):
            _journals(bk, *journals)
            bk.settings["auto_fix_cookie"] = fix
            size = _log_size(bk)
            bk.start(wait=False)
            assert bk.exit_code(60) == 4, _log_from(bk, size)
            assert why in _log_from(bk, size)
    bk.settings["auto_fix_cookie"] = False
    # A previously listed journal directory that comes back empty (a replaced disk): refused as before.
    _journals(bk, "j0", "j1")
    for name in os.listdir(j1):
        os.unlink(j1 / name)
    size = _log_size(bk)
    bk.start(wait=False)
    assert bk.exit_code(60) == 4
    assert f"{j1}: no cookie" in _log_from(bk, size)
    bk.settings["auto_fix_cookie"] = True  # the operator's fix: phase one, the data was checkpointed
    bk.start()
    _read_all(bk, {1: 2, 2: 2})
    assert bk.stop() == 0


def test_a_failing_second_journal_stops_the_bookie_with_the_journal_exit_code(bookies) -> None:
    bk = bookies(settings={"journal_max_size_mb": 1})
    _, j1 = _journals(bk, "j0", "j1")
    bk.start()
    with bk.connect(timeout_s=3) as c:
        assert add(c, 1, [0], size=1024).status == Status.EOK
        for name in os.listdir(j1):  # the next segment of journal 1 cannot be created
            os.unlink(j1 / name)
        j1.rmdir()
        try:
            for k in range(1, 200):  # > 1 MiB into ledger 1 (journal 1): a rotation into the missing directory
                assert add(c, 1, list(range(k * 10 - 9, k * 10 + 1)), size=1024).status == Status.EOK
        except ZbkError:
            pass  # the bookie died: in-flight adds are never acknowledged
    assert bk.exit_code(30) == 11, bk.log_tail()
    assert "actor journal-1 crashed" in bk.log_tail(100)
