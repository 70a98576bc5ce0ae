"""The embedded metadata store: one sqlite3 file shared by many processes on one host.

URI: ``sqlite:///abs/path/meta.db[?scope=name]`` (scope defaults to ``zbk``).

It mirrors etcd's model (see :mod:`zbk.metadata.store`) so that one contract suite holds
for both drivers. Several scopes may share one file: keys are stored with the scope
prefix ``/<scope>/`` exactly as in etcd, and the revision counter and lease ids are
file-wide, as they are cluster-wide in etcd.

Schema (format 2, recorded in ``meta.format``)::

    meta(name TEXT PRIMARY KEY, value INTEGER)
        'format'     schema version (2; a format 1 file is converted when it is opened)
        'revision'   the store-wide revision: +1 per committed change
        'compacted'  highest revision trimmed from the changelog (watches must start above it)
        'boot'       the boot of the host the lease expiries count from (see boot_number)
    kv(key BLOB PRIMARY KEY, value BLOB, mod_revision INTEGER, create_revision INTEGER,
       lease INTEGER NULL)
    leases(id INTEGER PRIMARY KEY AUTOINCREMENT, ttl_s INTEGER, expires_at REAL)
        expires_at: seconds on the host's CLOCK_MONOTONIC (format 1: on the wall clock)
    changelog(revision INTEGER, key BLOB, kind TEXT 'put'|'delete', value BLOB NULL,
              PRIMARY KEY (revision, key))

Keys are BLOBs of UTF-8 so that sqlite's memcmp order is etcd's byte order.

Concurrency: WAL journal (readers never block the writer), ``synchronous=FULL`` (a
committed ledger-metadata change survives power loss, like an etcd commit), a busy
timeout, and ``BEGIN IMMEDIATE`` for every write, so that a write transaction takes the
file's write lock before it reads what it compares: compare-and-set is atomic across
processes. Each store object holds one connection guarded by a lock (one process may
own several store objects).

Leases run on the host's monotonic clock: ``expires_at = monotonic() + ttl``. Every process
of the file is on one host (sqlite's WAL needs shared memory), and on Linux CLOCK_MONOTONIC
is one clock for the whole host, counted from its boot, that a step of the wall clock (NTP,
``date -s``) never moves. So a step neither expires a live holder's lease early nor keeps a
dead holder's lease alive, as etcd's leases, timed on its own monotonic clock, are not
moved by one. (CLOCK_MONOTONIC, not CLOCK_BOOTTIME: a suspend stops every holder with the
host, and should expire nothing.) The clock restarts at a reboot: the file records which
boot its expiries count from, and the first process that opens it after a reboot drops
every lease of the previous boot with its keys (no holder survived it). Reads filter
out keys whose lease has expired, so an expired lease's keys vanish at the instant of
expiry even if no sweep has run yet. The sweep that deletes them and logs their delete
events runs at the start of every write transaction, on reads that notice an expired
lease, and in the watch poller; each swept lease is one revision, as a revoke is in etcd.
A stall of the store is not its lease holders' fault: a write that waited ``limits.sqlite_stall_s_min``
or more for the file's write lock (a writer stuck in a slow fsync on a busy disk blocks
every keep-alive) first gives every lease a full TTL from now, as etcd's new leader
extends every lease; a holder that is really gone expires one TTL later. Reads in the
meantime still hide keys whose lease ran out during the stall.

Watches: one poller thread per store object reads the changelog every
``poll_interval_s`` and hands events to each watch in (revision, key) order, tracking a
per-watch cursor so each event is delivered once. The changelog keeps at least the last
``changelog_kept`` revisions; a watch starting (or falling) below that raises (or
reports) WatchCompactedError.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from zbk import limits
from zbk.clock import SYSTEM_CLOCK, Clock
from zbk.errors import (
    ConfigError,
    CorruptMetadataError,
    KeyExistsError,
    LeaseExpiredError,
    MetadataError,
    MetadataUnavailableError,
    MetadataVersionError,
    WatchCompactedError,
    ZbkError,
)
from zbk.metadata.store import KeyValue, WatchCallback, WatchEvent

log = logging.getLogger(__name__)

FORMAT = 2

ErrorCallback = Callable[[Exception], None]

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS kv (key BLOB PRIMARY KEY, value BLOB NOT NULL,"
    " mod_revision INTEGER NOT NULL, create_revision INTEGER NOT NULL, lease INTEGER)",
    "CREATE INDEX IF NOT EXISTS kv_by_lease ON kv(lease) WHERE lease IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS leases (id INTEGER PRIMARY KEY AUTOINCREMENT,"
    " ttl_s INTEGER NOT NULL, expires_at REAL NOT NULL)",
    "CREATE INDEX IF NOT EXISTS leases_by_expiry ON leases(expires_at)",
    "CREATE TABLE IF NOT EXISTS changelog (revision INTEGER NOT NULL, key BLOB NOT NULL,"
    " kind TEXT NOT NULL, value BLOB, PRIMARY KEY (revision, key)) WITHOUT ROWID",
    f"INSERT OR IGNORE INTO meta (name, value) VALUES ('format', {FORMAT}), ('revision', 0), ('compacted', 0)",
)

# A key is visible unless it is bound to a lease that has expired (or vanished).
_ALIVE = "(kv.lease IS NULL OR EXISTS (SELECT 1 FROM leases l WHERE l.id = kv.lease AND l.expires_at > ?))"


def boot_number() -> int:
    """This boot of the host, as a number: the first 60 bits of the kernel's boot id (0
    where the kernel does not tell it; then a reboot cannot be recognised)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return int(f.read().strip().replace("-", "")[:15], 16)
    except (OSError, ValueError):
        return 0


def prefix_end(prefix: bytes) -> bytes:
    """The smallest byte string greater than every string starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    assert stripped, "a scoped prefix is never empty or all 0xff"
    return stripped[:-1] + bytes([stripped[-1] + 1])


class SqliteStore:
    """A :class:`~zbk.metadata.store.MetadataStore` on one sqlite3 file."""

    def __init__(self, path: str, *, scope: str = "zbk", uri: str | None = None,
                 clock: Clock = SYSTEM_CLOCK,
                 changelog_kept: int = limits.watch_changelog_revisions_kept,
                 poll_interval_s: float = limits.sqlite_poll_interval_s_default,
                 busy_timeout_s: float = limits.sqlite_busy_timeout_s_default) -> None:
        assert changelog_kept >= 1 and poll_interval_s > 0
        self.path = path
        self.scope = scope
        self.uri = uri or f"sqlite://{path}?scope={scope}"
        self._prefix = f"/{scope}/".encode()
        self._clock = clock
        self._kept = changelog_kept
        self._poll_interval_s = poll_interval_s
        self._lock = threading.RLock()
        self._closed = False
        self._conn = self._connect(path, busy_timeout_s)
        try:
            self._adopt_clock()
        except BaseException:
            self._conn.close()
            raise
        self._watches: list[SqliteWatch] = []
        self._poller: threading.Thread | None = None
        self._stop = threading.Event()

    # -- connection ---------------------------------------------------------------------
    @staticmethod
    def _connect(path: str, busy_timeout_s: float) -> sqlite3.Connection:
        parent = os.path.dirname(path) or "."
        if not os.path.isdir(parent):
            raise ConfigError(f"sqlite metadata: directory {parent!r} does not exist")
        # Processes that open a new file at once (a sandbox's bookies and auditor) race to
        # turn it to WAL, and SQLite answers the losers "database is locked" at once, without
        # its busy handler: such an open is tried again until the busy timeout has passed.
        deadline = time.monotonic() + busy_timeout_s
        while True:
            try:
                # isolation_level=None: we issue BEGIN/COMMIT ourselves. check_same_thread=False:
                # the poller and callers share the connection, serialized by self._lock.
                conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None,
                                       check_same_thread=False)
            except sqlite3.Error as e:
                raise MetadataUnavailableError(f"sqlite metadata {path}: cannot open ({e})") from None
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=FULL")
                conn.execute("BEGIN IMMEDIATE")
                for stmt in _SCHEMA:
                    conn.execute(stmt)
                (fmt,) = conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
                conn.execute("COMMIT")
                break
            except sqlite3.OperationalError as e:  # locked beyond the busy timeout, read-only, ...
                conn.close()
                if "locked" in str(e) and time.monotonic() < deadline:
                    time.sleep(limits.sqlite_open_retry_pause_s)
                    continue
                raise MetadataUnavailableError(f"sqlite metadata {path}: cannot open ({e})") from None
            except sqlite3.DatabaseError as e:  # "file is not a database" and the like
                conn.close()
                raise CorruptMetadataError(f"sqlite metadata {path}: not a zbk metadata database ({e})") from None
        if fmt not in (1, FORMAT):
            conn.close()
            raise CorruptMetadataError(f"sqlite metadata {path}: unknown format {fmt} (this zbk reads 1 and {FORMAT})")
        return conn

    def _adopt_clock(self) -> None:
        """Make the file's lease expiries count on this host's monotonic clock, this boot:
        convert a format 1 file (wall-clock expiries; its leases keep what they had left),
        and drop every lease of a previous boot with its keys (the first open after a
        reboot: the clock restarted, and no holder survived)."""
        with self._lock, _translated(self.path):
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                (fmt,) = conn.execute("SELECT value FROM meta WHERE name = 'format'").fetchone()
                if fmt == 1:
                    conn.execute("UPDATE leases SET expires_at = ? + MIN(MAX(expires_at - ?, 0), ttl_s)",
                                 (self._clock.monotonic(), self._clock.time()))
                    conn.execute("UPDATE meta SET value = ? WHERE name = 'format'", (FORMAT,))
                    log.info("sqlite metadata %s: converted to format %d (leases on the monotonic clock)",
                             self.path, FORMAT)
                boot = boot_number()
                row = conn.execute("SELECT value FROM meta WHERE name = 'boot'").fetchone()
                if row is None or (boot != 0 and row[0] != boot):
                    if row is not None:
                        dead = [lease for (lease,) in conn.execute("SELECT id FROM leases ORDER BY id")]
                        for lease in dead:
                            self._drop_lease(conn, lease)
                        log.warning("sqlite metadata %s: the host rebooted; dropped the %d lease(s) of its "
                                    "previous boot", self.path, len(dead))
                    conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('boot', ?)", (boot,))
            except BaseException:
                _end(conn, "ROLLBACK")
                raise
            _end(conn, "COMMIT")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot for several statements (a deferred read transaction)."""
        with self._lock, _translated(self.path):
            self._check_open()
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            finally:
                _end(self._conn, "COMMIT")

    @contextmanager
    def _write(self) -> Iterator[tuple[sqlite3.Connection, float]]:
        """A write transaction holding the file's write lock from its first statement.

        Expired leases are swept first. An expected failure (a ZbkError raised by the
        body before it changed anything) still commits, so that the sweep is kept."""
        with self._lock, _translated(self.path):
            self._check_open()
            conn = self._conn
            asked = time.monotonic()
            conn.execute("BEGIN IMMEDIATE")
            try:
                now = self._clock.monotonic()
                if time.monotonic() - asked >= limits.sqlite_stall_s_min:
                    # The store was stalled (another writer held the lock that long, e.g. in
                    # a slow fsync on a busy disk): every keep-alive was blocked like this
                    # write. As etcd's new leader does, give each lease a full TTL from now
                    # before sweeping; a holder that is really gone expires one TTL later.
                    conn.execute("UPDATE leases SET expires_at = MAX(expires_at, ? + ttl_s)", (now,))
                self._sweep(conn, now)
                yield conn, now
            except ZbkError:
                _end(conn, "COMMIT")
                raise
            except BaseException:
                _end(conn, "ROLLBACK")
                raise
            _end(conn, "COMMIT")

    def _check_open(self) -> None:
        if self._closed:
            raise MetadataError(f"metadata store {self.uri} is closed")

    # -- revisions, leases, changelog (inside a write transaction) ------------------------
    def _bump(self, conn: sqlite3.Connection) -> int:
        conn.execute("UPDATE meta SET value = value + 1 WHERE name = 'revision'")
        (rev,) = conn.execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()
        if rev % limits.sqlite_trim_every_revisions == 0:
            self._trim(conn, rev - self._kept)
        return int(rev)

    @staticmethod
    def _trim(conn: sqlite3.Connection, upto: int) -> None:
        (compacted,) = conn.execute("SELECT value FROM meta WHERE name = 'compacted'").fetchone()
        if upto > compacted:
            conn.execute("DELETE FROM changelog WHERE revision <= ?", (upto,))
            conn.execute("UPDATE meta SET value = ? WHERE name = 'compacted'", (upto,))

    @staticmethod
    def _log(conn: sqlite3.Connection, rev: int, key: bytes, kind: str, value: bytes | None) -> None:
        conn.execute("INSERT INTO changelog (revision, key, kind, value) VALUES (?, ?, ?, ?)",
                     (rev, key, kind, value))

    def _sweep(self, conn: sqlite3.Connection, now: float) -> None:
        expired = conn.execute("SELECT id FROM leases WHERE expires_at <= ? ORDER BY id", (now,)).fetchall()
        for (lease_id,) in expired:
            self._drop_lease(conn, lease_id)

    def _drop_lease(self, conn: sqlite3.Connection, lease_id: int) -> None:
        """Delete a lease and its keys as one revision (etcd's revoke)."""
        keys = [k for (k,) in conn.execute("SELECT key FROM kv WHERE lease = ? ORDER BY key", (lease_id,))]
        if keys:
            rev = self._bump(conn)
            for key in keys:
                self._log(conn, rev, key, "delete", None)
            conn.execute("DELETE FROM kv WHERE lease = ?", (lease_id,))
        conn.execute("DELETE FROM leases WHERE id = ?", (lease_id,))

    def _maybe_sweep(self) -> None:
        """Sweep from a reader, but only when some lease has in fact expired (cheap check)."""
        with self._lock, _translated(self.path):
            self._check_open()
            row = self._conn.execute("SELECT 1 FROM leases WHERE expires_at <= ? LIMIT 1",
                                     (self._clock.monotonic(),)).fetchone()
        if row is not None:
            with self._write():
                pass

    @staticmethod
    def _require_lease(conn: sqlite3.Connection, lease: int | None) -> None:
        # Runs after the sweep of the same transaction: a row present is a lease alive.
        if lease is not None and conn.execute("SELECT 1 FROM leases WHERE id = ?", (lease,)).fetchone() is None:
            raise LeaseExpiredError(f"lease {lease} has expired or was revoked")

    def _current(self, conn: sqlite3.Connection, key: bytes) -> tuple[int, int] | None:
        row = conn.execute("SELECT mod_revision, create_revision FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    def _store(self, conn: sqlite3.Connection, key: bytes, value: bytes, lease: int | None,
               create_revision: int | None) -> int:
        rev = self._bump(conn)
        conn.execute("INSERT OR REPLACE INTO kv (key, value, mod_revision, create_revision, lease)"
                     " VALUES (?, ?, ?, ?, ?)", (key, value, rev, create_revision or rev, lease))
        self._log(conn, rev, key, "put", value)
        return rev

    # -- the protocol -----------------------------------------------------------------------
    def _k(self, key: str) -> bytes:
        return self._prefix + key.encode()

    def _kv(self, row: tuple[bytes, bytes, int, int, int | None]) -> KeyValue:
        key, value, mod, create, lease = row
        return KeyValue(key=bytes(key)[len(self._prefix):].decode(), value=bytes(value),
                        version=int(mod), create_revision=int(create), lease=lease)

    def get(self, key: str) -> KeyValue | None:
        self._maybe_sweep()
        with self._read() as conn:
            row = conn.execute("SELECT key, value, mod_revision, create_revision, lease FROM kv"
                               f" WHERE key = ? AND {_ALIVE}", (self._k(key), self._clock.monotonic())).fetchone()
        return None if row is None else self._kv(row)

    def put(self, key: str, value: bytes, *, lease: int | None = None) -> int:
        with self._write() as (conn, _):
            self._require_lease(conn, lease)
            cur = self._current(conn, self._k(key))
            return self._store(conn, self._k(key), value, lease, cur[1] if cur else None)

    def create(self, key: str, value: bytes, *, lease: int | None = None) -> int:
        with self._write() as (conn, _):
            self._require_lease(conn, lease)
            if self._current(conn, self._k(key)) is not None:
                raise KeyExistsError(f"key {key!r} already exists")
            return self._store(conn, self._k(key), value, lease, None)

    def cas(self, key: str, value: bytes, version: int, *, lease: int | None = None) -> int:
        with self._write() as (conn, _):
            cur = self._current(conn, self._k(key))
            if cur is None or cur[0] != version:
                raise MetadataVersionError(_conflict(key, version, cur))
            self._require_lease(conn, lease)
            return self._store(conn, self._k(key), value, lease, cur[1])

    def delete(self, key: str, *, version: int | None = None) -> bool:
        with self._write() as (conn, _):
            cur = self._current(conn, self._k(key))
            if version is not None and (cur is None or cur[0] != version):
                raise MetadataVersionError(_conflict(key, version, cur))
            if cur is None:
                return False
            rev = self._bump(conn)
            conn.execute("DELETE FROM kv WHERE key = ?", (self._k(key),))
            self._log(conn, rev, self._k(key), "delete", None)
            return True

    def list(self, prefix: str, *, start_after: str | None = None,
             limit: int = limits.metadata_list_page_keys) -> list[KeyValue]:
        assert limit >= 1, limit
        lo = self._k(prefix)
        after = self._k(start_after) if start_after is not None else b""
        self._maybe_sweep()
        with self._read() as conn:
            rows = conn.execute(
                "SELECT key, value, mod_revision, create_revision, lease FROM kv"
                f" WHERE key >= ? AND key < ? AND key > ? AND {_ALIVE} ORDER BY key LIMIT ?",
                (lo, prefix_end(lo), after, self._clock.monotonic(), limit)).fetchall()
        return [self._kv(r) for r in rows]

    def revision(self) -> int:
        with self._read() as conn:
            (rev,) = conn.execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()
        return int(rev)

    def grant_lease(self, ttl_s: int) -> int:
        assert ttl_s >= 1, ttl_s
        with self._write() as (conn, now):
            cursor = conn.execute("INSERT INTO leases (ttl_s, expires_at) VALUES (?, ?)", (ttl_s, now + ttl_s))
            assert cursor.lastrowid is not None
            return int(cursor.lastrowid)

    def keepalive(self, lease: int, *, timeout_s: float | None = None) -> None:
        # timeout_s is not used: a local file answers within the busy timeout or not at all.
        with self._write() as (conn, now):
            cursor = conn.execute("UPDATE leases SET expires_at = ? + ttl_s WHERE id = ?", (now, lease))
            if cursor.rowcount == 0:
                raise LeaseExpiredError(f"lease {lease} has expired or was revoked")

    def revoke_lease(self, lease: int) -> None:
        with self._write() as (conn, _):
            self._drop_lease(conn, lease)

    def compact(self, revision: int) -> None:
        """Drop changelog history before ``revision``, as etcd's compaction does: watches may
        start at ``revision`` or later."""
        with self._write() as (conn, _):
            self._trim(conn, revision - 1)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stop.set()
            watches, self._watches = self._watches, []
        for w in watches:
            w.cancelled = True
        if self._poller is not None and self._poller is not threading.current_thread():
            self._poller.join()
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SqliteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- watches --------------------------------------------------------------------------
    def watch(self, prefix: str, callback: WatchCallback, *, start_revision: int | None = None,
              on_error: ErrorCallback | None = None) -> SqliteWatch:
        """See the protocol. ``on_error`` (driver extension) hears a WatchCompactedError if
        the watch falls behind the trimmed changelog; the watch then stops."""
        assert start_revision is None or start_revision >= 1, start_revision
        with self._read() as conn:
            (rev,) = conn.execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()
            (compacted,) = conn.execute("SELECT value FROM meta WHERE name = 'compacted'").fetchone()
        start = rev + 1 if start_revision is None else start_revision
        if start <= compacted:
            raise WatchCompactedError(f"watch on {prefix!r}: revision {start} is compacted (history starts at {compacted + 1})")
        w = SqliteWatch(self, self._k(prefix), callback, start, on_error)
        with self._lock:
            self._check_open()
            self._watches.append(w)
            if self._poller is None:
                self._poller = threading.Thread(target=self._poll_loop, name=f"zbk-sqlite-watch:{self.scope}",
                                                daemon=True)
                self._poller.start()
        return w

    def _unregister(self, w: SqliteWatch) -> None:
        with self._lock:
            if w in self._watches:
                self._watches.remove(w)

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                caught_up = self._poll_once()
            except ZbkError as e:
                if self._stop.is_set():
                    return
                # Busy beyond the timeout: try again at the next tick.
                log.warning("sqlite metadata %s: watch poll failed: %s", self.path, e)
                caught_up = True
            if caught_up:
                self._stop.wait(self._poll_interval_s)

    def _poll_once(self) -> bool:
        """Deliver one batch of changelog rows; True once every watch is caught up."""
        with self._lock:
            watches = [w for w in self._watches if not w.cancelled]
        if not watches:
            return True
        self._maybe_sweep()
        lo = min(w.next_rev for w in watches)
        with self._read() as conn:
            (rev,) = conn.execute("SELECT value FROM meta WHERE name = 'revision'").fetchone()
            (compacted,) = conn.execute("SELECT value FROM meta WHERE name = 'compacted'").fetchone()
            hi = min(rev, lo + limits.sqlite_poll_batch_revisions - 1)
            rows = conn.execute("SELECT revision, key, kind, value FROM changelog"
                                " WHERE revision >= ? AND revision <= ? ORDER BY revision, key",
                                (lo, hi)).fetchall()
        for w in watches:
            if w.next_rev <= compacted:
                w.fail(WatchCompactedError(f"watch fell behind: revision {w.next_rev} is compacted"))
            else:
                w.deliver(rows, hi)
        return hi >= rev


class SqliteWatch:
    """One watch of a SqliteStore; its events come from the store's poller thread."""

    def __init__(self, store: SqliteStore, prefix: bytes, callback: WatchCallback, start: int,
                 on_error: ErrorCallback | None) -> None:
        self._store = store
        self._prefix = prefix
        self._callback = callback
        self._on_error = on_error
        self._lock = threading.RLock()  # held while delivering: cancel() waits on it
        self.next_rev = start
        self._last = start - 1
        self.cancelled = False

    @property
    def last_revision(self) -> int:
        return self._last

    def deliver(self, rows: list[tuple[int, bytes, str, bytes | None]], upto: int) -> None:
        with self._lock:
            strip = len(self._store._prefix)
            for rev, key, kind, value in rows:
                if self.cancelled:
                    return
                key = bytes(key)
                if rev < self.next_rev or not key.startswith(self._prefix):
                    continue
                ev = WatchEvent(kind="put" if kind == "put" else "delete", key=key[strip:].decode(),
                                value=None if value is None else bytes(value), revision=rev)
                self._last = rev
                try:
                    self._callback(ev)
                except Exception:
                    log.exception("watch callback failed on %s", ev)
            self.next_rev = max(self.next_rev, upto + 1)

    def fail(self, err: Exception) -> None:
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
        self._store._unregister(self)
        _report(err, self._on_error)

    def cancel(self) -> None:
        self.cancelled = True
        self._store._unregister(self)
        # Wait out a delivery in progress, unless we are that delivery (cancel from a callback).
        with self._lock:
            pass


def _end(conn: sqlite3.Connection, statement: str) -> None:
    """COMMIT or ROLLBACK; if that fails, roll back so the connection is not left inside
    a transaction (every later BEGIN would fail)."""
    try:
        conn.execute(statement)
    except sqlite3.Error:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def _report(err: Exception, on_error: ErrorCallback | None) -> None:
    if on_error is None:
        log.error("watch stopped: %s", err)
        return
    try:
        on_error(err)
    except Exception:
        log.exception("watch error callback failed")


def _conflict(key: str, version: int, cur: tuple[int, int] | None) -> str:
    found = "absent" if cur is None else f"at version {cur[0]}"
    return f"key {key!r}: expected version {version}, found {found}"


@contextmanager
def _translated(path: str) -> Iterator[None]:
    """sqlite3 errors -> the zbk error tree: a lock held too long is 'unavailable'."""
    try:
        yield
    except sqlite3.OperationalError as e:
        raise MetadataUnavailableError(f"sqlite metadata {path}: {e}") from None
    except sqlite3.DatabaseError as e:
        raise MetadataError(f"sqlite metadata {path}: {e}") from None
