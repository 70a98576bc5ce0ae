"""Protocol rules on a real bookie: fencing, master keys, BP-46 limbo, cookies, read-only,
HTTP endpoints."""

from __future__ import annotations

import json
import shutil
import time
import urllib.request

from zbk.metadata.ledger import LedgerMetadata
from zbk.metadata.registry import LedgerStore, list_bookies
from zbk.metadata.uri import open_store
from zbk.recovery.underreplication import UnderReplicationRegistry
from zbk.wire import messages as w
from zbk.wire.ops import AddFlag, ReadFlag
from zbk.wire.status import Status

from .util import MK, add, check_payloads, entry, read


def test_fence_then_plain_add_is_fenced_recovery_add_accepted_and_fence_survives_kill9(bookies):
    bk = bookies()
    bk.start()
    with bk.connect() as c:
        assert add(c, 1, list(range(5))).status == Status.EOK
        r = c.call(w.ReadLacRequest(rid=c.next_rid(), ledger_id=1, flags=ReadFlag.FENCE, master_key=MK))
        assert r.status == Status.EOK and r.lac == 3
        assert add(c, 1, [5]).status == Status.EFENCED
        assert add(c, 1, [5], flags=AddFlag.RECOVERY_ADD).status == Status.EOK
        assert check_payloads(read(c, 1, 0, 10), 1) == [0, 1, 2, 3, 4, 5]
    bk.kill9()
    bk.start()
    with bk.connect() as c:
        assert add(c, 1, [6]).status == Status.EFENCED, "the fence must be durable"
    assert bk.stop() == 0


def test_fencing_read_creates_unknown_ledger_and_fences_it(bookies):
    bk = bookies()
    bk.start()
    with bk.connect() as c:
        r = read(c, 77, 0, flags=ReadFlag.FENCE, key=MK)
        assert r.status == Status.ENOENTRY  # known now (fencing created it), entry absent
        assert add(c, 77, [0]).status == Status.EFENCED
    assert bk.stop() == 0


def test_wrong_master_key_is_eua_and_stores_nothing(bookies):
    bk = bookies()
    bk.start()
    with bk.connect() as c:
        assert add(c, 2, [0, 1]).status == Status.EOK
        assert add(c, 2, [2, 3], key=b"\x01" * 32).status == Status.EUA
        assert read(c, 2, 2).status == Status.ENOENTRY
        r = c.call(w.ReadLacRequest(rid=c.next_rid(), ledger_id=2, flags=ReadFlag.FENCE, master_key=b"\x02" * 32))
        assert r.status == Status.EUA
        assert add(c, 2, [2]).status == Status.EOK, "a fencing read with a wrong key must fence nothing"
        lst = c.call(w.ListEntriesRequest(rid=c.next_rid(), ledger_id=2))
        assert lst.entry_ranges == ((0, 2),)
    assert bk.stop() == 0


def test_journal_off_kill9_makes_open_ledgers_fenced_and_limbo(bookies):
    bk = bookies(settings={"journal_write_data": False, "entry_log_write_buffer_bytes": 4 * 1024 * 1024,
                           "flush_interval_ms": 600_000})
    bk.start()  # first: a new bookie that ledgers already name runs phase one (its disks were replaced)
    store = open_store(bookies.metadata_uri)
    ledgers = LedgerStore(store)
    frag = ((0, (bk.bookie_id, "127.0.0.1:1", "127.0.0.1:2")),)
    open_md, _ = ledgers.create(LedgerMetadata(ledger_id=0, ensemble_size=3, write_quorum=3, ack_quorum=2,
                                               password=b"secret", fragments=frag))
    closed_md, v = ledgers.create(LedgerMetadata(ledger_id=0, ensemble_size=3, write_quorum=3, ack_quorum=2,
                                                 password=b"secret", fragments=frag))
    ledgers.write(closed_md.closed(9, 0), v)
    with bk.connect() as c:
        for md in (open_md, closed_md):
            assert add(c, md.ledger_id, list(range(10))).status == Status.EOK
        info = c.call(w.BookieInfoRequest(rid=c.next_rid()))
        assert info.limbo_ledgers == 0
    bk.kill9()  # the entries sat in the entry logger's write buffer: they are gone
    bk.start()
    with bk.connect() as c:
        info = c.call(w.BookieInfoRequest(rid=c.next_rid()))
        assert info.limbo_ledgers == 1
        lid = open_md.ledger_id
        assert add(c, lid, [10]).status == Status.EFENCED
        r = read(c, lid, 3)
        assert r.status == Status.EUNKNOWN, f"a lost entry of a limbo ledger must be EUNKNOWN, got {r.status!r}"
        lst = c.call(w.ListEntriesRequest(rid=c.next_rid(), ledger_id=lid))
        assert lst.status == Status.EUNKNOWN
        # The closed ledger is neither fenced nor limbo: an explicit negative is allowed there.
        assert read(c, closed_md.ledger_id, 3).status in (Status.ENOENTRY, Status.ENOLEDGER)
        assert add(c, lid, [0], flags=AddFlag.RECOVERY_ADD).status == Status.EOK
        assert check_payloads(read(c, lid, 0), lid) == [0]
    # Phase two is asked for in the metadata: a repair mark for the limbo ledger, and one for
    # the closed ledger, whose 10 entries assigned here are gone from the index (BP-46 phase
    # two checks every ledger).
    marks = UnderReplicationRegistry(store, "test").list_repairs()
    assert sorted((m.ledger_id, m.bookie_id, m.why) for m in marks) == \
        sorted([(lid, bk.bookie_id, "limbo"), (closed_md.ledger_id, bk.bookie_id, "unclean")])
    assert "closed_ledgers_lacking=1" in bk.log_tail(80)
    # CLEAR_LIMBO (what the repairer sends once the ledger is whole here) needs the key and
    # is journaled: after the ledger is closed (phase one leaves closed ledgers alone) and a
    # kill -9, the bookie comes back with no limbo ledger.
    ledgers.write(open_md.closed(0, 0), ledgers.read(lid)[1])
    with bk.connect() as c:
        bad = c.call(w.ClearLimboRequest(rid=c.next_rid(), ledger_id=lid, master_key=b"\x09" * 32))
        assert bad.status == Status.EUA
        assert c.call(w.BookieInfoRequest(rid=c.next_rid())).limbo_ledgers == 1
        ok = c.call(w.ClearLimboRequest(rid=c.next_rid(), ledger_id=lid, master_key=MK))
        assert ok.status == Status.EOK
        assert c.call(w.BookieInfoRequest(rid=c.next_rid())).limbo_ledgers == 0
        assert read(c, lid, 3).status == Status.ENOENTRY, "out of limbo: an explicit negative again"
        unknown = c.call(w.ClearLimboRequest(rid=c.next_rid(), ledger_id=999_999, master_key=MK))
        assert unknown.status == Status.ENOLEDGER
    bk.kill9()
    bk.start()
    with bk.connect() as c:
        assert c.call(w.BookieInfoRequest(rid=c.next_rid())).limbo_ledgers == 0
        assert add(c, lid, [1]).status == Status.EFENCED, "the fence stays"
    assert bk.stop() == 0
    store.close()


def test_cookie_mismatch_refuses_boot_and_auto_fix_runs_phase_one(bookies):
    bk = bookies()
    bk.start()
    assert bk.stop() == 0
    shutil.rmtree(bk.data_dir / "ledgers")  # a replaced, empty disk
    bk.start(wait=False)
    assert bk.exit_code(60) == 4
    assert "cookie" in bk.log_tail().lower()
    bk.settings["auto_fix_cookie"] = True
    bk.start()
    assert "phase_one" in bk.log_tail(80)
    assert bk.stop() == 0


def _http(bk, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{bk.http_port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_http_endpoints_and_manual_read_only(bookies):
    bk = bookies()
    bk.start()
    store = open_store(bookies.metadata_uri)
    with bk.connect() as c:
        assert add(c, 3, [0, 1, 2]).status == Status.EOK
    code, body = _http(bk, "GET", "/heartbeat")
    assert code == 200
    code, body = _http(bk, "GET", "/api/v1/bookie/info")
    info = json.loads(body)
    assert code == 200 and info["state"] == "writable" and info["ledgers"] == 1 and info["id"] == bk.bookie_id
    code, body = _http(bk, "GET", "/metrics")
    text = body.decode()
    for name in ("zbk_bookie_add_entry_seconds", "zbk_journal_fsync_seconds", "zbk_bookie_requests_total",
                 "zbk_bookie_writable", "zbk_journal_group_commit_entries"):
        assert name in text, name
    assert _http(bk, "PUT", "/api/v1/bookie/state", {"state": "sideways"})[0] == 400
    assert _http(bk, "PUT", "/api/v1/bookie/state", {"state": "readonly"})[0] == 200
    deadline = time.monotonic() + 10
    # Moving between lists writes the new key before deleting the old: wait for the end state.
    while (not list_bookies(store, readonly=True) or list_bookies(store)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [b.bookie_id for b in list_bookies(store, readonly=True)] == [bk.bookie_id]
    assert list_bookies(store) == []
    with bk.connect() as c:
        assert add(c, 3, [3]).status == Status.EREADONLY
        assert check_payloads(read(c, 3, 0, 3), 3) == [0, 1, 2]  # reads still served
    assert _http(bk, "PUT", "/api/v1/bookie/state", {"state": "writable"})[0] == 200
    with bk.connect() as c:
        assert add(c, 3, [3]).status == Status.EOK
    assert bk.stop() == 0
    deadline = time.monotonic() + 5
    while list_bookies(store) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list_bookies(store) == [], "a clean stop unregisters the bookie"
    store.close()


def test_disk_over_threshold_turns_read_only(bookies):
    bk = bookies(settings={"disk_usage_threshold": 0.001, "disk_usage_warn_threshold": 0.0005,
                           "disk_check_interval_ms": 100})
    bk.start()
    time.sleep(0.5)
    with bk.connect() as c:
        assert add(c, 4, [0]).status == Status.EREADONLY
        info = c.call(w.BookieInfoRequest(rid=c.next_rid()))
        assert info.state == "readonly"
        assert add(c, 4, [0], flags=AddFlag.RECOVERY_ADD).status == Status.EREADONLY
    assert bk.stop() == 0


def test_force_write_lac_and_write_close(bookies):
    bk = bookies()
    bk.start()
    with bk.connect() as c:
        assert add(c, 6, list(range(4))).status == Status.EOK
        assert c.call(w.ForceLedgerRequest(rid=c.next_rid(), ledger_id=6)).status == Status.EOK
        assert c.call(w.ForceLedgerRequest(rid=c.next_rid(), ledger_id=99)).status == Status.ENOLEDGER
        r = c.call(w.WriteLacRequest(rid=c.next_rid(), ledger_id=6, master_key=MK, lac=3))
        assert r.status == Status.EOK
        assert c.call(w.WriteLacRequest(rid=c.next_rid(), ledger_id=6, master_key=b"\x03" * 32, lac=9)).status == Status.EUA
        assert c.call(w.ReadLacRequest(rid=c.next_rid(), ledger_id=6)).lac == 3
        assert c.call(w.WriteCloseRequest(rid=c.next_rid(), ledger_id=6, master_key=MK)).status == Status.EOK
        assert c.call(w.WriteCloseRequest(rid=c.next_rid(), ledger_id=6, master_key=b"\x03" * 32)).status == Status.EUA
    bk.kill9()
    bk.start()
    with bk.connect() as c:  # the explicit LAC was journaled: it survives kill -9
        assert c.call(w.ReadLacRequest(rid=c.next_rid(), ledger_id=6)).lac == 3
    assert bk.stop() == 0


def test_sparse_ranged_read_returns_every_held_entry_of_the_range(bookies):
    bk = bookies()
    bk.start()
    held = [e for e in range(30) if e % 3 != 1]  # a stripe pattern: E=3, WQ=2
    with bk.connect() as c:
        assert add(c, 8, held).status == Status.EOK
        plain = read(c, 8, 0, 30)
        assert check_payloads(plain, 8) == [0]  # a plain ranged read stops at the first gap
        sparse = read(c, 8, 0, 30, flags=ReadFlag.SPARSE)
        assert sparse.status == Status.EOK
        from zbk.wire.entry import peek_entry_header

        assert [peek_entry_header(b)[1] for b in sparse.entries] == held
        assert read(c, 8, 31, 5, flags=ReadFlag.SPARSE).status == Status.ENOENTRY
        # One stripe: the held entries of the range whose id % 3 is the residue.
        for first, residue in ((0, 0), (0, 2), (4, 0), (5, 2), (7, 2)):
            striped = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=8, first_entry_id=first, count=20,
                                           flags=ReadFlag.SPARSE, stripe=(3, residue)))
            assert striped.status == Status.EOK
            assert [peek_entry_header(b)[1] for b in striped.entries] == \
                [e for e in held if first <= e < first + 20 and e % 3 == residue]
        lacking = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=8, first_entry_id=0, count=30,
                                       flags=ReadFlag.SPARSE, stripe=(3, 1)))
        assert lacking.status == Status.ENOENTRY and not lacking.entries
        # Asked for packed entries: the same blobs, as a length table and one frame.
        packed = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=8, first_entry_id=0, count=30,
                                      flags=ReadFlag.SPARSE, packed=True))
        assert packed.packed and list(map(bytes, packed.entries)) == list(map(bytes, sparse.entries))
        one = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=8, first_entry_id=0, count=1, packed=True))
        assert not one.packed and len(one.entries) == 1, "one entry is not worth a length table"
        bad = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=8, first_entry_id=0, count=2,
                                   flags=ReadFlag.SPARSE | ReadFlag.FENCE, master_key=MK))
        assert bad.status == Status.EBADREQ
    assert bk.stop() == 0


def test_long_poll_answers_new_entries_or_times_out_with_the_lac(bookies):
    bk = bookies()
    bk.start()
    with bk.connect() as c:
        assert add(c, 9, [0, 1, 2]).status == Status.EOK  # entry 2 piggybacks LAC 1
        poll = w.ReadRequest(rid=c.next_rid(), ledger_id=9, first_entry_id=0, count=10, flags=ReadFlag.LONG_POLL,
                             previous_lac=1, timeout_ms=300)
        r = c.call(poll)  # nothing beyond LAC 1 yet: times out, says so, and tells the LAC
        assert r.status == Status.ENOENTRY and r.lac == 1 and not r.entries
        poll = w.ReadRequest(rid=c.next_rid(), ledger_id=9, first_entry_id=0, count=10, flags=ReadFlag.LONG_POLL,
                             previous_lac=1, timeout_ms=5000)
        c.send(poll)
        more = w.AddRequest(rid=c.next_rid(), ledger_id=9, master_key=MK, flags=AddFlag(0), entries=[entry(9, 3, 256)])
        c.send(more)  # entry 3 piggybacks LAC 2: wakes the poll
        # The poll may be answered before the add: LAC 2 holds once entry 3 is appended,
        # without waiting for entry 3's own fsync.
        answers = {}
        while len(answers) < 2:
            a = c.recv()
            answers[a.rid] = a
        assert answers[more.rid].status == Status.EOK
        r = answers[poll.rid]
        assert r.status == Status.EOK and r.lac == 2 and check_payloads(r, 9) == [2]
    assert bk.stop() == 0


def test_new_disks_under_an_id_that_ledgers_name_run_phase_one(bookies):
    """A bookie id whose cookie was deleted from metadata and whose disks were replaced
    looks brand-new; ledgers still name it, so it must not answer explicit negatives for
    their entries: phase one fences and limbos the open ones (BP-46)."""
    bk = bookies()
    store = open_store(bookies.metadata_uri)
    ledgers = LedgerStore(store)
    frag = ((0, (bk.bookie_id, "127.0.0.1:1", "127.0.0.1:2")),)
    md, _ = ledgers.create(LedgerMetadata(ledger_id=0, ensemble_size=3, write_quorum=3, ack_quorum=2,
                                          password=b"secret", fragments=frag))
    bk.start()
    with bk.connect() as c:
        assert c.call(w.BookieInfoRequest(rid=c.next_rid())).limbo_ledgers == 1
        assert read(c, md.ledger_id, 0).status == Status.EUNKNOWN
        assert add(c, md.ledger_id, [0]).status == Status.EFENCED
    assert bk.stop() == 0
    store.close()


def test_count_missing_against_index_ranges():
    """Phase one's check of a closed ledger: which assigned entries the index ranges lack."""
    from zbk.recovery.repair import count_missing

    assert count_missing([], []) == 0
    assert count_missing([0, 1, 2], []) == 3
    assert count_missing([0, 1, 2], [(0, 2)]) == 0
    assert count_missing([0, 2, 3, 5, 6, 8], [(0, 0), (3, 5)]) == 3  # 2, 6, 8
    assert count_missing([4, 5], [(0, 1), (9, 12)]) == 2
    assert count_missing([10, 11, 20], [(0, 10), (12, 19), (21, 30)]) == 2  # 11, 20
