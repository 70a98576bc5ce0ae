"""Ledger passwords (master keys) on a real bookie: every add, recovery add, fencing read,
WRITE_LAC and WRITE_CLOSE with the wrong key is EUA and changes nothing; a plain read that
carries a wrong key is EUA too; the client maps it to UnauthorizedError."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.bookie import BookieProcess

import zbk
from zbk.client.digest import make_digest, master_key
from zbk.errors import UnauthorizedError
from zbk.wire import messages as w
from zbk.wire.entry import build_entry
from zbk.wire.ops import AddFlag, ReadFlag
from zbk.wire.status import Status

RIGHT = master_key(b"right")
WRONG = master_key(b"wrong")
DIGEST = make_digest("crc32c", b"right")


@pytest.fixture
def bookie(tmp_path: Path):
    bk = BookieProcess(tmp_path, f"sqlite:///{tmp_path}/meta.db")
    try:
        yield bk.start()
    finally:
        if bk.proc is not None and bk.proc.poll() is None:
            bk.proc.kill()
            bk.proc.wait(10)


def _add(c, lid: int, eid: int, key: bytes, flags: AddFlag = AddFlag(0)) -> w.AddResponse:  # noqa: B008
    return c.call(w.AddRequest(rid=c.next_rid(), ledger_id=lid, master_key=key, flags=flags,
                               entries=[build_entry(lid, eid, eid - 1, b"payload", DIGEST)]))


def test_every_keyed_request_with_the_wrong_key_is_refused_and_changes_nothing(bookie: BookieProcess) -> None:
    with bookie.connect() as c:
        assert _add(c, 1, 0, RIGHT).status == Status.EOK
        refused = {
            "add": _add(c, 1, 1, WRONG),
            "recovery add": _add(c, 1, 1, WRONG, AddFlag.RECOVERY_ADD),
            "fencing read": c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=1, first_entry_id=0,
                                                 flags=ReadFlag.FENCE, master_key=WRONG)),
            "fencing read_lac": c.call(w.ReadLacRequest(rid=c.next_rid(), ledger_id=1, flags=ReadFlag.FENCE,
                                                        master_key=WRONG)),
            "read with a wrong key": c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=1, first_entry_id=0,
                                                          master_key=WRONG)),
            "write_lac": c.call(w.WriteLacRequest(rid=c.next_rid(), ledger_id=1, master_key=WRONG, lac=5)),
            "write_close": c.call(w.WriteCloseRequest(rid=c.next_rid(), ledger_id=1, master_key=WRONG)),
        }
        for what, resp in refused.items():
            assert resp.status == Status.EUA, what
        # Not fenced, nothing added, LAC unchanged: the right key still writes entry 1.
        assert _add(c, 1, 1, RIGHT).status == Status.EOK
        r = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=1, first_entry_id=0, count=5))
        assert len(r.entries) == 2  # entries 0 and 1 only
        assert c.call(w.ReadLacRequest(rid=c.next_rid(), ledger_id=1)).lac == 0
        # The right key fences; then plain adds are EFENCED even with the right key.
        fence = c.call(w.ReadLacRequest(rid=c.next_rid(), ledger_id=1, flags=ReadFlag.FENCE, master_key=RIGHT))
        assert fence.status == Status.EOK
        assert _add(c, 1, 2, RIGHT).status == Status.EFENCED
    assert bookie.stop() == 0


def test_the_client_reports_a_wrong_password_as_unauthorized(bookie: BookieProcess) -> None:
    with zbk.BookKeeper(bookie.metadata_uri) as bk:
        lh = bk.create_ledger(ensemble=1, write_quorum=1, ack_quorum=1, password=b"right", digest="crc32c")
        lh.append(b"a")
        with pytest.raises(UnauthorizedError):
            bk.open_ledger(lh.ledger_id, password=b"wrong")  # recovery fences: refused by the bookie
        assert bk.ledger_metadata(lh.ledger_id).state == "OPEN"
        lh.append(b"b")  # the writer was not fenced by the failed attempt
        lh.close()
