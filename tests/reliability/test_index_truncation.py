"""An index file cut inside its last page: a torn write (the size a crash can leave) reads
as absent slots, which journal replay puts back; any other cut is corruption."""

from __future__ import annotations

import os

import pytest

from zbk.errors import CorruptDataError
from zbk.storage import index
from zbk.storage.disk import REAL_DISK


def _file_with_two_pages(path: str) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        REAL_DISK.pwrite(fd, index.IndexHeader(master_key=b"k" * 32).encode(9), 0)
        for page_no in (0, 1):
            page = index.new_page()
            for e in range(page_no * index.PAGE_ENTRIES, (page_no + 1) * index.PAGE_ENTRIES):
                index.set_slot(page, e, (1 << 40) | (64 + e))
            index.write_page(REAL_DISK, fd, page_no, page)
    finally:
        os.close(fd)


def _read(path: str, page_no: int) -> list[int]:
    fd = os.open(path, os.O_RDONLY)
    try:
        return index.page_entries(index.read_page(fd, page_no, path), page_no, path)
    finally:
        os.close(fd)


def test_a_cut_where_a_torn_write_can_end_reads_the_rest_as_absent(tmp_path):
    path = str(tmp_path / "x.idx")
    _file_with_two_pages(path)
    end = 3 * 4096  # a page-cache boundary inside page 0
    os.truncate(path, end)
    present = _read(path, 0)
    assert present == list(range((end - index.HEADER_BYTES) // index.SLOT_BYTES))
    assert _read(path, 1) == []


@pytest.mark.parametrize("cut", [index.HEADER_BYTES + 5, 3 * 4096 + 16, index.page_offset(1) + 100])
def test_any_other_cut_inside_a_page_is_corruption_with_file_and_offset(tmp_path, cut):
    path = str(tmp_path / "x.idx")
    _file_with_two_pages(path)
    os.truncate(path, cut)
    page_no = (cut - index.HEADER_BYTES) // index.PAGE_BYTES
    with pytest.raises(CorruptDataError, match="truncated") as err:
        _read(path, page_no)
    assert (err.value.path, err.value.offset) == (path, cut)


def test_whole_pages_and_an_intact_file_read_normally(tmp_path):
    path = str(tmp_path / "x.idx")
    _file_with_two_pages(path)
    assert len(_read(path, 1)) == index.PAGE_ENTRIES
    os.truncate(path, index.page_offset(1))  # a whole page gone: indistinguishable from never written
    assert _read(path, 1) == [] and len(_read(path, 0)) == index.PAGE_ENTRIES
