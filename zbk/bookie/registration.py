"""A bookie's registration in metadata: lease-bound, published again when the lease is
lost or the bookie's state (writable / read-only) changes.
"""

from __future__ import annotations

import logging
import threading

from zbk import limits
from zbk.backoff import Backoff
from zbk.bookie.boot import BookieBoot
from zbk.errors import KeyExistsError, LeaseExpiredError
from zbk.metadata.coordination import LeaseKeeper
from zbk.metadata.registry import BookieRegistration, register_bookie

log = logging.getLogger(__name__)


class BookieRegistrar(BookieBoot):
    # The Server's read-only state as it last reported it (on_state_change, on its thread):
    # what the registration publishes. No other thread reads the Server's own state.
    server_read_only = False

    def _register(self, *, read_only: bool) -> None:
        """Publish the registration (lease-bound). After a kill -9 the previous process's
        registration lives until its lease expires: wait for it, up to two TTLs."""
        reg = BookieRegistration(bookie_id=self.cfg.bookie_id, rack=self.cfg.rack, zone=self.cfg.zone,
                                 isolation_group=self.cfg.isolation_group, address=self.cfg.wire_address,
                                 http_url=f"http://{self.cfg.http.bind_address}:{self.http.port if self.http else 0}",
                                 state="readonly" if read_only else "writable")
        self._registration = reg
        with self._reg_lock:
            deadline = self.clock.monotonic() + 2 * self.cfg.registration_ttl_s + limits.registration_wait_slack_s
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
                    self.clock.sleep(limits.registration_held_poll_s)
                except LeaseExpiredError as e:
                    # Our own new lease expired before it was used (a loaded metadata store
                    # answered a keep-alive too late, e.g. while we waited above): take another.
                    if self.clock.monotonic() > deadline or self.stop_event.is_set():
                        raise
                    log.warning("registration lease expired before use (%s): taking a new one", e)
                    self.lease.stop(revoke=False)
                    self.lease = None

    def _lease_id(self) -> int | None:
        """The registration's lease while it is alive (read from the GC's thread: the
        attribute is replaced whole, never mutated)."""
        keeper = self.lease
        return None if keeper is None or keeper.lost else keeper.lease

    def _on_lease_lost(self) -> None:
        """The registration lease was lost (metadata outage): register again on a new lease."""
        if self.stop_event.is_set():
            return
        log.warning("registration lease lost: registering again")

        def again() -> None:
            backoff = Backoff(limits.reregistration_backoff_s_min, limits.reregistration_backoff_s_max,
                              clock=self.clock)
            while not self.stop_event.is_set():
                try:
                    self._register(read_only=self.server_read_only)
                    return
                except Exception as e:  # noqa: BLE001 - keep trying while the store is down
                    delay = backoff.fail()
                    log.error("re-registration failed (retrying in %.1fs): %s", delay, e)
                    self.stop_event.wait(delay)

        threading.Thread(target=again, name="zbk-reregister", daemon=True).start()

    def _on_state_change(self, read_only: bool) -> None:
        # Called on the server thread: registration is metadata I/O, so hand it off to one
        # worker (in order), which publishes whatever the state is when it runs.
        self.server_read_only = read_only
        self._registrar.submit(self._publish_state)

    def _publish_state(self) -> None:
        try:
            self._register(read_only=self.server_read_only)
        except Exception as e:  # noqa: BLE001 - the lease-lost path retries
            log.error("could not publish bookie state: %s", e)
