"""A bookie's boot, before any request is served: cookies, journal replay, phase one.

Boot (ARCHITECTURE.md "Boot sequence", BP-46):
1. Validate directories and cookies (local copies vs metadata). A mismatch refuses to
   start (exit code EXIT_COOKIE) unless auto_fix_cookie, which proceeds with phase one and
   rewrites the cookies; added journal directories are an expansion that updates the
   cookies (zbk/bookie/cookiecheck.py).
2. Detect an unclean shutdown: the dirty marker is still present. Set it for this run.
3. Replay every journal from its last mark into the entry logs and index, then checkpoint
   (zbk/bookie/replay.py).
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import zmq

from zbk import limits
from zbk.actors.base import ActorLoop
from zbk.actors.server import LedgerState, ServerCore
from zbk.bookie.cookiecheck import all_dirs, check_cookies
from zbk.bookie.replay import checkpoint_after_replay, replay_journals
from zbk.client.digest import master_key
from zbk.clock import SYSTEM_CLOCK, Clock
from zbk.config import BookieConfig
from zbk.errors import EXIT_OK, CorruptDataError
from zbk.metadata import layout
from zbk.metadata.coordination import LeaseKeeper
from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.store import MetadataStore, iter_prefix
from zbk.metadata.uri import open_store
from zbk.metrics.http import AdminHttpServer
from zbk.storage import markers
from zbk.storage.disk import makedirs_durable, raise_open_files_limit
from zbk.storage.entrylog import EntryLogWriter
from zbk.storage.journal import JournalWriter
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


class BookieBoot:
    """The bookie's state from its constructor to the end of boot (``boot()``)."""

    def __init__(self, cfg: BookieConfig, *, clock: Clock = SYSTEM_CLOCK, store: MetadataStore | None = None,
                 stop_event: threading.Event | None = None) -> None:
        self.cfg = cfg.validate()
        self.clock = clock
        self.store = store or open_store(self.cfg.metadata_uri)
        self.stop_event = stop_event or threading.Event()
        self.exit_code = EXIT_OK
        self.crashed: str | None = None
        self.loops: list[ActorLoop] = []
        self.index_actor: ActorLoop | None = None
        self.ctx: zmq.Context[Any] | None = None
        self.http: AdminHttpServer | None = None
        self.lease: LeaseKeeper | None = None
        self.autorecovery: Any = None  # zbk.recovery.embedded.EmbeddedAutoRecovery with autorecovery_enabled
        self.server: ServerCore | None = None
        self.boot_report: BootReport | None = None
        self._reg_lock = threading.Lock()
        self._registrar = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zbk-registrar")
        # One journal (writer and actor) per directory; a ledger's records go to journal
        # ledger_id % len(journal_dirs) (zbk/actors/journals.py).
        self.journal_dirs = list(self.cfg.journal_dirs)
        self.journals: list[JournalWriter] = []
        self.index_dir = self.cfg.index_dirs[0]

    # -- boot ---------------------------------------------------------------------------------
    def _all_dirs(self) -> list[str]:
        return all_dirs(self.cfg)

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

    def boot(self) -> BootReport:
        for d in self._all_dirs():
            makedirs_durable(d)
        cookie_fixed = check_cookies(self.cfg, self.store)
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
                                   clock=self.clock,
                                   direct_io=el.direct_io)
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
        """Replay every journal from its mark, open the journal writers, checkpoint
        (zbk/bookie/replay.py)."""
        n = replay_journals(self.journal_dirs, self.index_dir, self.logs, self.cache,
                            journal_replaced=journal_replaced)
        jc = self.cfg.journal
        self.journals = [JournalWriter(d, jc.segment_bytes, preallocate_bytes=jc.preallocate_bytes,
                                       reuse_files=limits.journal_reuse_files(jc.segment_bytes) if jc.reuse_files else 0,
                                       direct_io=jc.direct_io and jc.sync_data)
                         for d in self.journal_dirs]
        # Checkpoint what replay rebuilt, so the replayed segments can go.
        checkpoint_after_replay(self.journals, self.index_dir, self.logs, self.cache)
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

