"""Loops with behaviour beyond the plain ActorLoop: the Server's ROUTER socket and the
journal's group commit.

The ROUTER is where the network meets the bookie, so this is where slow and hostile peers
are contained (docs/reliability.md, "Resources"):

* Every peer has its own inbound and outbound pipe, each bounded in messages
  (``server_peer_recv_hwm_messages`` / ``server_peer_send_hwm_messages``). A client's own
  libzmq thread keeps reading its socket whatever its application does, so a peer's
  outbound pipe fills only when that client has stopped reading for a long time.
* ROUTER_MANDATORY makes a full pipe visible: the reply is dropped (counted), and the peer
  is *stalled* for ``server_peer_stall_s``: its requests are dropped unread, so a client that
  does not read its answers costs at most one pipe of replies, and no disk reads.
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

REPLIES_DROPPED = Counter("zbk_bookie_replies_dropped_total",
                          "Replies and requests dropped at the socket, by reason", ["reason"])
_PROBE_BYTES_MIN = 64 * 1024  # statvfs costs microseconds


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
        self.probe_after_bytes = _PROBE_BYTES_MIN
        self.stalled: dict[bytes, float] = {}  # peer identity -> until when its requests are dropped
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
        assert self.router is not None
        try:
            self.router.send_multipart([ident, *frames], flags=zmq.NOBLOCK)
        except zmq.Again:
            # The client stopped reading (its pipe is full): drop the reply rather than block
            # every other client, and stop serving it for a while. It times out and retries.
            if ident not in self.stalled:
                log.warning("server: client %s is not reading its replies; its requests are dropped for %.1f s",
                            ident.hex(), limits.server_peer_stall_s)
            self.stalled[ident] = self.clock.monotonic() + limits.server_peer_stall_s
            REPLIES_DROPPED.labels("peer_full").inc()
        except zmq.ZMQError as e:
            if e.errno != errno.EHOSTUNREACH:
                raise
            REPLIES_DROPPED.labels("peer_gone").inc()  # disconnected before its answer was ready

    def on_extra(self, sock: zmq.Socket[Any], now: float) -> None:
        for _ in range(1024):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return
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

    def after_batch(self, now: float) -> None:
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
            self.probe_after_bytes = max(_PROBE_BYTES_MIN, headroom // 4)

    def poll_timeout_ms(self) -> float:
        return 50.0

    def teardown(self) -> None:
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
