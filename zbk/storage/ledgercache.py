"""The ledger cache: index pages and ledger headers in memory, flushed lazily to index files.

``put`` only touches memory (the add path); :meth:`LedgerCache.flush` writes every dirty
page and header and makes them durable (checkpoint step two, after the entry logs were
flushed, so an index on disk never points at entry-log bytes that are not durable).

Syncing a flush: with ``syncfs=True`` (the bookie's ``index_flush_syncfs``, the
default) and a kernel whose ``syncfs`` reports writeback errors (Linux >= 5.8), a flush is
made durable by one ``syncfs`` per file system holding index directories instead of an
fsync per written file. The descriptor it goes through is a directory's, opened when the
cache is made and kept, so every writeback error on that file system since then is
reported to the flush, which then fails and leaves its pages dirty (as a failed fsync
does). A checkpoint of 10,000 ledgers with one new entry each took 1.2 s and 0.5 s of the
machine's CPU with fsyncs, 0.2 s and 0.16 s with syncfs (bench/storage_micro.py,
"index flush"). The price: a syncfs also writes back whatever else is dirty on that file
system; on one shared with heavy writers, set ``index_flush_syncfs = false``. Where an
index directory is on a file system whose syncfs makes nothing durable (FUSE:
:func:`zbk.storage.disk.syncfs_untrusted_fs`), flushes fsync each file, with a warning.

Memory: pages are ``PAGE_BYTES`` each (16 KiB with 1024 entries per page). Clean pages
are evicted least-recently-used first when the cache holds more than ``bytes_max``. A
dirty page is never dropped: when dirty pages alone reach ``bytes_max``,
:attr:`LedgerCache.needs_flush` turns true and the owner should run a checkpoint. Per
ledger the cache also keeps a small state record (path, header, highest entry id put);
those are not counted in ``bytes_max``.

Deltas, new pages and changed ranges: zbk/storage/ledgerpages.py. Index file descriptors:
zbk/storage/ledgerfiles.py.

One owner (the IndexSyncer actor); not thread-safe. The file format is in
:mod:`zbk.storage.index`.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence

from zbk import limits
from zbk.errors import BadRequestError, CorruptDataError
from zbk.storage import index
from zbk.storage.disk import REAL_DISK, SYNCFS_REPORTS_ERRORS, Disk, syncfs_untrusted_fs
from zbk.storage.index import PAGE_BYTES, PAGE_ENTRIES, SLOT_KEY, IndexHeader
from zbk.storage.ledgerfiles import FILES_OPEN_MAX_DEFAULT, LedgerFiles, _Ledger
from zbk.storage.ledgerpages import (
    _NEW_PAGE_DELTA_SLOTS_MAX,
    DELTA_PAGE_BYTES,
    DELTA_SLOT_BYTES,
    LedgerPages,
    Page,
    _apply,
)

__all__ = ["DELTA_PAGE_BYTES", "DELTA_SLOT_BYTES", "FILES_OPEN_MAX_DEFAULT", "LedgerCache", "LedgerFiles", "Page"]

log = logging.getLogger(__name__)

_FLUSH_GROUP = 512  # files written before their fsyncs in a flush (at most the descriptors kept, see flush)


class LedgerCache(LedgerPages):
    """Entry id -> location for every ledger of a bookie, and each ledger's header."""

    def __init__(self, index_dirs: Sequence[str], bytes_max: int = limits.ledger_cache_bytes_max_default,
                 disk: Disk = REAL_DISK, *, syncfs: bool = True,
                 files_open_max: int = FILES_OPEN_MAX_DEFAULT) -> None:
        assert index_dirs, "at least one index directory"
        assert bytes_max >= PAGE_BYTES, "the cache must hold at least one page"
        assert files_open_max >= 1, "at least one index file descriptor"
        self._fds_max = files_open_max
        self._flush_group = min(_FLUSH_GROUP, files_open_max)
        self._dirs = tuple(index_dirs)
        self._bytes_max = bytes_max
        self._disk = disk
        self._ledgers: dict[int, _Ledger] = {}
        self._dirty: dict[tuple[int, int], Page] = {}
        # Dirty pages that equal the file outside their changed slots: [lowest, highest]
        # word index put since (see the module doc, "Changed ranges").
        self._ranges: dict[tuple[int, int], list[int]] = {}
        self._clean: OrderedDict[tuple[int, int], Page] = OrderedDict()
        self._deltas: dict[tuple[int, int], dict[int, int]] = {}  # entry id -> location
        self._delta_slots = 0  # slots held in all deltas
        self._new_deltas: set[tuple[int, int]] = set()  # keys of deltas of pages beyond the file's end
        self._header_dirty: set[int] = set()
        self._fds: OrderedDict[int, int] = OrderedDict()
        for d in self._dirs:
            os.makedirs(d, exist_ok=True)
            for ledger_id, path in index.list_index_files(d).items():
                if ledger_id in self._ledgers:
                    raise CorruptDataError(f"ledger {ledger_id} has two index files (also "
                                           f"{self._ledgers[ledger_id].path})", path=path, offset=0)
                self._ledgers[ledger_id] = _Ledger(ledger_id, path, on_disk=True)
        # One directory descriptor per file system of the index directories, for syncfs
        # (see the module doc): opened now, before any write a flush must cover.
        self._fs_fds: list[int] = []
        untrusted = [(d, t) for d in self._dirs if (t := syncfs_untrusted_fs(d))] if syncfs else []
        if untrusted and SYNCFS_REPORTS_ERRORS:
            log.warning("index: syncfs cannot be trusted on %s, so checkpoints fsync each index file "
                        "(a syncfs reaches no FUSE daemon)", ", ".join(f"{d} ({t})" for d, t in untrusted))
        if syncfs and SYNCFS_REPORTS_ERRORS and not untrusted:
            devices: set[int] = set()
            for d in self._dirs:
                fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
                dev = os.fstat(fd).st_dev
                if dev in devices:
                    os.close(fd)
                else:
                    devices.add(dev)
                    self._fs_fds.append(fd)

    # --- entries -------------------------------------------------------------------------

    def put(self, ledger_id: int, entry_id: int, location: int) -> None:
        """Record an entry's location (memory only; durable after :meth:`flush`)."""
        self.put_many((ledger_id,), (entry_id,), (location,))

    def put_many(self, ledger_ids: Iterable[int], entry_ids: Iterable[int], locations: Iterable[int]) -> None:
        """:meth:`put` of each (ledger id, entry id, location), in order: an IndexPut's
        entries (a MULTI_ADD's are of as many ledgers as entries), with the look-ups the
        puts share done once: with one entry per ledger, those look-ups are a large part of each put."""
        dirty_get, deltas, ranges_get, ledgers = self._dirty.get, self._deltas, self._ranges.get, self._ledgers
        new_deltas = self._new_deltas
        for ledger_id, entry_id, location in zip(ledger_ids, entry_ids, locations, strict=True):
            assert entry_id >= 0 and location > 0
            key = (ledger_id, entry_id // PAGE_ENTRIES)
            page = dirty_get(key)
            if page is None:
                delta = deltas.get(key)
                if delta is None:
                    page = self._make_dirty(key)
                if page is None:  # a delta (see the module doc)
                    if delta is None:
                        delta = deltas[key]  # just started by _make_dirty
                    if entry_id not in delta:
                        self._delta_slots += 1
                    delta[entry_id] = location
                    if len(delta) > _NEW_PAGE_DELTA_SLOTS_MAX and key in new_deltas:
                        self._merge_delta(key)  # a whole dirty page from now on: zeros and its slots
            if page is not None:
                i = (entry_id % PAGE_ENTRIES) * 2
                page[i] = location
                page[i + 1] = location ^ entry_id ^ SLOT_KEY
                r = ranges_get(key)
                if r is not None:
                    if i < r[0]:
                        r[0] = i
                    if i > r[1]:
                        r[1] = i
            led = ledgers[ledger_id]
            if entry_id > led.max_put:
                led.max_put = entry_id

    def get(self, ledger_id: int, entry_id: int) -> int | None:
        """The entry's location, or ``None`` when this bookie does not hold it."""
        page = self._page_for_read(ledger_id, entry_id // PAGE_ENTRIES)
        if page is None:
            return None
        return index.slot_location(page, entry_id, self._ledgers[ledger_id].path)

    def get_range(self, ledger_id: int, first: int, count: int) -> list[int | None]:
        """``[get(ledger_id, e) for e in range(first, first + count)]``, a page at a time.

        A damaged slot raises :class:`CorruptDataError` as :meth:`get` does; the caller that
        needs the locations before it looks the range up again entry by entry."""
        out: list[int | None] = []
        end = first + count
        led = self._ledgers.get(ledger_id)
        while first < end:
            page_no, lo = divmod(first, PAGE_ENTRIES)
            hi = min(PAGE_ENTRIES, lo + end - first)
            page = self._page_for_read(ledger_id, page_no)
            if page is None:
                out.extend([None] * (hi - lo))
            else:
                assert led is not None
                out.extend(index.slot_locations(page, page_no, lo, hi, led.path))
            first += hi - lo
        return out

    def last_entry_id(self, ledger_id: int) -> int:
        """The highest entry id held for the ledger (-1 when none)."""
        led = self._ledgers.get(ledger_id)
        if led is None:
            return -1
        if led.disk_last is None:
            led.disk_last = self._last_on_disk(led)
        return max(led.max_put, led.disk_last)

    def _last_on_disk(self, led: _Ledger) -> int:
        for page_no in range(self._disk_pages(led) - 1, -1, -1):
            present = index.page_entries(self._peek_page(led, page_no), page_no, led.path)
            if present:
                return present[-1]
        return -1

    def entry_ids(self, ledger_id: int) -> list[tuple[int, int]]:
        """The entry ids held for the ledger as inclusive ``(first, last)`` ranges, ascending."""
        led = self._ledgers.get(ledger_id)
        if led is None:
            return []
        pages = max(self._disk_pages(led), max(led.pages or (), default=-1) + 1)
        ranges: list[tuple[int, int]] = []
        for page_no in range(pages):
            for entry_id in index.page_entries(self._peek_page(led, page_no), page_no, led.path):
                if ranges and ranges[-1][1] == entry_id - 1:
                    ranges[-1] = (ranges[-1][0], entry_id)
                else:
                    ranges.append((entry_id, entry_id))
        return ranges

    # --- headers ---------------------------------------------------------------------------

    def set_master_key(self, ledger_id: int, key: bytes) -> None:
        if len(key) > index.MASTER_KEY_BYTES_MAX:
            raise BadRequestError(f"master key of {len(key)} bytes exceeds {index.MASTER_KEY_BYTES_MAX}")
        self._update_header(ledger_id, master_key=key)

    def get_master_key(self, ledger_id: int) -> bytes | None:
        return self._header_of(ledger_id).master_key

    def set_fenced(self, ledger_id: int, fenced: bool = True) -> bool:
        """Set the fenced flag (fencing is permanent in the protocol; the owner decides).

        Returns True when the flag changed.
        """
        if self._header_of(ledger_id).fenced == fenced:
            return False
        self._update_header(ledger_id, fenced=fenced)
        return True

    def is_fenced(self, ledger_id: int) -> bool:
        return self._header_of(ledger_id).fenced

    def set_limbo(self, ledger_id: int, limbo: bool) -> None:
        self._update_header(ledger_id, limbo=limbo)

    def is_limbo(self, ledger_id: int) -> bool:
        return self._header_of(ledger_id).limbo

    def set_explicit_lac(self, ledger_id: int, lac: int) -> None:
        self._update_header(ledger_id, explicit_lac=lac)

    def get_explicit_lac(self, ledger_id: int) -> int:
        """The explicit LAC, -1 when none was set (so ``max`` works without a special case)."""
        return self._header_of(ledger_id).explicit_lac

    def header(self, ledger_id: int) -> IndexHeader:
        """A copy of the ledger's header (defaults for an unknown ledger)."""
        h = self._header_of(ledger_id)
        return IndexHeader(h.fenced, h.limbo, h.master_key, h.explicit_lac)

    def _header_of(self, ledger_id: int) -> IndexHeader:
        led = self._ledgers.get(ledger_id)
        if led is None:
            return IndexHeader()
        if led.header is None:
            led.header = self._read_header(led)
        return led.header

    def _read_header(self, led: _Ledger) -> IndexHeader:
        if not led.on_disk:
            return IndexHeader()
        data = os.pread(self._fd(led), index.HEADER_BYTES, 0)
        return index.decode_header(data, led.ledger_id, led.path)

    def _update_header(self, ledger_id: int, **changes: object) -> None:
        self._ledger_for_write(ledger_id)
        header = self._header_of(ledger_id)
        for name, value in changes.items():
            setattr(header, name, value)
        self._header_dirty.add(ledger_id)

    def flush_header(self, ledger_id: int) -> None:
        """Write the ledger's header durably now (creating the index file if needed)."""
        led = self._ledgers.get(ledger_id)
        if led is None:
            return
        new_dirs = self._ensure_file(led)
        fd = self._fd(led)
        self._disk.pwrite(fd, self._header_of(ledger_id).encode(ledger_id), 0)
        self._disk.fsync(fd)
        for d in new_dirs:
            self._disk.fsync_dir(d)
        self._header_dirty.discard(ledger_id)

    # --- ledgers -------------------------------------------------------------------------

    def exists(self, ledger_id: int) -> bool:
        return ledger_id in self._ledgers

    def ledgers(self) -> list[int]:
        return sorted(self._ledgers)

    def delete_ledger(self, ledger_id: int) -> bool:
        """Forget the ledger and remove its index file durably; False when it was unknown."""
        led = self._ledgers.pop(ledger_id, None)
        if led is None:
            return False
        for page_no in led.pages or ():
            self._dirty.pop((ledger_id, page_no), None)
            self._ranges.pop((ledger_id, page_no), None)
            self._clean.pop((ledger_id, page_no), None)
            delta = self._deltas.pop((ledger_id, page_no), None)
            if delta is not None:
                self._delta_slots -= len(delta)
                self._new_deltas.discard((ledger_id, page_no))
        self._header_dirty.discard(ledger_id)
        fd = self._fds.pop(ledger_id, None)
        if fd is not None:
            os.close(fd)
        if led.on_disk:
            os.unlink(led.path)
            self._disk.fsync_dir(os.path.dirname(led.path))
        return True

    # --- flushing and memory -----------------------------------------------------------------

    def flush(self) -> int:
        """Write every dirty page and header, make them and new directories durable; returns
        bytes written.

        Pages stay dirty until every fsync (or syncfs) succeeded, so a failed flush can be
        retried and never loses an update.
        """
        pages_of: dict[int, list[int]] = {ledger_id: [] for ledger_id in self._header_dirty}
        for ledger_id, page_no in sorted(self._dirty):
            pages_of.setdefault(ledger_id, []).append(page_no)
        deltas_of: dict[int, list[int]] = {}
        for ledger_id, page_no in self._deltas:
            deltas_of.setdefault(ledger_id, []).append(page_no)
            pages_of.setdefault(ledger_id, [])
        written = 0
        new_dirs: set[str] = set()
        # New pages written whole are kept (cached clean) only while the cache has room for
        # them: a checkpoint after 40,000 new ledgers must not hold 40,000 pages at once.
        kept: dict[tuple[int, int], Page] = {}
        keep_max = max(0, self._bytes_max - self.cached_bytes) // PAGE_BYTES

        def write(ledger_id: int) -> int:
            nonlocal written
            fd, n = self._write_ledger(self._ledgers[ledger_id], pages_of[ledger_id], deltas_of.get(ledger_id, ()),
                                       new_dirs, kept, keep_max)
            written += n
            return fd

        ledger_ids = sorted(pages_of)
        if self._fs_fds and ledger_ids:  # one syncfs per file system (see the module doc)
            for ledger_id in ledger_ids:
                write(ledger_id)
            for fs_fd in self._fs_fds:
                self._disk.syncfs(fs_fd)
        else:
            # Files are written a group at a time, then the group's files fsynced, each
            # through the descriptor that wrote it (so a writeback error is reported to us and
            # not to a descriptor opened later; a group is never larger than the descriptor
            # cache, so none of its descriptors is closed before its fsync). With many dirty
            # ledgers this lets the file system commit a whole group at once: on ext4 the
            # first fsync of a group commits the metadata and ordered data of all its files,
            # and the others find nothing left to commit, instead of one journal commit per
            # ledger.
            group = self._flush_group
            for at in range(0, len(ledger_ids), group):
                fds = [(ledger_id, write(ledger_id)) for ledger_id in ledger_ids[at:at + group]]
                for ledger_id, fd in fds:
                    assert self._fds.get(ledger_id) == fd, "an index descriptor was closed before its fsync"
                    self._disk.fsync(fd)
        for d in sorted(new_dirs):
            self._disk.fsync_dir(d)
        self._mark_clean(kept)
        return written

    def _write_ledger(self, led: _Ledger, page_nos: list[int], delta_page_nos: Sequence[int],
                      new_dirs: set[str], kept: dict[tuple[int, int], Page], keep_max: int) -> tuple[int, int]:
        """Write the ledger's dirty pages, deltas and header (no fsync); returns (fd, bytes
        written). New pages written whole go to ``kept`` while it holds fewer than ``keep_max``."""
        created = not led.on_disk
        new_dirs.update(self._ensure_file(led))
        fd = self._fd(led)
        written = index.HEADER_BYTES if created else 0
        for page_no in page_nos:
            key = (led.ledger_id, page_no)
            r = self._ranges.get(key)
            if r is None:
                index.write_page(self._disk, fd, page_no, self._dirty[key])
                written += PAGE_BYTES
            elif r[1] >= 0:
                index.write_page_words(self._disk, fd, page_no, self._dirty[key], r[0], r[1] + 2)
                written += 8 * (r[1] + 2 - r[0])
        for page_no in delta_page_nos:
            key = (led.ledger_id, page_no)
            if key in self._new_deltas:  # beyond the file's end: the whole page
                page = index.new_page()
                _apply(page, self._deltas[key])
                index.write_page(self._disk, fd, page_no, page)
                if len(kept) < keep_max:
                    kept[key] = page  # cached clean once the flush has succeeded
                written += PAGE_BYTES
            else:
                written += self._write_delta(fd, self._deltas[key])
        # A file created just now already starts with the current header (_ensure_file).
        if led.ledger_id in self._header_dirty and not created:
            self._disk.pwrite(fd, self._header_of(led.ledger_id).encode(led.ledger_id), 0)
            written += index.HEADER_BYTES
        return fd, written

    def _write_delta(self, fd: int, delta: dict[int, int]) -> int:
        """Write a delta's slots in place, one write per run of consecutive entry ids."""
        entry_ids = sorted(delta)
        start = 0
        for k in range(1, len(entry_ids) + 1):
            if k == len(entry_ids) or entry_ids[k] != entry_ids[k - 1] + 1:
                first = entry_ids[start]
                index.write_slots(self._disk, fd, first, [delta[e] for e in entry_ids[start:k]])
                start = k
        return len(entry_ids) * index.SLOT_BYTES

    def _ensure_file(self, led: _Ledger) -> list[str]:
        """Create the ledger's index file with its header; returns directories to fsync."""
        if led.on_disk:
            return []
        shard = os.path.dirname(led.path)
        new_dirs = [shard]
        if not os.path.isdir(shard):
            os.makedirs(shard)
            new_dirs.append(os.path.dirname(shard))
        fd = os.open(led.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._remember_fd(led.ledger_id, fd)
        led.on_disk = True
        # Written at once so that the file never starts without a header.
        self._disk.pwrite(fd, self._header_of(led.ledger_id).encode(led.ledger_id), 0)
        return new_dirs
