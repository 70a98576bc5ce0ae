"""Ledger metadata: the model, its validation and its versioned CBOR encoding.

Encoding (format version 1): a CBOR map with text keys

    fv   int      format version (1); a reader refuses versions it does not know
    id   int      ledger id (0 .. 2**63-1)
    e    int      ensemble size E
    wq   int      write quorum WQ
    aq   int      ack quorum AQ
    dg   text     digest type: crc32 | crc32c | hmac | dummy
    pw   bytes    ledger password (kept so that auto-recovery can write recovery adds)
    st   text     OPEN | IN_RECOVERY | CLOSED
    le   int      last entry id (-1: empty; meaningful once CLOSED)
    ln   int      length in bytes of all payloads (meaningful once CLOSED)
    fr   array    fragments: [[first_entry_id, [bookie id, ...]], ...] in increasing first id
    cm   map      custom metadata: text -> bytes
    ct   int      creation time, milliseconds since the epoch
    tok  bytes    creator token (random), so a creator can tell its own create from a racer's

State machine: OPEN -> IN_RECOVERY -> CLOSED, or OPEN -> CLOSED. A state may stay the
same (ensemble changes keep OPEN; recovery's ensemble changes keep IN_RECOVERY). Nothing
ever leaves CLOSED, and a CLOSED ledger's entries and end never change.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any

import cbor2

from zbk import limits
from zbk.errors import BadRequestError, CorruptMetadataError, InvalidStateTransitionError

FORMAT_VERSION = 1
DIGEST_TYPES = ("crc32", "crc32c", "hmac", "dummy")
STATES = ("OPEN", "IN_RECOVERY", "CLOSED")
_ALLOWED = {
    ("OPEN", "OPEN"), ("OPEN", "IN_RECOVERY"), ("OPEN", "CLOSED"),
    ("IN_RECOVERY", "IN_RECOVERY"), ("IN_RECOVERY", "CLOSED"),
}


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    """A ledger's metadata, as stored (``BookKeeper.ledger_metadata``, a handle's ``metadata``).

    Immutable: a change makes a new copy, written by compare-and-set on the version.

    Attributes:
        ledger_id: The ledger's id.
        ensemble_size: E, the number of bookies of each fragment.
        write_quorum: WQ, the number of bookies each entry is written to.
        ack_quorum: AQ, the number that acknowledged an entry before it was confirmed.
        digest: The entries' digest: ``crc32``, ``crc32c``, ``hmac`` or ``dummy``.
        password: The ledger's password (kept so that auto-recovery can write recovery adds).
        state: ``OPEN``, ``IN_RECOVERY`` (being recovered) or ``CLOSED``.
        last_entry_id: The last entry's id once ``CLOSED`` (-1: empty); -1 before.
        length: The payload bytes of all entries once ``CLOSED``; 0 before.
        fragments: ``(first entry id, ensemble)`` pairs in increasing first id: entries
            from each first id on are on that fragment's bookies (an ensemble change adds
            a fragment).
        custom_metadata: The names and bytes the creator stored with the ledger.
        ctime_ms: The creation time, in milliseconds since the epoch.
        creator_token: Random bytes that let a creator recognise its own create after a
            lost reply.
    """

    ledger_id: int
    ensemble_size: int
    write_quorum: int
    ack_quorum: int
    digest: str = "crc32c"
    password: bytes = b""
    state: str = "OPEN"
    last_entry_id: int = -1
    length: int = 0
    fragments: tuple[tuple[int, tuple[str, ...]], ...] = ()
    custom_metadata: dict[str, bytes] = field(default_factory=dict)
    ctime_ms: int = 0
    creator_token: bytes = b""

    # -- the names API.md gives to users ------------------------------------------------
    @property
    def ensembles(self) -> dict[int, list[str]]:
        """The fragments as a dict: first entry id -> the bookies from there on."""
        return {first: list(bookies) for first, bookies in self.fragments}

    @property
    def is_closed(self) -> bool:
        """Whether the state is ``CLOSED``: the entries and the end never change again."""
        return self.state == "CLOSED"

    # -- derived views --------------------------------------------------------------------
    def validate(self) -> LedgerMetadata:
        """Raise BadRequestError unless every field is in range and the shape is consistent."""
        if not 0 <= self.ledger_id <= limits.ledger_id_max:
            raise BadRequestError(f"ledger id out of range: {self.ledger_id}")
        e, wq, aq = self.ensemble_size, self.write_quorum, self.ack_quorum
        if not (limits.ledger_ensemble_size_max >= e >= wq >= aq >= 1):
            raise BadRequestError(f"need {limits.ledger_ensemble_size_max} >= E >= WQ >= AQ >= 1, got E={e} WQ={wq} AQ={aq}")
        if self.digest not in DIGEST_TYPES:
            raise BadRequestError(f"digest must be one of {', '.join(DIGEST_TYPES)}, got {self.digest!r}")
        if len(self.password) > limits.ledger_password_bytes_max:
            raise BadRequestError("password too long")
        if self.state not in STATES:
            raise BadRequestError(f"unknown ledger state {self.state!r}")
        if self.last_entry_id < -1 or self.length < 0:
            raise BadRequestError("last entry id and length must be >= -1 and >= 0")
        if not self.fragments:
            raise BadRequestError("a ledger needs at least one fragment")
        prev = -1
        for i, (first, bookies) in enumerate(self.fragments):
            if i == 0 and first != 0:
                raise BadRequestError("the first fragment must start at entry 0")
            if i > 0 and first <= prev:
                raise BadRequestError("fragments must start at increasing entry ids")
            if len(bookies) != e:
                raise BadRequestError(f"fragment at {first} has {len(bookies)} bookies, ensemble size is {e}")
            if len(set(bookies)) != e:
                raise BadRequestError(f"fragment at {first} names a bookie twice")
            prev = first
        size = sum(len(k.encode()) + len(v) for k, v in self.custom_metadata.items())
        if size > limits.ledger_custom_metadata_bytes_max:
            raise BadRequestError("custom metadata too large")
        return self

    def fragment_index(self, entry_id: int) -> int:
        """The index in ``fragments`` of the fragment that holds ``entry_id``."""
        found = 0
        for i, (first, _) in enumerate(self.fragments):
            if first <= entry_id:
                found = i
            else:
                break
        return found

    def fragment_for(self, entry_id: int) -> tuple[int, tuple[str, ...]]:
        """The fragment (first entry id, ensemble) that holds ``entry_id``."""
        return self.fragments[self.fragment_index(entry_id)]

    def fragment_end(self, index: int) -> int:
        """Last entry id of fragment ``index`` (for the last fragment: last_entry_id when
        closed, else a very large number)."""
        if index + 1 < len(self.fragments):
            return self.fragments[index + 1][0] - 1
        return self.last_entry_id if self.is_closed else limits.ledger_id_max

    def write_set(self, entry_id: int) -> list[str]:
        """Bookies that store ``entry_id``: ensemble[(e + k) % E] for k in 0..WQ-1."""
        _, ensemble = self.fragment_for(entry_id)
        e = self.ensemble_size
        return [ensemble[(entry_id + k) % e] for k in range(self.write_quorum)]

    @property
    def last_ensemble(self) -> tuple[str, ...]:
        """The bookies of the last fragment (where new entries go)."""
        return self.fragments[-1][1]

    def all_bookies(self) -> set[str]:
        return {b for _, bookies in self.fragments for b in bookies}

    # -- transitions ----------------------------------------------------------------------
    def with_state(self, state: str, **changes: Any) -> LedgerMetadata:
        if (self.state, state) not in _ALLOWED:
            raise InvalidStateTransitionError(f"ledger {self.ledger_id}: {self.state} -> {state} is not allowed")
        return dataclasses.replace(self, state=state, **changes).validate()

    def closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        """The CLOSED copy of this ledger ending at ``last_entry_id``; fragments that start
        after the end are dropped (they hold nothing)."""
        frags = tuple(f for i, f in enumerate(self.fragments) if i == 0 or f[0] <= last_entry_id)
        return self.with_state("CLOSED", last_entry_id=last_entry_id, length=length, fragments=frags)

    def with_fragment(self, first_entry_id: int, bookies: list[str] | tuple[str, ...]) -> LedgerMetadata:
        """Add (or, at the same first entry id, replace) the last fragment: an ensemble change."""
        if self.is_closed:
            raise InvalidStateTransitionError(f"ledger {self.ledger_id} is closed: no ensemble change")
        frags = [f for f in self.fragments if f[0] < first_entry_id]
        if not frags:
            frags = []
        frags.append((first_entry_id, tuple(bookies)))
        return dataclasses.replace(self, fragments=tuple(frags)).validate()

    def with_replaced_bookie(self, fragment_index: int, old: str, new: str) -> LedgerMetadata:
        """Replace ``old`` by ``new`` in one fragment (re-replication); allowed in any state."""
        first, bookies = self.fragments[fragment_index]
        assert old in bookies, (old, bookies)
        swapped = tuple(new if b == old else b for b in bookies)
        frags = list(self.fragments)
        frags[fragment_index] = (first, swapped)
        return dataclasses.replace(self, fragments=tuple(frags)).validate()

    # -- encoding -------------------------------------------------------------------------
    def as_json(self, version: int) -> dict[str, Any]:
        """The metadata as users are shown it (shell, HTTP): no password, no creator token;
        custom values as text where they are UTF-8, else as hex."""
        return {"ledger_id": self.ledger_id, "state": self.state, "ensemble_size": self.ensemble_size,
                "write_quorum": self.write_quorum, "ack_quorum": self.ack_quorum, "digest": self.digest,
                "last_entry_id": self.last_entry_id, "length": self.length,
                "ensembles": {str(k): v for k, v in self.ensembles.items()},
                "custom_metadata": {k: _text_or_hex(v) for k, v in self.custom_metadata.items()},
                "ctime_ms": self.ctime_ms, "version": version}

    def encode(self) -> bytes:
        self.validate()
        return cbor2.dumps({
            "fv": FORMAT_VERSION, "id": self.ledger_id, "e": self.ensemble_size,
            "wq": self.write_quorum, "aq": self.ack_quorum, "dg": self.digest,
            "pw": self.password, "st": self.state, "le": self.last_entry_id, "ln": self.length,
            "fr": [[first, list(bookies)] for first, bookies in self.fragments],
            "cm": dict(self.custom_metadata), "ct": self.ctime_ms, "tok": self.creator_token,
        })

    @classmethod
    def decode(cls, data: bytes, *, ledger_id: int | None = None) -> LedgerMetadata:
        """Decode; anything corrupt or of an unknown format version is a CorruptMetadataError
        naming the ledger."""
        name = f"ledger {ledger_id}" if ledger_id is not None else "ledger metadata"
        try:
            raw = cbor2.loads(data)
        except Exception as e:  # cbor2 raises several types for garbage input
            raise CorruptMetadataError(f"{name}: metadata is not valid CBOR ({e})") from None
        if not isinstance(raw, dict):
            raise CorruptMetadataError(f"{name}: metadata is not a map")
        fv = raw.get("fv")
        if fv != FORMAT_VERSION:
            raise CorruptMetadataError(f"{name}: unknown metadata format version {fv!r} (this zbk reads {FORMAT_VERSION})")
        try:
            md = cls(
                ledger_id=_int(raw["id"]), ensemble_size=_int(raw["e"]), write_quorum=_int(raw["wq"]),
                ack_quorum=_int(raw["aq"]), digest=_name(raw["dg"]), password=_bytes(raw["pw"]),
                state=_name(raw["st"]), last_entry_id=_int(raw["le"]), length=_int(raw["ln"]),
                fragments=tuple((_int(f[0]), tuple(_name(b) for b in f[1])) for f in raw["fr"]),
                custom_metadata={_str(k): _bytes(v) for k, v in raw.get("cm", {}).items()},
                ctime_ms=_int(raw.get("ct", 0)), creator_token=_bytes(raw.get("tok", b"")),
            )
            md.validate()
        except (KeyError, TypeError, IndexError, ValueError, AttributeError, BadRequestError) as e:
            raise CorruptMetadataError(f"{name}: metadata is malformed ({e!r})") from None
        if ledger_id is not None and md.ledger_id != ledger_id:
            raise CorruptMetadataError(f"{name}: metadata names ledger {md.ledger_id}")
        return md


def _text_or_hex(b: bytes) -> str:
    try:
        return b.decode()
    except UnicodeDecodeError:
        return b.hex()


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"expected int, got {type(v).__name__}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected text, got {type(v).__name__}")
    return v


def _name(v: Any) -> str:
    """A string that many ledgers' metadata hold alike (bookie ids, digest, state), interned:
    a client with 10,000 open ledgers keeps one copy of each, not one per ledger."""
    return sys.intern(_str(v))


def _bytes(v: Any) -> bytes:
    if not isinstance(v, bytes):
        raise TypeError(f"expected bytes, got {type(v).__name__}")
    return v
