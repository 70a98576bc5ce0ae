"""The writable bookies as a writer's ensemble change sees them: a list kept by a watch of
the registry, so that the change makes one metadata round trip (the ledger's
compare-and-set) instead of listing the registry from the store first.

An ensemble change is what a writer waits on after a bookie failed. Listing the registry
and then writing the ledger's metadata are two round trips in a row, each through a worker
thread that must win the GIL back from a busy event loop; the list alone cost 2-50 ms of a
stall whose target is 100 ms. BookKeeper's client keeps this list from ZooKeeper watches
for the same reason.

A watched list lags the registry by one event delivery (a poll interval of the embedded
store), so it is used only where a stale answer costs nothing but another attempt, and
the store stays the authority:

* it answers only the first attempt of an ensemble change. A bookie the list still shows
  although it is gone fails its first add at once, and the next attempt reads the store;
* a change it cannot place (too few bookies in it, e.g. one registered a moment ago) is
  placed again from the store before it fails;
* ledger creation always reads the store.

The watch starts with the first ledger a client creates (a client that only reads sets up
none). Until it runs, or when it cannot be set up, every caller reads the store.
"""

from __future__ import annotations

import logging
import threading

from zbk.errors import ZbkError
from zbk.metadata.registry import BookieEvent, BookieRegistration, list_bookies, watch_bookies
from zbk.metadata.store import MetadataStore, Watch

log = logging.getLogger(__name__)


class WritableBookies:
    """The registered writable bookies, from a list and then a watch of the registry."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self._regs: dict[str, BookieRegistration] = {}
        self._lock = threading.Lock()
        self._watch: Watch | None = None
        self._closed = False
        self.live = False

    def start(self) -> None:
        """Blocking (run it in a worker thread: the client's start must not wait for a store
        that may be down): the list, then a watch from the revision before it. Events the
        list already shows are applied again, which changes nothing."""
        try:
            rev = self.store.revision()
            regs = list_bookies(self.store)
            with self._lock:
                self._regs = {r.bookie_id: r for r in regs}
            watch = watch_bookies(self.store, self._on_event, start_revision=rev + 1)
        except ZbkError as e:
            log.info("bookie registry watch not set up (ensemble changes read the store): %s", e)
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self._watch, self.live = watch, True
        if closed:  # the client closed meanwhile
            watch.cancel()

    def _on_event(self, ev: BookieEvent) -> None:
        if ev.readonly:
            return  # a bookie turning read-only deletes its writable registration: that event comes too
        with self._lock:
            if ev.registration is None:
                self._regs.pop(ev.bookie_id, None)
            else:
                self._regs[ev.bookie_id] = ev.registration

    def snapshot(self) -> list[BookieRegistration]:
        with self._lock:
            return [self._regs[b] for b in sorted(self._regs)]

    def close(self) -> None:
        with self._lock:
            self._closed, self.live = True, False
            watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()
