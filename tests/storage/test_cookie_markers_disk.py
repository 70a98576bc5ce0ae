"""Cookies, the dirty marker, the last mark, and the Disk implementations."""

from __future__ import annotations

import dataclasses
import os

import cbor2
import pytest

from zbk.errors import CorruptDataError
from zbk.storage.cookie import (
    COOKIE_FILE,
    Cookie,
    decode_cookie,
    read_cookie,
    verify_cookies,
    write_cookie,
    write_cookies,
)
from zbk.storage.disk import FaultyDisk, RealDisk
from zbk.storage.journal import START, LogMark
from zbk.storage.markers import (
    LAST_MARK_FILE,
    clear_dirty,
    mark_dirty,
    read_last_mark,
    was_dirty,
    write_last_mark,
)

from .helpers import flip_byte


def _cookie(tmp_path) -> Cookie:
    return Cookie.new("127.0.0.1:3181", "inst-1", journal_dirs=(str(tmp_path / "j"),),
                      ledger_dirs=(str(tmp_path / "l"),), index_dirs=(str(tmp_path / "x"),))


def _dirs(c: Cookie) -> list[str]:
    return [*c.journal_dirs, *c.ledger_dirs, *c.index_dirs]


def test_cookie_bytes_round_trip_and_fresh_incarnations(tmp_path):
    c = _cookie(tmp_path)
    assert decode_cookie(c.encode()) == c
    assert _cookie(tmp_path).incarnation != c.incarnation
    doc = cbor2.loads(c.encode())
    assert doc["fv"] == 1 and doc["bid"] == "127.0.0.1:3181"


def test_cookie_bytes_of_unknown_version_or_shape_are_refused(tmp_path):
    doc = cbor2.loads(_cookie(tmp_path).encode())
    with pytest.raises(CorruptDataError, match="format version 2"):
        decode_cookie(cbor2.dumps({**doc, "fv": 2}))
    with pytest.raises(CorruptDataError, match="malformed"):
        decode_cookie(cbor2.dumps({k: v for k, v in doc.items() if k != "iid"}))
    with pytest.raises(CorruptDataError, match="malformed"):
        decode_cookie(cbor2.dumps({**doc, "jd": "not-a-list"}))
    with pytest.raises(CorruptDataError):
        decode_cookie(b"\xff\x00garbage")


def test_cookie_files_verify(tmp_path):
    c = _cookie(tmp_path)
    dirs = _dirs(c)
    assert read_cookie(dirs[0]) is None
    write_cookies(dirs, c)
    assert read_cookie(dirs[1]) == c
    assert verify_cookies(dirs, c) == []
    # A directory without its cookie: its data may be gone.
    os.unlink(os.path.join(dirs[2], COOKIE_FILE))
    assert verify_cookies(dirs, c) == [f"{dirs[2]}: cookie missing"]
    # Another incarnation's disk.
    write_cookie(dirs[2], dataclasses.replace(c, incarnation="other", bookie_id="h:1"))
    reasons = verify_cookies(dirs, c)
    assert len(reasons) == 2 and all(r.startswith(dirs[2]) for r in reasons)
    assert any("bookie_id" in r for r in reasons) and any("incarnation" in r for r in reasons)
    # A damaged cookie is a reason too, not a crash of the check.
    write_cookie(dirs[2], c)
    flip_byte(os.path.join(dirs[2], COOKIE_FILE), 20)
    assert verify_cookies(dirs, c)[0].startswith(f"{dirs[2]}: cookie unreadable")
    with pytest.raises(CorruptDataError):
        read_cookie(dirs[2])


def test_dirty_marker_lifecycle(tmp_path):
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert not was_dirty(dirs)
    mark_dirty(dirs)
    assert was_dirty(dirs) and was_dirty(dirs[1])
    clear_dirty(dirs[0])
    assert was_dirty(dirs)  # one directory still says the last run did not end cleanly
    clear_dirty(dirs)
    clear_dirty(dirs)  # idempotent
    assert not was_dirty(dirs)


def test_last_mark(tmp_path):
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert read_last_mark(dirs) == START
    write_last_mark(dirs, LogMark(3, 4096))
    assert read_last_mark(dirs) == LogMark(3, 4096)
    write_last_mark(dirs[0], LogMark(4, 24))  # a crash between the two directories
    assert read_last_mark(dirs) == LogMark(4, 24)
    flip_byte(os.path.join(dirs[1], LAST_MARK_FILE), 15)
    with pytest.raises(CorruptDataError) as err:
        read_last_mark(dirs)
    assert err.value.path == os.path.join(dirs[1], LAST_MARK_FILE)


def test_atomic_write_failure_keeps_the_old_contents(tmp_path):
    path = str(tmp_path / "f")
    RealDisk().write_file_atomic(path, b"old contents")
    disk = FaultyDisk(write_bytes_left=3)
    with pytest.raises(OSError) as err:
        disk.write_file_atomic(path, b"new contents")
    assert err.value.errno == 28
    assert open(path, "rb").read() == b"old contents"
    disk = FaultyDisk(fail_fsync=True)
    with pytest.raises(OSError):
        write_last_mark(str(tmp_path), LogMark(1, 2), disk)
    assert read_last_mark(str(tmp_path)) == START


def test_faulty_disk_partial_write_then_enospc(tmp_path):
    disk = FaultyDisk(write_bytes_left=5)
    fd = os.open(str(tmp_path / "g"), os.O_WRONLY | os.O_CREAT)
    with pytest.raises(OSError):
        disk.write(fd, b"0123456789")
    os.close(fd)
    assert open(str(tmp_path / "g"), "rb").read() == b"01234"  # like a real disk filling up
    assert disk.bytes_written == 5


def test_usage_reports_the_file_system(tmp_path):
    used, total = RealDisk().usage(str(tmp_path))
    assert 0 <= used <= total and total > 0
    assert FaultyDisk(usage_result=(9, 10)).usage(str(tmp_path)) == (9, 10)
