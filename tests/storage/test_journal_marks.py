"""One last mark per journal (zbk/storage/markers.py): journal 0 keeps ``lastMark``, journal i
``lastMark.<i>``; each is read on its own, the greatest over the index directories."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zbk.errors import CorruptDataError
from zbk.storage.journal import START, LogMark
from zbk.storage.markers import (
    LAST_MARK_FILE,
    last_mark_file,
    read_last_mark,
    read_last_marks,
    write_last_mark,
    write_last_marks,
)


def test_each_journal_has_its_own_mark_file(tmp_path: Path) -> None:
    d = str(tmp_path)
    assert [last_mark_file(j) for j in range(3)] == [LAST_MARK_FILE, f"{LAST_MARK_FILE}.1", f"{LAST_MARK_FILE}.2"]
    assert read_last_marks(d, 2) == [START, START]
    write_last_marks(d, [LogMark(4, 100), (7, 24)])
    assert sorted(os.listdir(d)) == ["lastMark", "lastMark.1"]
    assert read_last_marks(d, 2) == [LogMark(4, 100), LogMark(7, 24)]
    assert read_last_mark(d) == LogMark(4, 100)  # journal 0's, as a one-journal bookie reads it
    assert read_last_mark(d, journal=1) == LogMark(7, 24)
    # A journal added later has no mark yet: it replays from its start.
    assert read_last_marks(d, 3) == [LogMark(4, 100), LogMark(7, 24), START]


def test_one_journals_mark_moves_without_the_others(tmp_path: Path) -> None:
    d = str(tmp_path)
    write_last_marks(d, [LogMark(2, 50), LogMark(3, 60)])
    write_last_mark(d, LogMark(9, 10), journal=1)  # a crash between two journals' marks of one checkpoint
    assert read_last_marks(d, 2) == [LogMark(2, 50), LogMark(9, 10)]


def test_marks_are_the_greatest_over_index_dirs_per_journal(tmp_path: Path) -> None:
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    write_last_marks(dirs, [LogMark(3, 1), LogMark(3, 1)])
    write_last_mark(dirs[1], LogMark(5, 0), journal=1)
    write_last_mark(dirs[0], LogMark(4, 0), journal=0)
    assert read_last_marks(dirs, 2) == [LogMark(4, 0), LogMark(5, 0)]


def test_a_damaged_mark_of_any_journal_is_an_error(tmp_path: Path) -> None:
    d = str(tmp_path)
    write_last_marks(d, [LogMark(1, 1), LogMark(2, 2)])
    with open(tmp_path / "lastMark.1", "r+b") as f:
        f.seek(14)
        f.write(b"\xff")
    assert read_last_mark(d) == LogMark(1, 1)
    with pytest.raises(CorruptDataError, match="lastMark.1"):
        read_last_marks(d, 2)
