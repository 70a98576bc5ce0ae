"""Loops with behaviour beyond the plain ActorLoop: the Server's ROUTER socket, the
journal's group commit, and the EntryLogger's reads served between drains.

The ROUTER is where the network meets the bookie, so this is where slow and hostile peers
are contained (docs/reliability.md, "Resources"):

* Every peer has its own inbound and outbound pipe. The outbound one is bounded in messages
  (``server_peer_send_hwm_messages``). The inbound one is not
  (``server_peer_recv_hwm_messages`` is 0): libzmq reads every peer at once, PINGs included,
  and the Server sheds what it cannot take with ETOOMANYREQUESTS (see zbk/limits.py for why
  libzmq must not stop reading a peer).
* ROUTER_MANDATORY makes a full outbound pipe visible. Replies then wait in a per-peer
  backlog bounded in bytes, and a peer that stops reading is stalled: the decisions are
  :class:`~zbk.actors.serverpolicy.PeerBacklogs`'s, carried out by :class:`ReplySocket`.
* Frames over max_frame_bytes never reach Python (ZMQ_MAXMSGSIZE drops the peer).
* With CURVE configured (zbk/wire/curve.py), only clients whose public key is authorized
  complete the handshake; nothing from anyone else reaches the Server.
* Every connection's handshake announces the bookie's id (zbk/wire/identity.py), so a
  client that reached this bookie at an address it expected another bookie at refuses
  the answers instead of taking them for that bookie's.
* The disk checker runs when :class:`~zbk.actors.serverpolicy.DiskProbeSchedule` says so.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from typing import Any

import zmq
from prometheus_client import Counter

from zbk import limits
from zbk.actors.base import ActorLoop
from zbk.actors.entrylogger import EntryLoggerCore
from zbk.actors.journal import JournalCore
from zbk.actors.server import ServerCore
from zbk.actors.serverpolicy import DiskProbeSchedule, PeerBacklogs
from zbk.errors import ConfigError
from zbk.wire.curve import CurveServer
from zbk.wire.frames import send_frames
from zbk.wire.identity import announce

log = logging.getLogger(__name__)

class _PeerGone(Exception):
    """The ROUTER no longer knows the peer (it disconnected)."""


_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
REPLIES_DROPPED = Counter("zbk_bookie_replies_dropped_total",
                          "Replies and requests dropped at the socket, by reason", ["reason"])


class ReplySocket:
    """The Server's way to its clients: :meth:`reply` is the ``reply`` the ServerCore is
    constructed with. Made before the core; its ROUTER socket is made and bound by the
    ServerLoop, in the loop's thread (:meth:`attach`). Replies a full pipe refuses wait or
    are dropped as ``backlogs`` decides; ``now`` is the loop's latest reading of its clock
    (a reply is sent while the loop feeds the core a message, a request or a tick)."""

    def __init__(self, backlogs: PeerBacklogs | None = None) -> None:
        self.backlogs = backlogs or PeerBacklogs()
        self._queues = self.backlogs.queues  # the same dict: one look-up per reply
        self.router: zmq.Socket[Any] | None = None
        self.now = 0.0

    def attach(self, router: zmq.Socket[Any]) -> None:
        assert self.router is None, "one ROUTER per ReplySocket"
        self.router = router

    def reply(self, ident: bytes, frames: list[Any]) -> None:
        if ident not in self._queues:  # otherwise behind the replies already waiting (FIFO)
            try:
                if self._send(ident, frames):
                    return
            except _PeerGone:
                return
        if not self.backlogs.hold(ident, frames, self.now):
            REPLIES_DROPPED.labels("peer_full").inc()

    def _send(self, ident: bytes, frames: list[Any]) -> bool:
        """True when handed to libzmq, False when the peer's pipe is full; _PeerGone if the
        peer disconnected (its reply is dropped and counted)."""
        assert self.router is not None
        try:
            send_frames(self.router, frames, ident)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            if e.errno != errno.EHOSTUNREACH:
                raise
            REPLIES_DROPPED.labels("peer_gone").inc()  # disconnected before its answer was ready
            raise _PeerGone() from None

    def flush(self) -> None:
        """Send what waits, peer by peer, until each peer's pipe is full."""
        backlogs = self.backlogs
        for ident in backlogs.peers():
            try:
                while (frames := backlogs.head(ident)) is not None and self._send(ident, frames):
                    backlogs.sent(ident)
            except _PeerGone:
                backlogs.drop(ident)


class ServerLoop(ActorLoop):
    """Owns the ROUTER socket on tcp; requests go to ServerCore.on_request, and the core's
    replies through ``replies`` (the ReplySocket whose ``reply`` it was constructed with)."""

    core: ServerCore

    def __init__(self, *, replies: ReplySocket, endpoint: str, max_frame_bytes: int,
                 disk_probe: Callable[[], tuple[int, int]] | None = None,
                 disk_check_interval_s: float = 10.0, disk_thresholds: tuple[float, float] = (0.95, 0.90),
                 bookie_id: str, curve: CurveServer | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        assert self.core.reply == replies.reply, "the core answers through this loop's socket"
        self.replies = replies
        self.backlogs = replies.backlogs
        self.endpoint = endpoint
        self.max_frame_bytes = max_frame_bytes
        self.disk_probe = disk_probe
        self.disk_schedule = DiskProbeSchedule(interval_s=disk_check_interval_s, threshold=disk_thresholds[0])
        self.disk_thresholds = disk_thresholds
        self.curve = curve
        self.bookie_id = bookie_id  # announced in every connection's handshake
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
        announce(r, self.bookie_id)  # before bind: part of the handshake of every connection
        try:
            r.bind(self.endpoint)
        except zmq.ZMQError as e:
            r.close(0)
            raise ConfigError(f"cannot listen on {self.endpoint} (port): {os.strerror(e.errno or 0)}") from e
        self.bound = r.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.replies.attach(r)
        self.extra.append(r)

    def _drain(self, sock: zmq.Socket[Any], now: float, budget: int = 1024) -> None:
        self.replies.now = now  # the time of the replies the core sends while handling these
        super()._drain(sock, now, budget)

    def on_extra(self, sock: zmq.Socket[Any], now: float) -> None:
        self.replies.now = now
        recv, backlogs, received = sock.recv, self.backlogs, self.disk_schedule.received
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
            if backlogs.stalled and not backlogs.admits(ident, now):
                REPLIES_DROPPED.labels("peer_stalled").inc()
                continue
            received(sum(map(len, frames)))
            self.core.on_request(ident, frames[1:], now)
            if not int(sock.get(_EVENTS)) & _POLLIN:  # cheaper than ending on a zmq.Again
                return

    def after_batch(self, now: float) -> None:
        self.replies.now = now
        backlogs = self.backlogs
        if backlogs.queues:
            self.replies.flush()
        if backlogs.stalled:
            backlogs.expire(now)
        if self.disk_probe is not None and self.disk_schedule.due(now):
            used, total = self.disk_probe()
            self.disk_schedule.probed(now, used, total)
            threshold, warn = self.disk_thresholds
            self.core.set_disk_usage(used, total, threshold=threshold, warn_threshold=warn)

    def poll_timeout_ms(self) -> float:
        return self.backlogs.poll_timeout_ms()

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


class EntryLoggerLoop(ActorLoop):
    """Drains everything ready (an append is done at once, a read only queued), then serves one
    slice of a read, and polls without waiting while reads are under way
    (zbk/actors/entrylogger.py)."""

    core: EntryLoggerCore

    def after_batch(self, now: float) -> None:
        if self.core.reads:
            self.core.serve_read_slice()
            # Give the GIL away between slices: the poll(0) that follows releases it for
            # microseconds only, and this thread takes it back before the Server or the
            # journal, woken to carry an add on, can run (bench/beside.py: adds beside a
            # full-speed reader, p99 14.3-14.9 ms against 16.5-17.9 without).
            os.sched_yield()

    def poll_timeout_ms(self) -> float:
        return 0.0 if self.core.reads else 100.0


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
