"""Bit flips and truncations in the journal, entry logs and index files of real bookies.

Each test writes through the wire protocol, stops the bookie (cleanly, or with kill -9 when
the damage must hit journal records that a checkpoint would otherwise retire), damages one
file the way a disk does, then restarts and checks three things: the damage is detected by
a checksum or format check, the log names the file and the offset, and no damaged byte is
ever served (a read of the damaged entry answers EIO; undamaged entries are still served).
Where the damage leaves no safe way to serve anything (a corrupt journal record that was
acknowledged, a corrupt entry log or index header), the bookie refuses to boot (exit 5).

Every bookie is stopped by PID at teardown (conftest.py).
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from helpers.journal import write_torn
from helpers.wait import wait_until

from zbk.errors import EXIT_BOOT
from zbk.metadata.registry import list_bookies
from zbk.metadata.uri import open_store
from zbk.storage import entrylog, index
from zbk.storage.journal import list_segments, segment_name
from zbk.wire.status import Status

from .util import add, checked, metric, read, read_all

SIZE = 1000


def flip(path: Path, offset: int, mask: int = 0x10) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ mask]))


def cut(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def fill(bk, ledgers: dict[int, int], size: int = SIZE) -> None:
    """Add entries 0..n-1 to each ledger, in batches of 10."""
    with bk.connect() as c:
        for lid, n in ledgers.items():
            for first in range(0, n, 10):
                assert add(c, lid, list(range(first, min(n, first + 10))), size).status == Status.EOK


def entry_offsets(data_dir: Path) -> dict[tuple[int, int], tuple[Path, int]]:
    """(ledger, entry) -> (entry log file, record offset), from the offline log reader."""
    out = {}
    for path in sorted((data_dir / "ledgers").glob("*.log")):
        for lid, eid, offset, _ in entrylog.scan_file(str(path)):
            out[(lid, eid)] = (path, offset)
    return out


def boot_fails_naming(bk, path: Path, offset: int | None = None) -> str:
    bk.start(wait=False)
    code = bk.exit_code(60)
    log = bk.log_tail(60)
    assert code == EXIT_BOOT, f"expected boot failure (exit {EXIT_BOOT}), got {code}\n{log}"
    assert str(path) in log, log
    if offset is not None:
        assert f"offset {offset}" in log, log
    return log


# --- entry logs ------------------------------------------------------------------------------


def test_entry_log_bit_flip_is_eio_for_that_entry_only(bookies):
    bk = bookies().start()
    fill(bk, {1: 100, 2: 50})
    assert bk.stop() == 0
    path, offset = entry_offsets(bk.data_dir)[(1, 42)]
    flip(path, offset + entrylog.RECORD_HEADER_BYTES + 500)  # inside the payload
    bk.start()
    with bk.connect() as c:
        r = read(c, 1, 42)
        assert r.status == Status.EIO and not r.entries
        ranged = read(c, 1, 0, 100)  # a ranged read stops before the damage and says why
        assert checked(ranged, 1, SIZE) == list(range(42)) and ranged.status == Status.EIO
        assert checked(read(c, 1, 43, 57), 1, SIZE) == list(range(43, 100))
        read_all(c, 2, 49, SIZE)
    log = bk.log_tail(50)
    assert str(path) in log and f"offset {offset}" in log and "crc32c" in log, log
    assert metric(bk, "zbk_bookie_requests_total", 'status="EIO"') >= 2
    assert bk.stop() == 0


def test_entry_log_truncation_is_sealed_at_the_cut_and_the_rest_is_eio(bookies):
    bk = bookies().start()
    fill(bk, {1: 100})
    assert bk.stop() == 0
    path, offset = entry_offsets(bk.data_dir)[(1, 60)]
    cut(path, offset + 37)  # inside record 60; the footer is gone too
    bk.start()
    log = bk.log_tail(50)
    assert str(path) in log and f"offset {offset}" in log and "sealed" in log, log
    with bk.connect() as c:
        read_all(c, 1, 59, SIZE)
        for eid in (60, 61, 99):
            r = read(c, 1, eid)
            assert r.status == Status.EIO and not r.entries, (eid, r)
    assert bk.stop() == 0


def test_entry_log_header_corruption_refuses_boot(bookies):
    bk = bookies().start()
    fill(bk, {1: 20})
    assert bk.stop() == 0
    path = sorted((bk.data_dir / "ledgers").glob("*.log"))[0]
    flip(path, 3)  # the magic
    boot_fails_naming(bk, path, 0)


def test_client_reads_a_good_replica_when_one_copy_is_corrupt(bookies):
    """Two bookies hold every entry; one has bit rot in many records. The client reads
    every entry correctly: the damaged bookie answers EIO, the client asks the other."""
    import zbk

    a, b = bookies("a").start(), bookies("b").start()
    store = open_store(bookies.metadata_uri)
    try:  # a bookie answers before its registration is published: wait for both
        wait_until(lambda: len(list_bookies(store)) == 2, timeout_s=20, message="both bookies registered")
    finally:
        store.close()
    payloads = [os.urandom(700) for _ in range(60)]
    with zbk.BookKeeper(bookies.metadata_uri) as bk:
        lh = bk.create_ledger(ensemble=2, write_quorum=2, ack_quorum=2, password=b"pw", digest="crc32c")
        for p in payloads:
            lh.append(p)
        lh.close()
        lid = lh.ledger_id
    assert a.stop() == 0
    rng = random.Random(7)
    for (l_id, _), (path, offset) in entry_offsets(a.data_dir).items():
        if l_id == lid:
            flip(path, offset + entrylog.RECORD_HEADER_BYTES + rng.randrange(100, 700))
    a.start()
    with zbk.BookKeeper(bookies.metadata_uri) as bk:
        rh = bk.open_ledger(lid, password=b"pw", recovery=False)
        # Entry by entry: the first bookie asked is the first of each entry's write set, so
        # the damaged one is asked first for half of them, whatever the ensemble's order.
        got = [next(iter(rh.read(e, e))).payload for e in range(60)]
    assert got == payloads
    assert metric(a, "zbk_bookie_requests_total", 'status="EIO"') > 0, "the damaged bookie was never asked"
    assert a.stop() == 0 and b.stop() == 0


# --- index files -----------------------------------------------------------------------------


def _index_file(bk, lid: int) -> Path:
    return Path(index.index_path(str(bk.data_dir / "index"), lid))


def test_index_header_bit_flip_refuses_boot(bookies):
    bk = bookies().start()
    fill(bk, {5: 30})
    assert bk.stop() == 0
    path = _index_file(bk, 5)
    flip(path, 40)  # inside the master key
    boot_fails_naming(bk, path, 0)


def test_index_slot_bit_flip_is_detected_with_file_and_offset(bookies):
    bk = bookies().start()
    fill(bk, {5: 30})
    assert bk.stop() == 0
    path = _index_file(bk, 5)
    slot = index.HEADER_BYTES + 17 * index.SLOT_BYTES
    flip(path, slot + 2)  # the location of entry 17
    # Boot reads the ledger's last index page for its last entry id: the damage is found
    # there and the bookie refuses to serve a ledger whose index it cannot trust.
    boot_fails_naming(bk, path, slot)


def test_index_truncated_inside_a_page_refuses_boot(bookies):
    bk = bookies().start()
    fill(bk, {5: 30})
    assert bk.stop() == 0
    path = _index_file(bk, 5)
    size = index.HEADER_BYTES + 20 * index.SLOT_BYTES + 5  # not where a torn write can end
    cut(path, size)
    log = boot_fails_naming(bk, path, size)
    assert "truncated" in log


# --- journal -----------------------------------------------------------------------------------


def _journal_with_segments(bookies, segments: int = 3):
    """A bookie killed with several journal segments that no checkpoint retired."""
    bk = bookies(settings={"flush_interval_ms": 600_000, "journal_max_size_mb": 1}).start()
    journal = bk.data_dir / "journal"
    with bk.connect() as c:
        e = 0
        while len(list_segments(str(journal))) < segments + 1:
            assert add(c, 1, list(range(e, e + 10)), 10_000).status == Status.EOK
            e += 10
    bk.kill9()
    return bk, journal, [journal / segment_name(s) for s in list_segments(str(journal))]


def test_journal_bit_flip_in_a_sealed_segment_refuses_boot(bookies):
    bk, _, segs = _journal_with_segments(bookies)
    offset = segs[0].stat().st_size // 2
    flip(segs[0], offset)
    log = boot_fails_naming(bk, segs[0])
    assert "offset" in log


def test_journal_truncation_of_a_sealed_segment_refuses_boot(bookies):
    bk, _, segs = _journal_with_segments(bookies)
    size = segs[1].stat().st_size * 2 // 3
    cut(segs[1], size)
    log = boot_fails_naming(bk, segs[1])
    assert "offset" in log and "sealed segment" in log


def test_journal_torn_tail_is_truncated_with_file_and_offset_and_earlier_entries_served(bookies):
    bk = bookies(settings={"flush_interval_ms": 600_000}).start()
    with bk.connect() as c:
        for first in range(0, 50, 10):
            assert add(c, 3, list(range(first, first + 10)), SIZE).status == Status.EOK
    bk.kill9()
    seg = bk.data_dir / "journal" / segment_name(list_segments(str(bk.data_dir / "journal"))[-1])
    # Half of a record: what a crash in the middle of a write leaves.
    size = write_torn(seg, (SIZE + 17).to_bytes(4, "little") + os.urandom(40))
    bk.start()
    log = bk.log_tail(60)
    assert "torn tail" in log and str(seg) in log and f"offset {size}" in log, log
    with bk.connect() as c:
        read_all(c, 3, 49, SIZE)
    assert bk.stop() == 0
