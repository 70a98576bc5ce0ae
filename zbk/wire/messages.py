"""One frozen dataclass per wire message (docs/protocol.md has the wire field names).

Messages are plain values: the codec (:mod:`zbk.wire.codec`) turns them into ZeroMQ frames
and back, and validates on the way in. Constructing one does not validate (the decoder
already did, and the hot path should not pay twice); a message built with bad values is
rejected by the receiving side's decoder.

Entry blobs (:mod:`zbk.wire.entry`) travel as raw payload frames and are held here as the
frame objects themselves (``bytes`` or ``memoryview``), never copied. Decoded sequences are
tuples.

Ids: ledger and entry ids are int64 >= 0; a LAC is an entry id or -1 (nothing confirmed);
a request id (``rid``) is any uint64, chosen by the client, unique among its pending requests.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, TypeAlias

from zbk.wire.ops import AddFlag, ReadFlag
from zbk.wire.status import Status

Blob: TypeAlias = bytes | bytearray | memoryview
"""A payload frame as received or sent: bytes, or a zero-copy view (zmq ``frame.buffer``)."""

EntryRanges: TypeAlias = tuple[tuple[int, int], ...]
"""Sorted, disjoint, non-adjacent inclusive ranges of entry ids: ((0, 9), (12, 12))."""

MASTER_KEY_BYTES = 32  # SHA-256 (zbk.client.digest.master_key); the only length accepted
BOOKIE_STATES = ("writable", "readonly")


# --- requests -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class AddRequest:
    """ADD_ENTRY: store ``entries`` (entry blobs of ``ledger_id``, ascending entry ids)."""

    rid: int
    ledger_id: int
    master_key: bytes
    flags: AddFlag
    entries: Sequence[Blob]


_AR_SET = tuple(AddRequest.__dict__[name].__set__ for name in ("rid", "ledger_id", "master_key", "flags", "entries"))
_new = object.__new__


def add_part(ledger_id: int, master_key: bytes, flags: AddFlag, entries: Sequence[Blob]) -> AddRequest:
    """``AddRequest(rid=0, ...)``, a MULTI_ADD part, built at a quarter of the cost: a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__`` (about 2 us for
    five), and a MULTI_ADD has a part per ledger, thousands per second at 10,000 ledgers on
    both the client and every bookie. Equal to the ordinary construction (tested)."""
    r = _new(AddRequest)
    set_rid, set_lid, set_key, set_flags, set_entries = _AR_SET
    set_rid(r, 0)
    set_lid(r, ledger_id)
    set_key(r, master_key)
    set_flags(r, flags)
    set_entries(r, entries)
    return r


class PackedParts(Sequence[AddRequest]):
    """The parts of a decoded MULTI_ADD as the decoder found them: its part table in columns
    (``ledger_ids``, ``counts``, ``flags`` as ints, ``keys``; one item per part) and
    ``entries``, every part's entries one after the other. Part ``i`` is built as an
    AddRequest only when asked for (``parts[i]``, iteration); a bookie's admission reads the
    columns instead, so that a request of 500 one-entry parts costs no object per part.
    ``ones``: every part has exactly one entry, the entry of part
    ``i`` is then ``entries[i]``. The decoder validated every column."""

    __slots__ = ("ledger_ids", "counts", "flags", "keys", "entries", "ones", "_starts")

    def __init__(self, ledger_ids: Sequence[int], counts: Sequence[int], flags: Sequence[int],
                 keys: Sequence[bytes], entries: Sequence[Blob]) -> None:
        self.ledger_ids, self.counts, self.flags, self.keys = ledger_ids, counts, flags, keys
        self.entries = entries
        self.ones = len(counts) == len(entries)  # counts are >= 1 each: then all are 1
        self._starts: list[int] | None = None

    def __len__(self) -> int:
        return len(self.counts)

    def _part(self, i: int) -> AddRequest:
        if self.ones:
            entries: Sequence[Blob] = (self.entries[i],)
        else:
            starts = self._starts
            if starts is None:
                starts = self._starts = list(accumulate(self.counts, initial=0))
            entries = tuple(self.entries[starts[i]:starts[i] + self.counts[i]])
        return add_part(self.ledger_ids[i], self.keys[i], AddFlag(self.flags[i]), entries)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._part(k) for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("part index out of range")
        return self._part(i % n)

    def __iter__(self) -> Iterator[AddRequest]:
        return (self._part(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedParts({list(self)!r})"


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiAddRequest:
    """MULTI_ADD: several ADD_ENTRY batches (``parts``) in one message, typically of different
    ledgers. Each part is checked and stored as if it came alone and gets its own status;
    the parts' own ``rid`` is not sent (decoded parts carry 0): the message's ``rid`` names them all.
    """

    rid: int
    parts: Sequence[AddRequest]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadRequest:
    """READ_ENTRY: read ``count`` entries from ``first_entry_id``.

    With ``FENCE`` the ledger is fenced first (``master_key`` required). With ``LONG_POLL``
    the bookie waits until its LAC > ``previous_lac`` or ``timeout_ms`` passes, then answers
    the read as usual. ``master_key`` is optional otherwise (checked when present);
    ``previous_lac`` and ``timeout_ms`` are sent only with ``LONG_POLL``. ``stripe``
    ``(modulus, residue)``, only with ``SPARSE``: just the entries whose id % modulus ==
    residue (with WQ < E, the client asks each bookie for one stripe, so no entry comes twice).
    ``packed``: the sender takes the answer's entries packed (docs/protocol.md, "Packed
    entries").
    """

    rid: int
    ledger_id: int
    first_entry_id: int
    count: int = 1
    flags: ReadFlag = ReadFlag(0)
    master_key: bytes | None = None
    previous_lac: int = -1
    timeout_ms: int = 0
    stripe: tuple[int, int] | None = None
    packed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLacRequest:
    """READ_LAC: the bookie's LAC and last entry; flags and fields as for :class:`ReadRequest`."""

    rid: int
    ledger_id: int
    flags: ReadFlag = ReadFlag(0)
    master_key: bytes | None = None
    previous_lac: int = -1
    timeout_ms: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteLacRequest:
    """WRITE_LAC: record ``lac`` as the ledger's explicit LAC on this bookie."""

    rid: int
    ledger_id: int
    master_key: bytes
    lac: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ForceLedgerRequest:
    """FORCE_LEDGER: fsync everything of ``ledger_id`` (ends a run of DEFERRED_SYNC adds)."""

    rid: int
    ledger_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteCloseRequest:
    """WRITE_CLOSE (BP-32, advisory): the writer closed ``ledger_id``; never waited for."""

    rid: int
    ledger_id: int
    master_key: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class ClearLimboRequest:
    """CLEAR_LIMBO (BP-46 phase two): the ledger was recovered and every entry this bookie
    should hold was copied here; clear its limbo status. Needs the master key; answered
    once the change is journaled and fsynced."""

    rid: int
    ledger_id: int
    master_key: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class BookieInfoRequest:
    """GET_BOOKIE_INFO."""

    rid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ListEntriesRequest:
    """GET_LIST_OF_ENTRIES_OF_LEDGER: which entries of ``ledger_id`` does this bookie hold?"""

    rid: int
    ledger_id: int


# --- responses ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorResponse:
    """ERROR: the request ``rid`` was rejected before it was understood (never with EOK).

    Sent for a request that failed to decode (EBADREQ, EBADVERSION) or that the bookie shed
    unread (ETOOMANYREQUESTS). Its layout (v, op, rid, st) is frozen across versions.
    """

    rid: int
    status: Status


@dataclass(frozen=True, slots=True, kw_only=True)
class AddResponse:
    """ADD_ENTRY answer: one status for the whole batch (all stored, or an error).

    ``first_entry_id``/``last_entry_id`` echo the batch's first and last entry ids. A batch
    sent to one bookie may skip ids of other write sets, so these bound it and do not list it:
    the client matches the answer to its batch by ``rid`` and checks the bounds.
    """

    rid: int
    status: Status
    ledger_id: int
    first_entry_id: int
    last_entry_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class MultiAddResponse:
    """MULTI_ADD answer: ``statuses[i]`` is the ADD_ENTRY status of part ``i`` of the request
    (EOK: all its entries are stored). ``status`` is EOK: the message itself was understood
    (a request refused whole gets an ERROR response instead)."""

    rid: int
    status: Status
    statuses: Sequence[Status]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadResponse:
    """READ_ENTRY answer: the contiguous prefix of the range that the bookie holds.

    ``entries`` are entry blobs for ``first_entry_id``, ``first_entry_id + 1``, ... ``status``
    is the status of the first entry *not* returned: EOK with fewer entries than asked means
    the bookie stopped at its response size bound (ask again for the rest); ENOENTRY,
    EUNKNOWN, ... describe entry ``first_entry_id + len(entries)``. ``lac`` is the bookie's
    LAC for the ledger (-1 if none known). ``packed`` (only with entries, to a request that
    was ``packed``): the entries travel as a length table and one blob frame.
    """

    rid: int
    status: Status
    ledger_id: int
    first_entry_id: int
    lac: int
    entries: Sequence[Blob] = ()
    packed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadLacResponse:
    """READ_LAC answer: the bookie's LAC and the blob of the highest entry it holds, if any.

    ``lac`` is the maximum of the explicit LAC and the LACs piggybacked on stored entries;
    ``last_entry`` lets a client take the LAC from a digest-checked entry instead.
    """

    rid: int
    status: Status
    ledger_id: int
    lac: int
    last_entry: Blob | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteLacResponse:
    """WRITE_LAC answer."""

    rid: int
    status: Status
    ledger_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ForceLedgerResponse:
    """FORCE_LEDGER answer: EOK once every entry acknowledged before it is durable."""

    rid: int
    status: Status
    ledger_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteCloseResponse:
    """WRITE_CLOSE answer (logged by the client, never waited for)."""

    rid: int
    status: Status
    ledger_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ClearLimboResponse:
    """CLEAR_LIMBO answer: EOK (cleared, or was not in limbo), ENOLEDGER, EUA."""

    rid: int
    status: Status
    ledger_id: int


@dataclass(frozen=True, slots=True, kw_only=True)
class BookieInfoResponse:
    """GET_BOOKIE_INFO answer: ``state`` is "writable" or "readonly"."""

    rid: int
    status: Status
    free_bytes: int
    total_bytes: int
    state: str
    ledgers: int
    limbo_ledgers: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ListEntriesResponse:
    """GET_LIST_OF_ENTRIES_OF_LEDGER answer: the held entry ids as sorted inclusive ranges."""

    rid: int
    status: Status
    ledger_id: int
    entry_ranges: EntryRanges = ()


Request: TypeAlias = (
    AddRequest
    | MultiAddRequest
    | ReadRequest
    | ReadLacRequest
    | WriteLacRequest
    | ForceLedgerRequest
    | WriteCloseRequest
    | ClearLimboRequest
    | BookieInfoRequest
    | ListEntriesRequest
)
Response: TypeAlias = (
    ErrorResponse
    | AddResponse
    | MultiAddResponse
    | ReadResponse
    | ReadLacResponse
    | WriteLacResponse
    | ForceLedgerResponse
    | WriteCloseResponse
    | ClearLimboResponse
    | BookieInfoResponse
    | ListEntriesResponse
)
Message: TypeAlias = Request | Response
