"""GarbageCollector actor: drops the local data of ledgers deleted in metadata, removes entry
logs that hold only dead data, and compacts sparse logs, throttled.

:class:`GcCore` is the logic (messages and ticks in, messages out); the metadata listing and
a tiny persisted state (:class:`GcStateStore`; on disk, zbk/storage/gcstate.py) are
injected, so tests drive it with a ``ListOutbox`` and fakes. It never touches entry logs
or the index itself: the EntryLogger and the IndexSyncer own those, and the GC asks.

A run (every ``gc_wait_time_ms`` after the previous one ended, or at once on
POST /api/v1/bookie/gc; one run at a time)
    1. ``S1`` = the ledgers of the local index (LocalLedgersRequest, via the Server).
    2. ``M`` = the ledger ids in metadata (the injected ``list_ledger_ids``), listed *after*
       S1: a ledger created in between is absent from S1, so it cannot look deleted. Each
       ledger of ``S1 - M`` is then read on its own (``ledger_exists``), so a listing that
       lost keys deletes nothing. If the store fails, the run ends here: nothing is ever
       deleted on an error.
    2b. When its scan is due, the ledgers of ``S1`` that metadata holds but no longer names
       this bookie in, past their grace period (zbk/actors/overrep.py), join the deletion.
    3. Those confirmed were deleted (or over-replicated): DeleteLedgers to the Server, which drops their state (a
       ledger with an add in flight is kept for the next run) and forwards the message to
       the IndexSyncer, which removes their index files.
    4. LogStats from the EntryLogger: ``{log: {ledger: bytes}}`` and the unflushed logs.
    5. ``S2`` = the local ledgers again. This is what "live" means for the logs of step 4:
       a ledger with bytes in a log of step 4 is in S2 unless it was deleted (proof below).
    6. A sealed log none of whose ledgers is in S2 is deleted (DeleteLogs, via the
       IndexSyncer). Its bytes count in zbk_gc_reclaimed_bytes_total.
    7. Compaction, when due: every sealed log whose live fraction is below
       ``major_compaction_threshold`` (every ``major_compaction_interval_s``) or else
       ``minor_compaction_threshold`` (every ``minor_compaction_interval_s``) is compacted,
       one log at a time, sparsest first.

Why S2 is a safe notion of "live" (step 5)
    The Server sends a ledger's HeaderUpdate (master key) to the IndexSyncer before it sends
    the ledger's first AppendBatch to the EntryLogger. A ledger with bytes in the usage of
    step 4 was appended before the EntryLogger answered, so its HeaderUpdate was sent before
    the GC sent its second LocalLedgersRequest to the Server; the Server forwards both on the
    one Server->IndexSyncer pipe (FIFO), so the index holds the ledger when it answers, unless
    a DeleteLedgers removed it. Journal replay at boot puts every replayed entry in the index
    before any actor runs. Deletion of a whole log (step 6) rests on this ordered fact only;
    the estimates used to pick compaction candidates never decide a deletion.

Compaction of log O (a job)
    * Before the first copy, the GC persists ``dupes_from`` = the least unflushed log id: every
      log that can receive copies has an id at least that large (ids only grow). It is
      cleared when every job of the run has become durable (or ended).
    * CompactLog, then CompactChunk(budget) messages paced by a token bucket refilled at
      ``compaction_rate_bytes`` per second (bytes scanned), so the EntryLogger handles adds
      and reads between chunks. Per chunk the EntryLogger scans records of O, asks the index
      which ones it still points at (LiveCheck, via the Server so it follows every IndexPut
      of those entries), appends those to its current log, flushes (fsync) the copies, and
      sends Relocate (via the Server) with (ledger, entry, old, new) for each. The IndexSyncer
      applies each as a conditional put: only where the slot still holds the old location (an
      entry re-added or a ledger deleted meanwhile wins over the copy).
    * After the last chunk the IndexSyncer starts a checkpoint and, once an index flush that
      began after the last Relocate was applied has completed, sends CompactionDurable. Only
      then is O deleted (DeleteLogs, via the IndexSyncer, so every read location pointing
      into O that it handed out earlier reaches the EntryLogger first). Once relocated, no
      slot points into O again: nothing appends to a sealed log and only replay (at boot) puts
      locations that did not come from an append or a relocation.
    * A kill -9 at any point: until the index flush, O is on disk and the durable index
      points into O (or, for slots flushed by a regular checkpoint, at copies that were
      fsynced before their Relocate was sent). Copies whose relocation never became durable
      are unreferenced duplicates in logs >= ``dupes_from``; the next boot finds the persisted
      ``dupes_from`` and compacts those logs once ("suspects"), which drops them because
      compaction copies only what the index points at. Copies the index rejected while the
      process ran are counted as garbage of their log, for choosing compaction candidates.

Messages (zbk/actors/messages.py)::

    GC --LocalLedgersRequest--> Server --> IndexSyncer --LocalLedgers--> GC
    GC --DeleteLedgers--> Server (drops LedgerState) --> IndexSyncer (deletes index files)
    GC --LogStatsRequest--> EntryLogger --LogStats--> GC
    GC --DeleteLogs--> IndexSyncer --> EntryLogger --LogsDeleted--> GC
    GC --CompactLog / CompactChunk--> EntryLogger --LiveCheck--> Server --> IndexSyncer
       --LiveResult--> EntryLogger --Relocate--> Server --> IndexSyncer --Relocated--> GC
    IndexSyncer (index flushed after the last Relocate) --CompactionDurable--> GC
    admin (HTTP) --GcTrigger--> GC
    admin (HTTP) --GcStatusRequest / GcSuspend--> GC (answered through their Future)

Compaction of either kind can be suspended by an operator (PUT gc/suspend_compaction, as
BookKeeper's): a suspended kind is not started, forced or due, and the logs queued for it
wait (an interrupted compaction's "suspects" are major work: they wait for major too);
the log being compacted is finished. Not persisted: a restart resumes both.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from zbk import limits
from zbk.actors.base import Outbox
from zbk.actors.messages import (
    CompactChunk,
    CompactionDurable,
    CompactLog,
    DeleteLedgers,
    DeleteLogs,
    GcStatus,
    GcStatusRequest,
    GcSuspend,
    GcTrigger,
    LocalLedgers,
    LocalLedgersRequest,
    LogsDeleted,
    LogStats,
    LogStatsRequest,
    Relocated,
)
from zbk.actors.overrep import OverrepTracker
from zbk.config import GcConfig
from zbk.metrics import bookie as m
from zbk.tokenbucket import TokenBucket

log = logging.getLogger(__name__)

MINOR = "minor"
MAJOR = "major"


@dataclass(frozen=True, kw_only=True)
class GcSettings:
    gc_wait_s: float
    minor_threshold: float
    minor_interval_s: float
    major_threshold: float
    major_interval_s: float
    rate_bytes_per_s: float
    chunk_bytes_max: int = limits.gc_compaction_chunk_bytes_max
    tick_s: float = limits.gc_tick_s

    @classmethod
    def from_config(cls, cfg: GcConfig) -> GcSettings:
        return cls(gc_wait_s=cfg.wait_time_ms / 1000.0,
                   minor_threshold=cfg.minor_compaction_threshold,
                   minor_interval_s=cfg.minor_compaction_interval_s,
                   major_threshold=cfg.major_compaction_threshold,
                   major_interval_s=cfg.major_compaction_interval_s,
                   rate_bytes_per_s=float(cfg.compaction_rate_bytes)).validate()

    def validate(self) -> GcSettings:
        assert self.gc_wait_s > 0 and self.rate_bytes_per_s > 0 and self.tick_s > 0
        assert 0 < self.minor_threshold <= self.major_threshold <= 1
        assert self.minor_interval_s > 0 and self.major_interval_s > 0 and self.chunk_bytes_max > 0
        return self

    @property
    def chunk_bytes_min(self) -> int:
        """Tokens to gather before a chunk: one tick's worth, so a slow rate sends a chunk
        per tick instead of a message per record."""
        return max(1, int(min(self.chunk_bytes_max, self.rate_bytes_per_s * self.tick_s)))


# -- decisions (pure functions, unit-tested on their own) ------------------------------------

def deleted_ledgers(local: set[int], in_metadata: set[int]) -> set[int]:
    """Ledgers to delete: held locally, gone from metadata. ``local`` must be the older
    snapshot (see the module docstring, step 2)."""
    return local - in_metadata


@dataclass(frozen=True)
class LogUse:
    total: int
    live: int

    @property
    def fraction(self) -> float:
        return self.live / self.total if self.total else 0.0


def log_use(per_ledger: dict[int, int], live_ledgers: set[int], garbage: dict[int, int] | None = None) -> LogUse:
    """Total and live record bytes of one log. ``garbage`` (ledger -> bytes of copies the
    index rejected) lowers a live ledger's bytes, never below zero."""
    garbage = garbage or {}
    live = sum(max(0, n - garbage.get(lid, 0)) for lid, n in per_ledger.items() if lid in live_ledgers)
    return LogUse(sum(per_ledger.values()), live)


def dead_logs(usage: dict[int, dict[int, int]], live_ledgers: set[int], keep: set[int]) -> list[int]:
    """Logs holding no byte of a live ledger, except those in ``keep`` (unflushed, or being
    compacted). Ledger level only, never garbage-adjusted: a deletion rests on ordered facts."""
    return sorted(lg for lg, per in usage.items() if lg not in keep and not per.keys() & live_ledgers)


def compaction_candidates(usage: dict[int, dict[int, int]], live_ledgers: set[int],
                          garbage: dict[int, dict[int, int]], threshold: float, exclude: set[int]) -> list[int]:
    """Logs whose live fraction is below ``threshold``, sparsest first."""
    picked: list[tuple[float, int]] = []
    for lg, per in usage.items():
        if lg in exclude:
            continue
        use = log_use(per, live_ledgers, garbage.get(lg))
        if use.total and use.fraction < threshold:
            picked.append((use.fraction, lg))
    return [lg for _, lg in sorted(picked)]


# -- the persisted state --------------------------------------------------------------------

class GcStateStore(Protocol):
    def load(self) -> int | None:
        """The persisted ``dupes_from`` log id, or None."""

    def save(self, dupes_from: int | None) -> None:
        """Persist ``dupes_from`` durably before returning."""


# -- the core -------------------------------------------------------------------------------

class Phase(enum.Enum):
    LOCAL_BEFORE = "local snapshot"
    STATS = "log stats"
    LOCAL_AFTER = "live ledgers"
    COMPACTING = "compacting"


@dataclass
class _Candidate:
    log_id: int
    kind: str
    suspect: bool = False


@dataclass
class _Run:
    ctx: int
    major: bool
    minor: bool
    forced: bool = False  # asked for (GcTrigger), not the periodic schedule
    phase: Phase = Phase.LOCAL_BEFORE
    stats: LogStats | None = None
    queue: list[_Candidate] = field(default_factory=list)


@dataclass
class _Job:
    job_id: int
    log_id: int
    kind: str
    total_bytes: int
    scanned: int = 0
    copied: int = 0
    chunk_out: bool = False  # a CompactChunk is in the pipeline (at most one)
    finished: bool = False  # the last Relocated arrived; waiting for CompactionDurable
    error: str = ""


@dataclass
class _Deletion:
    reclaim_bytes: dict[int, int]  # log id -> bytes its deletion reclaims
    kind: str | None  # compaction kind when this deletion ends a compaction


class GcCore:
    name = "gc"

    def __init__(self, settings: GcSettings, *, outbox: Outbox, list_ledger_ids: Callable[[], set[int]],
                 state: GcStateStore, suspect_below: int, compaction_allowed: Callable[[], bool] = lambda: True,
                 ledger_exists: Callable[[int], bool] | None = None, overrep: OverrepTracker | None = None,
                 wall_clock: Callable[[], float] = time.time) -> None:
        """``suspect_below``: the least unflushed log id when the bookie started; logs below it
        and >= a persisted ``dupes_from`` may hold copies of a compaction cut short.
        ``ledger_exists``: when given, each ledger missing from the listing is read once more
        on its own before it is deleted (a listing that silently lost keys deletes nothing).
        ``overrep``: when given, local copies of over-replicated ledgers are deleted too."""
        self.s = settings
        self.list_ledger_ids = list_ledger_ids
        self.ledger_exists = ledger_exists
        self.overrep = overrep
        self.state = state
        self.compaction_allowed = compaction_allowed
        self.tick_interval_s: float | None = settings.tick_s
        self.outbox: Outbox = outbox
        self.dupes_from = state.load()
        self.suspect_below = suspect_below
        self.suspects_scheduled = self.dupes_from is None
        self.seq = 0
        self.run: _Run | None = None
        self.job: _Job | None = None
        self.pending_trigger: GcTrigger | None = None
        self.next_run_at: float | None = None
        self.last_minor_at = 0.0
        self.last_major_at = 0.0
        # Compaction pacing: bytes scanned, refilled at rate_bytes_per_s, one chunk's worth at most.
        self.bucket = TokenBucket(settings.rate_bytes_per_s, float(settings.chunk_bytes_max))
        self.garbage: dict[int, dict[int, int]] = {}  # log -> ledger -> bytes the index rejected
        self.failed_logs: set[int] = set()  # compaction failed (corrupt?): left for an operator
        self.deletions: dict[int, _Deletion] = {}
        self.runs_completed = 0
        self.wall_clock = wall_clock  # for gc_details' times only; every decision uses ``now``
        self.suspended = {MAJOR: False, MINOR: False}
        self.passes = {MAJOR: 0, MINOR: 0}  # compaction passes of each kind (gc_details' counters)
        self.last_pass_ms = {MAJOR: 0, MINOR: 0}

    def _send(self, dest: str, msg: Any) -> None:
        self.outbox.send(dest, msg)

    def _next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def _start_clock(self, now: float) -> None:
        """The schedule starts with the first message or tick: runs after gc_wait, each
        compaction kind after its interval."""
        if self.next_run_at is None:
            self.next_run_at = now + self.s.gc_wait_s
            self.last_minor_at = self.last_major_at = now
            self.bucket.reset(0.0, now)

    # -- ticks and dispatch -------------------------------------------------------------------
    def on_tick(self, now: float) -> None:
        self._start_clock(now)
        assert self.next_run_at is not None
        if self.run is None and now >= self.next_run_at:
            self._start_run(major=False, minor=False)
        self._pump(now)

    def on_message(self, msg: Any, now: float) -> None:
        self._start_clock(now)
        if isinstance(msg, GcTrigger):
            self._on_trigger(msg, now)
        elif isinstance(msg, LocalLedgers):
            self._on_local_ledgers(msg, now)
        elif isinstance(msg, LogStats):
            self._on_log_stats(msg)
        elif isinstance(msg, LogsDeleted):
            self._on_logs_deleted(msg)
        elif isinstance(msg, Relocated):
            self._on_relocated(msg, now)
        elif isinstance(msg, CompactionDurable):
            self._on_durable(msg, now)
        elif isinstance(msg, GcStatusRequest):
            msg.answer.set_result(self.status())
        elif isinstance(msg, GcSuspend):
            for kind, value in ((MAJOR, msg.major), (MINOR, msg.minor)):
                if value is not None and value != self.suspended[kind]:
                    log.info("gc: %s compaction %s by an operator", kind, "suspended" if value else "resumed")
                    self.suspended[kind] = value
            msg.answer.set_result(self.status())
        else:
            raise AssertionError(f"gc: unexpected message {msg!r}")

    @property
    def busy(self) -> bool:
        return self.run is not None

    def status(self) -> GcStatus:
        kind = self.job.kind if self.job is not None else None
        return GcStatus(forced=self.run is not None and self.run.forced,
                        major_compacting=kind == MAJOR, minor_compacting=kind == MINOR,
                        last_major_ms=self.last_pass_ms[MAJOR], last_minor_ms=self.last_pass_ms[MINOR],
                        major_count=self.passes[MAJOR], minor_count=self.passes[MINOR],
                        major_suspended=self.suspended[MAJOR], minor_suspended=self.suspended[MINOR])

    # -- a run ----------------------------------------------------------------------------------
    def _on_trigger(self, msg: GcTrigger, now: float) -> None:
        if self.run is None:
            self._start_run(major=msg.major, minor=msg.minor, forced=True)
            return
        # A run is under way: remember the request (merged) and start it when this one ends.
        prev = self.pending_trigger or GcTrigger()
        self.pending_trigger = GcTrigger(major=prev.major or msg.major, minor=prev.minor or msg.minor)

    def _start_run(self, *, major: bool, minor: bool, forced: bool = False) -> None:
        run = self.run = _Run(self._next_seq(), major, minor, forced)
        log.debug("gc: run %d starts", run.ctx)
        self._send("server", LocalLedgersRequest(run.ctx))

    def _end_run(self, now: float) -> None:
        if self.overrep is not None:
            self.overrep.release()
        self.run = None
        self.runs_completed += 1
        self.next_run_at = now + self.s.gc_wait_s
        if self.pending_trigger is not None:
            trigger, self.pending_trigger = self.pending_trigger, None
            self._start_run(major=trigger.major, minor=trigger.minor, forced=True)

    def _current(self, ctx: int, *phases: Phase) -> _Run | None:
        run = self.run
        if run is None or run.ctx != ctx or run.phase not in phases:
            log.warning("gc: ignoring a stale answer (ctx %d, expected %s)", ctx, "/".join(p.value for p in phases))
            return None
        return run

    def _on_local_ledgers(self, msg: LocalLedgers, now: float) -> None:
        run = self._current(msg.ctx, Phase.LOCAL_BEFORE, Phase.LOCAL_AFTER)
        if run is None:
            return
        if run.phase is Phase.LOCAL_AFTER:
            # The Server handled this request after the run's DeleteLedgers (one FIFO pipe):
            # the over-replicated copies are gone, their replication locks can go too.
            if self.overrep is not None:
                self.overrep.release()
            self._plan(run, set(msg.ledger_ids), now)
            return
        try:
            local = set(msg.ledger_ids)
            in_metadata = self.list_ledger_ids()  # after the local snapshot: see step 2
            gone = deleted_ledgers(local, in_metadata)
            if self.ledger_exists is not None:
                gone = {lid for lid in gone if not self.ledger_exists(lid)}
            surplus: set[int] = set()
            if self.overrep is not None and self.overrep.due(now, forced=run.forced):
                surplus = self.overrep.scan(local & in_metadata, now)
        except Exception as e:  # noqa: BLE001 - any failure of the metadata store: delete nothing
            log.warning("gc: reading ledgers from metadata failed, skipping this run: %s", e)
            self._end_run(now)
            return
        if gone:
            log.info("gc: deleting %d ledger(s) gone from metadata: %s", len(gone), _ids(gone))
        if gone or surplus:
            m.GC_OVERREPLICATED_LEDGERS.inc(len(surplus))
            self._send("server", DeleteLedgers(sorted(gone | surplus)))
        run.phase = Phase.STATS
        self._send("entrylogger", LogStatsRequest(run.ctx))

    def _on_log_stats(self, msg: LogStats) -> None:
        run = self._current(msg.ctx, Phase.STATS)
        if run is None:
            return
        run.stats = msg
        run.phase = Phase.LOCAL_AFTER
        self._send("server", LocalLedgersRequest(run.ctx))  # after the stats: see step 5

    def _plan(self, run: _Run, live: set[int], now: float) -> None:
        stats = run.stats
        assert stats is not None
        for lg in [lg for lg in self.garbage if lg not in stats.usage]:
            del self.garbage[lg]
        keep = set(stats.unflushed)
        dead = dead_logs(stats.usage, live, keep)
        if dead:
            log.info("gc: deleting %d entry log(s) with no live ledger: %s", len(dead), _ids(dead))
            self._delete_logs({lg: sum(stats.usage[lg].values()) for lg in dead}, kind=None)
        run.queue = self._compaction_queue(run, stats, live, keep | set(dead) | self.failed_logs, now)
        run.phase = Phase.COMPACTING
        self._next_job(now)

    def _compaction_queue(self, run: _Run, stats: LogStats, live: set[int], exclude: set[int],
                          now: float) -> list[_Candidate]:
        kind = self._due_kind(run, now)
        suspects: list[int] = []
        if not self.suspects_scheduled and not self.suspended[MAJOR]:
            assert self.dupes_from is not None
            suspects = [lg for lg in sorted(stats.usage)
                        if self.dupes_from <= lg < self.suspect_below and lg not in exclude]
        if kind is None and not suspects:
            return []
        if not self.compaction_allowed():
            log.warning("gc: disk nearly full, compaction postponed (only whole dead logs are deleted)")
            return []
        queue = [_Candidate(lg, MAJOR, suspect=True) for lg in suspects]
        self.suspects_scheduled = True
        if suspects:
            log.info("gc: an earlier compaction was interrupted; compacting logs %s once to drop its "
                     "unreferenced copies", _ids(suspects))
        if kind is not None:
            threshold = self.s.major_threshold if kind == MAJOR else self.s.minor_threshold
            picked = compaction_candidates(stats.usage, live, self.garbage, threshold, exclude | set(suspects))
            queue += [_Candidate(lg, kind) for lg in picked]
            self.last_minor_at = now
            if kind == MAJOR:  # a major compaction covers what a minor one would do
                self.last_major_at = now
            self.passes[kind] += 1
            self.last_pass_ms[kind] = int(self.wall_clock() * 1000)
        return queue

    def _due_kind(self, run: _Run, now: float) -> str | None:
        """The kind to run now; a suspended one never (a due minor runs instead of a
        suspended major)."""
        if not self.suspended[MAJOR] and (run.major or now - self.last_major_at >= self.s.major_interval_s):
            return MAJOR
        if not self.suspended[MINOR] and (run.minor or now - self.last_minor_at >= self.s.minor_interval_s):
            return MINOR
        return None

    # -- deleting logs --------------------------------------------------------------------------
    def _delete_logs(self, reclaim_bytes: dict[int, int], kind: str | None) -> None:
        ctx = self._next_seq()
        self.deletions[ctx] = _Deletion(reclaim_bytes, kind)
        self._send("index", DeleteLogs(ctx, sorted(reclaim_bytes)))

    def _on_logs_deleted(self, msg: LogsDeleted) -> None:
        d = self.deletions.pop(msg.ctx, None)
        if d is None:
            log.warning("gc: ignoring a stale LogsDeleted (ctx %d)", msg.ctx)
            return
        reclaimed = sum(d.reclaim_bytes[lg] for lg in msg.log_ids)
        m.GC_RECLAIMED_BYTES.inc(reclaimed)
        for lg in msg.log_ids:
            self.garbage.pop(lg, None)
        if d.kind is not None and msg.log_ids:
            m.GC_COMPACTIONS.labels(d.kind).inc()
        skipped = set(d.reclaim_bytes) - set(msg.log_ids)
        if skipped:
            log.warning("gc: entry logs %s were not deleted (still open or already gone)", _ids(skipped))

    # -- compaction jobs ------------------------------------------------------------------------
    def _next_job(self, now: float) -> None:
        run = self.run
        assert run is not None and run.phase is Phase.COMPACTING and self.job is None
        while run.queue:
            cand = run.queue.pop(0)
            if not self.suspended[cand.kind]:
                self._start_job(cand, now)
                return
            if cand.suspect:
                self.suspects_scheduled = False  # suspended before its turn: the next run takes it

        if self.dupes_from is not None and self.suspects_scheduled:
            # Every job of this run waited for its relocations to be durable, and the suspects
            # of an earlier crash were compacted: no log holds copies the index could miss.
            self._set_dupes_from(None)
        self._end_run(now)

    def _start_job(self, cand: _Candidate, now: float) -> None:
        run = self.run
        assert run is not None and run.stats is not None
        per_ledger = run.stats.usage.get(cand.log_id, {})
        if self.dupes_from is None:
            # Persisted before any copy exists: every log that receives copies has an id at
            # least this large (ids only grow, and this one was unflushed when listed).
            self._set_dupes_from(run.stats.least_unflushed)
        job = self.job = _Job(self._next_seq(), cand.log_id, cand.kind, sum(per_ledger.values()))
        log.info("gc: compacting entry log %d (%s%s, %d bytes)", job.log_id, cand.kind,
                 ", suspect" if cand.suspect else "", job.total_bytes)
        self._send("entrylogger", CompactLog(job.job_id, job.log_id))
        self.bucket.reset(float(self.s.chunk_bytes_min), now)  # the first chunk goes at once
        self._pump(now)

    def _pump(self, now: float) -> None:
        """Send the next chunk when the token bucket allows it (at most one in flight)."""
        job = self.job
        if job is None or job.chunk_out or job.finished:
            return
        tokens = self.bucket.refill(now)
        if tokens < self.s.chunk_bytes_min:
            return
        job.chunk_out = True
        self._send("entrylogger", CompactChunk(job.job_id, int(tokens)))

    def _on_relocated(self, msg: Relocated, now: float) -> None:
        job = self.job
        if job is None or job.job_id != msg.job:
            log.warning("gc: ignoring a stale Relocated (job %d)", msg.job)
            return
        job.chunk_out = False
        job.scanned += msg.scanned_bytes
        job.copied += msg.copied_bytes
        self.bucket.take(msg.scanned_bytes)  # may go below zero: the next chunk waits longer
        for lg, lid, size in msg.rejected:
            per = self.garbage.setdefault(lg, {})
            per[lid] = per.get(lid, 0) + size
        if msg.last:
            job.finished = True
            job.error = msg.error
        else:
            self._pump(now)

    def _on_durable(self, msg: CompactionDurable, now: float) -> None:
        job = self.job
        if job is None or job.job_id != msg.job:
            log.warning("gc: ignoring a stale CompactionDurable (job %d)", msg.job)
            return
        assert job.finished, "durable before the last chunk"
        self.job = None
        if job.error:
            log.error("gc: compaction of entry log %d failed, the log is kept: %s", job.log_id, job.error)
            self.failed_logs.add(job.log_id)
        else:
            log.info("gc: entry log %d compacted: %d bytes scanned, %d copied", job.log_id, job.scanned, job.copied)
            self._delete_logs({job.log_id: max(0, job.total_bytes - job.copied)}, kind=job.kind)
        self._next_job(now)

    def _set_dupes_from(self, value: int | None) -> None:
        self.state.save(value)
        self.dupes_from = value


def _ids(ids: Any) -> str:
    """A short rendering of an id collection for logs."""
    ordered = sorted(ids)
    head = ", ".join(str(i) for i in ordered[:10])
    return head + (f", ... ({len(ordered)} in all)" if len(ordered) > 10 else "")
