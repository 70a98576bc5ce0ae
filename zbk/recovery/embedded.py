"""Auto-recovery inside a bookie process (``autorecovery.enabled``).

The same auditor candidate and replicator workers as `zbk autorecovery`
(zbk/recovery/process.py), watched by one thread of the bookie:

- A lost lease starts them again on a new lease. The store says a lease is gone only after
  the process went unheard for a whole TTL (a stall: a long pause of the process or the
  host, swapping), and the bookie's registration, bound to a lease of the same TTL, is
  registered again after such a stall (zbk/bookie/registration.py). A bookie that holds
  ledgers stays up for it; its leadership and ledger locks are already gone with the old
  lease, and every metadata change they guard is a compare-and-set, so the new candidate
  starts from the metadata as it is.
- A crash (an exception no part expected) stops the bookie, with exit code 1: a bug is not
  worked around by running on without an auditor candidate.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zbk import limits
from zbk.backoff import Backoff
from zbk.errors import ZbkError
from zbk.recovery.process import AutoRecovery

if TYPE_CHECKING:
    from zbk.config import AutoRecoveryConfig

log = logging.getLogger(__name__)


class EmbeddedAutoRecovery:
    """One :class:`AutoRecovery` at a time, started again when its lease is lost."""

    def __init__(self, cfg: AutoRecoveryConfig, *, http: Any, on_crash: Callable[[], None]) -> None:
        """``http``: the bookie's AdminHttpServer (its cluster routes are installed already);
        ``on_crash``: stops the bookie."""
        self.cfg = cfg
        self.http = http
        self._on_crash = on_crash
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # guards `current` against a restart racing stop()
        self.current: AutoRecovery | None = None
        self.restarts = 0  # times a lost lease started it again
        self._thread = threading.Thread(target=self._watch, name="zbk-autorecovery-watch", daemon=True)

    def start(self) -> None:
        """Grant the lease and start the parts (errors reach the caller), then watch them."""
        self.current = self._new()
        self._thread.start()

    def _new(self) -> AutoRecovery:
        ar = AutoRecovery(self.cfg, stop_event=threading.Event(), http=self.http)
        try:
            ar.start()
        except BaseException:
            ar.stop()
            raise
        return ar

    def _watch(self) -> None:
        try:
            self._watch_loop()
        except BaseException:
            # A bug here would leave the bookie running without its auto-recovery, unseen.
            log.exception("autorecovery watch crashed: stopping the bookie")
            self._on_crash()

    def _watch_loop(self) -> None:
        while not self._stopping.is_set():
            ar = self.current
            if ar is None or not ar.stop_event.wait(limits.process_stop_poll_s) or self._stopping.is_set():
                continue
            if not ar.lease.lost:
                log.error("autorecovery %s crashed: stopping the bookie", ar.candidate_id)
                self._on_crash()
                return
            log.warning("autorecovery %s: lease lost (the process went unheard for its %d s TTL); "
                        "starting again on a new lease", ar.candidate_id, self.cfg.lease_ttl_s)
            with self._lock:
                self.current = None
            ar.stop()
            self._restart()

    def _restart(self) -> None:
        backoff = Backoff(limits.auditor_error_backoff_s_min, limits.auditor_error_backoff_s_max, jitter=0.5)
        while not self._stopping.is_set():
            try:
                ar = self._new()
            except ZbkError as e:  # the store does not answer yet
                delay = backoff.fail()
                log.warning("autorecovery: cannot start again: %s; retrying in %.1f s", e, delay)
                self._stopping.wait(delay)
                continue
            with self._lock:
                late = self._stopping.is_set()  # stop() came meanwhile: it does not see this one
                if not late:
                    self.current = ar
                    self.restarts += 1
            if late:
                ar.stop()
            else:
                log.info("autorecovery %s: running again", ar.candidate_id)
            return

    def stop(self) -> None:
        """Resign leadership and release locks (before the bookie goes away)."""
        with self._lock:
            self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        with self._lock:
            ar, self.current = self.current, None
        if ar is not None:
            ar.stop()
