"""Sending a message's frames at the lowest cost pyzmq allows: large frames without a copy,
and the C-level send with plain int flags. The client sends requests to a bookie's DEALER
with it, the bookie's Server its replies to a ROUTER peer."""

from __future__ import annotations

from typing import Any

import zmq

from zbk.wire.codec import encode

# pyzmq's send_multipart calls the Python-level Socket.send per frame and ORs IntFlag enums
# each time (~2.3 us a frame); the C-level send with int flags costs ~0.65 us. An add
# request of 1,000 entries is 1,001 frames, so this is most of the client's send cost; a
# range read's reply is a frame per entry (4,096 frames: 1.2 ms of the Server's thread
# this way, 4.0 ms by send_multipart, time in which the adds behind the reply wait).
_send_frame = zmq.backend.Socket.send
_MORE = int(zmq.SNDMORE) | int(zmq.DONTWAIT)
_LAST = int(zmq.DONTWAIT)

# Frames of this size or more are sent without a copy (pyzmq's own threshold for copy=False).
_ZERO_COPY_BYTES = zmq.COPY_THRESHOLD
_Frame = zmq.Frame


def encoded(msg: Any) -> list[Any]:
    """``encode(msg)`` with every frame of _ZERO_COPY_BYTES or more wrapped in a zmq.Frame
    that references the bytes: sent to three bookies, a packed add request's blob frame
    (hundreds of KiB) is then copied zero times instead of three; the bytes are immutable
    and the Frame keeps them alive until libzmq has sent every copy (copying would be more
    than half the CPU of sending such a request). Smaller frames are copied: that is
    cheaper than a Frame's bookkeeping."""
    return [_Frame(f) if len(f) >= _ZERO_COPY_BYTES else f for f in encode(msg)]


def send_frames(sock: zmq.Socket[Any], frames: list[Any], first: bytes | None = None) -> None:
    """send_multipart(([first] if first else []) + frames, DONTWAIT), copying each frame
    except the zmq.Frame ones (``encoded``); ``first`` is a ROUTER's peer identity. Raises
    zmq.Again before sending anything if the message cannot be queued: ZeroMQ takes a
    multipart message whole or not at all, so only the first part can raise it."""
    if first is not None:
        _send_frame(sock, first, _MORE, True, False)
    for f in frames[:-1]:
        _send_frame(sock, f, _MORE, f.__class__ is not _Frame, False)
    f = frames[-1]
    _send_frame(sock, f, _LAST, f.__class__ is not _Frame, False)
