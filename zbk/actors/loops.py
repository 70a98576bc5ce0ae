"""Loops with behaviour beyond the plain ActorLoop: the Server's ROUTER socket and the
journal's group commit.

The ROUTER is where the network meets the bookie, so this is where slow and hostile peers
are contained (docs/reliability.md, "Resources"):

* Every peer has its own inbound and outbound pipe, each bounded in messages
  (``server_peer_recv_hwm_messages`` / ``server_peer_send_hwm_messages``). A full inbound
  pipe makes libzmq stop reading that peer's TCP socket (backpressure).
* ROUTER_MANDATORY makes a full outbound pipe visible. Replies then wait in a per-peer
  backlog bounded in *bytes* (``server_peer_backlog_bytes_max``, and
  ``server_backlog_bytes_max`` for all peers), flushed as the pipe drains: a burst of
  replies (a group commit acknowledging a thousand adds) is delivered, not lost. A reply
  that does not fit is dropped (counted) and the peer is *stalled* for
  ``server_peer_stall_s``: its requests are dropped unread. So a client that stops reading
  costs at most one pipe and one backlog of replies, and no further disk reads.
* Frames over max_frame_bytes never reach Python (ZMQ_MAXMSGSIZE drops the peer).
* With CURVE configured (zbk/wire/curve.py), only clients whose public key is authorized
  complete the handshake; nothing from anyone else reaches the Server.
* The disk checker runs every ``disk_check_interval`` and also as soon as the bytes received
  since the last check could have used a quarter of the space left below the read-only
  threshold, so a burst of adds cannot run the disk full between two timed checks.
"""

from __future__ import annotations

import errno
import logging
import os
from collections import deque
from collections.abc import Callable
from typing import Any

import zmq
from prometheus_client import Counter

from zbk import limits
from zbk.actors.base import ActorLoop
from zbk.actors.journal import JournalCore
from zbk.actors.server import ServerCore
from zbk.wire.curve import CurveServer

log = logging.getLogger(__name__)

class _PeerGone(Exception):
    """The ROUTER no longer knows the peer (it disconnected)."""


_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK_MORE = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
REPLIES_DROPPED = Counter("zbk_bookie_replies_dropped_total",
                          "Replies and requests dropped at the socket, by reason", ["reason"])


class ServerLoop(ActorLoop):
    """Owns the ROUTER socket on tcp; requests go to ServerCore.on_request."""

    core: ServerCore

    def __init__(self, *, endpoint: str, max_frame_bytes: int,
                 disk_probe: Callable[[], tuple[int, int]] | None = None,
                 disk_check_interval_s: float = 10.0, disk_thresholds: tuple[float, float] = (0.95, 0.90),
                 curve: CurveServer | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.endpoint = endpoint
        self.max_frame_bytes = max_frame_bytes
        self.disk_probe = disk_probe
        self.disk_check_interval_s = disk_check_interval_s
        self.disk_thresholds = disk_thresholds
        self.curve = curve
        self.next_disk_check = 0.0
        self.bytes_since_probe = 0
        self.probe_after_bytes = limits.disk_probe_bytes_min
        self.stalled: dict[bytes, float] = {}  # peer identity -> until when its requests are dropped
        self.backlogs: dict[bytes, deque[tuple[list[Any], int]]] = {}  # replies waiting for a full pipe
        self.backlog_bytes: dict[bytes, int] = {}
        self.backlog_total = 0
        self.router: zmq.Socket[Any] | None = None
        self.bound = ""

    def setup(self) -> None:
        r = self.ctx.socket(zmq.ROUTER)
        r.setsockopt(zmq.LINGER, 0)
        r.setsockopt(zmq.RCVHWM, limits.server_peer_recv_hwm_messages)
        r.setsockopt(zmq.SNDHWM, limits.server_peer_send_hwm_messages)
        r.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a full or vanished peer raises, instead of a silent drop
        # Frames over max_frame_bytes are dropped by libzmq itself (and the peer disconnected):
        # an oversized message never reaches Python memory.
        r.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes + limits.header_bytes_max)
        if self.curve is not None:
            self.curve.apply(r)  # CURVE server + ZAP handler: unknown clients never get through
        r.bind(self.endpoint)
        self.bound = r.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.router = r
        self.extra.append(r)
        self.core.reply = self._reply

    def _reply(self, ident: bytes, frames: list[Any]) -> None:
        if ident not in self.backlogs:  # otherwise behind the replies already waiting (FIFO)
            try:
                if self._send(ident, frames):
                    return
            except _PeerGone:
                return
        size = sum(map(len, frames))
        held = self.backlog_bytes.get(ident, 0)
        if (held + size > limits.server_peer_backlog_bytes_max
                or self.backlog_total + size > limits.server_backlog_bytes_max):
            # The client stopped reading: drop the reply rather than grow, and stop serving
            # it for a while. It times out and retries (or reconnects).
            if ident not in self.stalled:
                log.warning("server: client %s is not reading its replies (%d bytes waiting); its requests "
                            "are dropped for %.1f s", ident.hex(), held, limits.server_peer_stall_s)
            self.stalled[ident] = self.clock.monotonic() + limits.server_peer_stall_s
            REPLIES_DROPPED.labels("peer_full").inc()
            return
        self.backlogs.setdefault(ident, deque()).append((frames, size))
        self.backlog_bytes[ident] = held + size
        self.backlog_total += size

    def _send(self, ident: bytes, frames: list[Any]) -> bool:
        """True when handed to libzmq, False when the peer's pipe is full; _PeerGone if the
        peer disconnected (its reply is dropped and counted)."""
        assert self.router is not None
        # send_multipart, unrolled with int flags: it ors zmq.SNDMORE into the flags per frame
        # in Python's enum code (~2 us a frame), and a range read answers one frame per entry.
        # Only the first part can raise Again: a ROUTER takes a message whole or not at all.
        send = self.router.send
        try:
            send(ident, _NOBLOCK_MORE)
            for frame in frames[:-1]:
                send(frame, _NOBLOCK_MORE)
            send(frames[-1], _NOBLOCK)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            if e.errno != errno.EHOSTUNREACH:
                raise
            REPLIES_DROPPED.labels("peer_gone").inc()  # disconnected before its answer was ready
            raise _PeerGone() from None

    def _flush_backlogs(self) -> None:
        for ident in list(self.backlogs):
            queue = self.backlogs[ident]
            try:
                while queue and self._send(ident, queue[0][0]):
                    self._forget(ident, queue.popleft()[1])
            except _PeerGone:
                while queue:
                    self._forget(ident, queue.popleft()[1])
            if not queue:
                del self.backlogs[ident]
                del self.backlog_bytes[ident]

    def _forget(self, ident: bytes, size: int) -> None:
        self.backlog_bytes[ident] -= size
        self.backlog_total -= size

    def on_extra(self, sock: zmq.Socket[Any], now: float) -> None:
        recv = sock.recv
        for _ in range(1024):
            # recv_multipart, unrolled: Frame.more and Frame.bytes cost about half of what
            # recv(copy=True) + getsockopt(RCVMORE) per frame do, and an add carries one
            # frame per entry. The parts of a message arrive together (ZeroMQ delivers a
            # multipart message atomically), so only the first recv can find nothing.
            try:
                frame = recv(_NOBLOCK, False)
            except zmq.Again:
                return
            frames = [frame.bytes]
            while frame.more:
                frame = recv(_NOBLOCK, False)
                frames.append(frame.bytes)
            if len(frames) < 2:
                continue
            ident = frames[0]
            if self.stalled and ident in self.stalled:
                if now < self.stalled[ident]:
                    REPLIES_DROPPED.labels("peer_stalled").inc()
                    continue
                del self.stalled[ident]
            self.bytes_since_probe += sum(map(len, frames))
            self.core.on_request(ident, frames[1:], now)
            if not int(sock.get(_EVENTS)) & _POLLIN:  # cheaper than ending on a zmq.Again
                return

    def after_batch(self, now: float) -> None:
        if self.backlogs:
            self._flush_backlogs()
        if self.stalled:
            for ident in [i for i, until in self.stalled.items() if until <= now]:
                del self.stalled[ident]
        if self.disk_probe is None:
            return
        if now >= self.next_disk_check or self.bytes_since_probe >= self.probe_after_bytes:
            self.next_disk_check = now + self.disk_check_interval_s
            self.bytes_since_probe = 0
            used, total = self.disk_probe()
            threshold, warn = self.disk_thresholds
            self.core.set_disk_usage(used, total, threshold=threshold, warn_threshold=warn)
            # An add is written twice (journal and entry log): probe again after a quarter of
            # the headroom below the threshold has arrived.
            headroom = int(threshold * total) - used
            self.probe_after_bytes = max(limits.disk_probe_bytes_min, headroom // 4)

    def poll_timeout_ms(self) -> float:
        return 2.0 if self.backlogs else 50.0  # replies waiting: look at the pipes again soon

    def teardown(self) -> None:
        # Index updates the Server still holds go to the IndexSyncer's pipe, which stays open
        # until the bookie's stop has applied what is in it (Bookie.stop).
        self.core.send_held_puts()
        if self.curve is not None:
            self.curve.close()


class JournalLoop(ActorLoop):
    """Drains everything ready, then commits once (group commit)."""

    core: JournalCore

    def after_message(self) -> None:
        if self.core.must_commit_now(self.clock.monotonic()):
            self.core.commit()

    def after_batch(self, now: float) -> None:
        self.core.commit()

    def teardown(self) -> None:
        try:
            self.core.commit()
        except OSError as e:  # the process is going down anyway; the dirty marker stays
            log.error("journal: final commit failed: %s", e)


def disk_probe_for(paths: list[str]) -> Callable[[], tuple[int, int]]:
    """(used, total) bytes of the fullest filesystem among ``paths``."""

    def probe() -> tuple[int, int]:
        worst = (0, 1)
        for p in paths:
            st = os.statvfs(p)
            total = st.f_blocks * st.f_frsize
            used = total - st.f_bavail * st.f_frsize
            if total and used / total > worst[0] / worst[1]:
                worst = (used, total)
        return worst

    return probe
