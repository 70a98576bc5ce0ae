"""The shell's offline tools on a real bookie's files: localconsistencycheck (clean, then
with damage of each kind it must find), listfilesondisc, and bookieformat (refusals, then
a wiped bookie that boots again as a new one)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest
from crc32c import crc32c
from helpers.bookie import wait_registered
from helpers.shell import refused, shell, shell_json

import zbk
from zbk.storage.entrylog import list_logs, scan_file
from zbk.wire.entry import ENTRY_HEADER_BYTES

_RECORD_PREFIX = struct.Struct("<II")  # an entry log record's length and crc32c (zbk/storage/entrylogformat.py)


@pytest.fixture
def written(bookies):
    """Three bookies holding every entry of three ledgers (crc32c, hmac and dummy digests)."""
    bks = [bookies(f"b{i}").start() for i in range(3)]
    ledgers = {}
    with zbk.BookKeeper(bookies.metadata_uri) as bk:
        for digest in ("crc32c", "hmac", "dummy", "crc32"):
            lh = bk.create_ledger(3, 3, 3, password=b"pw", digest=digest)
            for i in range(20):
                lh.append(b"%s-%d" % (digest.encode(), i))
            lh.close()
            ledgers[digest] = lh.ledger_id
    return bookies.metadata_uri, bks, ledgers


def _records(data_dir: Path) -> list[tuple[str, int, int, int, bytes]]:
    """(log path, ledger id, entry id, record offset, blob) of every record of the bookie."""
    out = []
    for path in list_logs(str(data_dir / "ledgers")).values():
        out += [(path, lid, eid, off, blob) for lid, eid, off, blob in scan_file(path)]
    return out


def _patch(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_localconsistencycheck_passes_a_clean_bookie_and_finds_each_kind_of_damage(written):
    uri, bks, ledgers = written
    assert bks[0].stop() == 0
    d = str(bks[0].data_dir)
    clean = shell_json("localconsistencycheck", "--data-dir", d)
    assert clean["ok"] is True and clean["bad"] == []
    assert clean["ledgers"] == 4 and clean["entries"] == 80
    assert clean["digests_checked"] == 40 and clean["digests_unchecked_hmac"] == 20 and clean["no_digest"] == 20
    r = shell("localconsistencycheck", "--data-dir", d)
    assert r.returncode == 0 and "80 entries" in r.stdout and r.stdout.rstrip().endswith("OK")

    records = {(lid, eid): (path, off, blob) for path, lid, eid, off, blob in _records(bks[0].data_dir)}
    # 1. A flipped payload byte: the record's crc32c fails.
    path, off, blob = records[(ledgers["crc32c"], 3)]
    _patch(path, off + 24 + len(blob) - 1, bytes([blob[-1] ^ 0xFF]))
    # 2. A flipped payload byte with the record crc made right again: only the entry's own
    #    crc32 digest can tell (the bookie's write path checks no digest).
    path, off, blob = records[(ledgers["crc32"], 5)]
    forged = blob[:-1] + bytes([blob[-1] ^ 0xFF])
    ids = struct.pack("<Qq", ledgers["crc32"], 5)
    _patch(path, off, _RECORD_PREFIX.pack(16 + len(forged), crc32c(forged, crc32c(ids))) + ids + forged)
    # 3. The same on an hmac entry: not checkable without the password, so not reported.
    path, off, blob = records[(ledgers["hmac"], 7)]
    forged = blob[:-1] + bytes([blob[-1] ^ 0xFF])
    ids = struct.pack("<Qq", ledgers["hmac"], 7)
    _patch(path, off, _RECORD_PREFIX.pack(16 + len(forged), crc32c(forged, crc32c(ids))) + ids + forged)
    # 4. A dummy entry whose header names another entry id: structure is checked without a digest.
    path, off, blob = records[(ledgers["dummy"], 9)]
    bad_header = blob[:10] + struct.pack(">q", 10) + blob[18:ENTRY_HEADER_BYTES] + blob[ENTRY_HEADER_BYTES:]
    ids = struct.pack("<Qq", ledgers["dummy"], 9)
    _patch(path, off, _RECORD_PREFIX.pack(16 + len(bad_header), crc32c(bad_header, crc32c(ids))) + ids + bad_header)

    got = shell_json("localconsistencycheck", "--data-dir", d, code=1)
    bad = {(b["ledger_id"], b["entry_id"]): b["problem"] for b in got["bad"]}
    assert set(bad) == {(ledgers["crc32c"], 3), (ledgers["crc32"], 5), (ledgers["dummy"], 9)}, bad
    assert "crc32c" in bad[(ledgers["crc32c"], 3)]
    assert "digest" in bad[(ledgers["crc32"], 5)]
    assert f"{ledgers['dummy']}:10" in bad[(ledgers["dummy"], 9)]
    assert got["ok"] is False and got["entries"] == 80
    r = shell("localconsistencycheck", "--data-dir", d)
    assert r.returncode == 1 and "3 BAD" in r.stdout and "Traceback" not in r.stderr

    # 5. An entry log gone: every entry that points into it is reported.
    for path in {p for p, *_ in _records(bks[0].data_dir)}:
        os.unlink(path)
    got = shell_json("localconsistencycheck", "--data-dir", d, code=1)
    assert len(got["bad"]) == 80 and all("does not exist" in b["problem"] for b in got["bad"])

    # 6. A damaged index slot.
    from zbk.storage.index import HEADER_BYTES, SLOT_BYTES, index_path

    assert bks[1].stop() == 0
    idx = index_path(str(bks[1].data_dir / "index"), ledgers["crc32c"])
    _patch(idx, HEADER_BYTES + 2 * SLOT_BYTES, b"\x01" * 8)
    got = shell_json("localconsistencycheck", "--data-dir", str(bks[1].data_dir), code=1)
    assert [(b["ledger_id"], b["entry_id"]) for b in got["bad"]] == [(ledgers["crc32c"], 2)]
    assert "slot" in got["bad"][0]["problem"] and got["entries"] == 79

    refused(shell("localconsistencycheck", "--data-dir", str(bks[0].data_dir / "nope")), 2, "no such directory")


def test_listfilesondisc(written):
    _, bks, ledgers = written
    assert bks[0].stop() == 0
    d = bks[0].data_dir
    files = shell_json("listfilesondisc", "--data-dir", str(d))
    kinds = {f["kind"] for f in files}
    assert {"journal", "entrylog", "index"} <= kinds
    for f in files:
        assert f["bytes"] == os.path.getsize(f["path"]) and f["path"].startswith(str(d))
    assert {f["id"] for f in files if f["kind"] == "index"} == set(ledgers.values())
    assert {f["path"] for f in files if f["kind"] == "entrylog"} == set(list_logs(str(d / "ledgers")).values())
    only_logs = shell_json("--data-dir", str(d), "listfilesondisc", "--entrylog")
    assert only_logs and {f["kind"] for f in only_logs} == {"entrylog"}
    both = shell_json("listfilesondisc", "--index", "--journal", "--data-dir", str(d))
    assert {f["kind"] for f in both} - {"journal-free"} == {"index", "journal"}
    r = shell("listfilesondisc", "--data-dir", str(d))
    assert r.returncode == 0 and f"{len(files)} files" in r.stdout and "entrylog" in r.stdout


def test_bookieformat_refuses_then_wipes_and_the_bookie_boots_as_new(written, tmp_path: Path):
    uri, bks, ledgers = written
    b = bks[0]
    d = str(b.data_dir)
    before = sorted(str(p) for p in b.data_dir.rglob("*"))

    # Without --force: nothing changes, and the message says what would go.
    refused(shell("bookieformat", "--data-dir", d, "--metadata", uri), 1, "OPERATION_REFUSED", "--force",
            f"cookie of bookie {b.bookie_id}")
    # While the bookie is registered (running): refused, nothing changes.
    refused(shell("bookieformat", "--data-dir", d, "--metadata", uri, "--force"), 1, "OPERATION_REFUSED",
            f"bookie {b.bookie_id} is registered", "stop it first")
    assert sorted(str(p) for p in b.data_dir.rglob("*")) == before
    assert shell_json("cookie", "get", b.bookie_id, "--metadata", uri)["bookie_id"] == b.bookie_id

    assert b.stop() == 0
    got = shell_json("--metadata", uri, "bookieformat", "--force", "--data-dir", d)
    assert got["bookie_id"] == b.bookie_id and got["metadata_cookie"] == "deleted" and got["files_removed"] > 0
    for sub in ("journal", "ledgers", "index"):
        assert os.listdir(b.data_dir / sub) == [], sub
    refused(shell("cookie", "get", b.bookie_id, "--metadata", uri), 1, "no cookie")

    # The bookie starts again as a new, empty bookie under the same id.
    b.start()
    wait_registered(uri, [b.bookie_id])
    assert shell_json("cookie", "get", b.bookie_id, "--metadata", uri)["bookie_id"] == b.bookie_id
    assert shell_json("ledgerentries", "--bookie", b.bookie_id, str(ledgers["crc32c"]), code=1)["ranges"] == []
    # The ledgers still read from the other two replicas.
    read = shell_json("readledger", str(ledgers["crc32c"]), "--metadata", uri, "--password", "pw")
    assert len(read) == 20

    # Directories without a cookie: wiped, metadata untouched.
    empty = tmp_path / "stray"
    (empty / "journal").mkdir(parents=True)
    (empty / "journal" / "junk").write_bytes(b"x")
    got = shell_json("bookieformat", "--data-dir", str(empty), "--metadata", uri, "--force")
    assert got["bookie_id"] is None and "metadata untouched" in got["metadata_cookie"]
    assert os.listdir(empty / "journal") == []


def test_offline_tools_find_a_bookies_configured_directories_through_its_cookie(bookies, tmp_path: Path):
    """A bookie configured with journal_dirs, ledger_dirs and index_dirs instead of a data
    dir: any one of its directories serves as --data-dir, the cookie names the others."""
    disks = tmp_path / "disks"
    settings = {"journal_dirs": str(disks / "j"), "ledger_dirs": f"{disks / 'l1'},{disks / 'l2'}",
                "index_dirs": str(disks / "x"), "entry_log_per_ledger": True}
    b = bookies("split", settings=settings).start()
    with zbk.BookKeeper(bookies.metadata_uri) as bk:
        ids = []
        for n in range(4):
            lh = bk.create_ledger(1, 1, 1)
            for i in range(10):
                lh.append(b"%d-%d" % (n, i))
            lh.close()
            ids.append(lh.ledger_id)
    assert b.stop() == 0
    assert not b.data_dir.exists() or not any(b.data_dir.iterdir()), "nothing under the unused data dir"

    for one_of_them in ("x", "l2", "j"):
        files = shell_json("listfilesondisc", "--data-dir", str(disks / one_of_them))
        assert {f["id"] for f in files if f["kind"] == "index"} == set(ids)
        assert {Path(f["path"]).parent.name for f in files if f["kind"] == "entrylog"} <= {"l1", "l2"}
        assert any(f["kind"] == "journal" for f in files)
    check = shell_json("localconsistencycheck", "--data-dir", str(disks / "j"))
    assert check["ok"] and check["ledgers"] == 4 and check["entries"] == 40
    assert shell_json("lastmark", "--data-dir", str(disks / "x"))["segment_id"] > 0
    assert shell_json("readjournal", "--data-dir", str(disks / "j")) == []  # a clean stop checkpointed everything

    got = shell_json("bookieformat", "--data-dir", str(disks / "x"), "--metadata", bookies.metadata_uri, "--force")
    assert got["metadata_cookie"] == "deleted"
    for sub in ("j", "l1", "l2", "x"):
        assert os.listdir(disks / sub) == [], sub
