"""Encoders: each message type to its frames (frame 0 the CBOR header, then the payload
frames, never copied). The layout is in docs/protocol.md; decoding is zbk/wire/codec.py.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from typing import Any

from zbk import limits
from zbk.wire.cborwriter import _cbor_map, _HeaderValue
from zbk.wire.messages import (
    MASTER_KEY_BYTES,
    AddRequest,
    AddResponse,
    Blob,
    BookieInfoRequest,
    BookieInfoResponse,
    ClearLimboRequest,
    ClearLimboResponse,
    ErrorResponse,
    ForceLedgerRequest,
    ForceLedgerResponse,
    ListEntriesRequest,
    ListEntriesResponse,
    Message,
    MultiAddRequest,
    MultiAddResponse,
    PackedParts,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    WriteCloseRequest,
    WriteCloseResponse,
    WriteLacRequest,
    WriteLacResponse,
)
from zbk.wire.ops import OpCode, ReadFlag
from zbk.wire.ranges import pack_ranges
from zbk.wire.status import Status

VERSION = limits.PROTOCOL_VERSION
# Flag bits as plain ints: bit tests on IntFlag members go through the enum machinery (~1 us).
_FENCE = int(ReadFlag.FENCE)
_LONG_POLL = int(ReadFlag.LONG_POLL)
_SPARSE = int(ReadFlag.SPARSE)


def _base(op: OpCode, rid: int) -> dict[str, _HeaderValue]:
    return {"v": VERSION, "op": op, "rid": rid}


def _response_base(op: OpCode, rid: int, status: Status, ledger_id: int) -> dict[str, _HeaderValue]:
    return {"v": VERSION, "op": op, "rid": rid, "st": status, "l": ledger_id}


def _put_read_options(
    h: dict[str, _HeaderValue], flags: ReadFlag, master_key: bytes | None, previous_lac: int, timeout_ms: int
) -> None:
    if flags:
        h["f"] = flags
    if master_key is not None:
        h["mk"] = master_key
    if flags and int(flags) & _LONG_POLL:  # int(): "&" on an IntFlag costs ~1 us
        h["pl"] = previous_lac
        h["to"] = timeout_ms


# Packed entries (ADD_ENTRY and MULTI_ADD with ``n`` in the header): the entry blobs travel
# as two frames, not one frame each: a length table (``n`` big-endian uint32) and the blobs
# back to back. A ZeroMQ frame costs ~1.5 us to send and as much to receive, whatever its
# size, and a batch holds up to 4,096 entries (docs/protocol.md, "Packed entries").
def _packed(entries: Sequence[Blob]) -> list[Blob]:
    return [struct.pack(f">{len(entries)}I", *map(len, entries)), b"".join(entries)]


def _enc_add_request(m: AddRequest) -> list[Blob]:
    h: dict[str, _HeaderValue] = {"v": VERSION, "op": OpCode.ADD_ENTRY, "rid": m.rid, "l": m.ledger_id}
    h["mk"] = m.master_key
    if m.flags:
        h["f"] = m.flags
    h["n"] = len(m.entries)
    return [_cbor_map(h), *_packed(m.entries)]


# MULTI_ADD part table (frame 1): per part, big-endian ledger id, entry count, add flags,
# master key. Its entries follow, part after part: packed in frames 2 and 3 (``n`` = all
# entries), or one frame each from frame 2 on (no ``n``; still accepted).
_PART = struct.Struct(">qIB32s")
assert _PART.size == 45 and MASTER_KEY_BYTES == 32


@functools.lru_cache(maxsize=limits.wire_parts_structs_cached_max)
def _parts_struct(n: int) -> struct.Struct:
    """The format of a part table of ``n`` parts, compiled once per part count in use."""
    return struct.Struct(">" + "qIB32s" * n)


def _part_columns(table: Blob, n: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[bytes, ...]]:
    """The part table's ledger ids, counts, flags and keys, each a tuple: one unpack of all
    ``n`` parts into a flat tuple, then four strided slices, all in C. (``zip`` over
    ``iter_unpack`` makes a tuple per part and transposes them, at several times the cost,
    and every bookie decodes every part of every MULTI_ADD.)"""
    flat = _parts_struct(n).unpack(table)
    return flat[0::4], flat[1::4], flat[2::4], flat[3::4]


def _enc_multi_add_request(m: MultiAddRequest) -> list[Blob]:
    parts = m.parts
    entries: Sequence[Blob]
    if type(parts) is PackedParts:  # the client's write path: columns, packed in C
        table = b"".join(map(_PART.pack, parts.ledger_ids, parts.counts, parts.flags, parts.keys))
        entries = parts.entries
    else:
        pack = _PART.pack
        table = b"".join([pack(p.ledger_id, len(p.entries), p.flags, p.master_key) for p in parts])
        entries = []
        for p in parts:
            entries.extend(p.entries)
    header = _cbor_map({"v": VERSION, "op": OpCode.MULTI_ADD, "rid": m.rid, "n": len(entries)})
    return [header, table, *_packed(entries)]


def _enc_multi_add_response(m: MultiAddResponse) -> list[Blob]:
    h = _base(OpCode.MULTI_ADD, m.rid)
    h["st"] = m.status
    return [_cbor_map(h), bytes(m.statuses)]


def encode_multi_add_statuses(rid: int, statuses: bytes | bytearray) -> list[Blob]:
    """``encode(MultiAddResponse(rid=rid, status=EOK, statuses=...))`` from the status codes
    as bytes (the frames are identical): a bookie answers up to thousands of parts per
    request and need not build a Status per part only for the encoder to turn it back into
    a byte. Every byte must be a Status code."""
    return _enc_multi_add_response(MultiAddResponse(rid=rid, status=Status.EOK, statuses=statuses))  # type: ignore[arg-type]


def _enc_read_request(m: ReadRequest) -> list[Blob]:
    h = _base(OpCode.READ_ENTRY, m.rid)
    h["l"] = m.ledger_id
    h["e"] = m.first_entry_id
    if m.count != 1:
        h["n"] = m.count
    _put_read_options(h, m.flags, m.master_key, m.previous_lac, m.timeout_ms)
    if m.stripe is not None:
        h["sm"], h["sr"] = m.stripe
    if m.packed:
        h["pk"] = 1
    return [_cbor_map(h)]


def _enc_read_lac_request(m: ReadLacRequest) -> list[Blob]:
    h = _base(OpCode.READ_LAC, m.rid)
    h["l"] = m.ledger_id
    _put_read_options(h, m.flags, m.master_key, m.previous_lac, m.timeout_ms)
    return [_cbor_map(h)]


def _enc_write_lac_request(m: WriteLacRequest) -> list[Blob]:
    h = _base(OpCode.WRITE_LAC, m.rid)
    h.update(l=m.ledger_id, mk=m.master_key, lac=m.lac)
    return [_cbor_map(h)]


def _enc_force_ledger_request(m: ForceLedgerRequest) -> list[Blob]:
    h = _base(OpCode.FORCE_LEDGER, m.rid)
    h["l"] = m.ledger_id
    return [_cbor_map(h)]


def _enc_write_close_request(m: WriteCloseRequest) -> list[Blob]:
    h = _base(OpCode.WRITE_CLOSE, m.rid)
    h.update(l=m.ledger_id, mk=m.master_key)
    return [_cbor_map(h)]


def _enc_clear_limbo_request(m: ClearLimboRequest) -> list[Blob]:
    h = _base(OpCode.CLEAR_LIMBO, m.rid)
    h.update(l=m.ledger_id, mk=m.master_key)
    return [_cbor_map(h)]


def _enc_bookie_info_request(m: BookieInfoRequest) -> list[Blob]:
    return [_cbor_map(_base(OpCode.GET_BOOKIE_INFO, m.rid))]


def _enc_list_entries_request(m: ListEntriesRequest) -> list[Blob]:
    h = _base(OpCode.GET_LIST_OF_ENTRIES_OF_LEDGER, m.rid)
    h["l"] = m.ledger_id
    return [_cbor_map(h)]


def _enc_error_response(m: ErrorResponse) -> list[Blob]:
    h = _base(OpCode.ERROR, m.rid)
    h["st"] = m.status
    return [_cbor_map(h)]


def _enc_add_response(m: AddResponse) -> list[Blob]:
    h = _response_base(OpCode.ADD_ENTRY, m.rid, m.status, m.ledger_id)
    h["e0"] = m.first_entry_id
    h["e1"] = m.last_entry_id
    return [_cbor_map(h)]


def _enc_read_response(m: ReadResponse) -> list[Blob]:
    h = _response_base(OpCode.READ_ENTRY, m.rid, m.status, m.ledger_id)
    h["e"] = m.first_entry_id
    h["lac"] = m.lac
    if m.packed and m.entries:
        h["n"] = len(m.entries)
        return [_cbor_map(h), *_packed(m.entries)]
    return [_cbor_map(h), *m.entries]


def _enc_read_lac_response(m: ReadLacResponse) -> list[Blob]:
    h = _response_base(OpCode.READ_LAC, m.rid, m.status, m.ledger_id)
    h["lac"] = m.lac
    header = _cbor_map(h)
    return [header] if m.last_entry is None else [header, m.last_entry]


def _enc_write_lac_response(m: WriteLacResponse) -> list[Blob]:
    return [_cbor_map(_response_base(OpCode.WRITE_LAC, m.rid, m.status, m.ledger_id))]


def _enc_force_ledger_response(m: ForceLedgerResponse) -> list[Blob]:
    return [_cbor_map(_response_base(OpCode.FORCE_LEDGER, m.rid, m.status, m.ledger_id))]


def _enc_write_close_response(m: WriteCloseResponse) -> list[Blob]:
    return [_cbor_map(_response_base(OpCode.WRITE_CLOSE, m.rid, m.status, m.ledger_id))]


def _enc_clear_limbo_response(m: ClearLimboResponse) -> list[Blob]:
    return [_cbor_map(_response_base(OpCode.CLEAR_LIMBO, m.rid, m.status, m.ledger_id))]


def _enc_bookie_info_response(m: BookieInfoResponse) -> list[Blob]:
    h = _base(OpCode.GET_BOOKIE_INFO, m.rid)
    h.update(st=m.status, fb=m.free_bytes, tb=m.total_bytes, bs=m.state, nl=m.ledgers, nll=m.limbo_ledgers)
    return [_cbor_map(h)]


def _enc_list_entries_response(m: ListEntriesResponse) -> list[Blob]:
    h = _response_base(OpCode.GET_LIST_OF_ENTRIES_OF_LEDGER, m.rid, m.status, m.ledger_id)
    return [_cbor_map(h), pack_ranges(m.entry_ranges)]


_ENCODERS: dict[type, Callable[[Any], list[Blob]]] = {
    AddRequest: _enc_add_request,
    MultiAddRequest: _enc_multi_add_request,
    ReadRequest: _enc_read_request,
    ReadLacRequest: _enc_read_lac_request,
    WriteLacRequest: _enc_write_lac_request,
    ForceLedgerRequest: _enc_force_ledger_request,
    WriteCloseRequest: _enc_write_close_request,
    ClearLimboRequest: _enc_clear_limbo_request,
    BookieInfoRequest: _enc_bookie_info_request,
    ListEntriesRequest: _enc_list_entries_request,
    ErrorResponse: _enc_error_response,
    AddResponse: _enc_add_response,
    MultiAddResponse: _enc_multi_add_response,
    ReadResponse: _enc_read_response,
    ReadLacResponse: _enc_read_lac_response,
    WriteLacResponse: _enc_write_lac_response,
    ForceLedgerResponse: _enc_force_ledger_response,
    WriteCloseResponse: _enc_write_close_response,
    ClearLimboResponse: _enc_clear_limbo_response,
    BookieInfoResponse: _enc_bookie_info_response,
    ListEntriesResponse: _enc_list_entries_response,
}


def encode(msg: Message) -> list[Blob]:
    """The frames of ``msg``: the CBOR header, then its payload frames (not copied)."""
    return _ENCODERS[type(msg)](msg)

