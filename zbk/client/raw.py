"""A small synchronous connection to one bookie, speaking the raw wire protocol.

Used by `zbk shell` (readentry, ledgerentries, bookieinfo), by tests that need exact
control over requests (fencing, master keys, garbage), and by tools. Applications use
:class:`zbk.BookKeeper` instead.

It connects to ``address``, which the caller resolved (zbk/metadata/resolver.py), or else
to the bookie id itself, which must then be host:port. An answer from a bookie that
announces another id (zbk/wire/identity.py: another bookie has that address) raises
BookieUnavailableError naming both ids; a bookie that announces none (older) is taken at
its word.
"""

from __future__ import annotations

import itertools
from typing import Any

import zmq

from zbk import limits
from zbk.bookieid import is_address
from zbk.errors import BadRequestError, BookieUnavailableError, ZbkTimeoutError
from zbk.wire.codec import decode_response, encode
from zbk.wire.curve import CurveClient
from zbk.wire.identity import peer_id, wrong_bookie


class BookieConnection:
    def __init__(self, bookie_id: str, *, timeout_s: float = 10.0, ctx: zmq.Context[Any] | None = None,
                 curve: CurveClient | None = None, address: str | None = None) -> None:
        """``curve``: this client's CURVE keys, for a bookie that requires them (the key
        file is chosen by the bookie's id); ``address``: where the bookie is, if not at
        its id."""
        address = address or bookie_id
        if not is_address(address):
            raise BadRequestError(f"bookie {bookie_id}: {address!r} is not host:port (a name id is resolved "
                                  "through its registration first)")
        self.bookie_id = bookie_id
        self.address = address
        self.timeout_s = timeout_s
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, limits.socket_hwm_messages)
        self.sock.setsockopt(zmq.RCVHWM, limits.socket_hwm_messages)
        if curve is not None:
            try:
                curve.apply(self.sock, bookie_id)  # ConfigError: no server key for this bookie
            except BaseException:
                self.close()
                raise
        self.sock.connect(f"tcp://{address}")
        self._rids = itertools.count(1)

    def next_rid(self) -> int:
        return next(self._rids)

    def send(self, msg: Any) -> None:
        self.sock.send_multipart(encode(msg), copy=False)

    def send_frames(self, frames: list[Any]) -> None:
        """Send raw frames (tests use this for garbage)."""
        self.sock.send_multipart(frames)

    def recv(self, timeout_s: float | None = None) -> Any:
        t = self.timeout_s if timeout_s is None else timeout_s
        if not self.sock.poll(int(t * 1000)):
            raise ZbkTimeoutError(f"bookie {self.bookie_id} did not answer within {t:.1f}s")
        frames = self.sock.recv_multipart(copy=False)
        actual = peer_id(frames[0])
        if actual is not None and actual != self.bookie_id:
            raise BookieUnavailableError(wrong_bookie(self.bookie_id, actual, self.address))
        return decode_response([f.bytes for f in frames])

    def call(self, msg: Any, timeout_s: float | None = None) -> Any:
        """Send one request and return its response (skipping stale responses of earlier
        requests that timed out)."""
        self.send(msg)
        t = self.timeout_s if timeout_s is None else timeout_s
        while True:
            try:
                resp = self.recv(t)
            except ZbkTimeoutError as e:
                raise BookieUnavailableError(str(e)) from None
            if resp.rid == msg.rid:
                return resp

    def close(self) -> None:
        self.sock.close(0)
        if self._own_ctx:
            self.ctx.term()

    def __enter__(self) -> BookieConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
