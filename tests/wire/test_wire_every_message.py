"""Every message type of zbk/wire/messages.py, one by one: round trips, garbage, junk fields.

The type list is taken from the ``Request`` and ``Response`` unions, so a message added to
the protocol is fuzzed here from the moment it exists (and this file fails if a message
class is defined but left out of both unions, or has a field no strategy knows).
Hypothesis prints the seed and the shrunk input of any failure (replay: --hypothesis-seed).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wire_strategies import REQUEST_TYPES, RESPONSE_TYPES, strategy_for

from zbk.wire import messages
from zbk.wire.codec import decode_request, decode_response, encode
from zbk.wire.errors import FrameError
from zbk.wire.status import Status

PER_TYPE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALL_TYPES = [*REQUEST_TYPES, *RESPONSE_TYPES]


def _decoder(cls: type) -> Any:
    return decode_request if cls in REQUEST_TYPES else decode_response


def _other_decoder(cls: type) -> Any:
    return decode_response if cls in REQUEST_TYPES else decode_request


def _decode_or_frame_error(decode: Any, frames: list[Any]) -> Any:
    """A message, or None after a FrameError with coherent fields; anything else fails."""
    try:
        return decode(frames)
    except FrameError as err:
        assert err.status in (Status.EBADREQ, Status.EBADVERSION), err
        assert err.rid is None or (type(err.rid) is int and 0 <= err.rid < 2**64), err
        return None


def test_every_message_class_is_in_a_union_and_has_a_strategy() -> None:
    defined = {
        obj for _, obj in inspect.getmembers(messages, inspect.isclass)
        if dataclasses.is_dataclass(obj) and obj.__module__ == messages.__name__
    }
    assert defined == set(ALL_TYPES), f"not in Request/Response: {sorted(c.__name__ for c in defined - set(ALL_TYPES))}"
    assert not set(REQUEST_TYPES) & set(RESPONSE_TYPES)
    for cls in ALL_TYPES:
        strategy_for(cls)  # KeyError names a field without a strategy


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@PER_TYPE
@given(data=st.data())
def test_round_trip(cls: type, data: st.DataObject) -> None:
    msg = data.draw(strategy_for(cls))
    frames = encode(msg)
    assert _decoder(cls)(frames) == msg
    # The same frames as zero-copy views (what the socket loops hand over).
    assert _decoder(cls)([memoryview(bytes(f)) for f in frames]) == msg


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@PER_TYPE
@given(data=st.data())
def test_the_other_direction_is_refused_with_the_rid(cls: type, data: st.DataObject) -> None:
    """A request fed to the response decoder (and vice versa) is never mistaken for a message."""
    msg = data.draw(strategy_for(cls))
    with pytest.raises(FrameError) as info:
        _other_decoder(cls)(encode(msg))
    assert info.value.rid == msg.rid


@st.composite
def _mutated(draw: st.DrawFn, cls: type) -> list[Any]:
    frames = [bytes(f) for f in encode(draw(strategy_for(cls)))]
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(frames) - 1))
        frame = frames[i]
        kind = draw(st.sampled_from(["flip", "truncate", "extend", "drop_frame", "add_frame", "replace"]))
        if kind == "flip" and frame:
            pos = draw(st.integers(0, len(frame) - 1))
            frames[i] = frame[:pos] + bytes([frame[pos] ^ (1 << draw(st.integers(0, 7)))]) + frame[pos + 1:]
        elif kind == "truncate":
            frames[i] = frame[: draw(st.integers(0, len(frame)))]
        elif kind == "extend":
            frames[i] = frame + draw(st.binary(min_size=1, max_size=16))
        elif kind == "drop_frame":
            del frames[i]
            if not frames:
                frames = [b""]
        elif kind == "add_frame":
            frames.insert(i + 1, draw(st.binary(max_size=24)))
        else:
            frames[i] = draw(st.binary(max_size=len(frame) + 8))
    return frames


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@PER_TYPE
@given(data=st.data())
def test_mutated_frames_decode_or_raise_frame_error(cls: type, data: st.DataObject) -> None:
    frames = data.draw(_mutated(cls))
    for decode in (decode_request, decode_response):
        _decode_or_frame_error(decode, frames)


_SCALAR_JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**64), 2**64 - 1), st.floats(allow_nan=True),
    st.binary(max_size=40), st.text(max_size=10),
)
_CONTAINER_JUNK = st.one_of(st.lists(st.integers(), max_size=2),
                            st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@pytest.mark.parametrize("cls", ALL_TYPES, ids=lambda c: c.__name__)
@PER_TYPE
@given(data=st.data())
def test_junk_in_any_header_field_is_refused_or_valid(cls: type, data: st.DataObject) -> None:
    """Replace one header value (or add an unknown key) with junk of any CBOR type: the
    decoder answers a valid message or a FrameError. A scalar outside the rid leaves the
    request id readable, so the error names it; a container is always refused (the parser
    refuses nesting, so the error may have no rid)."""
    msg = data.draw(strategy_for(cls))
    frames = encode(msg)
    header = cbor2.loads(frames[0])
    key = data.draw(st.sampled_from([*sorted(header), "zz"]))
    container = data.draw(st.booleans())
    header[key] = data.draw(_CONTAINER_JUNK if container else _SCALAR_JUNK)
    if container:
        with pytest.raises(FrameError) as info:
            _decoder(cls)([cbor2.dumps(header), *frames[1:]])
        assert info.value.rid in (None, msg.rid)  # an empty container may pass the parser
        return
    decoded = _decode_or_frame_error(_decoder(cls), [cbor2.dumps(header), *frames[1:]])
    if decoded is None and key not in ("rid", "v"):
        with pytest.raises(FrameError) as info:
            _decoder(cls)([cbor2.dumps(header), *frames[1:]])
        assert info.value.rid == msg.rid
    if decoded is not None:
        assert type(decoded) is cls or key == "op"
