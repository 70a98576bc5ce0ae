"""Ledger metadata: encoding, validation, state transitions, and corrupt values (which are
always a CorruptMetadataError naming the ledger, never a crash)."""

from __future__ import annotations

import dataclasses
import itertools

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zbk import limits
from zbk.errors import BadRequestError, CorruptMetadataError, InvalidStateTransitionError
from zbk.metadata import layout
from zbk.metadata.ledger import STATES, LedgerMetadata
from zbk.metadata.registry import BookieRegistration, Cookie, LedgerStore
from zbk.metadata.store import MetadataStore

B = ("b1:3181", "b2:3181", "b3:3181", "b4:3181")


def md(**kw: object) -> LedgerMetadata:
    args: dict[str, object] = dict(ledger_id=5, ensemble_size=3, write_quorum=2, ack_quorum=2, password=b"pw",
                                   fragments=((0, B[:3]),))
    args.update(kw)
    return LedgerMetadata(**args)  # type: ignore[arg-type]


def test_encode_decode_roundtrip() -> None:
    full = md(digest="hmac", state="CLOSED", last_entry_id=41, length=4096,
              fragments=((0, B[:3]), (10, (B[0], B[3], B[2])), (30, (B[3], B[1], B[2]))),
              custom_metadata={"app": b"orders", "empty": b""}, ctime_ms=1_700_000_000_000, creator_token=b"tok")
    assert LedgerMetadata.decode(full.encode(), ledger_id=5) == full
    assert LedgerMetadata.decode(md().encode()) == md()
    assert full.ensembles == {0: list(B[:3]), 10: [B[0], B[3], B[2]], 30: [B[3], B[1], B[2]]}


@pytest.mark.parametrize("e,wq,aq", [(3, 4, 2), (3, 2, 3), (3, 3, 0), (0, 0, 0), (limits.ledger_ensemble_size_max + 1, 2, 2)])
def test_quorums_must_satisfy_e_ge_wq_ge_aq_ge_1(e: int, wq: int, aq: int) -> None:
    bookies = tuple(f"b{i}:1" for i in range(e))
    with pytest.raises(BadRequestError, match="E >= WQ >= AQ >= 1"):
        md(ensemble_size=e, write_quorum=wq, ack_quorum=aq, fragments=((0, bookies),)).validate()


@pytest.mark.parametrize("change,message", [
    (dict(ledger_id=-1), "ledger id"),
    (dict(ledger_id=1 << 63), "ledger id"),
    (dict(digest="md5"), "digest"),
    (dict(password=b"x" * 2000), "password"),
    (dict(state="DELETED"), "state"),
    (dict(last_entry_id=-2), "last entry id"),
    (dict(fragments=()), "at least one fragment"),
    (dict(fragments=((1, B[:3]),)), "start at entry 0"),
    (dict(fragments=((0, B[:3]), (0, B[1:4]))), "increasing"),
    (dict(fragments=((0, B[:2]),)), "ensemble size"),
    (dict(fragments=((0, (B[0], B[0], B[1])),)), "twice"),
    (dict(custom_metadata={"k": b"x" * 70_000}), "custom metadata"),
])
def test_validation_errors(change: dict[str, object], message: str) -> None:
    with pytest.raises(BadRequestError, match=message):
        md(**change).validate()
    with pytest.raises(BadRequestError):
        md(**change).encode()  # nothing invalid is ever written


ALLOWED = {("OPEN", "OPEN"), ("OPEN", "IN_RECOVERY"), ("OPEN", "CLOSED"),
           ("IN_RECOVERY", "IN_RECOVERY"), ("IN_RECOVERY", "CLOSED")}


@pytest.mark.parametrize("src,dst", list(itertools.product(STATES, STATES)))
def test_state_transitions(src: str, dst: str) -> None:
    start = md(state=src)
    if (src, dst) in ALLOWED:
        assert start.with_state(dst).state == dst
    else:
        with pytest.raises(InvalidStateTransitionError, match="ledger 5"):
            start.with_state(dst)


def test_close_drops_empty_trailing_fragments_and_freezes() -> None:
    m = md().with_fragment(10, (B[3], B[1], B[2])).with_fragment(20, (B[3], B[0], B[2]))
    closed = m.closed(last_entry_id=15, length=160)
    assert [first for first, _ in closed.fragments] == [0, 10]
    assert closed.fragment_end(1) == 15
    with pytest.raises(InvalidStateTransitionError):
        closed.with_fragment(16, B[:3])
    with pytest.raises(InvalidStateTransitionError):
        closed.with_state("OPEN")


def test_write_set_is_round_robin() -> None:
    m = md(ensemble_size=4, write_quorum=3, ack_quorum=2, fragments=((0, B),))
    assert m.write_set(0) == [B[0], B[1], B[2]]
    assert m.write_set(2) == [B[2], B[3], B[0]]


def _corrupt_cases() -> list[tuple[str, bytes]]:
    good = cbor2.loads(md().encode())
    return [
        ("not cbor", b"\xff\xfe garbage"),
        ("empty", b""),
        ("truncated", md().encode()[:-3]),
        ("a list", cbor2.dumps([1, 2, 3])),
        ("future format", cbor2.dumps({**good, "fv": 2})),
        ("no format", cbor2.dumps({k: v for k, v in good.items() if k != "fv"})),
        ("missing field", cbor2.dumps({k: v for k, v in good.items() if k != "wq"})),
        ("wrong type", cbor2.dumps({**good, "e": "three"})),
        ("bool as int", cbor2.dumps({**good, "aq": True})),
        ("bad fragments", cbor2.dumps({**good, "fr": [[0]]})),
        ("invalid quorum", cbor2.dumps({**good, "wq": 9})),
        ("other ledger", cbor2.dumps({**good, "id": 6})),
    ]


@pytest.mark.parametrize("name,data", _corrupt_cases(), ids=[n for n, _ in _corrupt_cases()])
def test_corrupt_values_name_the_ledger(name: str, data: bytes) -> None:
    with pytest.raises(CorruptMetadataError, match="ledger 5"):
        LedgerMetadata.decode(data, ledger_id=5)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_decoding_random_bytes_never_crashes(data: bytes) -> None:
    for decode in (lambda: LedgerMetadata.decode(data, ledger_id=5), lambda: Cookie.decode(data),
                   lambda: BookieRegistration.decode(data)):
        try:
            decode()
        except CorruptMetadataError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_decoding_mutated_metadata_never_crashes(data: st.DataObject) -> None:
    raw = bytearray(md(custom_metadata={"a": b"b"}).encode())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        decoded = LedgerMetadata.decode(bytes(raw), ledger_id=5)
    except CorruptMetadataError:
        return
    assert decoded.validate() is decoded  # whatever decodes is valid


def test_ledger_store_read_of_garbage_is_corrupt_metadata(store: MetadataStore) -> None:
    ledgers = LedgerStore(store)
    store.put(layout.ledger_key(77), b"\x9f\x01garbage")
    with pytest.raises(CorruptMetadataError, match="ledger 77"):
        ledgers.read(77)
    store.put(layout.ledger_key(78), dataclasses.replace(md(), ledger_id=79).encode())
    with pytest.raises(CorruptMetadataError, match="ledger 78"):
        ledgers.read(78)
    assert list(ledgers.list_ids()) == [77, 78], "listing does not decode values"


def test_registration_and_cookie_formats_are_versioned() -> None:
    reg = BookieRegistration("h:1", rack="/r", http_url="http://h:8000", state="readonly")
    assert BookieRegistration.decode(reg.encode(), bookie_id="h:1") == reg
    with pytest.raises(CorruptMetadataError, match="bookie h:2"):
        BookieRegistration.decode(reg.encode(), bookie_id="h:2")
    raw = cbor2.loads(reg.encode())
    with pytest.raises(CorruptMetadataError, match="format version 9"):
        BookieRegistration.decode(cbor2.dumps({**raw, "fv": 9}))
    # Zone and isolation group: written only when set, so a registration without them is
    # what older bookies write, and theirs (no "zn", "ig") decodes with both empty.
    placed = dataclasses.replace(reg, zone="z1", isolation_group="gold")
    assert BookieRegistration.decode(placed.encode()) == placed
    assert "zn" not in raw and "ig" not in raw
    assert cbor2.loads(placed.encode()) == {**raw, "zn": "z1", "ig": "gold"}
    with pytest.raises(CorruptMetadataError, match="zn"):
        BookieRegistration.decode(cbor2.dumps({**raw, "zn": 3}))
    cookie = Cookie.new("h:1", "inst", journal_dirs=["/j"], ledger_dirs=["/l"], index_dirs=["/l"])
    assert Cookie.decode(cookie.encode()) == cookie
    with pytest.raises(CorruptMetadataError, match="local cookie"):
        Cookie.decode(cbor2.dumps({**cbor2.loads(cookie.encode()), "jd": "/j"}), source="local cookie")
    assert Cookie.new("h:1", "inst", journal_dirs=[], ledger_dirs=[], index_dirs=[]).incarnation != cookie.incarnation


def test_cookie_bytes_are_the_bookies_local_cookie_body() -> None:
    """The metadata copy and the bookie's local copy are the same bytes (either decodes
    the other), so the boot-time comparison never depends on which side wrote them."""
    from zbk.storage import cookie as local

    mine = Cookie.new("h:1", "inst", journal_dirs=["/j"], ledger_dirs=["/l1", "/l2"], index_dirs=["/x"])
    theirs = local.decode_cookie(mine.encode())
    assert mine.encode() == theirs.encode()
    assert Cookie.decode(theirs.encode()) == mine


def test_decoded_metadata_of_many_ledgers_share_their_bookie_ids_and_names() -> None:
    """A client reading 10,000 ledgers' metadata keeps one copy of each bookie id, digest
    and state name; the values are those encoded."""
    ids = ["bookie-a:3181", "bookie-b:3181", "bookie-c:3181"]
    mds = [LedgerMetadata.decode(LedgerMetadata(ledger_id=lid, ensemble_size=3, write_quorum=2, ack_quorum=2,
                                                fragments=((0, tuple("".join(list(b)) for b in ids)),)).encode())
           for lid in (1, 2)]
    assert mds[0].fragments == mds[1].fragments == ((0, tuple(ids)),)
    assert all(x is y for x, y in zip(mds[0].last_ensemble, mds[1].last_ensemble, strict=True))
    assert mds[0].digest is mds[1].digest and mds[0].state is mds[1].state == "OPEN"
