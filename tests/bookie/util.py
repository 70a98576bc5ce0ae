"""Raw-protocol helpers for bookie tests."""

from __future__ import annotations

import hashlib
import os
import random
import time
from typing import Any

from zbk.client.digest import make_digest, master_key
from zbk.client.raw import BookieConnection
from zbk.wire import messages as w
from zbk.wire.entry import build_entry, parse_entry
from zbk.wire.ops import AddFlag, ReadFlag
from zbk.wire.status import Status

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


def seeded_rng() -> random.Random:
    """A Random seeded from ``ZBK_SEED`` (or a fresh seed), printed so a failure can be replayed."""
    seed = int(os.environ.get("ZBK_SEED", random.randrange(1 << 30)))
    print(f"ZBK_SEED={seed}")
    return random.Random(seed)


def send_random_add(c: BookieConnection, rng: random.Random, next_eid: dict[int, int],
                    pending: dict[int, tuple[int, list[int]]], batch: int, size: int = 256) -> None:
    """Pipeline one add of ``batch`` entries to a random ledger of ``next_eid`` (its next
    ids); ``pending`` maps the request id to (ledger, entry ids) until its answer."""
    lid = rng.choice(list(next_eid))
    eids = list(range(next_eid[lid], next_eid[lid] + batch))
    next_eid[lid] += batch
    rid = c.next_rid()
    c.send(w.AddRequest(rid=rid, ledger_id=lid, master_key=MK, flags=NO_ADD_FLAGS,
                        entries=[entry(lid, e, size) for e in eids]))
    pending[rid] = (lid, eids)


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


def multi_adds_through_checkpoints_then_kill9(bk: Any, ledgers: list[int], rounds: int, size: int = 512) -> None:
    """MULTI_ADDs of two entries to each of ``ledgers``, ``rounds`` times, each followed by a
    checkpoint (a new last mark); then until the journal before those marks is deleted
    (those entries live only in the entry logs and the index); then three more MULTI_ADDs
    pipelined and a kill -9 while a checkpoint of these dirty ledgers may run. After a
    restart every acknowledged entry must read back byte for byte."""
    from zbk.storage.journal import list_segments
    from zbk.storage.markers import read_last_mark
    from zbk.wire.codec import encode

    index_dir = str(bk.data_dir / "index")
    journal_dir = str(bk.data_dir / "journal")
    first_segment = list_segments(journal_dir)[0]
    acked = dict.fromkeys(ledgers, -1)

    def last_mark() -> Any:
        return read_last_mark(index_dir) if os.path.exists(os.path.join(index_dir, "lastMark")) else None

    def multi(c: BookieConnection, first: int, count: int) -> int:
        parts = [w.AddRequest(rid=0, ledger_id=lid, master_key=MK, flags=NO_ADD_FLAGS,
                              entries=[entry(lid, e, size) for e in range(first, first + count)]) for lid in ledgers]
        rid = c.next_rid()
        c.sock.send_multipart(encode(w.MultiAddRequest(rid=rid, parts=parts)), copy=False)
        return rid

    with bk.connect(timeout_s=30) as c:
        for k in range(rounds):
            mark = last_mark()
            multi(c, 2 * k, 2)
            resp = c.recv()
            assert isinstance(resp, w.MultiAddResponse) and set(resp.statuses) == {Status.EOK}, resp
            for lid in ledgers:
                acked[lid] = 2 * k + 1
            deadline = time.monotonic() + 30
            while last_mark() == mark:
                assert time.monotonic() < deadline, "no checkpoint ran"
                time.sleep(0.05)
        deadline = time.monotonic() + 30
        while list_segments(journal_dir)[0] == first_segment:
            assert time.monotonic() < deadline, "checkpoints did not trim the journal"
            time.sleep(0.05)
        in_flight: dict[int, int] = {}
        first = 2 * rounds
        for _ in range(3):
            in_flight[multi(c, first, 2)] = first + 1
            first += 2
        resp = c.recv()
        assert set(resp.statuses) == {Status.EOK}
        last = in_flight.pop(resp.rid)
        for lid in ledgers:
            acked[lid] = max(acked[lid], last)
        time.sleep(0.15)
        bk.kill9()
    bk.start()
    with bk.connect(timeout_s=30) as c:
        for lid in ledgers:
            resp = read(c, lid, 0, count=acked[lid] + 1)
            assert check_payloads(resp, lid, size) == list(range(acked[lid] + 1)), f"ledger {lid}: {resp.status!r}"
    assert bk.stop() == 0
