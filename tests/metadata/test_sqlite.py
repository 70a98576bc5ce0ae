"""What only the embedded store has: changelog trimming, an injectable lease clock that is
the host's monotonic one (steps of the wall clock do not move leases; a reboot drops them),
its schema version, and many processes creating one file at once."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from helpers.spawn import run_racing
from helpers.wait import wait_until

from zbk import limits
from zbk.clock import FakeClock
from zbk.errors import CorruptMetadataError, LeaseExpiredError, WatchCompactedError
from zbk.metadata.sqlite import SqliteStore
from zbk.metadata.store import WatchEvent

from .conftest import Recorder
from .workers import open_and_put


def test_changelog_is_trimmed_to_what_is_kept(tmp_path: Path) -> None:
    with SqliteStore(str(tmp_path / "m.db"), changelog_kept=10) as store:
        for i in range(3 * limits.sqlite_trim_every_revisions):
            store.put("k", str(i).encode())
        top = store.revision()
        with pytest.raises(WatchCompactedError):
            store.watch("k", Recorder(), start_revision=1)
        recent = Recorder()
        w = store.watch("k", recent, start_revision=top - 9)
        assert [e.revision for e in recent.wait_for(10)] == list(range(top - 9, top + 1))
        w.cancel()


def test_watch_that_falls_behind_reports_compaction(tmp_path: Path) -> None:
    path = str(tmp_path / "m.db")
    with SqliteStore(path, changelog_kept=10) as store, SqliteStore(path, changelog_kept=10) as writer:
        release = threading.Event()
        errors: list[Exception] = []
        seen: list[int] = []

        def slow(ev: WatchEvent) -> None:
            seen.append(ev.revision)
            release.wait(10)

        w = store.watch("s/", slow, on_error=errors.append)
        writer.put("s/first", b"")
        wait_until(lambda: seen, message="first event")
        for i in range(3 * limits.sqlite_trim_every_revisions):  # meanwhile history moves past the watch
            writer.put(f"s/{i}", b"")
        release.set()
        wait_until(lambda: errors, message="the compaction report")
        assert isinstance(errors[0], WatchCompactedError)
        count = len(seen)
        writer.put("s/later", b"")
        assert not wait_for_more(seen, count), "a stopped watch delivers nothing more"
        w.cancel()


def wait_for_more(seen: list[int], count: int) -> bool:
    try:
        wait_until(lambda: len(seen) > count, timeout_s=0.3)
        return True
    except AssertionError:
        return False


def test_leases_follow_the_injected_clock(tmp_path: Path) -> None:
    clock = FakeClock()
    with SqliteStore(str(tmp_path / "m.db"), clock=clock) as store:
        lease = store.grant_lease(10)
        store.put("l", b"1", lease=lease)
        clock.advance(9)
        store.keepalive(lease)
        clock.advance(9.9)
        assert store.get("l") is not None
        clock.advance(0.2)
        assert store.get("l") is None and store.list("") == []
        with pytest.raises(LeaseExpiredError):
            store.keepalive(lease)


def test_expiry_is_one_logged_revision_per_lease(tmp_path: Path) -> None:
    clock = FakeClock()
    with SqliteStore(str(tmp_path / "m.db"), clock=clock) as store:
        lease = store.grant_lease(5)
        for k in ("a", "b", "c"):
            store.put(k, b"", lease=lease)
        before = store.revision()
        recorder = Recorder()
        w = store.watch("", recorder, start_revision=before + 1)
        clock.advance(6)
        events = recorder.wait_for(3)
        assert [(e.kind, e.key, e.revision) for e in events] == [
            ("delete", "a", before + 1), ("delete", "b", before + 1), ("delete", "c", before + 1)]
        w.cancel()


def test_unknown_schema_version_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "m.db")
    SqliteStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = 3 WHERE name = 'format'")
    conn.close()
    with pytest.raises(CorruptMetadataError, match="unknown format 3"):
        SqliteStore(path)


class SteppedClock(FakeClock):
    """A host whose wall clock is stepped (NTP, ``date -s``) while its monotonic clock runs on."""

    def __init__(self) -> None:
        super().__init__()
        self.wall_offset_s = 0.0

    def time(self) -> float:
        return self.monotonic() + 1_700_000_000.0 + self.wall_offset_s


def test_sqlite_leases_ignore_wall_clock_steps(tmp_path: Path) -> None:
    """A step forward beyond the TTL expired every lease of the host at once (every
    autorecovery process exited, every bookie re-registered); a step back kept a dead
    holder's lease for the length of the step. Leases now count on the monotonic clock."""
    clock = SteppedClock()
    with SqliteStore(str(tmp_path / "m.db"), clock=clock) as store:
        kept, dead = store.grant_lease(10), store.grant_lease(10)
        store.put("kept", b"1", lease=kept)
        store.put("dead", b"1", lease=dead)
        clock.wall_offset_s = +3600.0
        store.keepalive(kept)  # raised LeaseExpiredError
        assert store.get("kept") is not None and store.get("dead") is not None
        clock.advance(5)
        clock.wall_offset_s = -3600.0
        store.keepalive(kept)
        clock.advance(5.1)  # the dead holder's TTL is over, whatever the wall clock says
        assert store.get("dead") is None and store.get("kept") is not None
        with pytest.raises(LeaseExpiredError):
            store.keepalive(dead)


def test_a_format_1_file_is_converted_keeping_what_each_lease_had_left(tmp_path: Path) -> None:
    clock = SteppedClock()
    path = str(tmp_path / "m.db")
    with SqliteStore(path, clock=clock) as store:
        alive, expired = store.grant_lease(10), store.grant_lease(10)
        store.put("alive", b"1", lease=alive)
        store.put("expired", b"1", lease=expired)
    with sqlite3.connect(path) as conn:  # as format 1 wrote them: wall-clock expiries
        conn.execute("UPDATE meta SET value = 1 WHERE name = 'format'")
        conn.execute("DELETE FROM meta WHERE name = 'boot'")
        conn.execute("UPDATE leases SET expires_at = ? WHERE id = ?", (clock.time() + 4, alive))
        conn.execute("UPDATE leases SET expires_at = ? WHERE id = ?", (clock.time() - 1, expired))
    conn.close()
    with SqliteStore(path, clock=clock) as store:
        assert store.get("alive") is not None and store.get("expired") is None
        clock.advance(3.9)
        assert store.get("alive") is not None
        clock.advance(0.2)
        assert store.get("alive") is None
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone() == (2,)
    conn.close()


def test_the_first_open_after_a_reboot_drops_the_previous_boots_leases(tmp_path: Path) -> None:
    path = str(tmp_path / "m.db")
    with SqliteStore(path) as store:
        lease = store.grant_lease(60)
        store.put("held", b"1", lease=lease)
        store.put("plain", b"1")
    with SqliteStore(path) as store:  # the same boot: nothing changes
        assert store.get("held") is not None
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = value + 1 WHERE name = 'boot'")
        (before,) = conn.execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()
    conn.close()
    with SqliteStore(path) as store:
        recorder = Recorder()
        store.watch("", recorder, start_revision=before + 1)
        assert store.get("held") is None and store.get("plain") is not None
        assert [(e.kind, e.key) for e in recorder.wait_for(1)] == [("delete", "held")]
        with pytest.raises(LeaseExpiredError):
            store.keepalive(lease)


def test_many_processes_create_one_file_at_once(tmp_path: Path) -> None:
    uri = f"sqlite://{tmp_path}/fresh.db"
    versions = run_racing(open_and_put, [(uri, f"p{i}") for i in range(4)])
    assert sorted(versions) == [1, 2, 3, 4]


def _stall(path: Path, seconds: float, started: threading.Event) -> None:
    """Another process's writer holding the file's write lock (as in a slow fsync)."""
    conn = sqlite3.connect(str(path), timeout=30, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        started.set()
        threading.Event().wait(seconds)
        conn.execute("COMMIT")
    finally:
        conn.close()


def test_a_stalled_store_does_not_expire_a_lease_being_kept_alive(tmp_path: Path) -> None:
    """A keep-alive blocked behind a stalled writer for longer than the TTL still keeps its
    lease: the stall was the store's, not the holder's. A holder that kept nothing alive
    expires one TTL after the stall."""
    path = tmp_path / "m.db"
    with SqliteStore(str(path)) as store:
        kept, dead = store.grant_lease(1), store.grant_lease(1)
        store.put("kept", b"1", lease=kept)
        store.put("dead", b"1", lease=dead)
        started = threading.Event()
        staller = threading.Thread(target=_stall, args=(path, 2.5, started))
        staller.start()
        assert started.wait(5)
        store.keepalive(kept)  # waits for the lock about 2.5 s, 2.5 TTLs
        staller.join()
        assert store.get("kept") is not None, "kept alive through the stall"
        assert store.get("dead") is not None, "every lease got a TTL from the end of the stall"

        def dead_gone() -> bool:
            store.keepalive(kept)  # the live holder goes on keeping its lease
            return store.get("dead") is None

        wait_until(dead_gone, timeout_s=3, interval_s=0.1, message="the lease nobody keeps alive to expire")
        assert store.get("kept") is not None
        with pytest.raises(LeaseExpiredError):
            store.keepalive(dead)



def test_processes_opening_a_new_file_together_all_get_it(tmp_path: Path) -> None:
    """Processes that open a new metadata file together race to turn it to WAL, and SQLite
    answers a loser "database is locked" at once, without its busy handler (8 forked
    openers: 8 rounds of 30 had one fail before the open was retried; this test with six
    rounds failed in one run of two). Eight openers, twelve new files: every open succeeds
    and every write lands."""
    for r in range(12):
        uri = f"sqlite://{tmp_path}/fresh{r}.db"
        versions = run_racing(open_and_put, [(uri, f"p{i}") for i in range(8)])
        assert sorted(versions) == list(range(1, 9))
