"""Micro-benchmark of the hot wire paths (not a test): .venv/bin/python tests/wire/bench_wire_codec.py

Prints the best-of-7 time per call, in microseconds.
"""

from __future__ import annotations

import timeit
from collections.abc import Callable
from functools import partial

from zbk.client.digest import make_digest, master_key
from zbk.wire.codec import decode_request, decode_response, encode
from zbk.wire.entry import build_entry, parse_entry, peek_entry_header
from zbk.wire.messages import AddRequest, AddResponse, Blob, Message, ReadRequest, ReadResponse
from zbk.wire.ops import AddFlag
from zbk.wire.status import Status


def best_us(fn: Callable[[], object], number: int = 50_000) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6


def main() -> None:
    mk = master_key(b"pw")
    crc = make_digest("crc32c", b"pw")
    blob = build_entry(7, 1000, 999, b"x" * 1024, crc)
    batch = tuple(build_entry(7, e, e - 1, b"x" * 1024, crc) for e in range(1000, 1100))
    messages: list[tuple[str, Message]] = [
        (
            "AddRequest (1 entry)",
            AddRequest(rid=12345, ledger_id=7, master_key=mk, flags=AddFlag(0), entries=(blob,)),
        ),
        (
            "AddRequest (100 entries)",
            AddRequest(rid=1, ledger_id=7, master_key=mk, flags=AddFlag(0), entries=batch),
        ),
        (
            "AddResponse",
            AddResponse(rid=12345, status=Status.EOK, ledger_id=7, first_entry_id=1000, last_entry_id=1000),
        ),
        ("ReadRequest", ReadRequest(rid=12345, ledger_id=7, first_entry_id=1000)),
        (
            "ReadResponse (1 entry)",
            ReadResponse(
                rid=1, status=Status.EOK, ledger_id=7, first_entry_id=1000, lac=999, entries=(blob,)
            ),
        ),  # fmt: skip
    ]
    for name, msg in messages:
        frames = encode(msg)
        decode: Callable[[list[Blob]], object] = decode_request if "Request" in name else decode_response
        enc_us = best_us(partial(encode, msg))
        dec_us = best_us(partial(decode, frames))
        print(f"{name:26} header {len(frames[0]):3} B  encode {enc_us:5.2f} us  decode {dec_us:5.2f} us")
    print(f"{'peek_entry_header':26} {best_us(partial(peek_entry_header, blob)):5.2f} us")
    for kind in ("crc32", "crc32c", "hmac", "dummy"):
        digest = make_digest(kind, b"pw")
        entry = build_entry(7, 1000, 999, b"x" * 1024, digest)
        build_us = best_us(partial(build_entry, 7, 1000, 999, b"x" * 1024, digest))
        parse_us = best_us(partial(parse_entry, entry, digest))
        print(f"{'1 KiB entry ' + kind:26} build {build_us:5.2f} us  parse {parse_us:5.2f} us")


if __name__ == "__main__":
    main()
