"""A dying actor stops the whole bookie with its own exit code (crash, don't limp), and
nothing it could not make durable was acknowledged."""

from __future__ import annotations

import shutil

from zbk.errors import ZbkError
from zbk.wire import messages as w
from zbk.wire.status import Status

from .util import MK, check_payloads, entry, read


def test_journal_failure_stops_bookie_with_journal_exit_code(bookies):
    bk = bookies(settings={"journal_max_size_mb": 1})
    bk.start()
    with bk.connect(timeout_s=3) as c:
        assert c.call(w.AddRequest(rid=c.next_rid(), ledger_id=1, master_key=MK, flags=w.AddFlag(0),
                                   entries=[entry(1, 0, 1024)])).status == Status.EOK
        shutil.rmtree(bk.data_dir / "journal")  # the next segment can not be created
        try:
            for k in range(1, 200):  # > 1 MiB: forces a rotation into the missing directory
                resp = c.call(w.AddRequest(rid=c.next_rid(), ledger_id=1, master_key=MK, flags=w.AddFlag(0),
                                           entries=[entry(1, e, 1024) for e in range(k * 10 - 9, k * 10 + 1)]))
                assert resp.status == Status.EOK
        except ZbkError:
            pass  # the bookie died: in-flight adds are never acknowledged
    code = bk.exit_code(30)
    assert code == 11, f"journal actor crash must exit 11, got {code}\n{bk.log_tail()}"
    assert "actor journal crashed" in bk.log_tail(100)
    # The journal disk is "replaced" (empty): without the cookie fix the bookie refuses to
    # boot; with it, it boots on a new journal and runs phase one (BP-46).
    (bk.data_dir / "journal").mkdir()
    bk.start(wait=False)
    assert bk.exit_code(30) == 4
    bk.settings["auto_fix_cookie"] = True
    bk.start()
    assert "journal disk replaced" in bk.log_tail(100)
    with bk.connect() as c:
        assert c.call(w.AddRequest(rid=c.next_rid(), ledger_id=2, master_key=MK, flags=w.AddFlag(0),
                                   entries=[entry(2, 0)])).status == Status.EOK
        assert check_payloads(read(c, 2, 0), 2) == [0]
    assert bk.stop() == 0
