"""The decisions of the Server's loop, apart from its sockets (zbk/actors/loops.py).

Two policies, each a plain class: the loop passes ``now`` in and does what they decide,
so they are tested without sockets and without a clock (tests/actors/test_serverpolicy.py).

* :class:`PeerBacklogs`: which replies wait for a peer whose outbound pipe is full, which
  are dropped, and which peers are stalled and until when. Replies wait in a per-peer
  backlog bounded in bytes (``server_peer_backlog_bytes_max``, and
  ``server_backlog_bytes_max`` for all peers), flushed as the pipe drains: a burst of
  replies (a group commit acknowledging a thousand adds) is delivered, not lost. A reply
  that does not fit is dropped and the peer *stalled* for ``server_peer_stall_s``: its
  requests are dropped unread. So a client that stops reading costs at most one pipe and
  one backlog of replies, and no further disk reads.
* :class:`DiskProbeSchedule`: when the disk checker runs: every ``disk_check_interval``,
  and also as soon as the bytes received since the last check could have used a quarter of
  the space left below the read-only threshold, so a burst of adds cannot run the disk
  full between two timed checks.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from zbk import limits

# The loop's own logger: these are its decisions, and log configuration stays as it was.
log = logging.getLogger("zbk.actors.loops")

_PROBE_BYTES_MIN = 64 * 1024  # statvfs costs microseconds


class PeerBacklogs:
    """Replies waiting for full peer pipes, and the peers stalled because one did not fit.

    The loop sends a reply straight to the socket unless :meth:`waiting` says the peer has
    replies queued already (they go out in order); a reply the socket could not take goes
    to :meth:`hold`. After each batch the loop sends each waiting peer's :meth:`head` until
    its pipe is full, calling :meth:`sent` for each, or :meth:`drop` when the peer is gone.
    A request is served only if :meth:`admits` it.
    """

    def __init__(self, *, peer_bytes_max: int = limits.server_peer_backlog_bytes_max,
                 total_bytes_max: int = limits.server_backlog_bytes_max,
                 stall_s: float = limits.server_peer_stall_s) -> None:
        self.peer_bytes_max = peer_bytes_max
        self.total_bytes_max = total_bytes_max
        self.stall_s = stall_s
        # Peer identity -> its waiting replies (frames, bytes), oldest first. Never empty:
        # a peer without waiting replies has no entry (the loop tests membership per reply).
        self.queues: dict[bytes, deque[tuple[list[Any], int]]] = {}
        self.peer_bytes: dict[bytes, int] = {}
        self.total_bytes = 0
        self.stalled: dict[bytes, float] = {}  # peer identity -> until when its requests are dropped

    def waiting(self, ident: bytes) -> bool:
        """Whether ``ident`` has replies queued (a new one then goes behind them)."""
        return ident in self.queues

    def hold(self, ident: bytes, frames: list[Any], now: float) -> bool:
        """Queue a reply the peer's pipe could not take. False when it does not fit: the
        client stopped reading, so the reply is dropped rather than the backlog grown, and
        the peer is stalled until ``now + stall_s`` (it times out and retries, or
        reconnects)."""
        size = sum(map(len, frames))
        held = self.peer_bytes.get(ident, 0)
        if held + size > self.peer_bytes_max or self.total_bytes + size > self.total_bytes_max:
            if ident not in self.stalled:
                log.warning("server: client %s is not reading its replies (%d bytes waiting); its requests "
                            "are dropped for %.1f s", ident.hex(), held, self.stall_s)
            self.stalled[ident] = now + self.stall_s
            return False
        self.queues.setdefault(ident, deque()).append((frames, size))
        self.peer_bytes[ident] = held + size
        self.total_bytes += size
        return True

    def peers(self) -> list[bytes]:
        """The peers with replies waiting (a copy: :meth:`sent` and :meth:`drop` change them)."""
        return list(self.queues)

    def head(self, ident: bytes) -> list[Any] | None:
        """The oldest reply waiting for ``ident``, or None."""
        queue = self.queues.get(ident)
        return queue[0][0] if queue else None

    def sent(self, ident: bytes) -> None:
        """The head of ``ident``'s backlog went to the socket."""
        queue = self.queues[ident]
        self._forget(ident, queue.popleft()[1])
        if not queue:
            del self.queues[ident]
            del self.peer_bytes[ident]

    def drop(self, ident: bytes) -> int:
        """``ident`` disconnected: forget its waiting replies. Returns how many."""
        queue = self.queues.pop(ident, None)
        if queue is None:
            return 0
        self.total_bytes -= self.peer_bytes.pop(ident)
        return len(queue)

    def _forget(self, ident: bytes, size: int) -> None:
        self.peer_bytes[ident] -= size
        self.total_bytes -= size

    def admits(self, ident: bytes, now: float) -> bool:
        """Whether a request from ``ident`` is served: not while the peer is stalled."""
        until = self.stalled.get(ident)
        if until is None:
            return True
        if now < until:
            return False
        del self.stalled[ident]
        return True

    def expire(self, now: float) -> None:
        """End the stalls that are over."""
        for ident in [i for i, until in self.stalled.items() if until <= now]:
            del self.stalled[ident]

    def poll_timeout_ms(self) -> float:
        """How long the loop may wait for input: not long while replies wait for a pipe."""
        return 2.0 if self.queues else 50.0  # replies waiting: look at the pipes again soon


class DiskProbeSchedule:
    """When the Server's loop reads the disk usage (see the module docstring).

    The loop counts the request bytes it receives (:meth:`received`), asks :meth:`due`
    after each batch and, when it probed, reports the reading (:meth:`probed`).
    """

    def __init__(self, *, interval_s: float, threshold: float, bytes_min: int = _PROBE_BYTES_MIN) -> None:
        self.interval_s = interval_s
        self.threshold = threshold
        self.bytes_min = bytes_min
        self.next_at = 0.0  # the first check comes at once
        self.bytes_since = 0  # received since the last probe
        self.after_bytes = bytes_min  # probe again once this many bytes have arrived

    def received(self, nbytes: int) -> None:
        self.bytes_since += nbytes

    def due(self, now: float) -> bool:
        return now >= self.next_at or self.bytes_since >= self.after_bytes

    def probed(self, now: float, used: int, total: int) -> None:
        """A probe read ``used`` of ``total`` bytes at ``now``. An add is written twice
        (journal and entry log): probe again after a quarter of the headroom below the
        threshold has arrived, or at the next interval."""
        self.next_at = now + self.interval_s
        self.bytes_since = 0
        headroom = int(self.threshold * total) - used
        self.after_bytes = max(self.bytes_min, headroom // 4)
