"""Round trips and strict validation of the wire codec."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wire_strategies import I64_MAX, U64_MAX, requests, responses

from zbk import limits
from zbk.errors import BadRequestError, status_for_error
from zbk.wire.codec import decode_request, decode_response, encode
from zbk.wire.errors import FrameError
from zbk.wire.messages import (
    AddRequest,
    AddResponse,
    ErrorResponse,
    ListEntriesResponse,
    MultiAddRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
    add_part,
)
from zbk.wire.ops import AddFlag, OpCode, ReadFlag
from zbk.wire.status import Status

MK = bytes(range(32))
RID = 4242


def header(frames: list[Any]) -> dict[str, Any]:
    h = cbor2.loads(frames[0])
    assert isinstance(h, dict)
    return h


def with_header(h: dict[str, Any], payload: list[bytes] | None = None) -> list[Any]:
    return [cbor2.dumps(h), *(payload or [])]


def add_header(**changes: Any) -> dict[str, Any]:
    h: dict[str, Any] = {
        "v": limits.PROTOCOL_VERSION,
        "op": OpCode.ADD_ENTRY.value,
        "rid": RID,
        "l": 7,
        "mk": MK,
    }
    h.update(changes)
    return {k: v for k, v in h.items() if v is not _DROP}


def read_header(**changes: Any) -> dict[str, Any]:
    h: dict[str, Any] = {
        "v": limits.PROTOCOL_VERSION,
        "op": OpCode.READ_ENTRY.value,
        "rid": RID,
        "l": 7,
        "e": 0,
    }
    h.update(changes)
    return {k: v for k, v in h.items() if v is not _DROP}


_DROP = object()


def reject_request(frames: list[Any], **kwargs: Any) -> FrameError:
    with pytest.raises(FrameError) as info:
        decode_request(frames, **kwargs)
    return info.value


# --- round trips -------------------------------------------------------------------------------


@settings(max_examples=600, deadline=None)
@given(requests)
def test_every_request_round_trips(msg: Any) -> None:
    assert decode_request(encode(msg)) == msg


@settings(max_examples=600, deadline=None)
@given(responses)
def test_every_response_round_trips(msg: Any) -> None:
    assert decode_response(encode(msg)) == msg


@settings(max_examples=300, deadline=None)
@given(st.one_of(requests, responses))
def test_header_writer_matches_cbor2_byte_for_byte(msg: Any) -> None:
    frames = encode(msg)
    h = header(frames)
    plain = {k: (int(v) if isinstance(v, int) else v) for k, v in h.items()}
    assert frames[0] == cbor2.dumps(plain)


def test_read_payload_frames_are_passed_through_not_copied() -> None:
    blob = memoryview(b"x" * 100)
    frames = encode(ReadResponse(rid=1, status=Status.EOK, ledger_id=2, first_entry_id=0, lac=-1, entries=(blob,)))
    assert frames[1] is blob
    decoded = decode_response(frames)
    assert isinstance(decoded, ReadResponse)
    assert decoded.entries[0] is blob


def test_add_entries_travel_packed_in_two_frames() -> None:
    blobs = (b"abc", b"", b"de" * 300)
    frames = encode(AddRequest(rid=1, ledger_id=2, master_key=MK, flags=AddFlag(0), entries=blobs))
    assert len(frames) == 3 and header(frames)["n"] == 3
    assert frames[1] == struct.pack(">3I", 3, 0, 600) and frames[2] == b"".join(blobs)
    decoded = decode_request(frames)
    assert isinstance(decoded, AddRequest) and tuple(map(bytes, decoded.entries)) == blobs
    multi = encode(MultiAddRequest(rid=3, parts=(
        AddRequest(rid=0, ledger_id=5, master_key=MK, flags=AddFlag(0), entries=blobs[:2]),
        AddRequest(rid=0, ledger_id=6, master_key=MK, flags=AddFlag.RECOVERY_ADD, entries=blobs[2:]))))
    assert len(multi) == 4 and header(multi)["n"] == 3 and multi[3] == b"".join(blobs)
    got = decode_request(multi)
    assert isinstance(got, MultiAddRequest)
    assert [(p.ledger_id, p.flags, tuple(map(bytes, p.entries))) for p in got.parts] == [
        (5, AddFlag(0), blobs[:2]), (6, AddFlag.RECOVERY_ADD, blobs[2:])]


def test_read_entries_travel_packed_when_the_request_asks() -> None:
    req = decode_request(with_header(read_header(n=10, pk=1)))
    assert isinstance(req, ReadRequest) and req.packed
    assert not decode_request(with_header(read_header(n=10))).packed
    for bad in (0, 2, "1", True):
        assert "pk must be 1" in str(reject_request(with_header(read_header(n=10, pk=bad))))
    blobs = (b"abc", b"", b"de" * 300)
    frames = encode(ReadResponse(rid=1, status=Status.EOK, ledger_id=2, first_entry_id=5, lac=7, entries=blobs,
                                 packed=True))
    assert len(frames) == 3 and header(frames)["n"] == 3
    assert frames[1] == struct.pack(">3I", 3, 0, 600) and frames[2] == b"".join(blobs)
    got = decode_response(frames)
    assert isinstance(got, ReadResponse) and got.packed and tuple(map(bytes, got.entries)) == blobs
    # Nothing to pack: the answer has no n, whatever was asked.
    none = encode(ReadResponse(rid=1, status=Status.ENOENTRY, ledger_id=2, first_entry_id=5, lac=7, packed=True))
    assert len(none) == 1 and "n" not in header(none)


PACKING_DAMAGE = ["n0", "n_over", "n_not_int", "table_short", "sum_long", "sum_short", "extra_frame", "missing_frame"]


def damaged(frames: list[Any], damage: str, at: int, n_max: int) -> list[Any]:
    """``frames`` of a packed message (its length table is frame ``at``) with ``damage``."""
    h, rest = header(frames), list(frames[1:])
    if damage == "n0":
        h["n"] = 0
    elif damage == "n_over":
        h["n"] = n_max + 1
    elif damage == "n_not_int":
        h["n"] = "2"
    elif damage == "table_short":
        rest[at - 1] = rest[at - 1][:-1]
    elif damage == "sum_long":
        rest[at] = rest[at] + b"!"
    elif damage == "sum_short":
        rest[at] = rest[at][:-1]
    elif damage == "extra_frame":
        rest.append(b"more")
    else:
        rest = rest[:-1]
    return with_header(h, rest)


@pytest.mark.parametrize("damage", PACKING_DAMAGE)
def test_malformed_packed_read_answers_fail_their_request(damage: str) -> None:
    frames = encode(ReadResponse(rid=RID, status=Status.EOK, ledger_id=2, first_entry_id=0, lac=1,
                                 entries=(b"abc", b"defg"), packed=True))
    with pytest.raises(FrameError) as err:
        decode_response(damaged(frames, damage, 1, limits.entries_per_read_request_max))
    assert err.value.rid == RID


def test_a_frame_per_entry_is_still_accepted_and_passed_through() -> None:
    blobs = [memoryview(b"x" * 100), memoryview(b"y" * 7)]
    frames = with_header({"v": 1, "op": OpCode.ADD_ENTRY, "rid": 1, "l": 2, "mk": MK}, blobs)  # type: ignore[arg-type]
    decoded = decode_request(frames)
    assert isinstance(decoded, AddRequest) and decoded.entries[0] is blobs[0] and decoded.entries[1] is blobs[1]
    table = struct.pack(">qIB32s", 5, 2, 0, MK)
    multi = with_header({"v": 1, "op": OpCode.MULTI_ADD, "rid": 1}, [table, b"a", b"b"])
    got = decode_request(multi)
    assert isinstance(got, MultiAddRequest) and got.parts[0].entries == (b"a", b"b")


@pytest.mark.parametrize("counts", [(1, 1, 1), (2, 1, 3)], ids=["one-entry-parts", "mixed"])
def test_decoded_multi_add_parts_are_a_sequence_of_add_requests(counts: tuple[int, ...]) -> None:
    """The decoder keeps a MULTI_ADD's parts in columns (PackedParts) and builds a part only
    when asked for: it is indexed, sliced, iterated and compared like the tuple of parts."""
    from zbk.wire.messages import PackedParts

    flags = (AddFlag(0), AddFlag.RECOVERY_ADD, AddFlag.DEFERRED_SYNC)
    sent, k = [], 0
    for i, c in enumerate(counts):
        sent.append(AddRequest(rid=0, ledger_id=10 + i, master_key=bytes([i]) * 32, flags=flags[i],
                               entries=tuple(b"e%d" % (k + j) for j in range(c))))
        k += c
    got = decode_request(encode(MultiAddRequest(rid=4, parts=tuple(sent))))
    assert isinstance(got, MultiAddRequest) and isinstance(got.parts, PackedParts)
    parts = got.parts
    assert parts.ones == (counts == (1, 1, 1))
    assert parts.ledger_ids == (10, 11, 12) and parts.counts == counts and parts.flags == tuple(map(int, flags))
    assert len(parts) == 3 and list(parts) == sent and parts == tuple(sent) and tuple(sent) == parts
    assert got == MultiAddRequest(rid=4, parts=tuple(sent))
    assert parts[-1] == sent[2] and parts[1:] == sent[1:] and parts[::2] == [sent[0], sent[2]]
    assert [type(p.flags) for p in parts] == [AddFlag] * 3 and parts.index(sent[1]) == 1
    assert parts != sent[:2] and parts != "abc" and "AddRequest" in repr(parts)
    with pytest.raises(IndexError):
        parts[3]
    with pytest.raises(IndexError):
        parts[-4]
    # The client builds the columns itself (its write path): the same frames as the parts.
    frames = encode(MultiAddRequest(rid=4, parts=tuple(sent)))
    columns = PackedParts([p.ledger_id for p in sent], list(counts), [p.flags for p in sent],
                          [p.master_key for p in sent], [e for p in sent for e in p.entries])
    assert encode(MultiAddRequest(rid=4, parts=columns)) == frames and encode(got) == frames


def test_part_tables_of_every_size_decode_to_their_columns() -> None:
    """The decoder unpacks a part table with one compiled format per part count (a bounded
    cache of them): tables of 1 to 40 parts and of 1,024, twice over, past the cache bound,
    give back exactly the ledger ids, counts, flags and keys that were encoded."""
    import random

    from zbk.wire import encoders
    from zbk.wire.messages import PackedParts

    rng = random.Random(8)
    for _ in range(2):
        for n in [*range(1, 41), limits.ledgers_per_multi_add_max]:
            lids = [rng.randrange(0, 2**63) for _ in range(n)]
            counts = [rng.randrange(1, 4) for _ in range(n)]
            flags = [rng.choice([AddFlag(0), AddFlag.RECOVERY_ADD, AddFlag.DEFERRED_SYNC]) for _ in range(n)]
            keys = [rng.randbytes(32) for _ in range(n)]
            entries = [b"%d" % i for i in range(sum(counts))]
            got = decode_request(encode(MultiAddRequest(rid=n, parts=PackedParts(lids, counts, flags, keys, entries))))
            assert isinstance(got, MultiAddRequest) and got.rid == n
            parts = got.parts
            assert isinstance(parts, PackedParts)
            assert list(parts.ledger_ids) == lids and list(parts.counts) == counts
            assert list(parts.flags) == [int(f) for f in flags] and list(parts.keys) == keys
            assert [bytes(e) for e in parts.entries] == entries
            assert encoders._parts_struct.cache_info().currsize <= limits.wire_parts_structs_cached_max


@pytest.mark.parametrize("damage", ["negative_ledger", "zero_count", "counts_over", "counts_under", "unknown_flag"])
def test_a_malformed_part_table_is_refused_with_the_rid_and_the_part_named(damage: str) -> None:
    rows = [[5, 1, 0], [6, 2, 0], [7, 1, 0]]
    entries = [b"a", b"b", b"c", b"d"]
    if damage == "negative_ledger":
        rows[1][0], want = -1, "part 1: ledger -1"
    elif damage == "zero_count":
        rows[2][1], want = 0, "part 2: ledger 7 with 0 entries"
    elif damage == "counts_over":
        rows[2][1], want = 2, "part 2: ledger 7 with 2 entries does not fit"
    elif damage == "counts_under":
        entries.append(b"e")
        want = "the parts hold 4 entries, the message 5"
    else:
        rows[0][2], want = 0x80, "f must be add flags"
    table = b"".join(struct.pack(">qIB32s", lid, n, f, MK) for lid, n, f in rows)
    frames = with_header({"v": 1, "op": OpCode.MULTI_ADD, "rid": RID, "n": len(entries)},
                         [table, struct.pack(f">{len(entries)}I", *map(len, entries)), b"".join(entries)])
    with pytest.raises(FrameError) as err:
        decode_request(frames)
    assert err.value.rid == RID and err.value.status == Status.EBADREQ and want in str(err.value)


@pytest.mark.parametrize("op", [OpCode.ADD_ENTRY, OpCode.MULTI_ADD])
@pytest.mark.parametrize("damage", PACKING_DAMAGE)
def test_malformed_packed_entries_are_refused_with_the_rid(op: OpCode, damage: str) -> None:
    blobs = (b"abc", b"defg")
    if op == OpCode.ADD_ENTRY:
        frames = encode(AddRequest(rid=RID, ledger_id=2, master_key=MK, flags=AddFlag(0), entries=blobs))
        at = 1
    else:
        frames = encode(MultiAddRequest(rid=RID, parts=(
            AddRequest(rid=0, ledger_id=2, master_key=MK, flags=AddFlag(0), entries=blobs),)))
        at = 2
    with pytest.raises(FrameError) as err:
        decode_request(damaged(frames, damage, at, limits.entries_per_add_request_max))
    assert err.value.rid == RID and err.value.status == Status.EBADREQ


def test_decoded_enums_are_enum_members() -> None:
    msg = decode_request(
        encode(ReadRequest(rid=1, ledger_id=2, first_entry_id=3, flags=ReadFlag.FENCE, master_key=MK))
    )
    assert isinstance(msg, ReadRequest) and type(msg.flags) is ReadFlag and msg.flags is ReadFlag.FENCE
    resp = decode_response(encode(ErrorResponse(rid=1, status=Status.EIO)))
    assert isinstance(resp, ErrorResponse) and resp.status is Status.EIO


def test_every_header_carries_version_op_and_rid() -> None:
    frames = encode(ReadRequest(rid=9, ledger_id=1, first_entry_id=0))
    h = header(frames)
    assert h == {"v": limits.PROTOCOL_VERSION, "op": OpCode.READ_ENTRY, "rid": 9, "l": 1, "e": 0}


# --- FrameError carries rid, status and op --------------------------------------------------------


def test_frame_error_is_a_bad_request_error_with_wire_status() -> None:
    err = reject_request(with_header(add_header(l=-1), [b"e"]))
    assert isinstance(err, BadRequestError)
    assert (err.rid, err.status, err.op) == (RID, Status.EBADREQ, OpCode.ADD_ENTRY)
    assert status_for_error(err) is Status.EBADREQ


def test_unknown_version_is_ebadversion_with_rid() -> None:
    err = reject_request(with_header(add_header(v=limits.PROTOCOL_VERSION + 1), [b"e"]))
    assert (err.rid, err.status) == (RID, Status.EBADVERSION)
    assert status_for_error(err) is Status.EBADVERSION


@pytest.mark.parametrize("version", [_DROP, "1", 1.0, True, None, b"\x01"])
def test_missing_or_mistyped_version_is_ebadreq(version: Any) -> None:
    err = reject_request(with_header(add_header(v=version), [b"e"]))
    assert (err.rid, err.status) == (RID, Status.EBADREQ)


@pytest.mark.parametrize("rid", [_DROP, -1, U64_MAX + 1, "1", 1.5, True, None, b"1"])
def test_unreadable_rid_gives_no_rid(rid: Any) -> None:
    err = reject_request(with_header(add_header(rid=rid), [b"e"]))
    assert err.rid is None


@pytest.mark.parametrize("rid", [0, 23, 24, 2**32, U64_MAX])
def test_any_uint64_rid_is_recovered(rid: int) -> None:
    err = reject_request(with_header(add_header(rid=rid, op=99)))
    assert err.rid == rid


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b""],
        [b"\xff"],
        [cbor2.dumps([1, 2, 3])],
        [cbor2.dumps("text")],
        [b"\xbf\x61v\x01\xff"],  # indefinite-length map
        [cbor2.dumps(cbor2.CBORTag(2, b"\x01" * 100))],  # a bignum tag at the top
        ["not bytes"],
        [12345],
        [None],
    ],
)
def test_garbage_gives_no_rid(frames: list[Any]) -> None:
    assert reject_request(frames).rid is None


def test_frames_that_are_not_a_sequence_are_rejected() -> None:
    with pytest.raises(FrameError):
        decode_request(None)  # type: ignore[arg-type]
    with pytest.raises(FrameError):
        decode_request(iter([b"x"]))  # type: ignore[arg-type]


# --- field validation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"l": _DROP}, "missing field 'l'"),
        ({"mk": _DROP}, "missing field 'mk'"),
        ({"l": -1}, "int64 >= 0"),
        ({"l": I64_MAX + 1}, "int64 >= 0"),
        ({"l": True}, "int64 >= 0"),
        ({"l": 1.0}, "int64 >= 0"),
        ({"l": "7"}, "int64 >= 0"),
        ({"mk": b"short"}, "32 bytes"),
        ({"mk": "x" * 32}, "32 bytes"),
        ({"mk": None}, "32 bytes"),
        ({"f": 4}, "add flags"),
        ({"f": -1}, "add flags"),
        ({"f": True}, "add flags"),
        ({"zz": 1}, "unknown fields"),
        ({"st": 0}, "unknown fields"),
    ],
)
def test_add_request_field_checks(changes: dict[str, Any], why: str) -> None:
    err = reject_request(with_header(add_header(**changes), [b"e"]))
    assert why in str(err) and err.rid == RID and err.op == OpCode.ADD_ENTRY


def test_byte_string_keys_are_unknown_fields() -> None:
    h = add_header()
    h[b"l"] = 1  # type: ignore[index]
    assert "unknown fields" in str(reject_request(with_header(h, [b"e"])))


def test_add_request_entry_count_bounds() -> None:
    assert "payload frames" in str(reject_request(with_header(add_header())))
    too_many = [b"e"] * (limits.entries_per_add_request_max + 1)
    assert "payload frames" in str(reject_request(with_header(add_header(), too_many)))
    ok = decode_request(with_header(add_header(), [b"e"] * limits.entries_per_add_request_max))
    assert isinstance(ok, AddRequest) and len(ok.entries) == limits.entries_per_add_request_max


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"e": -1}, "int64 >= 0"),
        ({"n": 0}, "n must be"),
        ({"n": limits.entries_per_read_request_max + 1}, "n must be"),
        ({"e": I64_MAX, "n": 2}, "overflows"),
        ({"f": ReadFlag.FENCE.value}, "master key"),
        ({"f": ReadFlag.LONG_POLL.value}, "missing field"),
        ({"f": ReadFlag.LONG_POLL.value, "pl": 5}, "missing field 'to'"),
        ({"f": ReadFlag.LONG_POLL.value, "pl": -2, "to": 5}, "pl must be"),
        ({"f": ReadFlag.LONG_POLL.value, "pl": 3, "to": limits.long_poll_timeout_ms_max + 1}, "to must be"),
        ({"f": ReadFlag.LONG_POLL.value, "pl": 3, "to": -1}, "to must be"),
        ({"pl": 3}, "only for LONG_POLL"),
        ({"f": 3, "mk": MK, "pl": 1, "to": 1}, "exclude each other"),
        ({"f": 8}, "read flags"),
        ({"sm": 3, "sr": 1}, "only for SPARSE"),
        ({"f": ReadFlag.SPARSE.value, "sm": 3}, "come together"),
        ({"f": ReadFlag.SPARSE.value, "sr": 0}, "come together"),
        ({"f": ReadFlag.SPARSE.value, "sm": 0, "sr": 0}, "sm must be"),
        ({"f": ReadFlag.SPARSE.value, "sm": limits.ledger_ensemble_size_max + 1, "sr": 0}, "sm must be"),
        ({"f": ReadFlag.SPARSE.value, "sm": 3, "sr": 3}, "sr must be"),
        ({"f": ReadFlag.SPARSE.value, "sm": 3, "sr": -1}, "sr must be"),
        ({"f": ReadFlag.SPARSE.value, "sm": 3, "sr": "1"}, "sr must be"),
    ],
)
def test_read_request_field_checks(changes: dict[str, Any], why: str) -> None:
    err = reject_request(with_header(read_header(**changes)))
    assert why in str(err) and err.rid == RID


def test_read_request_defaults_and_long_poll() -> None:
    plain = decode_request(with_header(read_header()))
    assert plain == ReadRequest(rid=RID, ledger_id=7, first_entry_id=0)
    polled = decode_request(with_header(read_header(f=2, pl=4, to=1000, n=10)))
    assert polled == ReadRequest(
        rid=RID,
        ledger_id=7,
        first_entry_id=0,
        count=10,
        flags=ReadFlag.LONG_POLL,
        previous_lac=4,
        timeout_ms=1000,
    )


def test_read_request_stripe() -> None:
    striped = decode_request(with_header(read_header(f=ReadFlag.SPARSE.value, n=300, sm=3, sr=2)))
    assert striped == ReadRequest(rid=RID, ledger_id=7, first_entry_id=0, count=300, flags=ReadFlag.SPARSE,
                                  stripe=(3, 2))


def test_requests_without_payload_refuse_payload_frames() -> None:
    assert "payload frames" in str(reject_request(with_header(read_header(), [b"x"])))


def test_unknown_op_and_error_op_are_not_requests() -> None:
    for op in (99, -1, OpCode.ERROR.value, True, "1", 1.0):
        err = reject_request(with_header(add_header(op=op), [b"e"]))
        assert "op" in str(err) and err.rid == RID and err.op is None


def test_response_checks() -> None:
    def reject(h: dict[str, Any], payload: list[bytes] | None = None) -> str:
        with pytest.raises(FrameError) as info:
            decode_response(with_header(h, payload))
        assert info.value.rid == RID
        return str(info.value)

    base = {"v": limits.PROTOCOL_VERSION, "rid": RID}
    assert "EOK" in reject({**base, "op": 0, "st": 0})
    assert "st must be" in reject({**base, "op": 0, "st": 99})
    assert "st must be" in reject({**base, "op": 0, "st": False})
    add = {**base, "op": 1, "st": 0, "l": 1, "e0": 5, "e1": 4}
    assert "e0 5 > e1 4" in reject(add)
    read = {**base, "op": 2, "st": 0, "l": 1, "e": 0, "lac": -1}
    assert "EOK with no entries" in reject(read)
    assert decode_response(with_header({**read, "st": Status.ENOENTRY.value})) == ReadResponse(
        rid=RID, status=Status.ENOENTRY, ledger_id=1, first_entry_id=0, lac=-1
    )
    assert "lac must be" in reject({**read, "lac": -2}, [b"x"])
    lac = {**base, "op": 3, "st": 0, "l": 1, "lac": 3}
    assert "payload frames" in reject(lac, [b"a", b"b"])
    assert decode_response(with_header(lac, [b"a"])) == ReadLacResponse(
        rid=RID, status=Status.EOK, ledger_id=1, lac=3, last_entry=b"a"
    )
    info = {**base, "op": 7, "st": 0, "fb": 10, "tb": 5, "bs": "writable", "nl": 1, "nll": 0}
    assert "fb 10 > tb 5" in reject(info)
    assert "bs must be" in reject({**info, "fb": 1, "bs": "broken"})
    listing = {**base, "op": 8, "st": 0, "l": 1}
    assert "payload frames" in reject(listing)
    assert "ranges" in reject(listing, [b"\x00" * 15])
    overlapping = (
        (0).to_bytes(8, "big") + (5).to_bytes(8, "big") + (5).to_bytes(8, "big") + (6).to_bytes(8, "big")
    )
    assert "ranges" in reject(listing, [overlapping])
    adjacent = (
        (0).to_bytes(8, "big") + (4).to_bytes(8, "big") + (5).to_bytes(8, "big") + (6).to_bytes(8, "big")
    )
    assert "ranges" in reject(listing, [adjacent])
    good = (0).to_bytes(8, "big") + (4).to_bytes(8, "big") + (6).to_bytes(8, "big") + (6).to_bytes(8, "big")
    assert decode_response(with_header(listing, [good])) == ListEntriesResponse(
        rid=RID, status=Status.EOK, ledger_id=1, entry_ranges=((0, 4), (6, 6))
    )


def test_a_request_is_not_a_response() -> None:
    frames = encode(ReadRequest(rid=RID, ledger_id=1, first_entry_id=0))
    with pytest.raises(FrameError) as info:
        decode_response(frames)
    assert info.value.rid == RID
    with pytest.raises(FrameError):
        decode_request(
            encode(AddResponse(rid=RID, status=Status.EOK, ledger_id=1, first_entry_id=0, last_entry_id=0))
        )


# --- size limits -----------------------------------------------------------------------------------


def test_oversized_header_is_rejected_before_decoding() -> None:
    h = add_header(pad=b"x" * limits.header_bytes_max)
    err = reject_request(with_header(h, [b"e"]))
    assert "header of" in str(err) and err.rid is None


def test_total_size_over_max_frame_bytes_is_rejected_with_rid() -> None:
    frames = with_header(add_header(), [b"x" * 600, b"y" * 600])
    err = reject_request(frames, max_frame_bytes=1000)
    assert "max_frame_bytes" in str(err) and err.rid == RID
    assert isinstance(decode_request(frames, max_frame_bytes=2000), AddRequest)


def test_max_frame_bytes_boundary() -> None:
    frames = with_header(add_header(), [b"x" * 100])
    total = sum(len(f) for f in frames)
    assert isinstance(decode_request(frames, max_frame_bytes=total), AddRequest)
    assert reject_request(frames, max_frame_bytes=total - 1).rid == RID


@pytest.mark.parametrize(
    "value",
    [[1], {"a": 1}, cbor2.CBORTag(30, [2**4000, 3]), cbor2.CBORTag(2, b"\x01" * 64), cbor2.CBORTag(9999, 1)],
)
def test_nested_values_and_tags_are_refused_by_the_parser(value: Any) -> None:
    # Refused while parsing (max_depth=1), before cbor2 builds big ints, fractions or other
    # objects; the rid is lost with it, a price worth paying for a bounded parse.
    err = reject_request(with_header(add_header(l=value), [b"e"]))
    assert "undecodable header" in str(err) and err.rid is None


def test_read_response_entry_count_bound() -> None:
    h = {"v": limits.PROTOCOL_VERSION, "op": 2, "rid": RID, "st": 0, "l": 1, "e": 0, "lac": 5}
    frames = with_header(h, [b"e"] * (limits.entries_per_read_request_max + 1))
    with pytest.raises(FrameError):
        decode_response(frames)


def test_encode_multi_add_statuses_is_the_encoding_of_the_response():
    from zbk.wire.codec import encode_multi_add_statuses
    from zbk.wire.messages import MultiAddResponse

    codes = [Status.EOK, Status.EFENCED, Status.ETOOMANYREQUESTS, Status.EOK, Status.EUA]
    for rid, statuses in ((0, codes), (2**64 - 1, codes[:1]), (77, [Status.EOK] * limits.ledgers_per_multi_add_max)):
        frames = encode_multi_add_statuses(rid, bytearray(int(s) for s in statuses))
        want = encode(MultiAddResponse(rid=rid, status=Status.EOK, statuses=statuses))
        assert [bytes(f) for f in frames] == [bytes(f) for f in want]
        resp = decode_response(frames)
        assert isinstance(resp, MultiAddResponse) and list(resp.statuses) == statuses and resp.rid == rid
        assert all(type(s) is Status for s in resp.statuses)  # all-EOK answers take a shortcut
    with pytest.raises(FrameError, match="status code"):
        decode_response(encode_multi_add_statuses(5, bytearray([0, 0, 250])))


@given(st.integers(0, I64_MAX), st.binary(min_size=32, max_size=32), st.sampled_from(list(AddFlag)),
       st.lists(st.binary(max_size=40), min_size=1, max_size=4).map(tuple))
def test_add_part_is_the_ordinary_frozen_add_request(ledger_id: int, key: bytes, flags: AddFlag,
                                                      entries: tuple[bytes, ...]) -> None:
    fast = add_part(ledger_id, key, flags, entries)
    slow = AddRequest(rid=0, ledger_id=ledger_id, master_key=key, flags=flags, entries=entries)
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert type(fast) is AddRequest and dataclasses.astuple(fast) == dataclasses.astuple(slow)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.ledger_id = 1  # type: ignore[misc]
    assert encode(MultiAddRequest(rid=9, parts=(fast,))) == encode(MultiAddRequest(rid=9, parts=(slow,)))
