"""Loops with behaviour beyond the plain ActorLoop: the Server's ROUTER socket and the
journal's group commit."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import zmq

from zbk import limits
from zbk.actors.base import ActorLoop
from zbk.actors.journal import JournalCore
from zbk.actors.server import ServerCore

log = logging.getLogger(__name__)


class ServerLoop(ActorLoop):
    """Owns the ROUTER socket on tcp; requests go to ServerCore.on_request."""

    core: ServerCore

    def __init__(self, *, endpoint: str, max_frame_bytes: int,
                 disk_probe: Callable[[], tuple[int, int]] | None = None,
                 disk_check_interval_s: float = 10.0, disk_thresholds: tuple[float, float] = (0.95, 0.90),
                 curve: Callable[[zmq.Socket[Any]], None] | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        self.endpoint = endpoint
        self.max_frame_bytes = max_frame_bytes
        self.disk_probe = disk_probe
        self.disk_check_interval_s = disk_check_interval_s
        self.disk_thresholds = disk_thresholds
        self.curve = curve
        self.next_disk_check = 0.0
        self.router: zmq.Socket[Any] | None = None
        self.bound = ""

    def setup(self) -> None:
        r = self.ctx.socket(zmq.ROUTER)
        r.setsockopt(zmq.LINGER, 0)
        r.setsockopt(zmq.RCVHWM, limits.socket_hwm_messages)
        r.setsockopt(zmq.SNDHWM, limits.socket_hwm_messages)
        # Frames over max_frame_bytes are dropped by libzmq itself (and the peer disconnected):
        # an oversized message never reaches Python memory.
        r.setsockopt(zmq.MAXMSGSIZE, self.max_frame_bytes + limits.header_bytes_max)
        if self.curve:
            self.curve(r)
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
            # The client stopped reading (its HWM is full): drop the reply rather than stall
            # every other client. It will time out and retry.
            log.warning("server: reply dropped, client not reading")

    def on_extra(self, sock: zmq.Socket[Any], now: float) -> None:
        for _ in range(1024):
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) < 2:
                continue
            self.core.on_request(frames[0], frames[1:], now)

    def after_batch(self, now: float) -> None:
        if self.disk_probe is not None and now >= self.next_disk_check:
            self.next_disk_check = now + self.disk_check_interval_s
            used, total = self.disk_probe()
            self.core.set_disk_usage(used, total, threshold=self.disk_thresholds[0],
                                     warn_threshold=self.disk_thresholds[1])

    def poll_timeout_ms(self) -> float:
        return 50.0


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
