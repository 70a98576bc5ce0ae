"""Raw-protocol helpers for bookie tests."""

from __future__ import annotations

import hashlib

from zbk.client.digest import make_digest, master_key
from zbk.client.raw import BookieConnection
from zbk.wire import messages as w
from zbk.wire.entry import build_entry, parse_entry
from zbk.wire.ops import AddFlag, ReadFlag

PASSWORD = b"secret"
MK = master_key(PASSWORD)
DIGEST = make_digest("crc32c", PASSWORD)
NO_ADD_FLAGS = AddFlag(0)
NO_READ_FLAGS = ReadFlag(0)


def payload(lid: int, eid: int, size: int = 256) -> bytes:
    """Deterministic bytes for (ledger, entry), so a reader can check them without a record."""
    seed = hashlib.sha256(f"{lid}:{eid}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def entry(lid: int, eid: int, size: int = 256) -> bytes:
    return build_entry(lid, eid, eid - 1, payload(lid, eid, size), DIGEST)


def add(c: BookieConnection, lid: int, eids: list[int], *, flags: AddFlag = NO_ADD_FLAGS, key: bytes = MK,
        size: int = 256) -> w.AddResponse:
    return c.call(w.AddRequest(rid=c.next_rid(), ledger_id=lid, master_key=key, flags=flags,
                               entries=[entry(lid, e, size) for e in eids]))


def read(c: BookieConnection, lid: int, first: int, count: int = 1, *, flags: ReadFlag = NO_READ_FLAGS,
         key: bytes | None = None) -> w.ReadResponse:
    return c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=lid, first_entry_id=first, count=count,
                                flags=flags, master_key=key))


def check_payloads(resp: w.ReadResponse, lid: int, size: int = 256) -> list[int]:
    """Entry ids in ``resp``, each verified byte for byte (digest and payload)."""
    out = []
    for i, blob in enumerate(resp.entries):
        eid = resp.first_entry_id + i
        parsed = parse_entry(blob, DIGEST)
        assert parsed.ledger_id == lid and parsed.entry_id == eid
        assert bytes(parsed.payload) == payload(lid, eid, size), f"ledger {lid} entry {eid}: wrong bytes"
        out.append(eid)
    return out
