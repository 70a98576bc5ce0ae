"""The ledger cache's per-ledger state and its index file descriptors.

Descriptors of index files are kept open, least recently used closed first, up to
``files_open_max``; ``LedgerFiles`` is the base of :class:`zbk.storage.ledgercache.LedgerCache`,
which sets the state annotated here.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass

from zbk.storage import index
from zbk.storage.index import IndexHeader

# Index file descriptors kept open (LRU) unless told otherwise: what a process under the
# common soft limit of 1,024 can spare. The bookie passes more (its index_files_open_max,
# within its raised limit): a checkpoint re-opens every dirty ledger's file beyond these.
FILES_OPEN_MAX_DEFAULT = 1024


@dataclass(eq=False, slots=True)
class _Ledger:
    ledger_id: int
    path: str
    on_disk: bool  # the index file exists
    header: IndexHeader | None = None  # loaded lazily
    max_put: int = -1  # highest entry id put since this cache opened
    disk_last: int | None = None  # highest entry id in the file when first asked
    disk_pages: int | None = None  # pages in the file (None: not yet looked)
    full_pages: int = 0  # pages wholly in the file (a torn last page is not); set with disk_pages
    # Page numbers held in the cache (pages or deltas); None when none: with 100,000 ledgers
    # most hold nothing, and an empty set is 216 bytes of the bookie's memory per ledger.
    pages: set[int] | None = None

    def hold(self, page_no: int) -> None:
        if self.pages is None:
            self.pages = {page_no}
        else:
            self.pages.add(page_no)

    def release(self, page_no: int) -> None:
        pages = self.pages
        if pages is not None:
            pages.discard(page_no)
            if not pages:
                self.pages = None


class LedgerFiles:
    _dirs: tuple[str, ...]
    _ledgers: dict[int, _Ledger]
    _header_dirty: set[int]
    _fds: OrderedDict[int, int]
    _fds_max: int
    _fs_fds: list[int]

    def _ledger_for_write(self, ledger_id: int) -> _Ledger:
        led = self._ledgers.get(ledger_id)
        if led is None:
            directory = self._dirs[ledger_id % len(self._dirs)]
            led = _Ledger(ledger_id, index.index_path(directory, ledger_id), on_disk=False,
                          header=IndexHeader(), disk_last=-1, disk_pages=0, full_pages=0)
            self._ledgers[ledger_id] = led
            self._header_dirty.add(ledger_id)  # a new ledger's file is created at the next flush
        return led

    def _written_whole(self, ledger_id: int, page_no: int) -> None:
        """A page written whole is in the file wholly now, and so are all before it."""
        led = self._ledgers[ledger_id]
        if led.disk_pages is not None:
            if page_no >= led.disk_pages:
                led.disk_pages = page_no + 1
            if page_no >= led.full_pages:
                led.full_pages = page_no + 1


    @property
    def files_open_max(self) -> int:
        """Index file descriptors kept open at most (least recently used closed first)."""
        return self._fds_max

    @property
    def sync_mode(self) -> str:
        """How a flush is made durable, for the boot log: ``syncfs`` or ``fsync``."""
        return "syncfs" if self._fs_fds else "fsync"

    def _disk_pages(self, led: _Ledger) -> int:
        if led.disk_pages is None:
            if led.on_disk:
                size = os.fstat(self._fd(led)).st_size
                led.disk_pages, led.full_pages = index.page_count(size), index.whole_pages(size)
            else:
                led.disk_pages = led.full_pages = 0
        return led.disk_pages

    def _full_pages(self, led: _Ledger) -> int:
        self._disk_pages(led)
        return led.full_pages

    def _fd(self, led: _Ledger) -> int:
        fd = self._fds.get(led.ledger_id)
        if fd is not None:
            self._fds.move_to_end(led.ledger_id)
            return fd
        fd = os.open(led.path, os.O_RDWR)
        self._remember_fd(led.ledger_id, fd)
        return fd

    def _remember_fd(self, ledger_id: int, fd: int) -> None:
        self._fds[ledger_id] = fd
        if len(self._fds) > self._fds_max:
            os.close(self._fds.popitem(last=False)[1])

    def close(self) -> None:
        """Close file descriptors (call :meth:`flush` first: close does not write)."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        for fd in self._fs_fds:
            os.close(fd)
        self._fs_fds.clear()

