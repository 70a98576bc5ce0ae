"""Wire protocol: CBOR header frames plus raw payload frames over ZeroMQ (docs/protocol.md).

* :mod:`zbk.wire.messages`: one frozen dataclass per request and response.
* :mod:`zbk.wire.codec`: ``encode(msg) -> frames``; ``decode_request`` / ``decode_response``
  that raise only :class:`FrameError`.
* :mod:`zbk.wire.entry`: the entry blob format (``build_entry``, ``peek_entry_header``,
  ``parse_entry``).
* :mod:`zbk.wire.ranges`: entry id sets as ranges (GET_LIST_OF_ENTRIES_OF_LEDGER).
* :mod:`zbk.wire.ops`, :mod:`zbk.wire.status`: opcodes, flags and status codes.
"""

import importlib
from typing import TYPE_CHECKING

# zbk.errors imports zbk.wire.status, and the codec imports zbk.errors: importing the codec
# here would make that a cycle. So the names below load on first use (PEP 562); type
# checkers see ordinary imports.
from zbk.wire.status import Status

if TYPE_CHECKING:
    from zbk.wire.codec import decode_request, decode_response, encode
    from zbk.wire.entry import (
        ENTRY_HEADER_BYTES,
        DigestType,
        EntryDigest,
        ParsedEntry,
        build_entry,
        parse_entry,
        peek_entry_header,
    )
    from zbk.wire.errors import FrameError
    from zbk.wire.messages import (
        MASTER_KEY_BYTES,
        AddRequest,
        AddResponse,
        Blob,
        BookieInfoRequest,
        BookieInfoResponse,
        EntryRanges,
        ErrorResponse,
        ForceLedgerRequest,
        ForceLedgerResponse,
        ListEntriesRequest,
        ListEntriesResponse,
        Message,
        ReadLacRequest,
        ReadLacResponse,
        ReadRequest,
        ReadResponse,
        Request,
        Response,
        WriteCloseRequest,
        WriteCloseResponse,
        WriteLacRequest,
        WriteLacResponse,
    )
    from zbk.wire.ops import AddFlag, OpCode, ReadFlag
    from zbk.wire.ranges import count_ids, iter_ids, ranges_from_ids

_HOMES = {
    "zbk.wire.codec": ("decode_request", "decode_response", "encode"),
    "zbk.wire.entry": ("ENTRY_HEADER_BYTES", "DigestType", "EntryDigest", "ParsedEntry", "build_entry", "parse_entry",
                       "peek_entry_header"),
    "zbk.wire.errors": ("FrameError",),
    "zbk.wire.ops": ("AddFlag", "OpCode", "ReadFlag"),
    "zbk.wire.ranges": ("count_ids", "iter_ids", "ranges_from_ids"),
}  # fmt: skip
_MESSAGES = "zbk.wire.messages"


def __getattr__(name: str) -> object:
    for module, names in _HOMES.items():
        if name in names:
            return getattr(importlib.import_module(module), name)
    if name in __all__:
        return getattr(importlib.import_module(_MESSAGES), name)
    raise AttributeError(f"module 'zbk.wire' has no attribute {name!r}")


__all__ = [
    "ENTRY_HEADER_BYTES",
    "MASTER_KEY_BYTES",
    "AddFlag",
    "AddRequest",
    "AddResponse",
    "Blob",
    "BookieInfoRequest",
    "BookieInfoResponse",
    "DigestType",
    "EntryDigest",
    "EntryRanges",
    "ErrorResponse",
    "ForceLedgerRequest",
    "ForceLedgerResponse",
    "FrameError",
    "ListEntriesRequest",
    "ListEntriesResponse",
    "Message",
    "OpCode",
    "ParsedEntry",
    "ReadFlag",
    "ReadLacRequest",
    "ReadLacResponse",
    "ReadRequest",
    "ReadResponse",
    "Request",
    "Response",
    "Status",
    "WriteCloseRequest",
    "WriteCloseResponse",
    "WriteLacRequest",
    "WriteLacResponse",
    "build_entry",
    "count_ids",
    "decode_request",
    "decode_response",
    "encode",
    "iter_ids",
    "parse_entry",
    "peek_entry_header",
    "ranges_from_ids",
]
