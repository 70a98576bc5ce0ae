"""A bookie's boot, before any request is served: cookies, journal replay, phase one.

Boot (ARCHITECTURE.md "Boot sequence", BP-46):
1. Validate directories and cookies (local copies vs metadata). A mismatch refuses to
   start (exit code EXIT_COOKIE) unless auto_fix_cookie, which proceeds with phase one and
   rewrites the cookies.
2. Detect an unclean shutdown: the dirty marker is still present. Set it for this run.
3. Replay the journal from the last mark into the entry logs and index, then checkpoint.
4. Phase one, if the cookie was fixed, or the shutdown was unclean while adds were not
   fsynced to the journal (journal_write_data or journal_sync_data off): every ledger that
   is not CLOSED and has this bookie in an ensemble becomes fenced and limbo, durably; every
   CLOSED one whose entries assigned here are not all in the index gets an ``unclean``
   repair mark (BP-46 phase two checks each ledger, closed ones too).
   (With the journal on and synced, replay restores every acknowledged add, so fencing
   every open ledger after each crash would only break healthy writers.)
5. Start the actors, bind the port, register as writable (lease-bound) and serve.
6. Phase two (limbo repair) is replicator work: at every boot the bookie writes a repair
   mark for each ledger still in limbo here; see zbk/recovery/repair.py.
The later steps (start the actors, register, serve) are zbk/bookie/process.py's.
"""

from __future__ import annotations

import logging
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import zmq

from zbk import limits
from zbk.actors.base import ActorLoop
from zbk.actors.server import LedgerState, ServerCore
from zbk.client.digest import master_key
from zbk.clock import SYSTEM_CLOCK, Clock
from zbk.config import BookieConfig
from zbk.errors import CookieMismatchError, CorruptDataError
from zbk.metadata import layout
from zbk.metadata.coordination import LeaseKeeper
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import get_or_create_instance_id
from zbk.metadata.store import MetadataStore, iter_prefix
from zbk.metadata.uri import open_store
from zbk.metrics.http import AdminHttpServer
from zbk.storage import cookie as cookies
from zbk.storage import markers
from zbk.storage.disk import makedirs_durable, raise_open_files_limit
from zbk.storage.entrylog import EntryLogWriter
from zbk.storage.journal import JournalWriter, LogMark, RecordType, list_segments, replay
from zbk.storage.ledgercache import LedgerCache
from zbk.wire.entry import peek_entry_header

log = logging.getLogger(__name__)


@dataclass
class BootReport:
    unclean: bool
    cookie_fixed: bool
    replayed_records: int
    phase_one_ledgers: int
    closed_ledgers_lacking: int = 0  # closed ledgers given an "unclean" repair mark by phase one


_REPLAY_PUTS = 4096  # index updates of replayed adds applied together (Bookie._replay)



class BookieBoot:
    """The bookie's state from its constructor to the end of boot (``boot()``)."""

    def __init__(self, cfg: BookieConfig, *, clock: Clock = SYSTEM_CLOCK, store: MetadataStore | None = None,
                 stop_event: threading.Event | None = None) -> None:
        self.cfg = cfg.validate()
        self.clock = clock
        self.store = store or open_store(self.cfg.metadata_uri)
        self.stop_event = stop_event or threading.Event()
        self.exit_code = 0
        self.crashed: str | None = None
        self.loops: list[ActorLoop] = []
        self.index_actor: ActorLoop | None = None
        self.ctx: zmq.Context[Any] | None = None
        self.http: AdminHttpServer | None = None
        self.lease: LeaseKeeper | None = None
        self.autorecovery: Any = None  # zbk.recovery.process.AutoRecovery with autorecovery_enabled
        self.server: ServerCore | None = None
        self.boot_report: BootReport | None = None
        self._reg_lock = threading.Lock()
        self._registrar = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zbk-registrar")
        self.journal_dir = self.cfg.journal_dirs[0]
        self.index_dir = self.cfg.index_dirs[0]

    # -- boot ---------------------------------------------------------------------------------
    def _all_dirs(self) -> list[str]:
        return list(dict.fromkeys([*self.cfg.journal_dirs, *self.cfg.ledger_dirs, *self.cfg.index_dirs]))

    def _index_files_open_max(self) -> int:
        """``index.files_open_max``, or fewer when the descriptor limit (raised to the hard
        limit first) leaves less beside ``limits.fds_reserved`` and the entry logs."""
        want = self.cfg.index.files_open_max
        soft = raise_open_files_limit()
        n = max(16, min(want, soft - limits.fds_reserved - self.cfg.entry_log.open_max))
        if n < want:
            log.warning("index: keeping at most %d index files open, not %d: the open-files limit is %d "
                        "(raise it, ulimit -n / LimitNOFILE, to spare a checkpoint re-opening files)",
                        n, want, soft)
        else:
            log.info("index: keeping up to %d index files open (open-files limit %d)", n, soft)
        return n

    def _check_cookies(self) -> bool:
        """Returns True when phase one is needed (cookie fixed, or brand-new directories);
        raises on mismatch."""
        cfg = self.cfg
        instance_id = get_or_create_instance_id(self.store)
        key = layout.cookie_key(cfg.bookie_id)
        stored = self.store.get(key)
        dirs = self._all_dirs()
        local = {d: cookies.read_cookie(d) for d in dirs}
        expected = cookies.Cookie(bookie_id=cfg.bookie_id, instance_id=instance_id,
                                  journal_dirs=tuple(cfg.journal_dirs), ledger_dirs=tuple(cfg.ledger_dirs),
                                  index_dirs=tuple(cfg.index_dirs),
                                  incarnation=uuid.uuid4().hex)
        if stored is None and all(c is None for c in local.values()):
            # A brand-new bookie: write its identity everywhere. Phase one still runs: if
            # ledgers name this id (its cookie was deleted from metadata and its disks
            # replaced), answering "no such entry" for them could let recovery truncate
            # acknowledged entries. For a truly new id it touches nothing.
            self._write_cookies(expected, None, dirs)
            return True
        reasons: list[str] = []
        meta_cookie = cookies.Cookie.decode(stored.value) if stored else None
        if meta_cookie is None:
            reasons.append("no cookie in metadata for this bookie id")
        for d, c in local.items():
            if c is None:
                reasons.append(f"{d}: no cookie (empty or replaced disk?)")
            elif meta_cookie is not None and not _same_identity(c, meta_cookie):
                reasons.append(f"{d}: cookie differs from metadata")
        if meta_cookie is not None and not _same_identity(meta_cookie, expected, check_incarnation=False):
            reasons.append("configured directories or instance id differ from the cookie in metadata")
        if not reasons:
            return False
        msg = "; ".join(reasons)
        if not cfg.auto_fix_cookie:
            raise CookieMismatchError(f"cookie validation failed for {cfg.bookie_id}: {msg} "
                                      "(run `zbk shell cookie fix` or set auto_fix_cookie = true)")
        log.warning("cookie validation failed (%s): auto_fix_cookie is on, fixing with phase one", msg)
        self._write_cookies(expected, stored.version if stored else None, dirs)
        return True

    def _write_cookies(self, cookie: cookies.Cookie, version: int | None, dirs: list[str]) -> None:
        data = cookie.encode()
        for d in dirs:
            cookies.write_cookie(d, cookie)
        key = layout.cookie_key(self.cfg.bookie_id)
        if version is None:
            existing = self.store.get(key)
            if existing is None:
                self.store.create(key, data)
                return
            version = existing.version
        self.store.cas(key, data, version)

    def boot(self) -> BootReport:
        for d in self._all_dirs():
            makedirs_durable(d)
        cookie_fixed = self._check_cookies()
        unclean = markers.was_dirty(self.index_dir)
        markers.mark_dirty(self.index_dir)
        el = self.cfg.entry_log
        self.logs = EntryLogWriter(list(self.cfg.ledger_dirs),
                                   size_limit_bytes=el.size_limit_bytes,
                                   write_buffer_bytes=el.write_buffer_bytes,
                                   writeback_bytes=el.flush_bytes,
                                   keep_cached_bytes=el.keep_cached_bytes,
                                   per_ledger=el.per_ledger,
                                   open_max=el.open_max,
                                   expire_after_access_s=el.expire_after_access_s,
                                   clock=self.clock)
        self.cache = LedgerCache(list(self.cfg.index_dirs), bytes_max=self.cfg.index.cache_bytes_max,
                                 syncfs=self.cfg.index.flush_syncfs, files_open_max=self._index_files_open_max())
        if self.cache.sync_mode == "syncfs":
            log.info("index: checkpoints are made durable by syncfs of the index file system(s)")
        else:
            log.info("index: checkpoints fsync each index file (%s)",
                     "index.flush_syncfs = false" if not self.cfg.index.flush_syncfs
                     else "syncfs is not trusted on this kernel or file system")
        replayed = self._replay(journal_replaced=cookie_fixed)
        durable_adds = self.cfg.journal.write_data and self.cfg.journal.sync_data
        phase_one = closed_lacking = 0
        if cookie_fixed or (unclean and not durable_adds):
            phase_one, closed_lacking = self._phase_one()
        self._publish_limbo_marks()
        self.boot_report = BootReport(unclean, cookie_fixed, replayed, phase_one, closed_lacking)
        log.info("boot: unclean=%s cookie_fixed=%s replayed=%d phase_one_ledgers=%d closed_ledgers_lacking=%d",
                 unclean, cookie_fixed, replayed, phase_one, closed_lacking)
        return self.boot_report

    def _replay(self, *, journal_replaced: bool = False) -> int:
        start = markers.read_last_mark(self.index_dir)
        if journal_replaced and start.offset > 0 and not list_segments(self.journal_dir):
            # The journal disk was replaced (its cookie was missing and has been fixed): the
            # records after the last checkpoint are gone. Phase one fences and limbos this
            # bookie's open ledgers, and repair copies what it lacks from its peers (BP-46).
            log.warning("journal %s is empty but the last mark is %s: journal disk replaced, starting a new "
                        "journal (records after the last checkpoint are lost here)", self.journal_dir, tuple(start))
            start = LogMark(0, 0)
        n = 0
        last = start
        # Index updates of consecutive ADD records go in batches (LedgerCache.put_many),
        # in journal order: before any other record is applied, and at most _REPLAY_PUTS.
        lids: list[int] = []
        eids: list[int] = []
        locs: list[int] = []

        def put_pending() -> None:
            if lids:
                self.cache.put_many(lids, eids, locs)
                lids.clear()
                eids.clear()
                locs.clear()

        for rec, mark in replay(self.journal_dir, start):
            n += 1
            last = mark
            t = rec.type
            if t == RecordType.ADD:
                lids.append(rec.ledger_id)
                eids.append(rec.entry_id)
                locs.append(self.logs.append(rec.ledger_id, rec.entry_id, rec.payload))
                if len(lids) >= _REPLAY_PUTS:
                    put_pending()
                continue
            put_pending()
            if t == RecordType.FENCE:
                self.cache.set_fenced(rec.ledger_id, True)
            elif t == RecordType.MASTER_KEY:
                self.cache.set_master_key(rec.ledger_id, rec.payload)
            elif t == RecordType.LIMBO:
                self.cache.set_limbo(rec.ledger_id, rec.entry_id == 1)
            elif t == RecordType.EXPLICIT_LAC:
                self.cache.set_explicit_lac(rec.ledger_id, max(rec.entry_id, self.cache.get_explicit_lac(rec.ledger_id)))
        put_pending()
        jc = self.cfg.journal
        self.journal = JournalWriter(
            self.journal_dir, jc.segment_bytes,
            preallocate_bytes=jc.preallocate_bytes,
            reuse_files=limits.journal_reuse_files(jc.segment_bytes) if jc.reuse_files else 0)
        # Checkpoint what replay rebuilt, so the replayed segments can go.
        self.logs.flush()
        self.cache.flush()
        mark = self.journal.sync(fsync=True)
        markers.write_last_mark(self.index_dir, mark)
        self.journal.delete_segments_before(mark)
        if n:
            log.info("journal replay: %d records up to %s", n, tuple(last))
        return n

    def _phase_one(self) -> tuple[int, int]:
        """BP-46 phase one: fence and limbo every non-closed ledger with us in an ensemble.
        Returns how many it fenced, and how many closed ledgers it marked (below).

        And the closed ledgers' half of phase two ("check that all entries assigned to this
        bookie exist in the index; copy any that are missing"): a closed ledger lacking
        entries here gets an ``unclean`` repair mark, which the replicators fill. Written
        before we serve; a crash before then leaves the dirty marker, so the next boot
        looks again."""
        from zbk.recovery.underreplication import UnderReplicationRegistry

        me = self.cfg.bookie_id
        count = 0
        lacking: dict[int, int] = {}  # closed ledger -> entries assigned here but not held
        for kv in iter_prefix(self.store, layout.LEDGERS):
            lid = layout.ledger_id_from_key(kv.key)
            try:
                md = LedgerMetadata.decode(kv.value, ledger_id=lid)
            except Exception as e:  # noqa: BLE001 - a corrupt ledger must not stop the others
                log.error("phase one: skipping ledger %d: %s", lid, e)
                continue
            if me not in md.all_bookies():
                continue
            if md.is_closed:
                missing = self._entries_lacking(md)
                if missing:
                    lacking[lid] = missing
                continue
            self.cache.set_fenced(lid, True)
            self.cache.set_limbo(lid, True)
            if self.cache.get_master_key(lid) is None:
                self.cache.set_master_key(lid, master_key(md.password))
            count += 1
        self.cache.flush()  # durable before we register and serve
        if lacking:
            registry = UnderReplicationRegistry(self.store, me)
            new = sum(registry.mark_repair(lid, me, "unclean", f"{n} entries assigned here are missing after an "
                                           "unclean shutdown") for lid, n in lacking.items())
            log.warning("phase one: %d closed ledger(s) lack %d entries here; %d new repair mark(s)",
                        len(lacking), sum(lacking.values()), new)
        return count, len(lacking)

    def _entries_lacking(self, md: LedgerMetadata) -> int:
        """How many entries ``md`` (closed) assigns to this bookie that its index lacks."""
        from zbk.recovery.repair import count_missing, expected_entries

        try:
            ranges = self.cache.entry_ids(md.ledger_id) if self.cache.exists(md.ledger_id) else []
        except CorruptDataError as e:
            log.error("phase one: ledger %d: index unreadable (%s): all its entries count as missing", md.ledger_id, e)
            ranges = []
        if len(ranges) == 1 and ranges[0][0] <= 0 and ranges[0][1] >= md.last_entry_id:
            return 0  # holds every entry of the ledger
        return count_missing(expected_entries(md, self.cfg.bookie_id, closed_fragments_only=True), ranges)

    def _publish_limbo_marks(self) -> int:
        """Ask for phase two: a repair mark per ledger in limbo here, at every boot (so a
        crash between phase one and the marks, or a mark lost otherwise, is made good by the
        next boot). The autorecovery replicators recover each, copy what this bookie lacks,
        and clear its limbo with CLEAR_LIMBO."""
        from zbk.recovery.underreplication import UnderReplicationRegistry

        limbo = [lid for lid in self.cache.ledgers() if self.cache.is_limbo(lid)]
        if limbo:
            registry = UnderReplicationRegistry(self.store, self.cfg.bookie_id)
            new = sum(registry.mark_repair(lid, self.cfg.bookie_id, "limbo") for lid in limbo)
            log.info("boot: %d ledger(s) in limbo; %d new repair mark(s) for phase two", len(limbo), new)
        return len(limbo)

    def _ledger_states(self) -> dict[int, LedgerState]:
        states: dict[int, LedgerState] = {}
        for lid in self.cache.ledgers():
            last = self.cache.last_entry_id(lid)
            lac = self.cache.get_explicit_lac(lid)
            if last >= 0:
                loc = self.cache.get(lid, last)
                if loc is not None:
                    try:
                        lac = max(lac, peek_entry_header(self.logs.read(loc))[2])
                    except Exception as e:  # noqa: BLE001 - a bad last entry only costs the LAC hint
                        log.warning("ledger %d: cannot read last entry for its LAC: %s", lid, e)
            states[lid] = LedgerState(master_key=self.cache.get_master_key(lid), fenced=self.cache.is_fenced(lid),
                                      limbo=self.cache.is_limbo(lid), lac=lac, last_entry_id=last)
        return states


def _same_identity(a: cookies.Cookie, b: cookies.Cookie, *, check_incarnation: bool = True) -> bool:
    same = (a.bookie_id == b.bookie_id and a.instance_id == b.instance_id
            and tuple(a.journal_dirs) == tuple(b.journal_dirs) and tuple(a.ledger_dirs) == tuple(b.ledger_dirs)
            and tuple(a.index_dirs) == tuple(b.index_dirs))
    return same and (not check_incarnation or a.incarnation == b.incarnation)

