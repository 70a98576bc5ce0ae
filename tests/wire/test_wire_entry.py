"""The entry blob format and the digests that protect it."""

from __future__ import annotations

import hashlib
import hmac
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zbk import limits
from zbk.client.digest import DIGEST_KINDS, Digest, mac_key, make_digest, master_key
from zbk.errors import BadRequestError, DigestMismatchError
from zbk.wire.entry import (
    DIGEST_BYTES,
    ENTRY_FORMAT_VERSION,
    ENTRY_HEADER_BYTES,
    DigestType,
    build_entry,
    parse_entry,
    peek_entry_header,
    with_lac,
)
from zbk.wire.errors import FrameError
from zbk.wire.messages import MASTER_KEY_BYTES

I64_MAX = 2**63 - 1
CHECKING_KINDS = [k for k in DIGEST_KINDS if k != "dummy"]


@pytest.fixture(params=DIGEST_KINDS)
def digest(request: pytest.FixtureRequest) -> Digest:
    return make_digest(request.param, b"secret")


@st.composite
def entry_fields(draw: st.DrawFn) -> tuple[int, int, int, bytes]:
    entry_id = draw(st.integers(0, I64_MAX))
    return (
        draw(st.integers(0, I64_MAX)),
        entry_id,
        draw(st.integers(-1, entry_id - 1)),
        draw(st.binary(max_size=300)),
    )


@settings(max_examples=100, deadline=None)
@given(entry_fields(), st.sampled_from(DIGEST_KINDS), st.data())
def test_with_lac_is_the_entry_built_with_that_lac(fields: tuple[int, int, int, bytes], kind: str,
                                                    data: st.DataObject) -> None:
    ledger_id, entry_id, lac, payload = fields
    digest = make_digest(kind, b"secret")
    total = data.draw(st.integers(len(payload), I64_MAX))
    newer = data.draw(st.integers(-1, entry_id - 1))
    blob = build_entry(ledger_id, entry_id, lac, payload, digest, ledger_length=total)
    assert with_lac(blob, newer, digest) == build_entry(ledger_id, entry_id, newer, payload, digest, ledger_length=total)


@settings(max_examples=200, deadline=None)
@given(entry_fields(), st.sampled_from(DIGEST_KINDS), st.binary(max_size=16))
def test_build_then_parse_and_peek(fields: tuple[int, int, int, bytes], kind: str, password: bytes) -> None:
    ledger_id, entry_id, lac, payload = fields
    digest = make_digest(kind, password)
    blob = build_entry(ledger_id, entry_id, lac, payload, digest)
    assert len(blob) == ENTRY_HEADER_BYTES + digest.size + len(payload)
    assert peek_entry_header(blob) == (ledger_id, entry_id, lac)
    assert peek_entry_header(memoryview(blob)) == (ledger_id, entry_id, lac)
    parsed = parse_entry(blob, make_digest(kind, password), ledger_id=ledger_id, entry_id=entry_id)
    assert (parsed.ledger_id, parsed.entry_id, parsed.lac) == (ledger_id, entry_id, lac)
    assert parsed.payload == payload and isinstance(parsed.payload, memoryview)


def test_layout_is_the_documented_one() -> None:
    blob = build_entry(7, 5, 4, b"abc", make_digest("crc32", b""), ledger_length=103)
    assert blob[:38] == struct.pack(">BBqqqQI", ENTRY_FORMAT_VERSION, DigestType.CRC32, 7, 5, 4, 103, 3)
    assert blob[38:42] == zlib.crc32(b"abc", zlib.crc32(blob[:38])).to_bytes(4, "big")
    assert blob[42:] == b"abc"
    assert parse_entry(blob, make_digest("crc32", b"")).ledger_length == 103
    assert DIGEST_BYTES == {
        DigestType.DUMMY: 0,
        DigestType.CRC32: 4,
        DigestType.CRC32C: 4,
        DigestType.HMAC_SHA256: 32,
    }


def test_digest_sizes_and_types() -> None:
    sizes = {kind: make_digest(kind, b"pw").size for kind in DIGEST_KINDS}
    assert sizes == {"crc32": 4, "crc32c": 4, "hmac": 32, "dummy": 0}
    with pytest.raises(BadRequestError):
        make_digest("md5", b"pw")
    assert "secret" not in repr(make_digest("hmac", b"secret"))


@pytest.mark.parametrize("kind", CHECKING_KINDS)
def test_every_single_byte_change_is_detected(kind: str) -> None:
    digest = make_digest(kind, b"pw")
    blob = build_entry(11, 40, 39, b"some payload bytes", digest)
    for pos in range(len(blob)):
        for xor in (0x01, 0x80, 0xFF):
            tampered = bytearray(blob)
            tampered[pos] ^= xor
            with pytest.raises(DigestMismatchError):
                parse_entry(bytes(tampered), digest)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CHECKING_KINDS), st.binary(min_size=1, max_size=64), st.data())
def test_any_payload_change_is_detected(kind: str, payload: bytes, data: st.DataObject) -> None:
    digest = make_digest(kind, b"pw")
    blob = build_entry(1, 2, 1, payload, digest)
    other = data.draw(st.binary(min_size=len(payload), max_size=len(payload)).filter(lambda p: p != payload))
    with pytest.raises(DigestMismatchError):
        parse_entry(blob[: -len(payload)] + other, digest)


def test_dummy_checks_structure_but_not_payload() -> None:
    digest = make_digest("dummy", b"pw")
    blob = build_entry(1, 2, 1, b"payload", digest)
    assert bytes(parse_entry(blob[:-1] + b"X", digest).payload) == b"payloaX"  # undetected, by design
    with pytest.raises(DigestMismatchError):
        parse_entry(blob[:-1], digest)  # length no longer matches the header
    with pytest.raises(DigestMismatchError):
        parse_entry(blob, digest, entry_id=3)


def test_hmac_with_the_wrong_password_mismatches() -> None:
    blob = build_entry(1, 0, -1, b"payload", make_digest("hmac", b"right"))
    with pytest.raises(DigestMismatchError):
        parse_entry(blob, make_digest("hmac", b"wrong"))
    assert parse_entry(blob, make_digest("hmac", b"right")).entry_id == 0


@pytest.mark.parametrize("kind", ["crc32", "crc32c"])
def test_crc_digests_do_not_depend_on_the_password(kind: str) -> None:
    blob = build_entry(1, 0, -1, b"payload", make_digest(kind, b"one"))
    assert parse_entry(blob, make_digest(kind, b"two")).lac == -1


def test_a_blob_of_another_digest_type_is_refused(digest: Digest) -> None:
    for other in DIGEST_KINDS:
        if other != digest.kind:
            blob = build_entry(1, 1, 0, b"x", make_digest(other, b"secret"))
            with pytest.raises(DigestMismatchError, match="digest type"):
                parse_entry(blob, digest)


def test_wrong_ids_are_refused(digest: Digest) -> None:
    blob = build_entry(5, 6, 2, b"x", digest)
    parse_entry(blob, digest, ledger_id=5, entry_id=6)
    with pytest.raises(DigestMismatchError):
        parse_entry(blob, digest, ledger_id=4)
    with pytest.raises(DigestMismatchError):
        parse_entry(blob, digest, entry_id=7)


def test_payload_size_limit(digest: Digest) -> None:
    with pytest.raises(BadRequestError):
        build_entry(1, 0, -1, bytes(limits.entry_bytes_max + 1), digest)
    blob = build_entry(1, 0, -1, memoryview(bytes(limits.entry_bytes_max)), digest)
    assert peek_entry_header(blob) == (1, 0, -1)


def _raw(version: int = 1, dtype: int = 0, lid: int = 1, eid: int = 1, lac: int = 0, size: int = 0,
         total: int | None = None) -> bytes:
    total = size if total is None else total
    return struct.pack(">BBqqqQI", version, dtype, lid, eid, lac, total, size) + bytes(
        DIGEST_BYTES.get(dtype, 0) + size
    )


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\x01" * (ENTRY_HEADER_BYTES - 1),
        _raw(version=2),
        _raw(version=0),
        _raw(dtype=9),
        _raw(lid=-1),
        _raw(eid=-1, lac=-2),
        _raw(eid=3, lac=3),  # the LAC is always below the entry's own id
        _raw(eid=3, lac=-2),
        _raw(size=5)[:-1],
        _raw(size=5) + b"x",
        struct.pack(">BBqqqQI", 1, 0, 1, 1, 0, limits.entry_bytes_max + 1, limits.entry_bytes_max + 1),
        _raw(size=5, total=4),  # a ledger can not be shorter than its last entry
        "not bytes",
        None,
    ],
)
def test_peek_rejects_malformed_blobs(blob: bytes) -> None:
    with pytest.raises(FrameError):
        peek_entry_header(blob)
    with pytest.raises(DigestMismatchError):
        parse_entry(blob, make_digest("dummy", b""))


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=120))
def test_peek_and_parse_of_garbage_raise_only_typed_errors(blob: bytes) -> None:
    try:
        lid, eid, lac = peek_entry_header(blob)
        assert lid >= 0 and eid >= 0 and -1 <= lac < eid
    except FrameError:
        pass
    for kind in DIGEST_KINDS:
        try:
            parse_entry(blob, make_digest(kind, b"pw"))
        except DigestMismatchError:
            pass


def test_master_key() -> None:
    key = master_key(b"pw")
    assert len(key) == MASTER_KEY_BYTES and key == master_key(b"pw")
    assert key != master_key(b"pw2") and key != master_key(b"")
    # The bookie learns the master key; it must not be the HMAC key (forgery) nor the password.
    assert key != mac_key(b"pw") and b"pw" not in key


def test_hmac_is_keyed_by_the_mac_key_not_the_master_key() -> None:
    blob = build_entry(1, 0, -1, b"payload", make_digest("hmac", b"pw"))
    header, code = blob[:ENTRY_HEADER_BYTES], blob[ENTRY_HEADER_BYTES : ENTRY_HEADER_BYTES + 32]
    assert code == hmac.new(mac_key(b"pw"), header + b"payload", hashlib.sha256).digest()
    # A bookie holds the master key: an entry it forges with it must not verify.
    forged = header + hmac.new(master_key(b"pw"), header + b"payload", hashlib.sha256).digest() + b"payload"
    with pytest.raises(DigestMismatchError):
        parse_entry(forged, make_digest("hmac", b"pw"))
