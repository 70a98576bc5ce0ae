"""A booted bookie's journals and entry logs write with O_DIRECT unless told not to
(``journal_direct_io``, ``entry_log_direct_io``). Journals whose commits are not fsynced
(``journal_sync_data`` off) write buffered, where a direct write would wait for the disk that
a buffered one leaves to the page cache; so do entry logs per ledger."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from helpers.directio import direct_io_ok

from zbk.bookie.boot import BookieBoot
from zbk.config import BookieConfig, EntryLogConfig, JournalConfig
from zbk.metadata.memory import MemoryMetadataStore


@contextmanager
def _booted(tmp_path, direct: bool, **settings: Any) -> Iterator[BookieBoot]:
    """A bookie booted on ``tmp_path`` with ``settings``; skipped where ``direct`` is expected
    and the file system refuses O_DIRECT."""
    if direct and not direct_io_ok(str(tmp_path)):
        pytest.skip(f"{tmp_path}: the file system refuses O_DIRECT")
    store = MemoryMetadataStore()
    cfg = BookieConfig(bookie_id="b1:3181", data_dir=str(tmp_path / "data"), metadata_uri=store.uri, **settings)
    bookie = BookieBoot(cfg, store=store)
    try:
        bookie.boot()
        yield bookie
    finally:
        for close in (bookie.logs.close, *(j.close for j in bookie.journals), bookie.cache.close):
            close()
        store.close()


@pytest.mark.parametrize(("journal", "direct"), [
    (JournalConfig(), True),
    (JournalConfig(direct_io=False), False),
    (JournalConfig(sync_data=False), False),
])
def test_the_journals_of_a_booted_bookie_write_direct_by_default(tmp_path, journal, direct):
    with _booted(tmp_path, direct, journal=journal,
                 journal_dirs=(str(tmp_path / "j0"), str(tmp_path / "j1"))) as bookie:
        assert [j._dfd >= 0 for j in bookie.journals] == [direct, direct]


@pytest.mark.parametrize(("entry_log", "direct"), [
    (EntryLogConfig(), True),
    (EntryLogConfig(direct_io=False), False),
    (EntryLogConfig(per_ledger=True), False),
])
def test_the_entry_logs_of_a_booted_bookie_write_direct_by_default(tmp_path, entry_log, direct):
    with _booted(tmp_path, direct, entry_log=entry_log) as bookie:
        bookie.logs.append(1, 0, b"x" * 5000)
        assert [lg.dfd >= 0 for lg in bookie.logs._active.values()] == [direct]
