"""Messages to ZeroMQ frames and back (the layout is in docs/protocol.md).

A message is a list of frames: frame 0 is a CBOR map with short text keys (the header),
frames 1..n are raw payload frames (entry blobs, or packed entry ranges) that are never
copied into the CBOR. The ROUTER identity frame is the socket loop's business: this codec
sees the frames after it.

Encoding (zbk/wire/encoders.py) writes the header with a small hand-rolled CBOR writer
(zbk/wire/cborwriter.py: the header holds only ints, byte strings and text, so the writer
is ~20 lines and about 3x faster than ``cbor2.dumps``; the tests check it byte for byte
against cbor2). It does not validate: the receiver's decoder does.

Decoding is the trust boundary. It reads the header with one ``cbor2.loads`` restricted to a
flat definite-length map (no nesting, hence no tags, no duplicate keys, text or byte keys
only), then checks every field's type and range, the set of keys, the number and total size
of frames. Any failure raises :class:`FrameError` and nothing else, carrying the request id
when it was readable. Payload frames are passed through as they came (bytes or memoryview);
their contents are the entry format's business (:func:`zbk.wire.entry.peek_entry_header`).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import cbor2

from zbk import limits
from zbk.wire.cborwriter import _KEY_BYTES, _MAJOR_MAP
from zbk.wire.encoders import (
    _PART,
    VERSION,
    _part_columns,
    encode,
    encode_multi_add_statuses,
)
from zbk.wire.errors import FrameError
from zbk.wire.messages import (
    BOOKIE_STATES,
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
    MultiAddRequest,
    MultiAddResponse,
    PackedParts,
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
from zbk.wire.ops import ADD_FLAGS_ALL, READ_FLAGS_ALL, AddFlag, OpCode, ReadFlag
from zbk.wire.ranges import unpack_ranges
from zbk.wire.status import Status

__all__ = ["VERSION", "decode_request", "decode_response", "encode", "encode_multi_add_statuses"]

# Flag bits as plain ints: bit tests on IntFlag members go through the enum machinery (~1 us).
_FENCE = int(ReadFlag.FENCE)
_LONG_POLL = int(ReadFlag.LONG_POLL)
_SPARSE = int(ReadFlag.SPARSE)
_U64_MAX = 2**64 - 1
_I64_MAX = 2**63 - 1


# --- field validators ------------------------------------------------------------------------


class _Invalid(Exception):
    """A field failed validation; the decoder adds rid and op and re-raises as FrameError."""


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _id(value: object, name: str) -> int:
    """A ledger or entry id: int64 >= 0."""
    if type(value) is not int or not 0 <= value <= _I64_MAX:
        raise _Invalid(f"{name} must be an int64 >= 0, got {_show(value)}")
    return value


def _lac(value: object, name: str) -> int:
    """A LAC: an entry id, or -1 for none."""
    if type(value) is not int or not -1 <= value <= _I64_MAX:
        raise _Invalid(f"{name} must be an int64 >= -1, got {_show(value)}")
    return value


def _u64(value: object, name: str) -> int:
    if type(value) is not int or not 0 <= value <= _U64_MAX:
        raise _Invalid(f"{name} must be a uint64, got {_show(value)}")
    return value


def _master_key(value: object) -> bytes:
    if type(value) is not bytes or len(value) != MASTER_KEY_BYTES:
        raise _Invalid(f"mk must be {MASTER_KEY_BYTES} bytes, got {_show(value)}")
    return value


def _count(value: object, name: str, high: int) -> int:
    if type(value) is not int or not 1 <= value <= high:
        raise _Invalid(f"{name} must be in 1..{high}, got {_show(value)}")
    return value


# Lookup tables instead of Enum(value) calls: a dict hit costs ~30 ns, an Enum call ~500 ns.
_STATUS: dict[int, Status] = {s.value: s for s in Status}
_ADD_FLAGS: dict[int, AddFlag] = {v: AddFlag(v) for v in range(ADD_FLAGS_ALL + 1)}
_READ_FLAGS: dict[int, ReadFlag] = {v: ReadFlag(v) for v in range(READ_FLAGS_ALL + 1)}


def _status(value: object) -> Status:
    status = _STATUS.get(value) if type(value) is int else None  # type() check: True must not pass as 1
    if status is None:
        raise _Invalid(f"st must be a status code, got {_show(value)}")
    return status


def _add_flags(value: object) -> AddFlag:
    flags = _ADD_FLAGS.get(value) if type(value) is int else None
    if flags is None:  # an unknown bit may change meaning: refuse rather than ignore it
        raise _Invalid(f"f must be add flags, got {_show(value)}")
    return flags


def _read_flags(value: object) -> ReadFlag:
    flags = _READ_FLAGS.get(value) if type(value) is int else None
    if flags is None:
        raise _Invalid(f"f must be read flags, got {_show(value)}")
    return flags


def _frames(frames: Sequence[Blob], low: int, high: int) -> None:
    """There are low..high payload frames."""
    if not low <= len(frames) - 1 <= high:
        raise _Invalid(f"expected {low}..{high} payload frames, got {len(frames) - 1}")


def _read_options(h: dict[str, Any]) -> tuple[ReadFlag, bytes | None, int, int]:
    """flags, master key, previous LAC and timeout of READ_ENTRY and READ_LAC requests."""
    bits = h.get("f", 0)
    flags = _read_flags(bits)
    master_key = _master_key(h["mk"]) if "mk" in h else None  # CBOR null is not "absent"
    if bits & _FENCE and master_key is None:
        raise _Invalid("FENCE needs the master key (mk)")
    if bits & _SPARSE and bits & (_FENCE | _LONG_POLL):
        raise _Invalid("SPARSE is a plain ranged read: not with FENCE or LONG_POLL")
    if not bits & _LONG_POLL:
        if "pl" in h or "to" in h:
            raise _Invalid("pl and to are only for LONG_POLL")
        return flags, master_key, -1, 0
    if bits & _FENCE:
        raise _Invalid("FENCE and LONG_POLL exclude each other: a fencing read answers at once")
    timeout_ms = h["to"]
    if type(timeout_ms) is not int or not 0 <= timeout_ms <= limits.long_poll_timeout_ms_max:
        raise _Invalid(f"to must be in 0..{limits.long_poll_timeout_ms_max} ms, got {_show(timeout_ms)}")
    return flags, master_key, _lac(h["pl"], "pl"), timeout_ms


def _unpacked(h: dict[str, Any], frames: Sequence[Blob], at: int, high: int, *, views: bool = False) -> tuple[Blob, ...]:
    """The entry blobs of a packed message whose length table is frame ``at`` (and its blobs
    frame ``at + 1``, the last): exactly ``n`` blobs that fill the blob frame. With ``views``
    they are views into that frame rather than copies (slices of a memoryview frame are views
    either way)."""
    n = _count(h["n"], "n", high)
    if len(frames) != at + 2:
        raise _Invalid(f"packed entries take 2 frames after frame {at - 1}, got {len(frames) - at}")
    table, data = frames[at], frames[at + 1]
    if views:
        data = memoryview(data)
    if len(table) != 4 * n:
        raise _Invalid(f"length table of {len(table)} bytes for n = {n} entries")
    lengths = struct.unpack(f">{n}I", table)
    if sum(lengths) != len(data):
        raise _Invalid(f"the entries' lengths add up to {sum(lengths)} bytes, the blob frame has {len(data)}")
    out: list[Blob] = []
    append, pos = out.append, 0
    for size in lengths:
        end = pos + size
        append(data[pos:end])
        pos = end
    return tuple(out)


# --- request decoders ------------------------------------------------------------------------
# Each takes the header map (rid and v already checked) and all frames. A missing key raises
# KeyError, which decode_request() reports as a missing field.


# An add's entries are views into its frame: a bookie copies each entry once, into the entry
# log's records (which the journal writes as they are), so a copy per entry here would be a second.
def _dec_add_request(h: dict[str, Any], frames: Sequence[Blob]) -> AddRequest:
    if "n" in h:
        entries = _unpacked(h, frames, 1, limits.entries_per_add_request_max, views=True)
    else:  # one frame per entry
        _frames(frames, 1, limits.entries_per_add_request_max)
        entries = tuple(frames[1:])
    return AddRequest(
        rid=h["rid"],
        ledger_id=_id(h["l"], "l"),
        master_key=_master_key(h["mk"]),
        flags=_add_flags(h.get("f", 0)),
        entries=entries,
    )


def _dec_multi_add_request(h: dict[str, Any], frames: Sequence[Blob]) -> MultiAddRequest:
    """Frame 1 is the part table, then the entries of the parts in order (packed, or a frame
    each); every part has at least one entry and the counts add up to the entries exactly.
    The parts stay in columns (PackedParts): the table is checked column by column, in C
    (zip, min, sum), and a per-part loop runs only to name what is wrong."""
    if "n" in h:
        if len(frames) < 2:
            raise _Invalid("no part table")
        entries = _unpacked(h, frames, 2, limits.entries_per_add_request_max, views=True)
    else:
        _frames(frames, 2, limits.entries_per_add_request_max + 1)
        entries = tuple(frames[2:])
    table = frames[1]
    size = len(table)
    n, rest = divmod(size, _PART.size)
    if rest or not 1 <= n <= limits.ledgers_per_multi_add_max:
        raise _Invalid(f"part table of {size} bytes is not 1..{limits.ledgers_per_multi_add_max} parts")
    lids, counts, flags, keys = _part_columns(table, n)
    if min(lids) < 0 or min(counts) < 1 or sum(counts) != len(entries):
        at = 0
        for i, (ledger_id, count) in enumerate(zip(lids, counts, strict=True)):
            if ledger_id < 0 or count < 1 or at + count > len(entries):
                raise _Invalid(f"part {i}: ledger {ledger_id} with {count} entries does not fit the frames")
            at += count
        raise _Invalid(f"the parts hold {at} entries, the message {len(entries)}")
    for f in set(flags):
        _add_flags(f)
    return MultiAddRequest(rid=h["rid"], parts=PackedParts(lids, counts, flags, keys, entries))


def _dec_read_request(h: dict[str, Any], frames: Sequence[Blob]) -> ReadRequest:
    _frames(frames, 0, 0)
    first = _id(h["e"], "e")
    count = _count(h.get("n", 1), "n", limits.entries_per_read_request_max)
    if first + count - 1 > _I64_MAX:
        raise _Invalid("e + n overflows int64")
    flags, master_key, previous_lac, timeout_ms = _read_options(h)
    return ReadRequest(
        rid=h["rid"],
        ledger_id=_id(h["l"], "l"),
        first_entry_id=first,
        count=count,
        flags=flags,
        master_key=master_key,
        previous_lac=previous_lac,
        timeout_ms=timeout_ms,
        stripe=_stripe(h, flags) if "sm" in h or "sr" in h else None,
        packed=_flag_key(h, "pk"),
    )


def _flag_key(h: dict[str, Any], key: str) -> bool:
    """An optional key that says yes by being present with the value 1."""
    if key not in h:
        return False
    if type(h[key]) is not int or h[key] != 1:
        raise _Invalid(f"{key} must be 1 when present, got {_show(h[key])}")
    return True


def _stripe(h: dict[str, Any], flags: ReadFlag) -> tuple[int, int]:
    if not flags & _SPARSE:
        raise _Invalid("sm and sr are only for SPARSE")
    if "sm" not in h or "sr" not in h:
        raise _Invalid("sm and sr come together")
    modulus = _count(h["sm"], "sm", limits.ledger_ensemble_size_max)
    residue = h["sr"]
    if type(residue) is not int or not 0 <= residue < modulus:
        raise _Invalid(f"sr must be in 0..{modulus - 1}, got {_show(residue)}")
    return modulus, residue


def _dec_read_lac_request(h: dict[str, Any], frames: Sequence[Blob]) -> ReadLacRequest:
    _frames(frames, 0, 0)
    flags, master_key, previous_lac, timeout_ms = _read_options(h)
    return ReadLacRequest(
        rid=h["rid"],
        ledger_id=_id(h["l"], "l"),
        flags=flags,
        master_key=master_key,
        previous_lac=previous_lac,
        timeout_ms=timeout_ms,
    )


def _dec_write_lac_request(h: dict[str, Any], frames: Sequence[Blob]) -> WriteLacRequest:
    _frames(frames, 0, 0)
    return WriteLacRequest(
        rid=h["rid"], ledger_id=_id(h["l"], "l"), master_key=_master_key(h["mk"]), lac=_lac(h["lac"], "lac")
    )


def _dec_force_ledger_request(h: dict[str, Any], frames: Sequence[Blob]) -> ForceLedgerRequest:
    _frames(frames, 0, 0)
    return ForceLedgerRequest(rid=h["rid"], ledger_id=_id(h["l"], "l"))


def _dec_write_close_request(h: dict[str, Any], frames: Sequence[Blob]) -> WriteCloseRequest:
    _frames(frames, 0, 0)
    return WriteCloseRequest(rid=h["rid"], ledger_id=_id(h["l"], "l"), master_key=_master_key(h["mk"]))


def _dec_clear_limbo_request(h: dict[str, Any], frames: Sequence[Blob]) -> ClearLimboRequest:
    _frames(frames, 0, 0)
    return ClearLimboRequest(rid=h["rid"], ledger_id=_id(h["l"], "l"), master_key=_master_key(h["mk"]))


def _dec_bookie_info_request(h: dict[str, Any], frames: Sequence[Blob]) -> BookieInfoRequest:
    _frames(frames, 0, 0)
    return BookieInfoRequest(rid=h["rid"])


def _dec_list_entries_request(h: dict[str, Any], frames: Sequence[Blob]) -> ListEntriesRequest:
    _frames(frames, 0, 0)
    return ListEntriesRequest(rid=h["rid"], ledger_id=_id(h["l"], "l"))


# --- response decoders -----------------------------------------------------------------------


def _dec_error_response(h: dict[str, Any], frames: Sequence[Blob]) -> ErrorResponse:
    _frames(frames, 0, 0)
    status = _status(h["st"])
    if status is Status.EOK:
        raise _Invalid("an ERROR response cannot carry EOK")
    return ErrorResponse(rid=h["rid"], status=status)


def _dec_add_response(h: dict[str, Any], frames: Sequence[Blob]) -> AddResponse:
    _frames(frames, 0, 0)
    first, last = _id(h["e0"], "e0"), _id(h["e1"], "e1")
    if first > last:
        raise _Invalid(f"e0 {first} > e1 {last}")
    return AddResponse(
        rid=h["rid"],
        status=_status(h["st"]),
        ledger_id=_id(h["l"], "l"),
        first_entry_id=first,
        last_entry_id=last,
    )


def _dec_multi_add_response(h: dict[str, Any], frames: Sequence[Blob]) -> MultiAddResponse:
    _frames(frames, 1, 1)
    raw = bytes(frames[1])
    if not 1 <= len(raw) <= limits.ledgers_per_multi_add_max:
        raise _Invalid(f"expected 1..{limits.ledgers_per_multi_add_max} part statuses, got {len(raw)}")
    if raw.count(0) == len(raw):  # every part EOK (Status.EOK is 0): the common answer
        statuses: tuple[Status, ...] = (Status.EOK,) * len(raw)
    else:
        statuses = tuple(_status(b) for b in raw)
    return MultiAddResponse(rid=h["rid"], status=_status(h["st"]), statuses=statuses)


def _dec_read_response(h: dict[str, Any], frames: Sequence[Blob]) -> ReadResponse:
    packed = "n" in h
    if packed:
        entries = _unpacked(h, frames, 1, limits.entries_per_read_request_max)
    else:  # one frame per entry
        _frames(frames, 0, limits.entries_per_read_request_max)
        entries = tuple(frames[1:])
    first = _id(h["e"], "e")
    if first + len(entries) - 1 > _I64_MAX:
        raise _Invalid("e + entries overflows int64")
    status = _status(h["st"])
    if status is Status.EOK and not entries:
        raise _Invalid("EOK with no entries: a bookie returns at least the first entry it has")
    return ReadResponse(
        rid=h["rid"],
        status=status,
        ledger_id=_id(h["l"], "l"),
        first_entry_id=first,
        lac=_lac(h["lac"], "lac"),
        entries=entries,
        packed=packed,
    )


def _dec_read_lac_response(h: dict[str, Any], frames: Sequence[Blob]) -> ReadLacResponse:
    _frames(frames, 0, 1)
    return ReadLacResponse(
        rid=h["rid"],
        status=_status(h["st"]),
        ledger_id=_id(h["l"], "l"),
        lac=_lac(h["lac"], "lac"),
        last_entry=frames[1] if len(frames) == 2 else None,
    )


def _dec_write_lac_response(h: dict[str, Any], frames: Sequence[Blob]) -> WriteLacResponse:
    _frames(frames, 0, 0)
    return WriteLacResponse(rid=h["rid"], status=_status(h["st"]), ledger_id=_id(h["l"], "l"))


def _dec_force_ledger_response(h: dict[str, Any], frames: Sequence[Blob]) -> ForceLedgerResponse:
    _frames(frames, 0, 0)
    return ForceLedgerResponse(rid=h["rid"], status=_status(h["st"]), ledger_id=_id(h["l"], "l"))


def _dec_write_close_response(h: dict[str, Any], frames: Sequence[Blob]) -> WriteCloseResponse:
    _frames(frames, 0, 0)
    return WriteCloseResponse(rid=h["rid"], status=_status(h["st"]), ledger_id=_id(h["l"], "l"))


def _dec_clear_limbo_response(h: dict[str, Any], frames: Sequence[Blob]) -> ClearLimboResponse:
    _frames(frames, 0, 0)
    return ClearLimboResponse(rid=h["rid"], status=_status(h["st"]), ledger_id=_id(h["l"], "l"))


def _dec_bookie_info_response(h: dict[str, Any], frames: Sequence[Blob]) -> BookieInfoResponse:
    _frames(frames, 0, 0)
    free, total = _u64(h["fb"], "fb"), _u64(h["tb"], "tb")
    if free > total:
        raise _Invalid(f"fb {free} > tb {total}")
    state = h["bs"]
    if type(state) is not str or state not in BOOKIE_STATES:
        raise _Invalid(f"bs must be one of {BOOKIE_STATES}, got {_show(state)}")
    return BookieInfoResponse(
        rid=h["rid"],
        status=_status(h["st"]),
        free_bytes=free,
        total_bytes=total,
        state=state,
        ledgers=_id(h["nl"], "nl"),
        limbo_ledgers=_id(h["nll"], "nll"),
    )


def _dec_list_entries_response(h: dict[str, Any], frames: Sequence[Blob]) -> ListEntriesResponse:
    _frames(frames, 1, 1)
    try:
        ranges = unpack_ranges(frames[1])
    except (TypeError, ValueError, BufferError):
        ranges = None
    if ranges is None:
        raise _Invalid("the ranges frame is not sorted disjoint int64 pairs")
    return ListEntriesResponse(
        rid=h["rid"], status=_status(h["st"]), ledger_id=_id(h["l"], "l"), entry_ranges=ranges
    )


_Decoder = Callable[[dict[str, Any], Sequence[Blob]], Any]


def _table(spec: dict[OpCode, tuple[_Decoder, str]]) -> dict[int, tuple[_Decoder, frozenset[str], OpCode]]:
    """op number -> (decoder, the keys its header may hold, op)."""
    return {int(op): (dec, frozenset(keys.split()), op) for op, (dec, keys) in spec.items()}


_REQUESTS = _table({
    OpCode.ADD_ENTRY: (_dec_add_request, "v op rid l mk f n"),
    OpCode.MULTI_ADD: (_dec_multi_add_request, "v op rid n"),
    OpCode.READ_ENTRY: (_dec_read_request, "v op rid l e n f mk pl to sm sr pk"),
    OpCode.READ_LAC: (_dec_read_lac_request, "v op rid l f mk pl to"),
    OpCode.WRITE_LAC: (_dec_write_lac_request, "v op rid l mk lac"),
    OpCode.FORCE_LEDGER: (_dec_force_ledger_request, "v op rid l"),
    OpCode.WRITE_CLOSE: (_dec_write_close_request, "v op rid l mk"),
    OpCode.CLEAR_LIMBO: (_dec_clear_limbo_request, "v op rid l mk"),
    OpCode.GET_BOOKIE_INFO: (_dec_bookie_info_request, "v op rid"),
    OpCode.GET_LIST_OF_ENTRIES_OF_LEDGER: (_dec_list_entries_request, "v op rid l"),
})  # fmt: skip
_RESPONSES = _table({
    OpCode.ERROR: (_dec_error_response, "v op rid st"),
    OpCode.ADD_ENTRY: (_dec_add_response, "v op rid st l e0 e1"),
    OpCode.MULTI_ADD: (_dec_multi_add_response, "v op rid st"),
    OpCode.READ_ENTRY: (_dec_read_response, "v op rid st l e lac n"),
    OpCode.READ_LAC: (_dec_read_lac_response, "v op rid st l lac"),
    OpCode.WRITE_LAC: (_dec_write_lac_response, "v op rid st l"),
    OpCode.FORCE_LEDGER: (_dec_force_ledger_response, "v op rid st l"),
    OpCode.WRITE_CLOSE: (_dec_write_close_response, "v op rid st l"),
    OpCode.CLEAR_LIMBO: (_dec_clear_limbo_response, "v op rid st l"),
    OpCode.GET_BOOKIE_INFO: (_dec_bookie_info_response, "v op rid st fb tb bs nl nll"),
    OpCode.GET_LIST_OF_ENTRIES_OF_LEDGER: (_dec_list_entries_response, "v op rid st l"),
})  # fmt: skip
assert all(k in _KEY_BYTES for t in (_REQUESTS, _RESPONSES) for _, keys, _ in t.values() for k in keys)


# --- decoding --------------------------------------------------------------------------------


def _load_header(frames: Sequence[Blob]) -> dict[Any, Any]:
    """Frame 0 as a flat CBOR map, or FrameError without a rid (nothing is readable yet)."""
    try:
        if not frames:
            raise FrameError("empty message")
        header = frames[0]
        size = len(header)
        if size > limits.header_bytes_max:
            raise FrameError(f"header of {size} bytes exceeds {limits.header_bytes_max}")
        # A definite-length map (major type 5) at the top; with max_depth=1 nothing inside it
        # may be a container or a tag, so cbor2 never builds big ints, fractions, regexes...
        if size == 0 or header[0] & 0xE0 != _MAJOR_MAP:
            raise FrameError("header frame is not a CBOR map")
        h = cbor2.loads(
            header,
            max_depth=1,
            allow_indefinite=False,
            allow_duplicate_keys=False,
            strict_hashable_types=True,
        )
    except FrameError:
        raise
    except Exception as exc:  # cbor2 and odd frame objects raise many types; all mean garbage
        raise FrameError(f"undecodable header: {_show(exc)}") from None
    if type(h) is not dict:
        raise FrameError("header frame is not a CBOR map")
    return h


def _open(frames: Sequence[Blob], max_frame_bytes: int) -> tuple[dict[str, Any], int]:
    """The header map and rid, after the checks common to all messages (rid, v, total size)."""
    h = _load_header(frames)
    rid = h.get("rid")
    if type(rid) is not int or not 0 <= rid <= _U64_MAX:
        raise FrameError(f"rid must be a uint64, got {_show(rid)}")
    version = h.get("v")
    if type(version) is not int:
        raise FrameError(f"v must be an int, got {_show(version)}", rid=rid)
    if version != VERSION:
        raise FrameError(
            f"protocol version {_show(version)} is not {VERSION}", rid=rid, status=Status.EBADVERSION
        )
    try:
        total = sum(map(len, frames))
    except TypeError:
        raise FrameError("a frame is not bytes-like", rid=rid) from None
    if total > max_frame_bytes:
        raise FrameError(f"message of {total} bytes exceeds max_frame_bytes {max_frame_bytes}", rid=rid)
    return h, rid


def _decode(frames: Sequence[Blob], max_frame_bytes: int, table: dict[int, tuple[_Decoder, frozenset[str], OpCode]],
            kind: str) -> Any:  # fmt: skip
    h, rid = _open(frames, max_frame_bytes)
    op_value = h.get("op")
    entry = table.get(op_value) if type(op_value) is int else None
    if entry is None:
        raise FrameError(f"unknown {kind} op {_show(op_value)}", rid=rid)
    decoder, keys, op = entry
    if not h.keys() <= keys:
        extra = sorted(map(repr, h.keys() - keys))
        raise FrameError(f"unknown fields in {op.name} {kind}: {', '.join(extra)}", rid=rid, op=op)
    try:
        return decoder(h, frames)
    except _Invalid as exc:
        raise FrameError(f"{op.name} {kind}: {exc}", rid=rid, op=op) from None
    except KeyError as exc:
        raise FrameError(f"{op.name} {kind}: missing field {exc.args[0]!r}", rid=rid, op=op) from None


def decode_request(
    frames: Sequence[Blob], *, max_frame_bytes: int = limits.frame_bytes_max_default
) -> Request:
    """The request in ``frames``, a list or tuple of bytes-like frames after the ROUTER identity.

    Raises only :class:`FrameError`, whatever ``frames`` holds.
    """
    request: Request = _decode(frames, max_frame_bytes, _REQUESTS, "request")
    return request


def decode_response(
    frames: Sequence[Blob], *, max_frame_bytes: int = limits.frame_bytes_max_default
) -> Response:
    """The response in ``frames`` (a list or tuple of bytes-like frames). Raises only :class:`FrameError`."""
    response: Response = _decode(frames, max_frame_bytes, _RESPONSES, "response")
    return response
