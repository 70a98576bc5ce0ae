"""A bookie process: boot sequence, actor wiring, registration, HTTP, shutdown.

The HTTP server starts first (zbk/bookie/admin.py), so that is_ready answers 503 during the
boot. Boot (zbk/bookie/boot.py: cookies, dirty marker, journal replay, phase one) runs before
any wire request is served; then:
5. Start the actors, bind the port, register as writable (lease-bound) and serve.
6. Phase two (limbo repair) is replicator work: at every boot the bookie writes a repair
   mark for each ledger still in limbo here; see zbk/recovery/repair.py.

Exit codes (zbk/errors.py): EXIT_OK clean stop; EXIT_COOKIE cookie mismatch; EXIT_BOOT any
other boot failure (corrupt journal, unreachable metadata...); EXIT_ACTOR_BASE + n when actor
n of ACTORS crashed (any of the journals: the journal's code); EXIT_FAILED when the
auto-recovery it runs (``autorecovery.enabled``) crashed.

One JournalWriter actor runs per journal directory (zbk/actors/journals.py names them); the
Server, the EntryLogger and the IndexSyncer each have a pipe to every one of them.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
import uuid
from typing import Any

import zmq

from zbk import limits
from zbk.actors.base import ActorLoop, Outbox, SocketOutbox, drop_handoff, pipe_address
from zbk.actors.entrylogger import EntryLoggerCore
from zbk.actors.gc import GcCore, GcSettings
from zbk.actors.indexsyncer import IndexCore
from zbk.actors.journal import JournalCore
from zbk.actors.journals import journal_names, journal_of_actor
from zbk.actors.loops import EntryLoggerLoop, JournalLoop, ReplySocket, ServerLoop, disk_probe_for
from zbk.actors.messages import HeaderUpdate, IndexPut
from zbk.actors.overrep import OverrepTracker
from zbk.actors.server import ServerCore
from zbk.bookie.admin import BookieAdmin
from zbk.bookie.boot import BootReport
from zbk.bookie.overrepsource import BookieOverrepSource
from zbk.config import BookieConfig
from zbk.errors import (
    EXIT_ACTOR_BASE,
    EXIT_BOOT,
    EXIT_COOKIE,
    EXIT_FAILED,
    EXIT_OK,
    CookieMismatchError,
)
from zbk.metadata.registry import LedgerStore
from zbk.storage import markers
from zbk.storage.gcstate import GcStateFile
from zbk.wire.curve import CurveServer

__all__ = ["ACTORS", "Bookie", "BootReport", "run_bookie"]

log = logging.getLogger(__name__)

ACTORS = ("server", "journal", "entrylogger", "index", "gc")


class Bookie(BookieAdmin):
    """A bookie process: boot (BookieBoot), the actors, registration, HTTP, shutdown."""

    # -- run ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self.boot_report is None:
            self.boot()
        cfg = self.cfg
        self.ctx = zmq.Context()
        instance = self.instance = uuid.uuid4().hex[:8]

        def outbox(sender: str, peers: list[str]) -> SocketOutbox:
            """``sender``'s pipes to the actors it sends to (connected by its loop)."""
            return SocketOutbox(instance, sender, peers)

        replies = ReplySocket()
        n = len(self.journals)
        jnames = journal_names(n)
        self.server = ServerCore(ledgers=self._ledger_states(), journal_write_data=cfg.journal.write_data,
                                 max_frame_bytes=cfg.max_frame_bytes, reply=replies.reply,
                                 outbox=outbox("server", ["entrylogger", *jnames, "index"]),
                                 read_only_mode_enabled=cfg.disk.read_only_mode_enabled,
                                 on_state_change=self._on_state_change, journals=n)
        self._restore_read_only(self.server)
        journals = [JournalCore(writer, outbox=outbox(name, ["server", "entrylogger"]),
                                sync_data=cfg.journal.sync_data,
                                group_bytes_max=cfg.journal.buffered_writes_threshold_bytes,
                                group_wait_s=cfg.journal.group_wait_s, index=i, journals=n)
                    for i, (name, writer) in enumerate(zip(jnames, self.journals, strict=True))]
        entrylogger = EntryLoggerCore(self.logs, outbox=outbox("entrylogger", ["server", *jnames, "gc"]), journals=n)
        index = IndexCore(self.cache, outbox=outbox("index", ["entrylogger", *jnames, "server", "gc"]),
                          flush_interval_s=cfg.index.flush_interval_s,
                          persist_marks=lambda marks: markers.write_last_marks(self.index_dir, marks), journals=n)
        common: dict[str, Any] = dict(ctx=self.ctx, instance=instance, clock=self.clock, on_crash=self._on_crash,
                                      stop=self.stop_event, cpus=cfg.actor_cpu_set())
        # senders: who sends to this actor (one PULL each); to whom it sends: its outbox's peers.
        self.index_actor = ActorLoop(core=index, senders=["server", "entrylogger", "gc"], **common)
        self.index_actor.keep_inbound = True  # drained by stop(): see there
        self.loops = [
            *(JournalLoop(core=journal, senders=["server", "entrylogger", "index"], **common) for journal in journals),
            EntryLoggerLoop(core=entrylogger, senders=["server", "index", *jnames, "gc"], **common),
            self.index_actor,
            ActorLoop(core=self._make_gc(outbox("gc", ["server", "entrylogger", "index"])),
                      senders=["entrylogger", "index", "admin"], **common),
        ]
        self.server_loop = ServerLoop(core=self.server, senders=["entrylogger", *jnames, "index", "admin", "gc"],
                                      replies=replies, endpoint=f"tcp://{cfg.bind_address}:{cfg.port}",
                                      curve=CurveServer.from_config(cfg.curve), bookie_id=cfg.bookie_id,
                                      max_frame_bytes=cfg.max_frame_bytes,
                                      disk_probe=disk_probe_for(self._all_dirs()),
                                      disk_check_interval_s=cfg.disk.check_interval_s,
                                      disk_thresholds=(cfg.disk.usage_threshold, cfg.disk.usage_warn_threshold),
                                      **common)
        self.loops.append(self.server_loop)
        for loop in self.loops:  # PULL sockets are bound in the constructors, before any connect
            loop.start()
        for loop in self.loops:
            loop.ready.wait(limits.actor_start_timeout_s)
        for loop in self.loops:
            # An actor the configuration kept from starting (the wire port taken) handled
            # nothing: the bookie stops cleanly, with its error, instead of as a crash.
            if loop.start_error is not None:
                raise loop.start_error
        if self.crashed:
            raise RuntimeError(f"actor {self.crashed} failed to start")
        self.admin = self.ctx.socket(zmq.PUSH)
        self.admin.connect(f"inproc://zbk-{instance}-admin-to-server")
        self.admin_lock = threading.Lock()  # HTTP handlers run on many threads; a socket is not thread-safe
        self.admin_gc = self.ctx.socket(zmq.PUSH)  # POST /api/v1/bookie/gc -> GarbageCollector
        self.admin_gc.connect(pipe_address(instance, "admin", "gc"))
        self._serve_admin()
        self._register(read_only=self.server_read_only)
        self.ready = True  # replayed and registered: GET /api/v1/bookie/is_ready answers 200
        if cfg.autorecovery.enabled:
            self._start_autorecovery()
        log.info("bookie %s serving on %s, registered at %s (http %s)", cfg.bookie_id, self.server_loop.bound,
                 cfg.wire_address, self.http.port if self.http else "-")

    def _start_autorecovery(self) -> None:
        """``autorecovery.enabled``: run an auditor candidate and replicator workers in this
        process, exactly as `zbk autorecovery` would, with their routes on this bookie's
        HTTP server. A lost autorecovery lease starts them again on a new one; a crash of
        theirs stops the bookie (zbk/recovery/embedded.py)."""
        from zbk.recovery.embedded import EmbeddedAutoRecovery

        assert self.http is not None
        arcfg = self.cfg.autorecovery_config(self.http.port)
        self.autorecovery = EmbeddedAutoRecovery(arcfg, http=self.http, on_crash=self._autorecovery_crashed)
        self.autorecovery.start()

    def _autorecovery_crashed(self) -> None:
        self.exit_code = EXIT_FAILED
        self.stop_event.set()

    def _make_gc(self, outbox: Outbox) -> GcCore:
        """The GarbageCollector. Its metadata listing blocks only its own thread; compaction
        (which writes copies before it frees anything) waits while the ledger disks are full."""
        cfg = self.cfg
        ledgers = LedgerStore(self.store)
        probe = disk_probe_for(list(cfg.ledger_dirs))

        def compaction_allowed() -> bool:
            used, total = probe()
            return not total or used / total < cfg.disk.usage_threshold

        # Logs below the first one this process writes may hold copies of a compaction that a
        # crash cut short (zbk/actors/gc.py, "suspects").
        overrep = OverrepTracker(cfg.gc.overreplicated_ledger_wait_time_ms / 1000.0,
                                 BookieOverrepSource(self.store, cfg.bookie_id, lease=self._lease_id))
        return GcCore(GcSettings.from_config(cfg.gc), outbox=outbox, list_ledger_ids=lambda: set(ledgers.list_ids()),
                      ledger_exists=ledgers.exists, state=GcStateFile(cfg.ledger_dirs[0]),
                      suspect_below=self.logs.least_unflushed_log_id(), compaction_allowed=compaction_allowed,
                      overrep=overrep)

    def _on_crash(self, name: str, exc: BaseException) -> None:
        if self.crashed is None:
            self.crashed = name
            kind = "journal" if journal_of_actor(name) is not None else name
            self.exit_code = EXIT_ACTOR_BASE + ACTORS.index(kind) if kind in ACTORS else EXIT_ACTOR_BASE + 9
        self.stop_event.set()

    def wait(self) -> int:
        """Block until stopped (signal or actor crash); returns the exit code."""
        while not self.stop_event.wait(limits.process_stop_poll_s):
            pass
        return self.exit_code

    def stop(self) -> None:
        """Clean shutdown: unregister, stop actors, final checkpoint, clear the dirty marker.

        Its steps are logged with their times: a stop that outlives a supervisor's grace
        period (and ends in SIGKILL, leaving the dirty marker set) says in the log where it was."""
        started = time.monotonic()
        log.info("bookie %s stopping", self.cfg.bookie_id)
        self.stop_event.set()
        if self.autorecovery is not None:
            self.autorecovery.stop()  # resign and release locks before the bookie goes away
        self._registrar.shutdown(wait=True)
        if self.lease is not None:
            self.lease.stop()  # revokes the lease: the registration vanishes at once
        for loop in self.loops:
            loop.join(limits.actor_stop_timeout_s)
        self._stop_http()
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
                log.error("actor %s did not stop within %.0f s; it is at:\n%s", loop.core.name, limits.actor_stop_timeout_s,
                          where.rstrip())
            log.error("an actor did not stop: dirty marker left set")
            return
        log.info("stop: unregistered and actors stopped in %.1f s; final checkpoint", time.monotonic() - started)
        for journal in self.journals:
            journal.sync(fsync=True)
        self.logs.flush()
        self.cache.flush()
        markers.write_last_marks(self.index_dir, [journal.mark for journal in self.journals])
        self.logs.close()
        for journal in self.journals:
            journal.close()
        markers.clear_dirty(self.index_dir)
        if self.ctx is not None:
            self.ctx.destroy(0)
        self.store.close()
        log.info("bookie %s stopped cleanly in %.1f s", self.cfg.bookie_id, time.monotonic() - started)



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
        return EXIT_OK  # asked to stop before anything was touched
    try:
        bookie = Bookie(cfg, stop_event=stop)
        bookie.boot()
    except CookieMismatchError as e:
        log.error("%s", e)
        return EXIT_COOKIE
    except Exception as e:  # noqa: BLE001 - any boot failure is one clear line and an exit code
        log.error("boot failed: %s: %s", type(e).__name__, e, exc_info=log.isEnabledFor(logging.DEBUG))
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
        os._exit(code)  # a part crashed: do not run more cleanup that could mask it
    return EXIT_OK
