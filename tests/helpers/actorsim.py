"""The actor simulation: a bookie's real cores, joined by pipes, driven one message at a time.

One bookie is the cores zbk/bookie/process.py wires together (``ServerCore``, one
``JournalCore`` per journal directory, ``EntryLoggerCore``, ``IndexCore``, and ``GcCore``
when a test asks for it) on real storage files under one directory. Each core is constructed with a
:class:`PipeOutbox` of its own, as the bookie constructs each with a ``SocketOutbox``
(and the Server with the ``reply`` its answers go to): one FIFO per (sender, receiver),
like the inproc PUSH/PULL pipes, which hand the message object itself to the receiver
(zbk/actors/base.py). :meth:`BookieCores.step` delivers the
head of one ready pipe, picked by a seeded generator, so every interleaving the real loops
allow can happen; after it each journal commits with probability 0.3 while it holds
records (its loop commits whenever a drain ends, and the drain may end after any message);
a test of what happens between the commits of several journals asks for rarer ones
(``commit_probability``), which hold records longer.
Ticks come from the caller's clock, at each core's own interval; the Server's are left
out while they would do nothing (:meth:`BookieCores.server_has_tick_work`). Nothing reads
the wall clock and no thread runs, so a run is a function of its seed (``ZBK_SEED``
replays one).

Each message travels with a pickled snapshot taken at send: it is compared at delivery
(and, with ``keep_delivered``, again when the test asks), so a core that changes a message
(or a list inside one) after sending or receiving it fails the run: THE RULE of
zbk/actors/base.py.

Two drivers use the same cores:

* :class:`Sim` steps one bookie on its own virtual clock (1 ms per delivery, jumping to
  the next tick when nothing is ready), for tests of the storage protocols
  (tests/actors/test_gc.py, test_index_deltas.py).
* tests/client/sim.py drives one :class:`BookieCores` per bookie from its virtual-time
  event loop, under the real client.

Booting (:func:`open_storage`) is the storage half of ``BookieBoot.boot``
(zbk/bookie/boot.py): it notes an unclean
shutdown (the dirty marker), opens the entry logs (sealing torn ones) and the index,
replays every journal from its own last mark (adds, master keys, fences, limbo, explicit
LACs), checkpoints what replay rebuilt, and opens the journals, all through zbk's own replay
and checkpoint (zbk/bookie/replay.py). A bookie of ``journals=n`` has n journal directories
named as the journal actors are (zbk/actors/journals.py: ``journal`` for one,
``journal-0``, ``journal-1``, ... for several), and its cores are wired for n journals. :func:`phase_one` is BP-46
phase one (fence and limbo every non-closed ledger that names this bookie, in the index,
durably; a repair mark for each closed one lacking entries), :func:`publish_limbo_marks`
the repair marks that ask for phase two, and :func:`ledger_states` the Server's view of
the index, all as the bookie does them. The cookie check is not modelled: a caller that
replaced the disks (:meth:`SimDisk.wipe`) knows it and asks for phase one itself.

The crash model. The files live in a real directory; :class:`SimDisk` is the ``Disk``
every storage object writes through, and it keeps, for each file, the bytes each write
overwrote since the file's last fsync (an undo log; an fsync costs nothing else, so runs
do not wait for a disk).

* kill -9 (``crash(power_loss=False)``): the process stops dead. What it wrote (every
  write and pwrite that returned) stays, as the page cache keeps it; what it only held in
  memory is gone: the entry log's write buffer, dirty index pages, records the journal
  had not written yet, every message in the pipes, every request in flight. To release
  the files, the disk turns dead (every write raises EIO) and each storage object is
  closed: a close that tries to flush writes nothing.
* power loss (``crash(power_loss=True)``): as kill -9, and then every write not yet made
  durable is undone: each file goes back to its contents at its last fsync (or a syncfs
  of its file system). A journal whose records were written but not fsynced
  (``[journal] sync_data`` off) loses them, fence records included; with the journal off
  for adds (``[journal] write_data`` off) an acknowledged add survives only once a
  checkpoint flushed the entry logs and the index.
* Names (create, rename, unlink) are durable at once; a file created but never fsynced
  comes back empty (as ext4 may leave it).

A restart boots the real cores again on the files that survived, through
:func:`open_storage` (which finds the dirty marker: an unclean shutdown).
"""

from __future__ import annotations

import collections
import errno
import io
import math
import os
import pickle
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zbk import limits
from zbk.actors.base import Core, Outbox, Reply
from zbk.actors.entrylogger import EntryLoggerCore
from zbk.actors.indexsyncer import IndexCore
from zbk.actors.journal import JournalCore
from zbk.actors.journals import journal_name
from zbk.actors.server import LedgerState, ServerCore
from zbk.bookie.replay import checkpoint_after_replay, replay_journals
from zbk.client.digest import make_digest, master_key
from zbk.clock import Clock
from zbk.errors import CorruptDataError
from zbk.metadata import layout
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.store import MetadataStore, iter_prefix
from zbk.storage import markers
from zbk.storage.disk import RealDisk
from zbk.storage.entrylog import EntryLogWriter
from zbk.storage.journal import JournalWriter
from zbk.storage.ledgercache import LedgerCache
from zbk.wire.codec import decode_response, encode
from zbk.wire.entry import build_entry, peek_entry_header

T0 = 1000.0  # the actor tests' clock starts here
PASSWORD = b"gc-sim"
MK = master_key(PASSWORD)
DIGEST = make_digest("crc32c", PASSWORD)
READ_SLICE_PROBABILITY = 0.3  # after a delivery, the EntryLogger serves a slice of a read under way
COMMIT_PROBABILITY = 0.3  # after a delivery, each journal commits what it holds with this probability (default)


def blob(lid: int, eid: int) -> bytes:
    """Entry ``eid`` of ledger ``lid``: 100-600 bytes of payload, the same on every call."""
    r = random.Random(lid * 1_000_003 + eid)
    return build_entry(lid, eid, eid - 1, r.randbytes(r.randrange(100, 600)), DIGEST)


# -- the disk and its crash model ----------------------------------------------------------------
@dataclass(slots=True)
class _Undo:
    """A file's writes since its last fsync: (offset, the bytes overwritten there, the
    file's size before), oldest first; ``size``: its size after them."""

    size: int
    records: list[tuple[int, bytes, int]]


class SimDisk(RealDisk):
    """The Disk of a simulated bookie: real files, no real fsync, an undo log per file for
    power loss, and death at kill -9 (see the module doc)."""

    def __init__(self) -> None:
        self._files: dict[tuple[int, int], _Undo] = {}
        self.dead = False

    def _alive(self) -> None:
        if self.dead:
            raise OSError(errno.EIO, "the process is dead")

    def _record(self, fd: int, offset: int, length: int) -> None:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        undo = self._files.get(key)
        if undo is not None and undo.size != st.st_size:
            undo = None  # not the file recorded: that one was deleted and its inode reused
        if undo is None:
            undo = self._files[key] = _Undo(st.st_size, [])
        old = _pread(fd, min(length, st.st_size - offset), offset) if offset < st.st_size else b""
        undo.records.append((offset, old, st.st_size))
        undo.size = max(st.st_size, offset + length)

    def write(self, fd: int, data: Any) -> None:
        self._alive()
        self._record(fd, os.lseek(fd, 0, os.SEEK_CUR), memoryview(data).nbytes)
        super().write(fd, data)

    def pwrite(self, fd: int, data: Any, offset: int) -> None:
        self._alive()
        self._record(fd, offset, memoryview(data).nbytes)
        super().pwrite(fd, data, offset)

    def truncate(self, fd: int, size: int) -> None:
        self._alive()
        st = os.fstat(fd)
        self._record(fd, size, max(0, st.st_size - size))
        super().truncate(fd, size)
        self._files[(st.st_dev, st.st_ino)].size = size

    def fsync(self, fd: int) -> None:
        self._alive()
        st = os.fstat(fd)
        undo = self._files.get((st.st_dev, st.st_ino))
        if undo is not None:
            undo.records.clear()

    def fsync_dir(self, path: str) -> None:
        self._alive()  # names are durable at once

    def syncfs(self, fd: int) -> None:
        self._alive()
        for undo in self._files.values():  # one bookie, one file system
            undo.records.clear()

    def write_file_atomic(self, path: str, data: bytes) -> None:
        self._alive()
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            RealDisk.write(self, fd, data)  # durable when this returns: nothing to undo
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def start_writeback(self, fd: int, offset: int, nbytes: int) -> None:
        pass  # a hint to the kernel, with no effect on what survives

    def drop_cache(self, fd: int, offset: int, nbytes: int) -> None:
        pass

    # -- crashes ----------------------------------------------------------------------------
    def kill(self) -> None:
        """The process is dead: every later write fails, and writes no byte."""
        self.dead = True

    def lose_power(self, root: Path) -> None:
        """Undo every write under ``root`` not made durable since (see the module doc)."""
        self.dead = True
        for dirpath, _, names in os.walk(root):
            for name in names:
                path = os.path.join(dirpath, name)
                st = os.stat(path)
                undo = self._files.get((st.st_dev, st.st_ino))
                if undo is None or not undo.records or undo.size != st.st_size:
                    continue
                fd = os.open(path, os.O_RDWR)
                try:
                    for offset, old, size in reversed(undo.records):
                        if old:
                            os.pwrite(fd, old, offset)
                        os.ftruncate(fd, size)
                finally:
                    os.close(fd)
        self._files.clear()

    def wipe(self, root: Path) -> None:
        """The disks are replaced: nothing under ``root`` is left."""
        self.dead = True
        shutil.rmtree(root, ignore_errors=True)
        self._files.clear()

    def revive(self) -> None:
        """A new process starts on the disk (what a power loss did not undo is still volatile)."""
        self.dead = False


def _pread(fd: int, length: int, offset: int) -> bytes:
    """``length`` bytes at ``offset`` of the file open as ``fd``, which may be write-only
    (the journal's segments are): then through a descriptor of our own."""
    try:
        return os.pread(fd, length, offset)
    except OSError as e:
        if e.errno != errno.EBADF:
            raise
    own = os.open(os.readlink(f"/proc/self/fd/{fd}"), os.O_RDONLY)
    try:
        return os.pread(own, length, offset)
    finally:
        os.close(own)


# -- pipes -----------------------------------------------------------------------------------------
Pipes = dict[tuple[str, str], collections.deque[tuple[Any, bytes]]]


class PipeOutbox:
    """One FIFO per (sender, receiver), like the inproc PUSH/PULL pipes; each message
    travels with a pickled snapshot taken at send (see the module doc)."""

    def __init__(self, pipes: Pipes, sender: str) -> None:
        self.pipes, self.sender = pipes, sender

    def send(self, dest: str, msg: Any) -> None:
        self.pipes[(self.sender, dest)].append((msg, snapshot(msg)))


class _Snapshot(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, memoryview):  # a read's blobs are views of what was read: their bytes count
            return bytes, (obj.tobytes(),)
        return NotImplemented


def snapshot(msg: Any) -> bytes:
    """The message and everything reachable from it, as bytes to compare later."""
    out = io.BytesIO()
    _Snapshot(out, protocol=5).dump(msg)
    return out.getvalue()


def unchanged(msg: Any, taken: bytes) -> None:
    assert snapshot(msg) == taken, f"message changed after it was sent: {msg!r}"


class VirtualClock:
    """A zbk.clock.Clock that reads a simulation's virtual time (``now()``); nothing may
    sleep on it."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now()

    def time(self) -> float:
        return self.now()

    def sleep(self, seconds: float) -> None:
        raise AssertionError("nothing sleeps in a simulation: it would stop the virtual clock")


# -- booting ---------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class BookieSettings:
    """The bookie configuration the cores and storage are built from, with sizes small
    enough for thousands of simulated bookies (finer than the configuration's MiB keys).
    The two journal switches keep their flat names, which the bookie's configuration
    still accepts; the rest are what zbk/bookie/process.py derives from its sections (the
    key in the comment)."""

    journal_write_data: bool = True  # [journal] write_data
    journal_sync_data: bool = True  # [journal] sync_data
    flush_interval_s: float = 10.0  # [index] flush_interval_ms (its default)
    log_bytes: int = 1 << 20  # [entry_log] size_limit_mb
    write_buffer_bytes: int = limits.entry_log_write_buffer_bytes_default  # [entry_log] write_buffer_bytes
    cache_bytes: int = limits.ledger_cache_bytes_max_default  # [index] cache_bytes_max
    journal_segment_bytes: int = 1 << 20  # [journal] max_size_mb
    journal_preallocate_bytes: int = 64 * 1024  # [journal] pre_alloc_size_mb
    group_bytes_max: int = limits.journal_group_bytes_default  # [journal] buffered_writes_threshold_bytes
    group_wait_s: float = limits.journal_group_wait_ms_default / 1000.0  # [journal] max_group_wait_ms
    max_frame_bytes: int = limits.frame_bytes_max_default  # max_frame_bytes
    journals: int = 1  # len(journal_dirs)

    @property
    def durable_adds(self) -> bool:
        """Replay restores every acknowledged add (the bookie then skips phase one)."""
        return self.journal_write_data and self.journal_sync_data


DEFAULT_SETTINGS = BookieSettings()


@dataclass(slots=True)
class Storage:
    logs: EntryLogWriter
    cache: LedgerCache
    journals: list[JournalWriter]  # journal i's records are those of ledgers with id % len == i
    unclean: bool  # the dirty marker was set: the last shutdown was not clean
    replayed: int  # journal records replayed, of every journal


def journal_dirs(root: Path, journals: int = 1) -> list[str]:
    """The journal directories under ``root``, named as their journal actors."""
    return [str(root / journal_name(i, journals)) for i in range(journals)]


def storage_dirs(root: Path) -> tuple[str, str]:
    """The ledger and index directories under ``root``."""
    return str(root / "ledgers"), str(root / "index")


def open_storage(root: Path, settings: BookieSettings, disk: SimDisk, clock: Clock | None = None) -> Storage:
    """The storage half of ``BookieBoot.boot`` (see the module doc)."""
    jdirs = journal_dirs(root, settings.journals)
    ldir, xdir = storage_dirs(root)
    for d in (*jdirs, ldir, xdir):
        os.makedirs(d, exist_ok=True)
    unclean = markers.was_dirty(xdir)
    markers.mark_dirty(xdir, disk)
    extra: dict[str, Any] = {} if clock is None else {"clock": clock}
    logs = EntryLogWriter([ldir], size_limit_bytes=settings.log_bytes, write_buffer_bytes=settings.write_buffer_bytes,
                          disk=disk, **extra)
    cache = LedgerCache([xdir], settings.cache_bytes, disk=disk)
    n = replay_journals(jdirs, xdir, logs, cache)
    journals = [JournalWriter(d, settings.journal_segment_bytes, disk=disk,
                              preallocate_bytes=settings.journal_preallocate_bytes) for d in jdirs]
    checkpoint_after_replay(journals, xdir, logs, cache, disk)
    return Storage(logs, cache, journals, unclean, n)


def close_storage(st: Storage) -> None:
    """Close ``st``'s files as a process's death does; what close could not write is lost."""
    for close in (st.logs.close, *(j.close for j in st.journals), st.cache.close):
        try:
            close()
        except OSError:
            pass  # the dead disk refused what close tried to write: nothing landed


def phase_one(cache: LedgerCache, store: MetadataStore, bookie_id: str, *, fence: bool = True,
              limbo: bool = True) -> int:
    """BP-46 phase one as ``BookieBoot._phase_one`` does it (``fence`` / ``limbo`` off: the
    protections BP-46 shows are each needed); returns how many open ledgers it marked."""
    from zbk.recovery.repair import count_missing, expected_entries
    from zbk.recovery.underreplication import UnderReplicationRegistry

    count = 0
    lacking: list[int] = []
    for kv in iter_prefix(store, layout.LEDGERS):
        lid = layout.ledger_id_from_key(kv.key)
        md = LedgerMetadata.decode(kv.value, ledger_id=lid)
        if bookie_id not in md.all_bookies():
            continue
        if md.is_closed:
            ranges = cache.entry_ids(lid) if cache.exists(lid) else []
            if count_missing(expected_entries(md, bookie_id, closed_fragments_only=True), ranges):
                lacking.append(lid)
            continue
        if fence:
            cache.set_fenced(lid, True)
        if limbo:
            cache.set_limbo(lid, True)
        if (fence or limbo) and cache.get_master_key(lid) is None:
            cache.set_master_key(lid, master_key(md.password))
        count += fence or limbo
    cache.flush()
    if lacking:
        registry = UnderReplicationRegistry(store, bookie_id)
        for lid in lacking:
            registry.mark_repair(lid, bookie_id, "unclean", "entries assigned here are missing after an unclean shutdown")
    return count


def publish_limbo_marks(cache: LedgerCache, store: MetadataStore, bookie_id: str) -> list[int]:
    """A repair mark per ledger in limbo here (``BookieBoot._publish_limbo_marks``): phase two."""
    from zbk.recovery.underreplication import UnderReplicationRegistry

    limbo = [lid for lid in cache.ledgers() if cache.is_limbo(lid)]
    registry = UnderReplicationRegistry(store, bookie_id)
    for lid in limbo:
        registry.mark_repair(lid, bookie_id, "limbo")
    return limbo


def ledger_states(cache: LedgerCache, logs: EntryLogWriter) -> dict[int, LedgerState]:
    """The Server's state of every ledger in the index (``BookieBoot._ledger_states``)."""
    states: dict[int, LedgerState] = {}
    for lid in cache.ledgers():
        last = cache.last_entry_id(lid)
        lac = cache.get_explicit_lac(lid)
        if last >= 0:
            loc = cache.get(lid, last)
            if loc is not None:
                try:
                    lac = max(lac, peek_entry_header(logs.read(loc))[2])
                except CorruptDataError:
                    pass  # a bad last entry only costs the LAC hint, as in the bookie
        states[lid] = LedgerState(master_key=cache.get_master_key(lid), fenced=cache.is_fenced(lid),
                                  limbo=cache.is_limbo(lid), lac=lac, last_entry_id=last)
    return states


# -- the cores ---------------------------------------------------------------------------------------
GcFactory = Callable[[Storage, Outbox], Core]  # builds a GcCore on a bookie's storage, with its outbox


class BookieCores:
    """One bookie's cores on ``storage``, wired as zbk/bookie/process.py wires them: each
    constructed with its :class:`PipeOutbox` (the Server also with ``reply``); ``gc``
    builds a GcCore on this storage with the outbox it is given."""

    def __init__(self, root: Path, storage: Storage, settings: BookieSettings, disk: SimDisk, rng: random.Random,
                 *, reply: Reply, now: float, gc: GcFactory | None = None, keep_delivered: bool = False,
                 commit_probability: float = COMMIT_PROBABILITY) -> None:
        self.root, self.storage, self.settings, self.disk, self.rng = root, storage, settings, disk, rng
        self.commit_probability = commit_probability
        xdir = storage_dirs(root)[1]
        n = len(storage.journals)
        assert n == settings.journals, (n, settings.journals)
        self.pipes: Pipes = collections.defaultdict(collections.deque)
        pipes = self.pipes
        self.server = ServerCore(ledgers=ledger_states(storage.cache, storage.logs),
                                 journal_write_data=settings.journal_write_data,
                                 max_frame_bytes=settings.max_frame_bytes, reply=reply,
                                 outbox=PipeOutbox(pipes, "server"), journals=n)
        self.journals = [JournalCore(writer, outbox=PipeOutbox(pipes, journal_name(i, n)),
                                     sync_data=settings.journal_sync_data, group_bytes_max=settings.group_bytes_max,
                                     group_wait_s=settings.group_wait_s, index=i, journals=n)
                         for i, writer in enumerate(storage.journals)]
        self.index = IndexCore(storage.cache, outbox=PipeOutbox(pipes, "index"),
                               flush_interval_s=settings.flush_interval_s,
                               persist_marks=lambda marks: markers.write_last_marks(xdir, marks, disk=disk),
                               journals=n)
        self.entrylogger = EntryLoggerCore(storage.logs, outbox=PipeOutbox(pipes, "entrylogger"), journals=n)
        self.cores: dict[str, Core] = {
            "server": self.server, **{j.name: j for j in self.journals}, "index": self.index,
            "entrylogger": self.entrylogger}
        if gc is not None:
            self.cores["gc"] = gc(storage, PipeOutbox(pipes, "gc"))
        self.next_tick = {n: now + c.tick_interval_s for n, c in self.cores.items() if c.tick_interval_s}
        self.delivered: list[tuple[Any, bytes]] | None = [] if keep_delivered else None
        # Called with (receiver, message) just before each delivery, for tests that count.
        self.before_delivery: Callable[[str, Any], None] | None = None
        self.alive = True

    def busy(self) -> bool:
        """A message waits in a pipe, a journal holds records to commit, or the EntryLogger
        has reads under way."""
        return any(j.pending for j in self.journals) or any(self.pipes.values()) or bool(self.entrylogger.reads)

    # -- ticks ------------------------------------------------------------------------------
    # The Server ticks every 50 ms, and ServerCore.on_tick does three things only: send the
    # index updates it holds, answer the long polls whose deadline passed, and forget the
    # newest entries of ledgers no longer polled. With none held, waiting or kept
    # (``server_has_tick_work`` false) its tick changes nothing, so it is
    # not scheduled: a run of such ticks is most of a run's events, and leaving them out
    # changes no core's state. Its ticks keep their grid (its last tick + k * 50 ms):
    # :meth:`_server_may_have_work` runs after every delivery and request (the only ways the
    # Server gains work) and, if the Server now has work, moves its next tick to the first
    # grid point not before now; every point passed over fell while it had none.
    def server_has_tick_work(self) -> bool:
        """Whether the Server's tick would do anything now (see above)."""
        s = self.server
        return bool(s.held_puts) or bool(s.polling) or bool(s.tail)

    def _server_may_have_work(self, now: float) -> None:
        at = self.next_tick["server"]
        if at < now and self.server_has_tick_work():
            interval = self.server.tick_interval_s
            assert interval
            self.next_tick["server"] = at + math.ceil((now - at) / interval) * interval

    def server_tick_before(self, when: float) -> bool:
        """Whether the Server has tick work due before ``when`` (a driver that armed its
        next tick for ``when`` arms it earlier then)."""
        return self.next_tick["server"] < when and self.server_has_tick_work()

    def next_tick_at(self) -> float:
        """When the next tick is due (the Server's only while it has work: see above)."""
        nt = self.next_tick
        if "server" in nt and not self.server_has_tick_work():
            return min(at for name, at in nt.items() if name != "server")
        return min(nt.values())

    def tick(self, now: float) -> None:
        """Every core whose tick is due ticks; the Server only if it has work (see above),
        else its next tick moves to its next grid point after ``now``."""
        for name, at in self.next_tick.items():
            if now >= at:
                core = self.cores[name]
                interval = core.tick_interval_s
                assert interval
                if core is self.server and not self.server_has_tick_work():
                    self.next_tick[name] = at + (math.floor((now - at) / interval) + 1) * interval
                    continue
                core.on_tick(now)
                self.next_tick[name] = now + interval

    def request(self, ident: bytes, frames: list[Any], now: float) -> None:
        """A client's request reaches the Server."""
        self.server.on_request(ident, frames, now)
        self._server_may_have_work(now)

    def step(self, now: float) -> None:
        """Deliver the head of one ready pipe (picked by the generator); then each journal
        may commit (see the module doc), and the EntryLogger may serve a slice of a read (its
        loop serves one whenever a drain ends)."""
        ready = [key for key, q in self.pipes.items() if q]
        if ready:
            key = self.rng.choice(ready)
            msg, snapshot = self.pipes[key].popleft()
            unchanged(msg, snapshot)
            if self.delivered is not None:
                self.delivered.append((msg, snapshot))
            if self.before_delivery is not None:
                self.before_delivery(key[1], msg)
            self.cores[key[1]].on_message(msg, now)
            self._server_may_have_work(now)
        for journal in self.journals:  # each journal's loop ends its drains on its own
            if journal.pending and self.rng.random() < self.commit_probability:
                journal.commit()
        if self.entrylogger.reads and (not ready or self.rng.random() < READ_SLICE_PROBABILITY):
            self.entrylogger.serve_read_slice()

    def settle(self, now: float, steps_max: int = 100_000) -> None:
        """Deliver until nothing is left to deliver or commit, at ``now``."""
        for _ in range(steps_max):
            if not self.busy():
                return
            self.step(now)
        raise AssertionError(f"the cores did not settle in {steps_max} steps")

    def check_delivered(self) -> None:
        """No message delivered so far was changed since it was sent."""
        for msg, snapshot in self.delivered or ():
            unchanged(msg, snapshot)

    def crash(self, *, power_loss: bool) -> None:
        """The process dies: kill -9, or a power loss (see the module doc)."""
        self.alive = False
        self.disk.kill()
        close_storage(self.storage)
        if power_loss:
            self.disk.lose_power(self.root)
        self.pipes.clear()

    # -- inspection -------------------------------------------------------------------------
    def locations(self, lid: int) -> dict[int, int]:
        """Entry id -> location of every entry of ``lid`` that a read would find now: in the
        index, or acknowledged with its index update still held by the Server or in a pipe."""
        from zbk.actors.messages import IndexPut

        cache = self.storage.cache
        found: dict[int, int] = {}
        if cache.exists(lid):
            for first, last in cache.entry_ids(lid):
                for eid in range(first, last + 1):
                    loc = cache.get(lid, eid)
                    if loc is not None:
                        found[eid] = loc
        pending: list[Any] = list(self.server.held_puts)
        pending += [m for (_, dest), q in self.pipes.items() if dest == "index" for m, _ in q if isinstance(m, IndexPut)]
        for put in pending:
            for plid, eid, loc in zip(put.ledger_ids, put.entry_ids, put.locations, strict=True):
                if plid == lid:
                    found[eid] = loc
        return found

    def entries(self, lid: int) -> dict[int, bytes]:
        """Entry id -> blob of every entry of ``lid`` a read would find now."""
        logs = self.storage.logs
        return {eid: logs.read(loc, lid, eid) for eid, loc in sorted(self.locations(lid).items())}


def boot_cores(root: Path, settings: BookieSettings, disk: SimDisk, rng: random.Random, *, reply: Reply, now: float,
               clock: Clock | None = None, gc: GcFactory | None = None, keep_delivered: bool = False,
               commit_probability: float = COMMIT_PROBABILITY) -> BookieCores:
    """Boot the storage under ``root`` (no phase one) and start the cores on it."""
    disk.revive()
    storage = open_storage(root, settings, disk, clock)
    return BookieCores(root, storage, settings, disk, rng, reply=reply, now=now, gc=gc,
                       keep_delivered=keep_delivered, commit_probability=commit_probability)


# -- one bookie on its own clock ----------------------------------------------------------------------
class Sim:
    """One bookie's cores on files under ``root``, stepped on a virtual clock from a seeded
    generator: requests go in through :meth:`send`, and each step advances the clock 1 ms
    (or to the next tick when nothing is ready), runs due ticks and delivers one message.
    ``acked``: the (ledger, entry) pairs acknowledged, shared across reboots by the caller.
    ``gc``: builds a GcCore on the storage; ``keep_delivered``: recheck every delivered
    message at :meth:`verify` (the check that nothing sent is changed later)."""

    def __init__(self, root: Path, rng: random.Random, acked: set[tuple[int, int]], *,
                 settings: BookieSettings = DEFAULT_SETTINGS, gc: GcFactory | None = None,
                 keep_delivered: bool = True, disk: SimDisk | None = None,
                 commit_probability: float = COMMIT_PROBABILITY) -> None:
        self.root, self.rng, self.acked = root, rng, acked
        self.now = T0
        self.disk = disk or SimDisk()
        self.replies: list[Any] = []
        self.bookie = boot_cores(root, settings, self.disk, rng, now=T0, gc=gc, keep_delivered=keep_delivered,
                                 commit_probability=commit_probability,
                                 clock=VirtualClock(lambda: self.now),
                                 reply=lambda _ident, frames: self.replies.append(decode_response(frames)))
        self.server = self.bookie.server
        self.logs, self.cache = self.bookie.storage.logs, self.bookie.storage.cache
        self.waiting: dict[int, Callable[[Any], None]] = {}
        self.rid = 0
        self.steps = 0

    def send(self, make: Callable[[int], Any], on_reply: Callable[[Any], None]) -> None:
        """Send the request ``make(rid)`` now; ``on_reply`` gets its answer."""
        self.rid += 1
        self.waiting[self.rid] = on_reply
        self.bookie.request(b"client", encode(make(self.rid)), self.now)

    def step(self) -> None:
        self.steps += 1
        b = self.bookie
        # Nothing to deliver: jump to the next tick instead of spinning through idle time.
        self.now = self.now + 0.001 if b.busy() else max(self.now + 0.001, b.next_tick_at())
        b.tick(self.now)
        b.step(self.now)
        for resp in self.replies:
            self.waiting.pop(resp.rid)(resp)
        self.replies.clear()

    def idle(self) -> bool:
        # The Server's tick sends the index updates it holds: not idle while it holds some.
        return not self.waiting and not self.bookie.busy() and not self.server.held_puts

    def settle(self, steps_max: int = 50_000) -> None:
        for _ in range(steps_max):
            if self.idle():
                return
            self.step()
        raise AssertionError("the cores did not settle")

    def crash(self) -> None:
        """kill -9 now: what was written stays, the rest is gone (see the module doc)."""
        self.bookie.crash(power_loss=False)

    def verify(self, live: set[int] | None = None) -> int:
        """Every acknowledged entry (of a ``live`` ledger) reads back byte for byte from
        storage, and no delivered message was changed after it was sent; returns how many
        entries were checked."""
        self.bookie.check_delivered()
        n = 0
        for lid, eid in sorted(self.acked):
            if live is None or lid in live:
                loc = self.cache.get(lid, eid)
                assert loc is not None, f"entry {lid}:{eid} lost"
                assert self.logs.read(loc, lid, eid) == blob(lid, eid), f"entry {lid}:{eid} wrong bytes"
                n += 1
        return n
