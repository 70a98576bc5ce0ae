"""A bookie process: boot sequence, actor wiring, registration, HTTP, shutdown.

Boot (ARCHITECTURE.md "Boot sequence", BP-46), all before any request is served:
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

Exit codes: 0 clean stop; EXIT_COOKIE (4) cookie mismatch; EXIT_BOOT (5) any other boot
failure (corrupt journal, unreachable metadata...); 10 + n when actor n crashed.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import traceback
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import zmq

from zbk import limits
from zbk.actors.base import ActorLoop, drop_handoff, handoff_for, pipe_address, send_message
from zbk.actors.entrylogger import EntryLoggerCore
from zbk.actors.gc import GcCore, GcSettings, GcStateFile
from zbk.actors.indexsyncer import IndexCore
from zbk.actors.journal import JournalCore
from zbk.actors.loops import JournalLoop, ServerLoop, disk_probe_for
from zbk.actors.messages import GcTrigger, HeaderUpdate, IndexPut
from zbk.actors.server import LedgerState, ServerCore
from zbk.client.digest import master_key
from zbk.clock import SYSTEM_CLOCK, Clock
from zbk.config import BookieConfig
from zbk.errors import CookieMismatchError, CorruptDataError, KeyExistsError, LeaseExpiredError
from zbk.metadata import layout
from zbk.metadata.coordination import LeaseKeeper
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import BookieRegistration, LedgerStore, get_or_create_instance_id, register_bookie
from zbk.metadata.store import MetadataStore, iter_prefix
from zbk.metadata.uri import open_store
from zbk.metrics.http import AdminHttpServer
from zbk.storage import cookie as cookies
from zbk.storage import markers
from zbk.storage.disk import makedirs_durable, raise_open_files_limit
from zbk.storage.entrylog import EntryLogWriter
from zbk.storage.journal import JournalWriter, LogMark, RecordType, list_segments, replay
from zbk.storage.ledgercache import LedgerCache
from zbk.wire.curve import CurveServer
from zbk.wire.entry import peek_entry_header

log = logging.getLogger(__name__)

EXIT_COOKIE = 4
EXIT_BOOT = 5
ACTOR_EXIT_BASE = 10
ACTORS = ("server", "journal", "entrylogger", "index", "gc")


@dataclass
class BootReport:
    unclean: bool
    cookie_fixed: bool
    replayed_records: int
    phase_one_ledgers: int
    closed_ledgers_lacking: int = 0  # closed ledgers given an "unclean" repair mark by phase one


_REPLAY_PUTS = 4096  # index updates of replayed adds applied together (Bookie._replay)


class Bookie:
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
        """``index_files_open_max``, or fewer when the descriptor limit (raised to the hard
        limit first) leaves less beside ``limits.fds_reserved`` and the entry logs."""
        want = self.cfg.index_files_open_max
        soft = raise_open_files_limit()
        n = max(16, min(want, soft - limits.fds_reserved - self.cfg.entry_logs_open_max))
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
        self.logs = EntryLogWriter(list(self.cfg.ledger_dirs),
                                   size_limit_bytes=self.cfg.entry_log_size_limit_mb * 1024 * 1024,
                                   write_buffer_bytes=self.cfg.entry_log_write_buffer_bytes,
                                   writeback_bytes=self.cfg.flush_entry_log_bytes,
                                   keep_cached_bytes=self.cfg.entry_log_keep_cached_mb * 1024 * 1024,
                                   per_ledger=self.cfg.entry_log_per_ledger,
                                   open_max=self.cfg.entry_logs_open_max,
                                   expire_after_access_s=self.cfg.entry_log_expire_after_access_s,
                                   clock=self.clock)
        self.cache = LedgerCache(list(self.cfg.index_dirs), bytes_max=self.cfg.ledger_cache_bytes_max,
                                 syncfs=self.cfg.index_flush_syncfs, files_open_max=self._index_files_open_max())
        if self.cache.sync_mode == "syncfs":
            log.info("index: checkpoints are made durable by syncfs of the index file system(s)")
        else:
            log.info("index: checkpoints fsync each index file (%s)",
                     "index_flush_syncfs = false" if not self.cfg.index_flush_syncfs
                     else "syncfs is not trusted on this kernel or file system")
        replayed = self._replay(journal_replaced=cookie_fixed)
        durable_adds = self.cfg.journal_write_data and self.cfg.journal_sync_data
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
        segment_bytes = self.cfg.journal_max_size_mb * 1024 * 1024
        self.journal = JournalWriter(
            self.journal_dir, segment_bytes,
            preallocate_bytes=self.cfg.journal_pre_alloc_size_mb * 1024 * 1024,
            reuse_files=limits.journal_reuse_files(segment_bytes) if self.cfg.journal_reuse_files else 0)
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

    # -- run ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self.boot_report is None:
            self.boot()
        cfg = self.cfg
        self.ctx = zmq.Context()
        instance = self.instance = uuid.uuid4().hex[:8]
        self.server = ServerCore(ledgers=self._ledger_states(), journal_write_data=cfg.journal_write_data,
                                 max_frame_bytes=cfg.max_frame_bytes, reply=lambda i, f: None,
                                 read_only_mode_enabled=cfg.read_only_mode_enabled,
                                 on_state_change=self._on_state_change)
        journal = JournalCore(self.journal, sync_data=cfg.journal_sync_data,
                              group_bytes_max=cfg.journal_buffered_writes_threshold_bytes,
                              group_wait_s=cfg.journal_max_group_wait_ms / 1000.0)
        entrylogger = EntryLoggerCore(self.logs)
        index = IndexCore(self.cache, flush_interval_s=cfg.flush_interval_ms / 1000.0,
                          persist_mark=lambda mark: markers.write_last_mark(self.index_dir, LogMark(*mark)))
        common: dict[str, Any] = dict(ctx=self.ctx, instance=instance, clock=self.clock, on_crash=self._on_crash,
                                      stop=self.stop_event, cpus=cfg.actor_cpu_set())
        # senders: who sends to this actor (one PULL each); peers: to whom it sends.
        self.index_actor = ActorLoop(core=index, senders=["server", "entrylogger", "gc"],
                                     peers=["entrylogger", "journal", "server", "gc"], **common)
        self.index_actor.keep_inbound = True  # drained by stop(): see there
        self.loops = [
            JournalLoop(core=journal, senders=["server", "entrylogger", "index"], peers=["server", "entrylogger"], **common),
            ActorLoop(core=entrylogger, senders=["server", "index", "journal", "gc"],
                      peers=["server", "journal", "gc"], **common),
            self.index_actor,
            ActorLoop(core=self._make_gc(), senders=["entrylogger", "index", "admin"],
                      peers=["server", "entrylogger", "index"], **common),
        ]
        self.server_loop = ServerLoop(core=self.server, senders=["entrylogger", "journal", "index", "admin", "gc"],
                                      peers=["entrylogger", "journal", "index"],
                                      endpoint=f"tcp://{cfg.bind_address}:{cfg.port}",
                                      curve=CurveServer.from_config(cfg),
                                      max_frame_bytes=cfg.max_frame_bytes,
                                      disk_probe=disk_probe_for(self._all_dirs()),
                                      disk_check_interval_s=cfg.disk_check_interval_ms / 1000.0,
                                      disk_thresholds=(cfg.disk_usage_threshold, cfg.disk_usage_warn_threshold),
                                      **common)
        self.loops.append(self.server_loop)
        for loop in self.loops:  # PULL sockets are bound in the constructors, before any connect
            loop.start()
        for loop in self.loops:
            loop.ready.wait(10)
        if self.crashed:
            raise RuntimeError(f"actor {self.crashed} failed to start")
        self.admin = self.ctx.socket(zmq.PUSH)
        self.admin.connect(f"inproc://zbk-{instance}-admin-to-server")
        self.admin_lock = threading.Lock()  # HTTP handlers run on many threads; a socket is not thread-safe
        self.admin_gc = self.ctx.socket(zmq.PUSH)  # POST /api/v1/bookie/gc -> GarbageCollector
        self.admin_gc.connect(pipe_address(instance, "admin", "gc"))
        self._start_http()
        self._register(read_only=self.server.read_only)
        if cfg.autorecovery_enabled:
            self._start_autorecovery()
        log.info("bookie %s serving on %s (http %s)", cfg.bookie_id, self.server_loop.bound,
                 self.http.port if self.http else "-")

    def _start_autorecovery(self) -> None:
        """``autorecovery_enabled``: run an auditor candidate and replicator workers in this
        process, exactly as `zbk autorecovery` would, with their routes on this bookie's
        HTTP server. A lost autorecovery lease stops the bookie (crash, don't limp)."""
        from zbk.recovery.process import AutoRecovery

        assert self.http is not None
        arcfg = self.cfg.autorecovery_config(self.http.port)
        self.autorecovery = AutoRecovery(arcfg, stop_event=self.stop_event, http=self.http)
        self.autorecovery.start()

    def _register(self, *, read_only: bool) -> None:
        """Publish the registration (lease-bound). After a kill -9 the previous process's
        registration lives until its lease expires: wait for it, up to two TTLs."""
        reg = BookieRegistration(bookie_id=self.cfg.bookie_id, rack=self.cfg.rack,
                                 http_url=f"http://{self.cfg.http_bind_address}:{self.http.port if self.http else 0}",
                                 state="readonly" if read_only else "writable")
        self._registration = reg
        with self._reg_lock:
            deadline = self.clock.monotonic() + 2 * self.cfg.registration_ttl_s + 5
            while True:
                if self.lease is None or self.lease.lost:
                    self.lease = LeaseKeeper(self.store, ttl_s=self.cfg.registration_ttl_s,
                                             on_lost=self._on_lease_lost)
                    self.lease.start()
                try:
                    register_bookie(self.store, reg, self.lease.lease)
                    return
                except KeyExistsError:
                    if self.clock.monotonic() > deadline or self.stop_event.is_set():
                        raise
                    log.info("registration of %s still held by a previous process; waiting for its lease",
                             self.cfg.bookie_id)
                    self.clock.sleep(0.5)
                except LeaseExpiredError as e:
                    # Our own new lease expired before it was used (a loaded metadata store
                    # answered a keep-alive too late, e.g. while we waited above): take another.
                    if self.clock.monotonic() > deadline or self.stop_event.is_set():
                        raise
                    log.warning("registration lease expired before use (%s): taking a new one", e)
                    self.lease.stop(revoke=False)
                    self.lease = None

    def _on_lease_lost(self) -> None:
        """The registration lease was lost (metadata outage): register again on a new lease."""
        if self.stop_event.is_set():
            return
        log.warning("registration lease lost: registering again")

        def again() -> None:
            delay = 0.5
            while not self.stop_event.is_set():
                try:
                    self._register(read_only=self.server.read_only if self.server else False)
                    return
                except Exception as e:  # noqa: BLE001 - keep trying while the store is down
                    log.error("re-registration failed (retrying in %.1fs): %s", delay, e)
                    self.stop_event.wait(delay)
                    delay = min(delay * 2, 10.0)

        threading.Thread(target=again, name="zbk-reregister", daemon=True).start()

    def _on_state_change(self, read_only: bool) -> None:
        # Called on the server thread: registration is metadata I/O, so hand it off to one
        # worker (in order), which publishes whatever the state is when it runs.
        self._registrar.submit(self._publish_state)

    def _publish_state(self) -> None:
        try:
            self._register(read_only=bool(self.server and self.server.read_only))
        except Exception as e:  # noqa: BLE001 - the lease-lost path retries
            log.error("could not publish bookie state: %s", e)

    def _start_http(self) -> None:
        cfg = self.cfg
        self.http = AdminHttpServer(cfg.http_bind_address, cfg.http_port, token=cfg.admin_token)
        self.http.route("GET", "/api/v1/bookie/info", lambda _b: self.info())
        self.http.route("GET", "/api/v1/bookie/state", lambda _b: {"state": self.state()})
        self.http.route("PUT", "/api/v1/bookie/state", self._put_state)
        self.http.route("POST", "/api/v1/bookie/gc", self._post_gc)
        self.http.start()

    def state(self) -> str:
        return "readonly" if self.server and self.server.read_only else "writable"

    def info(self) -> dict[str, Any]:
        assert self.server is not None
        used, total = self.server.disk_usage
        return {"id": self.cfg.bookie_id, "state": self.state(), "ledgers": len(self.server.ledgers),
                "limbo_ledgers": sum(1 for s in self.server.ledgers.values() if s.limbo),
                "disk": {"used_bytes": used, "total_bytes": total,
                         "usage_ratio": round(used / total, 4) if total else 0.0}}

    def _put_state(self, body: dict[str, Any] | None) -> dict[str, Any]:
        from zbk.metrics.http import HttpError

        want = (body or {}).get("state")
        if want not in ("readonly", "writable"):
            raise HttpError(400, 'body must be {"state": "readonly" | "writable"}')
        with self.admin_lock:
            send_message(self.admin, handoff_for(self.instance), ("admin", "read_only", want == "readonly"))
        return {"state": want}

    def _make_gc(self) -> GcCore:
        """The GarbageCollector. Its metadata listing blocks only its own thread; compaction
        (which writes copies before it frees anything) waits while the ledger disks are full."""
        cfg = self.cfg
        ledgers = LedgerStore(self.store)
        probe = disk_probe_for(list(cfg.ledger_dirs))

        def compaction_allowed() -> bool:
            used, total = probe()
            return not total or used / total < cfg.disk_usage_threshold

        # Logs below the first one this process writes may hold copies of a compaction that a
        # crash cut short (zbk/actors/gc.py, "suspects").
        return GcCore(GcSettings.from_config(cfg), list_ledger_ids=lambda: set(ledgers.list_ids()),
                      ledger_exists=ledgers.exists, state=GcStateFile(cfg.ledger_dirs[0]),
                      suspect_below=self.logs.least_unflushed_log_id(), compaction_allowed=compaction_allowed)

    def _post_gc(self, body: dict[str, Any] | None) -> dict[str, Any]:
        """POST /api/v1/bookie/gc, body optional {"major": bool, "minor": bool}: start a GC
        run now (asynchronous; forced compactions regardless of their intervals)."""
        from zbk.metrics.http import HttpError

        flags = {k: (body or {}).get(k, False) for k in ("major", "minor")}
        if not all(isinstance(v, bool) for v in flags.values()):
            raise HttpError(400, 'body must be {"major": bool, "minor": bool}')
        with self.admin_lock:
            send_message(self.admin_gc, handoff_for(self.instance), GcTrigger(**flags))
        return {"triggered": True, **flags}

    def _on_crash(self, name: str, exc: BaseException) -> None:
        if self.crashed is None:
            self.crashed = name
            self.exit_code = ACTOR_EXIT_BASE + ACTORS.index(name) if name in ACTORS else ACTOR_EXIT_BASE + 9
        self.stop_event.set()

    def wait(self) -> int:
        """Block until stopped (signal or actor crash); returns the exit code."""
        while not self.stop_event.wait(0.5):
            pass
        return self.exit_code

    def stop(self) -> None:
        """Clean shutdown: unregister, stop actors, final checkpoint, clear the dirty marker."""
        self.stop_event.set()
        if self.autorecovery is not None:
            self.autorecovery.stop()  # resign and release locks before the bookie goes away
        self._registrar.shutdown(wait=True)
        if self.lease is not None:
            self.lease.stop()  # revokes the lease: the registration vanishes at once
        for loop in self.loops:
            loop.join(10)
        if self.http is not None:
            self.http.stop()
        if not self.crashed and self.index_actor is not None and not self.index_actor.is_alive():
            # The actors saw the stop at different moments: an add may have been acknowledged
            # while its index update was still on its way to the IndexSyncer (the Server's
            # teardown also sends the updates it held). The last mark written below skips
            # the journal records that could restore them, so apply them now.
            applied = self.index_actor.drain_inbound(lambda msg: isinstance(msg, (IndexPut, HeaderUpdate)))
            if applied:
                log.info("stop: applied %d index update(s) the IndexSyncer had not read", applied)
        if self.ctx is not None:
            drop_handoff(self.instance)  # messages still parked there were never received
        if self.crashed:
            log.error("bookie stopped because actor %s crashed: dirty marker left set", self.crashed)
            return
        stuck = [loop for loop in self.loops if loop.is_alive()]
        if stuck:
            frames = sys._current_frames()
            for loop in stuck:
                frame = frames.get(loop.ident or -1)
                where = "".join(traceback.format_stack(frame)) if frame is not None else "(no frame)\n"
                log.error("actor %s did not stop within 10 s; it is at:\n%s", loop.core.name, where.rstrip())
            log.error("an actor did not stop: dirty marker left set")
            return
        self.journal.sync(fsync=True)
        self.logs.flush()
        self.cache.flush()
        markers.write_last_mark(self.index_dir, self.journal.mark)
        self.logs.close()
        self.journal.close()
        markers.clear_dirty(self.index_dir)
        if self.ctx is not None:
            self.ctx.destroy(0)
        self.store.close()
        log.info("bookie %s stopped cleanly", self.cfg.bookie_id)


def _same_identity(a: cookies.Cookie, b: cookies.Cookie, *, check_incarnation: bool = True) -> bool:
    same = (a.bookie_id == b.bookie_id and a.instance_id == b.instance_id
            and tuple(a.journal_dirs) == tuple(b.journal_dirs) and tuple(a.ledger_dirs) == tuple(b.ledger_dirs)
            and tuple(a.index_dirs) == tuple(b.index_dirs))
    return same and (not check_incarnation or a.incarnation == b.incarnation)


def run_bookie(cfg: BookieConfig, *, stop: threading.Event | None = None) -> int:
    """`zbk bookie`: boot, serve until SIGTERM/SIGINT, stop cleanly. Returns the exit code.
    ``stop`` is set by the caller's signal handlers (installed before the heavy imports)."""
    if stop is None:
        stop = threading.Event()
        # Handlers first: a SIGTERM during boot or while waiting for an old registration
        # lease must still end in a clean stop, not a default-action kill.
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
    if stop.is_set():
        return 0  # asked to stop before anything was touched
    try:
        bookie = Bookie(cfg, stop_event=stop)
        bookie.boot()
    except CookieMismatchError as e:
        log.error("%s", e)
        return EXIT_COOKIE
    except Exception as e:  # noqa: BLE001 - any boot failure is one clear line and an exit code
        log.error("boot failed: %s", e, exc_info=log.isEnabledFor(logging.DEBUG))
        return EXIT_BOOT
    try:
        bookie.start()
    except Exception as e:  # noqa: BLE001
        if not stop.is_set():
            log.error("start failed: %s", e)
            bookie.stop()
            return EXIT_BOOT
    code = bookie.wait()
    bookie.stop()
    if code:
        os._exit(code)  # an actor crashed: do not run more cleanup that could mask it
    return 0
