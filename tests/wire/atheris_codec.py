"""Coverage-guided fuzzing of the frame decoder with atheris (libFuzzer for Python).

Run by tests/wire/test_wire_atheris.py for a few thousand iterations; by hand for longer:

    .venv/bin/python tests/wire/atheris_codec.py -runs=1000000 -seed=1 [CORPUS_DIR]
    .venv/bin/python tests/wire/atheris_codec.py --write-seeds CORPUS_DIR   # valid messages

Input layout (so that libFuzzer's mutations can add, drop and resize frames): a sequence of
frames, each a little-endian u16 length and that many bytes; a short last length takes what
is left. The property, for both decoders: the result is a message that encodes back to a
message equal to itself, or a FrameError with coherent fields. Any other exception, or an
assertion, is a crash: libFuzzer writes the input to crash-<sha1> in the working directory.
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Any

import atheris

with atheris.instrument_imports():
    from zbk.wire.codec import decode_request, decode_response, encode
    from zbk.wire.errors import FrameError
    from zbk.wire.status import Status

_LEN = struct.Struct("<H")
FRAMES_MAX = 64


def split_frames(data: bytes) -> list[bytes]:
    frames: list[bytes] = []
    pos = 0
    while pos < len(data) and len(frames) < FRAMES_MAX:
        if pos + _LEN.size > len(data):
            frames.append(data[pos:])
            break
        (n,) = _LEN.unpack_from(data, pos)
        pos += _LEN.size
        frames.append(data[pos:pos + n])
        pos += n
    return frames


def join_frames(frames: list[Any]) -> bytes:
    return b"".join(_LEN.pack(len(f)) + bytes(f) for f in frames)


def check(data: bytes) -> None:
    frames = split_frames(data)
    for decode in (decode_request, decode_response):
        try:
            msg = decode(frames)
        except FrameError as err:
            assert err.status in (Status.EBADREQ, Status.EBADVERSION), err
            assert err.rid is None or (type(err.rid) is int and 0 <= err.rid < 2**64), err
            continue
        again = decode(encode(msg))
        assert again == msg, (msg, again)


def write_seeds(directory: str) -> int:
    """One file per valid message of every type (examples drawn from the test strategies)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from wire_strategies import REQUEST_TYPES, RESPONSE_TYPES, strategy_for

    os.makedirs(directory, exist_ok=True)
    n = 0
    for cls in [*REQUEST_TYPES, *RESPONSE_TYPES]:
        strategy = strategy_for(cls)
        for i in range(4):
            msg = strategy.example()
            with open(os.path.join(directory, f"{cls.__name__}-{i}"), "wb") as f:
                f.write(join_frames(encode(msg)))
            n += 1
    return n


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--write-seeds":
        print(f"wrote {write_seeds(sys.argv[2])} seed inputs")
        return
    atheris.Setup(sys.argv, check)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
