"""The auditor: finds ledgers that lost a replica and marks them under-replicated.

Exactly one auditor acts at a time, elected through ``auditor/leader`` (LeaderElection,
bound to the process lease). The leader watches bookie registrations: a bookie that is
registered neither writable nor read-only is gone (a read-only bookie still serves reads,
so it is not lost). After ``lost_bookie_recovery_delay`` seconds (0: at once; the value
lives in metadata and may change at any time, which reschedules pending audits) every
ledger with a fragment on the gone bookie is marked under-replicated, naming it. A bookie
that comes back before its delay ran out is not audited: a restart is not a loss.

A new leader, and every ``auditor_periodic_check_interval_s`` the leader again, also
counts as gone every bookie that ledgers name but nobody has registered, so a bookie that
died while no auditor ran (or during a leader change, or whose event was missed) is still
audited. On the same schedule — and at once when ``auditor/trigger`` is written (`zbk shell
triggeraudit`) — a background thread runs the periodic check of every ledger's replicas
(:mod:`zbk.recovery.checker`: replica contents, read probes, placement), which marks
damaged replicas for in-place repair. The time of the last finished check is kept in
``auditor/last_check`` so that a new leader does not start a full check at once unless
one is due.

While an operator has auto-recovery switched off (:mod:`zbk.recovery.switch`) the leader
still follows the registrations, but marks nothing: audits that come due wait, and run as
soon as the switch is back on (it watches the switch); the periodic check does not start,
and one under way stops before its next ledger and runs again once the switch is on.

:class:`AuditorCore` holds the decisions (plain state, the clock passed in as numbers);
:class:`Auditor` is the thin thread around it that talks to the metadata store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from zbk import eventloop, limits
from zbk.backoff import Backoff
from zbk.clock import SYSTEM_CLOCK, Clock
from zbk.config import ClientConfig
from zbk.errors import CorruptMetadataError, MetadataError, NoSuchLedgerError, ZbkError
from zbk.metadata import layout
from zbk.metadata.coordination import LeaderElection
from zbk.metadata.registry import LedgerStore, list_bookies, watch_bookies
from zbk.metadata.store import MetadataStore, Watch, WatchEvent
from zbk.recovery import metrics as rm
from zbk.recovery.switch import is_enabled
from zbk.recovery.underreplication import UnderReplicationRegistry, get_recovery_delay

log = logging.getLogger(__name__)


class AuditorCore:
    """Which bookies are gone, since when, and which are due for an audit.

    Feed it the set of registered bookies (writable and read-only) whenever it may have
    changed, the delay whenever it may have changed, and ask :meth:`due` what to audit."""

    def __init__(self, delay_s: float) -> None:
        assert delay_s >= 0, delay_s
        self.delay_s = delay_s
        self.available: set[str] = set()
        self.pending: dict[str, float] = {}  # gone bookie -> when it was first seen gone
        self.lost: set[str] = set()  # audited and still gone

    def observe(self, available: set[str], now: float, *, referenced: set[str] | None = None) -> None:
        """``available``: bookies registered now. ``referenced``: bookies that ledgers name
        (passed by a new leader), gone too if not available."""
        for b in available:
            if self.pending.pop(b, None) is not None:
                log.info("bookie %s is back before its audit: not lost", b)
            self.lost.discard(b)
        for b in (self.available | (referenced or set())) - available:
            if b not in self.pending and b not in self.lost:
                log.info("bookie %s is gone; audit in %.1f s", b, self.delay_s)
                self.pending[b] = now
        self.available = set(available)

    def set_delay(self, delay_s: float) -> None:
        """A new delay applies to pending audits too: each is due ``delay_s`` after its
        bookie was first seen gone."""
        assert delay_s >= 0, delay_s
        self.delay_s = delay_s

    def due(self, now: float) -> list[str]:
        """Bookies whose delay ran out, sorted; they move from pending to lost."""
        ready = sorted(b for b, since in self.pending.items() if since + self.delay_s <= now)
        for b in ready:
            del self.pending[b]
            self.lost.add(b)
        return ready

    def retry(self, bookie: str, now: float) -> None:
        """An audit that failed half-way: due again at once (marks are idempotent)."""
        if bookie in self.lost:
            self.lost.discard(bookie)
            self.pending[bookie] = now - self.delay_s

    def forget(self, bookie: str) -> None:
        """An audited bookie that no ledger names: nothing to repair, stop counting it."""
        self.lost.discard(bookie)

    def next_due(self) -> float | None:
        """When the earliest pending audit is due (None: nothing pending)."""
        if not self.pending:
            return None
        return min(self.pending.values()) + self.delay_s

    @property
    def lost_count(self) -> int:
        return len(self.pending) + len(self.lost)


class Auditor:
    """The auditor candidate of one process: campaigns, and while leader runs the core."""

    def __init__(self, store: MetadataStore, registry: UnderReplicationRegistry, lease: int, candidate_id: str, *,
                 default_delay_s: float = 0.0, check_interval_s: float = 604_800.0, verification_percent: float = 0.0,
                 clock: Clock = SYSTEM_CLOCK, on_crash: Callable[[], None] | None = None,
                 client_config: ClientConfig | None = None) -> None:
        self.store = store
        self.registry = registry
        self.ledgers = LedgerStore(store)
        self.candidate_id = candidate_id
        self.default_delay_s = default_delay_s
        self.clock = clock
        self.check_interval_s = check_interval_s
        self.verification_percent = verification_percent
        self._on_crash = on_crash
        self.client_config = client_config or ClientConfig().validate()
        self.election = LeaderElection(store, candidate_id, lease, on_lost=self._on_lost)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="zbk-auditor", daemon=True)
        self._triggered = threading.Event()
        self._check_thread: threading.Thread | None = None
        self._check_halt = threading.Event()  # set to end the running periodic check (stop, switch off)
        rm.AUDITOR_IS_LEADER.set(0)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop campaigning and resign leadership (another candidate takes over at once)."""
        self._stop.set()
        self._check_halt.set()
        self._wake.set()
        self._thread.join(limits.auditor_stop_timeout_s)
        if self._check_thread is not None:
            self._check_thread.join(limits.auditor_stop_timeout_s)  # the check sees the stop event between ledgers
        self.election.close()
        rm.AUDITOR_IS_LEADER.set(0)

    def is_leader(self) -> bool:
        return self.election.is_leader()

    def _on_lost(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        try:
            self._campaign_loop()
        except BaseException:
            # A bug, not an expected failure: stop the process rather than run on without
            # an auditor candidate (crash, don't limp).
            log.exception("auditor crashed")
            if self._on_crash is not None:
                self._on_crash()

    def _campaign_loop(self) -> None:
        backoff = Backoff(limits.auditor_error_backoff_s_min, limits.auditor_error_backoff_s_max, clock=self.clock)
        while not self._stop.is_set():
            try:
                if not self.election.campaign(timeout_s=limits.auditor_campaign_timeout_s):
                    continue
                if self._stop.is_set():
                    break
                backoff.reset()  # elected: the metadata store answers again
                rm.AUDITOR_IS_LEADER.set(1)
                self._lead()
            except ZbkError as e:
                delay = backoff.fail()
                log.warning("auditor: %s; retrying in %.1f s", e, delay)
                self.election.resign()
                self._stop.wait(delay)
            finally:
                rm.AUDITOR_IS_LEADER.set(0)

    def _lead(self) -> None:
        """Audit while we lead: one pass per wake-up (a watch event, a due audit, or the poll)."""
        watches: list[Watch] = []
        try:
            watches.append(watch_bookies(self.store, lambda _ev: self._wake.set()))
            watches.append(self.store.watch(layout.LOST_BOOKIE_RECOVERY_DELAY, self._on_delay_event))
            watches.append(self.store.watch(layout.AUDITOR_TRIGGER, self._on_trigger,
                                            start_revision=self.store.revision() + 1))
            watches.append(self.store.watch(layout.AUTORECOVERY_DISABLED, self._on_switch_event))
            core = AuditorCore(get_recovery_delay(self.store, self.default_delay_s))
            next_check = self.clock.monotonic()
            next_fragment_check = self.clock.monotonic() + self._until_fragment_check_due()
            while not self._stop.is_set() and self.election.is_leader():
                self._wake.clear()  # before reading: a change from now on wakes the next pass
                now = self.clock.monotonic()
                enabled = self._enabled()
                if now >= next_check:
                    self._check_all(core)
                    next_check = self.clock.monotonic() + self.check_interval_s
                if enabled and (self._triggered.is_set() or now >= next_fragment_check):
                    if self._start_fragment_check():
                        self._triggered.clear()
                        next_fragment_check = now + self.check_interval_s
                self._pass(core, enabled=enabled)
                # Switched off, due audits wait for the switch (its watch wakes us), not for time.
                nxt = core.next_due() if enabled else None
                wait = limits.auditor_leader_poll_interval_s if nxt is None else nxt - self.clock.monotonic()
                self._wake.wait(max(0.0, min(limits.auditor_leader_poll_interval_s, wait)))
        finally:
            for w in watches:
                w.cancel()
        log.info("auditor %s: no longer leading", self.candidate_id)

    def _check_all(self, core: AuditorCore) -> None:
        """The periodic check (and a new leader's first): every bookie that ledgers name
        but nobody has registered counts as gone, even if no watch event ever said so.
        (Read probes of fragments on living bookies are not part of it yet.)"""
        core.observe(self._available(), self.clock.monotonic(), referenced=self._referenced())

    def _enabled(self) -> bool:
        enabled = is_enabled(self.store)
        rm.AUTORECOVERY_ENABLED.set(1 if enabled else 0)
        return enabled

    def _on_switch_event(self, ev: WatchEvent) -> None:
        if ev.key != layout.AUTORECOVERY_DISABLED:
            return
        if ev.kind == "put":  # switched off: a periodic check under way stops before its next ledger
            self._check_halt.set()
        self._wake.set()

    def _on_trigger(self, ev: WatchEvent) -> None:
        if ev.key == layout.AUDITOR_TRIGGER and ev.kind == "put":
            self._triggered.set()
            self._wake.set()

    def _until_fragment_check_due(self) -> float:
        kv = self.store.get(layout.AUDITOR_LAST_CHECK)
        try:
            last_s = int(kv.value.decode("ascii")) / 1000 if kv is not None else 0.0
        except (UnicodeDecodeError, ValueError):
            last_s = 0.0
        return max(0.0, last_s + self.check_interval_s - time.time())

    def _start_fragment_check(self) -> bool:
        """Start the periodic check of all ledgers in the background; False if one runs."""
        if self._check_thread is not None and self._check_thread.is_alive():
            return False
        self._check_halt = threading.Event()
        if self._stop.is_set():
            self._check_halt.set()
        self._check_thread = threading.Thread(target=self._run_fragment_check, name="zbk-auditor-check",
                                              daemon=True)
        self._check_thread.start()
        return True

    def _run_fragment_check(self) -> None:
        started = str(int(time.time() * 1000)).encode("ascii")
        halt = self._check_halt
        try:
            eventloop.run(self._fragment_check(halt))
            if halt.is_set() and not self._stop.is_set():
                # Cut short by the switch: not a finished check. Run it again once it is on.
                log.info("auditor: periodic check stopped: auto-recovery is switched off")
                self._triggered.set()
                return
            # The start too: a bookie's cookie fix counts as audited only by a check that
            # began after it (zbk/bookie/overrepsource.py).
            self.store.put(layout.AUDITOR_LAST_CHECK_STARTED, started)
            self.store.put(layout.AUDITOR_LAST_CHECK, str(int(time.time() * 1000)).encode("ascii"))
        except ZbkError as e:
            log.warning("auditor: periodic check failed: %s", e)
        except BaseException:
            log.exception("auditor: periodic check crashed")
            if self._on_crash is not None:
                self._on_crash()

    async def _fragment_check(self, halt: threading.Event) -> None:
        from zbk.client.bookkeeper import ClientContext
        from zbk.recovery.checker import LedgerChecker

        ctx = ClientContext.over_zmq(self.store, self.client_config)
        try:
            await LedgerChecker(ctx, self.registry, stop=halt,
                                verification_percent=self.verification_percent).check_all()
        finally:
            await ctx.transport.close()

    def _on_delay_event(self, ev: WatchEvent) -> None:
        if ev.key == layout.LOST_BOOKIE_RECOVERY_DELAY:
            self._wake.set()

    def _pass(self, core: AuditorCore, *, enabled: bool = True) -> None:
        core.set_delay(get_recovery_delay(self.store, self.default_delay_s))
        core.observe(self._available(), self.clock.monotonic())
        for bookie in core.due(self.clock.monotonic()) if enabled else []:
            try:
                if self._audit(bookie) == 0:
                    core.forget(bookie)
            except MetadataError:
                core.retry(bookie, self.clock.monotonic())
                raise
        rm.AUDITOR_LOST_BOOKIES.set(core.lost_count)
        rm.AUDITOR_UNDER_REPLICATED_LEDGERS.set(self.registry.count())
        rm.AUDITOR_REPAIR_MARKS.set(self.registry.count_repairs())

    def _available(self) -> set[str]:
        return {r.bookie_id for r in list_bookies(self.store)} | \
               {r.bookie_id for r in list_bookies(self.store, readonly=True)}

    def _referenced(self) -> set[str]:
        """Every bookie some ledger's fragments name (a full metadata scan)."""
        out: set[str] = set()
        for lid in self.ledgers.list_ids():
            try:
                md, _ = self.ledgers.read(lid)
            except (NoSuchLedgerError, CorruptMetadataError):
                continue  # deleted meanwhile; corrupt metadata is reported by its readers
            out |= md.all_bookies()
        return out

    def _audit(self, bookie: str) -> int:
        """Mark every ledger with a fragment on ``bookie``; returns how many."""
        marked = 0
        for lid in self.ledgers.list_ids():
            try:
                md, _ = self.ledgers.read(lid)
            except (NoSuchLedgerError, CorruptMetadataError):
                continue
            if bookie in md.all_bookies():
                try:
                    self.registry.mark(lid, [bookie])
                    marked += 1
                except MetadataError as e:
                    log.warning("auditor: could not mark ledger %d (lost %s), audit retried: %s", lid, bookie, e)
                    raise
        log.info("auditor: bookie %s lost: %d ledger(s) marked under-replicated", bookie, marked)
        return marked
