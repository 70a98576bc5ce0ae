"""Hypothesis strategies for every valid wire message (shared by the wire tests)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from hypothesis import strategies as st

from zbk import limits
from zbk.wire import messages
from zbk.wire.messages import (
    BOOKIE_STATES,
    MASTER_KEY_BYTES,
    AddRequest,
    AddResponse,
    BookieInfoResponse,
    ErrorResponse,
    ListEntriesResponse,
    MultiAddRequest,
    MultiAddResponse,
    ReadLacRequest,
    ReadLacResponse,
    ReadRequest,
    ReadResponse,
)
from zbk.wire.ops import AddFlag, ReadFlag
from zbk.wire.ranges import ranges_from_ids
from zbk.wire.status import Status

I64_MAX = 2**63 - 1
U64_MAX = 2**64 - 1

# Integers biased to the CBOR length boundaries (23/24, 255/256, 65535/65536, 2**32, 2**63).
_EDGES = [0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1]


def ints(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [e for e in _EDGES + [low, high, -1] if low <= e <= high]
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


rids = ints(0, U64_MAX)
ledger_ids = ints(0, I64_MAX)
entry_ids = ints(0, I64_MAX)
lacs = ints(-1, I64_MAX)
master_keys = st.binary(min_size=MASTER_KEY_BYTES, max_size=MASTER_KEY_BYTES)
statuses = st.sampled_from(list(Status))
blobs = st.one_of(st.binary(max_size=64), st.binary(max_size=64).map(lambda b: memoryview(b)))


def tuples_of_blobs(min_size: int, max_size: int) -> st.SearchStrategy[tuple[bytes | memoryview, ...]]:
    return st.lists(blobs, min_size=min_size, max_size=max_size).map(tuple)


add_requests = st.builds(
    AddRequest,
    rid=rids,
    ledger_id=ledger_ids,
    master_key=master_keys,
    flags=st.sampled_from([AddFlag(v) for v in range(4)]),
    entries=tuples_of_blobs(1, 8),
)


@st.composite
def multi_add_requests(draw: st.DrawFn) -> MultiAddRequest:
    """1..6 parts (rid 0: a part's rid is not on the wire), at most 4,096 entries in all."""
    parts = draw(st.lists(add_requests.map(lambda p: dataclasses.replace(p, rid=0)), min_size=1, max_size=6))
    return MultiAddRequest(rid=draw(rids), parts=tuple(parts))


@st.composite
def _read_options(draw: st.DrawFn) -> dict[str, Any]:
    flags = draw(st.sampled_from([ReadFlag(0), ReadFlag.FENCE, ReadFlag.LONG_POLL]))
    fence, long_poll = bool(flags & ReadFlag.FENCE), bool(flags & ReadFlag.LONG_POLL)
    options: dict[str, Any] = {
        "flags": flags,
        "master_key": draw(master_keys) if fence else draw(st.none() | master_keys),
    }
    if long_poll:
        options["previous_lac"] = draw(lacs)
        options["timeout_ms"] = draw(ints(0, limits.long_poll_timeout_ms_max))
    return options


@st.composite
def read_requests(draw: st.DrawFn) -> ReadRequest:
    count = draw(ints(1, limits.entries_per_read_request_max))
    first = draw(ints(0, I64_MAX - count + 1))
    if draw(st.booleans()):  # a ranged read of the stripes of a WQ < E ledger
        modulus = draw(ints(1, limits.ledger_ensemble_size_max))
        return ReadRequest(rid=draw(rids), ledger_id=draw(ledger_ids), first_entry_id=first, count=count,
                           flags=ReadFlag.SPARSE, master_key=draw(st.none() | master_keys),
                           stripe=draw(st.none() | st.tuples(st.just(modulus), ints(0, modulus - 1))),
                           packed=draw(st.booleans()))
    return ReadRequest(
        rid=draw(rids), ledger_id=draw(ledger_ids), first_entry_id=first, count=count, **draw(_read_options()),
        packed=draw(st.booleans()),
    )


@st.composite
def read_lac_requests(draw: st.DrawFn) -> ReadLacRequest:
    return ReadLacRequest(rid=draw(rids), ledger_id=draw(ledger_ids), **draw(_read_options()))


@st.composite
def read_responses(draw: st.DrawFn) -> ReadResponse:
    status = draw(statuses)
    entries = draw(tuples_of_blobs(1 if status is Status.EOK else 0, 6))
    first = draw(ints(0, I64_MAX - max(len(entries) - 1, 0)))
    return ReadResponse(
        rid=draw(rids),
        status=status,
        ledger_id=draw(ledger_ids),
        first_entry_id=first,
        lac=draw(lacs),
        entries=entries,
        packed=bool(entries) and draw(st.booleans()),  # packed: only with entries (n >= 1)
    )


@st.composite
def add_responses(draw: st.DrawFn) -> AddResponse:
    first, last = sorted((draw(entry_ids), draw(entry_ids)))
    return AddResponse(
        rid=draw(rids),
        status=draw(statuses),
        ledger_id=draw(ledger_ids),
        first_entry_id=first,
        last_entry_id=last,
    )


@st.composite
def bookie_info_responses(draw: st.DrawFn) -> BookieInfoResponse:
    free, total = sorted((draw(ints(0, U64_MAX)), draw(ints(0, U64_MAX))))
    return BookieInfoResponse(
        rid=draw(rids),
        status=draw(statuses),
        free_bytes=free,
        total_bytes=total,
        state=draw(st.sampled_from(BOOKIE_STATES)),
        ledgers=draw(ledger_ids),
        limbo_ledgers=draw(ledger_ids),
    )


entry_id_sets = st.one_of(
    st.sets(st.integers(0, 200), max_size=60),  # clustered: real ranges
    st.sets(entry_ids, max_size=8),  # sparse and huge
)

# Field name -> values, for every message whose fields are independent of each other. A
# message whose fields constrain each other (ranges, flags that need a key, e0 <= e1, ...)
# has its own builder in _BUILDERS; every other message is built from these, so that a new
# message type is fuzzed as soon as it exists (test_every_message_type_has_a_strategy).
FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "rid": rids,
    "ledger_id": ledger_ids,
    "master_key": master_keys,
    "lac": lacs,
    "status": statuses,
}
_BUILDERS: dict[type, st.SearchStrategy[Any]] = {
    AddRequest: add_requests,
    ReadRequest: read_requests(),
    ReadLacRequest: read_lac_requests(),
    ErrorResponse: st.builds(ErrorResponse, rid=rids, status=statuses.filter(lambda s: s is not Status.EOK)),
    AddResponse: add_responses(),
    MultiAddRequest: multi_add_requests(),
    MultiAddResponse: st.builds(MultiAddResponse, rid=rids, status=statuses,
                                statuses=st.lists(statuses, min_size=1, max_size=8).map(tuple)),
    ReadResponse: read_responses(),
    ReadLacResponse: st.builds(ReadLacResponse, rid=rids, status=statuses, ledger_id=ledger_ids, lac=lacs,
                               last_entry=st.none() | blobs),
    BookieInfoResponse: bookie_info_responses(),
    ListEntriesResponse: st.builds(ListEntriesResponse, rid=rids, status=statuses, ledger_id=ledger_ids,
                                   entry_ranges=entry_id_sets.map(ranges_from_ids)),
}


def message_types(union: Any) -> list[type]:
    """The message classes of a union alias of zbk.wire.messages (Request or Response)."""
    return list(typing.get_args(union))


def strategy_for(cls: type) -> st.SearchStrategy[Any]:
    """Valid instances of one message class; KeyError names a field that needs a strategy."""
    if cls in _BUILDERS:
        return _BUILDERS[cls]
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in FIELDS]
    if missing:
        raise KeyError(f"{cls.__name__}: no strategy for field(s) {missing}: add them to FIELDS or _BUILDERS")
    return st.builds(cls, **{f.name: FIELDS[f.name] for f in dataclasses.fields(cls)})


REQUEST_TYPES = message_types(messages.Request)
RESPONSE_TYPES = message_types(messages.Response)
requests = st.one_of(*(strategy_for(c) for c in REQUEST_TYPES))
responses = st.one_of(*(strategy_for(c) for c in RESPONSE_TYPES))
