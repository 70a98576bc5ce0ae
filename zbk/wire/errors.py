"""The one error the wire codec raises: :class:`FrameError`.

Decoding turns *any* input into either a message or a ``FrameError``; nothing else escapes,
so a socket loop needs exactly one ``except`` clause. The error says what the receiver can do
about it:

* ``rid`` is the request id when it could be read from the header. A bookie then answers
  ``ErrorResponse(rid, status)`` so the client fails that one request at once instead of
  waiting for its timeout; a client fails the pending request with that id. ``None`` means the
  message is garbage beyond attribution: drop it and count it.
* ``status`` is ``EBADVERSION`` when the header names a protocol version this side does not
  speak, else ``EBADREQ``.
* ``op`` is the opcode when it was readable (for per-op metrics), else ``None``.
"""

from __future__ import annotations

from zbk.errors import BadRequestError
from zbk.wire.status import Status


class FrameError(BadRequestError):
    """A message (or an entry blob) that is malformed, oversized or of an unknown version."""

    code = "BAD_FRAME"

    def __init__(
        self,
        message: str,
        *,
        rid: int | None = None,
        status: Status = Status.EBADREQ,
        op: int | None = None,
    ) -> None:
        super().__init__(message)
        self.rid = rid
        self.status = status
        self.op = op
        # errors.status_for_error() reads wire_status: per instance, since it varies.
        self.wire_status = status
