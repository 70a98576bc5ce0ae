"""The decoders raise nothing but FrameError, whatever they are fed.

Inputs: arbitrary bytes, arbitrary CBOR (nested, tagged, huge ints, floats), headers with our
keys and junk values, and valid messages mutated (bit flips, truncation, splices, dropped or
extra frames). Each test prints nothing on success; Hypothesis prints the seed and the
shrunk input on failure (reproduce with --hypothesis-seed).
"""

from __future__ import annotations

from typing import Any

import cbor2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import I64_MAX, U64_MAX, ints, requests, responses

from zbk import limits
from zbk.wire.codec import decode_request, decode_response, encode
from zbk.wire.errors import FrameError
from zbk.wire.status import Status

FUZZ = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def decode_both(frames: Any) -> None:
    """Both decoders either return a message or raise FrameError with coherent fields."""
    for decode in (decode_request, decode_response):
        try:
            decode(frames)
        except FrameError as err:
            assert err.status in (Status.EBADREQ, Status.EBADVERSION)
            assert err.rid is None or (type(err.rid) is int and 0 <= err.rid < 2**64)


cbor_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**64), 2**64 - 1),
    st.integers(),  # beyond 64 bits: cbor2 writes a bignum tag
    st.floats(allow_nan=True),
    st.binary(max_size=40),
    st.text(max_size=20),
)
cbor_values = st.recursive(
    cbor_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(st.text(max_size=4), st.integers(), st.binary(max_size=4)), inner, max_size=4
        ),
        st.builds(
            cbor2.CBORTag,
            st.sampled_from([0, 1, 2, 3, 4, 5, 25, 28, 29, 30, 35, 37, 258, 55799, 9999]),
            inner,
        ),
    ),
    max_leaves=12,
)
junk_values = st.one_of(
    st.integers(-3, 12),
    st.integers(-(2**64), 2**64 - 1),
    st.binary(min_size=32, max_size=32),
    cbor_scalars,
    st.lists(st.integers(), max_size=2),
    st.builds(cbor2.CBORTag, st.sampled_from([2, 3, 30, 9999]), st.integers(0, 9)),
)
# Plausible values per header key, so that generated headers get past the common checks
# and into each op's field checks (docs/protocol.md lists the keys).
plausible = {
    "l": ints(0, I64_MAX),
    "e": ints(0, I64_MAX),
    "n": ints(0, limits.entries_per_read_request_max + 1),
    "mk": st.binary(min_size=31, max_size=33),
    "f": ints(0, 4),
    "pl": ints(-2, I64_MAX),
    "to": ints(-1, limits.long_poll_timeout_ms_max + 1),
    "lac": ints(-2, I64_MAX),
    "e0": ints(0, I64_MAX),
    "e1": ints(0, I64_MAX),
    "st": ints(0, len(Status)),
    "fb": ints(0, U64_MAX),
    "tb": ints(0, U64_MAX),
    "bs": st.sampled_from(["writable", "readonly", "gone"]),
    "nl": ints(0, I64_MAX),
    "nll": ints(0, I64_MAX),
}
request_keys = {1: "l mk f?", 2: "l e n? f? mk? pl? to?", 3: "l f? mk? pl? to?", 4: "l mk lac", 5: "l", 6: "l mk",
                7: "", 8: "l"}  # fmt: skip
response_keys = {0: "st", 1: "st l e0 e1", 2: "st l e lac", 3: "st l lac", 4: "st l", 5: "st l", 6: "st l",
                 7: "st fb tb bs nl nll", 8: "st l"}  # fmt: skip


@st.composite
def near_valid_headers(draw: st.DrawFn) -> dict[str, Any]:
    """An op's keys with plausible, boundary or junk values; keys sometimes missing or extra."""
    op = draw(st.integers(-1, 9))
    keys = (response_keys if draw(st.booleans()) else request_keys).get(op, "l")
    h: dict[str, Any] = {"v": draw(st.sampled_from([limits.PROTOCOL_VERSION] * 12 + [0, 2, True]))}
    h["op"] = op
    h["rid"] = draw(st.sampled_from([0, 1, 2**32, U64_MAX] * 4 + [-1, U64_MAX + 1, None, 1.0]))
    for key in keys.split():
        optional = key.endswith("?")
        key = key.rstrip("?")
        if draw(st.integers(0, 1 if optional else 15)) == 0:
            continue  # optional keys half the time, required ones sometimes missing
        h[key] = draw(junk_values) if draw(st.integers(0, 15)) == 0 else draw(plausible[key])
    if draw(st.integers(0, 15)) == 0:
        h[draw(st.sampled_from(["zz", "lac", "mk", "st"]))] = draw(junk_values)
    return h


payload_frames = st.lists(st.binary(max_size=40), max_size=3)


@FUZZ
@given(st.lists(st.binary(max_size=200), min_size=0, max_size=4))
def test_arbitrary_bytes(frames: list[bytes]) -> None:
    decode_both(frames)


@FUZZ
@given(cbor_values, payload_frames)
def test_arbitrary_cbor(value: Any, payload: list[bytes]) -> None:
    try:
        header = cbor2.dumps(value)
    except (cbor2.CBOREncodeError, ValueError, TypeError, OverflowError):
        return
    decode_both([header, *payload])


@FUZZ
@given(near_valid_headers(), payload_frames)
def test_near_valid_headers(header: dict[str, Any], payload: list[bytes]) -> None:
    decode_both([cbor2.dumps(header), *payload])


@st.composite
def mutated(draw: st.DrawFn) -> list[Any]:
    frames = [bytes(f) for f in encode(draw(st.one_of(requests, responses)))]
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "drop_frame", "add_frame"]))
        i = draw(st.integers(0, len(frames) - 1))
        frame = frames[i]
        if kind == "flip" and frame:
            pos = draw(st.integers(0, len(frame) - 1))
            frames[i] = frame[:pos] + bytes([frame[pos] ^ (1 << draw(st.integers(0, 7)))]) + frame[pos + 1 :]
        elif kind == "truncate":
            frames[i] = frame[: draw(st.integers(0, len(frame)))]
        elif kind == "insert":
            pos = draw(st.integers(0, len(frame)))
            frames[i] = frame[:pos] + draw(st.binary(min_size=1, max_size=9)) + frame[pos:]
        elif kind == "drop_frame" and len(frames) > 1:
            del frames[i]
        elif kind == "add_frame":
            frames.insert(i + 1, draw(st.binary(max_size=20)))
    # Views of the result too: the socket loop may hand over zero-copy frame buffers.
    views = draw(st.sets(st.integers(0, len(frames) - 1)))
    return [memoryview(f) if i in views else f for i, f in enumerate(frames)]


@FUZZ
@given(mutated())
def test_mutated_valid_messages(frames: list[Any]) -> None:
    decode_both(frames)


@settings(max_examples=300, deadline=None)
@given(st.one_of(requests, responses), st.integers(0, 3000))
def test_decoding_respects_max_frame_bytes(msg: Any, max_frame_bytes: int) -> None:
    frames = encode(msg)
    decode = decode_request if type(msg).__name__.endswith("Request") else decode_response
    total = sum(len(f) for f in frames)
    try:
        assert decode(frames, max_frame_bytes=max_frame_bytes) == msg
        assert total <= max_frame_bytes
    except FrameError as err:
        assert total > max_frame_bytes and err.rid == msg.rid
