"""A stand-in bookie for transport tests: a plain ROUTER socket on loopback, in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from zbk.wire.codec import decode_request, encode


def serve_router(port: int, answer: Callable[[Any], Any], bind_after_s: float, stop: threading.Event) -> None:
    """Bind after ``bind_after_s``, then answer every request with ``answer(request)`` until
    ``stop``: a peer that goes away drops the answers its client has not read yet, so the
    server must outlive the client's reads."""
    time.sleep(bind_after_s)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"tcp://127.0.0.1:{port}")
    try:
        while not stop.is_set():
            if not sock.poll(100):
                continue
            ident, *frames = sock.recv_multipart()
            sock.send_multipart([ident, *encode(answer(decode_request(frames)))])
    finally:
        sock.close(0)
        ctx.term()
