"""MULTI_ADD against a real bookie: several ledgers' adds in one message, one status per
part, each part checked as if it came alone (a wrong master key fails only its own part)."""

from __future__ import annotations

from zbk.client.digest import make_digest, master_key
from zbk.client.raw import BookieConnection
from zbk.wire import messages as w
from zbk.wire.entry import build_entry
from zbk.wire.ops import AddFlag, ReadFlag
from zbk.wire.status import Status

DIGEST = make_digest("crc32c", b"")
PLAIN = AddFlag(0)


def blob(lid: int, eid: int) -> bytes:
    return build_entry(lid, eid, eid - 1, f"{lid}/{eid}".encode(), DIGEST)


def part(lid: int, key: bytes, eids: range, flags: AddFlag = PLAIN) -> w.AddRequest:
    return w.AddRequest(rid=0, ledger_id=lid, master_key=key, flags=flags, entries=[blob(lid, e) for e in eids])


def held(conn: BookieConnection, lid: int) -> list[tuple[int, int]]:
    resp = conn.call(w.ListEntriesRequest(rid=conn.next_rid(), ledger_id=lid))
    return list(resp.entry_ranges) if resp.status == Status.EOK else []


def test_multi_add_one_status_per_part_and_a_wrong_password_fails_only_its_part(cluster):
    c = cluster(1)
    good, other, wrong = master_key(b"a"), master_key(b"b"), master_key(b"not-b")
    with BookieConnection(c.bookies[0].bookie_id) as conn:
        # Ledger 2 exists here with the key of password "b"; ledger 3 is fenced.
        assert conn.call(w.AddRequest(rid=conn.next_rid(), ledger_id=2, master_key=other, flags=AddFlag(0),
                                      entries=[blob(2, 0)])).status == Status.EOK
        fence = conn.call(w.ReadLacRequest(rid=conn.next_rid(), ledger_id=3, flags=ReadFlag.FENCE, master_key=good))
        assert fence.status == Status.EOK
        req = w.MultiAddRequest(rid=conn.next_rid(), parts=[
            part(1, good, range(0, 3)),  # new ledger: created with this key
            part(2, wrong, range(1, 3)),  # wrong password: EUA, nothing stored
            part(3, good, range(0, 1)),  # fenced: plain adds refused
            part(3, good, range(0, 2), AddFlag.RECOVERY_ADD),  # recovery adds pass the fence
            part(4, good, range(5, 7)),
        ])
        resp = conn.call(req)
        assert isinstance(resp, w.MultiAddResponse) and resp.rid == req.rid and resp.status == Status.EOK
        assert list(resp.statuses) == [Status.EOK, Status.EUA, Status.EFENCED, Status.EOK, Status.EOK]
        assert held(conn, 1) == [(0, 2)]
        assert held(conn, 2) == [(0, 0)]  # only the entry of the right password
        assert held(conn, 3) == [(0, 1)]
        assert held(conn, 4) == [(5, 6)]
        # Read back: the stored blobs are the sent ones.
        r = conn.call(w.ReadRequest(rid=conn.next_rid(), ledger_id=4, first_entry_id=5, count=2))
        assert [bytes(b) for b in r.entries] == [blob(4, 5), blob(4, 6)]


def test_multi_add_with_a_garbled_part_fails_that_part_only(cluster):
    c = cluster(1)
    key = master_key(b"a")
    with BookieConnection(c.bookies[0].bookie_id) as conn:
        req = w.MultiAddRequest(rid=conn.next_rid(), parts=[
            part(10, key, range(0, 2)),
            w.AddRequest(rid=0, ledger_id=11, master_key=key, flags=AddFlag(0), entries=[blob(12, 0)]),  # wrong ledger
        ])
        resp = conn.call(req)
        assert list(resp.statuses) == [Status.EOK, Status.EBADREQ]
        assert held(conn, 10) == [(0, 1)]
