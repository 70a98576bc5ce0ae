"""The ledger cache's pages: dirty and clean pages, deltas, changed ranges, eviction.

Pages are ``PAGE_BYTES`` each; see zbk/storage/ledgercache.py for the cache as a whole.

Deltas: a ``put`` into a page that is not in the cache but lies
wholly inside its index file does not read the page. It records the new slots only (a
*delta*, entry id -> location, counted in ``bytes_max`` at ``DELTA_*_BYTES``), and
:meth:`LedgerCache.flush` writes just those slots in place
(:func:`zbk.storage.index.write_slots`): the page's other slots on disk are exactly what
a whole-page write would rewrite. Many ledgers with a few new entries each (MULTI_ADD
over thousands of ledgers) then cost neither a page read per put nor 16 KiB of memory
and of writing per ledger, and do not fill the cache into a checkpoint every few
thousand entries. A read of such a page loads it from the file and applies the delta
(it becomes an ordinary dirty page). A key is in at most one of: dirty pages, clean
pages, deltas.

New pages: a page beyond its file's end (every page of a new ledger, a page a ledger
grows into) starts as a delta too, a *new-page delta*, and the flush writes it whole:
zeros and its slots, so a file still only ever grows by whole pages. It becomes an
ordinary dirty page once it holds more than ``_NEW_PAGE_DELTA_SLOTS_MAX`` slots (where a
16 KiB page is the cheaper way to hold them). Why: as a whole dirty page, each new ledger
would cost 16 KiB from its first entry to the next checkpoint, and a bookie creating
thousands of ledgers a second would fill the cache's hard bound (twice ``bytes_max``)
within seconds and hold new adds while the checkpoint created their files. A torn last
page (part of a page at the file's end) is read and made a whole dirty page.

Changed ranges: a cached clean page that lies wholly inside its file is what the
file holds. When puts make it dirty, the cache remembers the lowest and highest slot they
changed, and the flush writes that range in place instead of the whole page: a ledger
written a few entries per checkpoint costs a few hundred bytes of writing, not 16 KiB,
while the page stays cached for its readers. So does a page read for a reader from the file
with a delta applied. Pages made dirty any other way (new pages, pages read beyond the file)
are written whole.

When the cache needs room and has no clean page left to drop, such a page becomes a delta
of the slots in its changed range (the oldest first), and the page is dropped: a few hundred
bytes instead of 16 KiB. So pages made dirty from clean ones never force a checkpoint
(``dirty_bytes`` counts each at a delta's charge). Why: with 10,000 ledgers written at
once, the pages the cache holds turn dirty again within a second of every checkpoint; kept
whole, they would fill ``bytes_max`` and force a checkpoint of all 10,000 ledgers every
second or two instead of every ``flush_interval``.
"""

from __future__ import annotations

import array
from collections import OrderedDict

from zbk.storage import index
from zbk.storage.index import PAGE_BYTES, PAGE_ENTRIES, SLOT_KEY
from zbk.storage.ledgerfiles import LedgerFiles, _Ledger

# Memory charged to deltas (see the module doc), above their Python size on CPython 3.11
# (tracemalloc: about 330 bytes per page with a delta, for its dict, key tuple and entry in
# the table of deltas; about 90 bytes per slot held, for the dict entry and two ints).
DELTA_PAGE_BYTES = 384
DELTA_SLOT_BYTES = 128
# A new-page delta with more slots than this is made a whole page (16 KiB): the slots'
# charge would pass the page's.
_NEW_PAGE_DELTA_SLOTS_MAX = PAGE_BYTES // DELTA_SLOT_BYTES
Page = array.array  # of int: (location, check) words; see zbk.storage.index


class LedgerPages(LedgerFiles):
    _bytes_max: int
    _dirty: dict[tuple[int, int], Page]
    _ranges: dict[tuple[int, int], list[int]]
    _clean: OrderedDict[tuple[int, int], Page]
    _deltas: dict[tuple[int, int], dict[int, int]]
    _delta_slots: int
    _new_deltas: set[tuple[int, int]]

    def _make_dirty(self, key: tuple[int, int]) -> Page | None:
        """The key's page, now dirty; None when a delta was started for it instead."""
        led = self._ledger_for_write(key[0])
        page = self._clean.pop(key, None)
        if page is not None:
            self._dirty[key] = page
            if led.on_disk and key[1] < self._full_pages(led):
                # Empty: the put that follows sets both ends to its own slot.
                self._ranges[key] = [2 * PAGE_ENTRIES, -1]
            # No _evict: the cache holds what it held (and an eviction now could turn this
            # very page into a delta under the put about to write into it).
            return page
        page_no = key[1]
        in_file = led.on_disk and page_no < self._full_pages(led)
        if in_file or not led.on_disk or page_no >= self._disk_pages(led):
            self._deltas[key] = {}  # its slots are counted by put
            if not in_file:
                self._new_deltas.add(key)  # a new page (see the module doc, "New pages")
            led.hold(page_no)
            self._evict()
            return None
        page = self._load_page(led, page_no)  # a torn last page
        led.hold(page_no)
        self._dirty[key] = page
        self._evict()
        return page

    def _merge_delta(self, key: tuple[int, int]) -> Page:
        """The page of a key that has a delta: read from the file, the delta applied; it is
        a dirty page from now on (written whole at the next flush)."""
        led = self._ledgers[key[0]]
        page = self._load_page(led, key[1])  # before the delta goes: a failed read loses nothing
        delta = self._deltas.pop(key)
        _apply(page, delta)
        self._delta_slots -= len(delta)
        self._dirty[key] = page
        if key in self._new_deltas:
            self._new_deltas.discard(key)  # beyond the file, the page read is zeros: written whole
        else:  # wholly in the file: it equals the file outside the delta's slots
            self._ranges[key] = ([2 * (min(delta) % PAGE_ENTRIES), 2 * (max(delta) % PAGE_ENTRIES)] if delta
                                 else [2 * PAGE_ENTRIES, -1])
        self._evict()
        return page

    def _page_for_read(self, ledger_id: int, page_no: int) -> Page | None:
        """The page from the cache or the file (then cached), ``None`` when no file holds it."""
        key = (ledger_id, page_no)
        page = self._dirty.get(key)
        if page is None:
            page = self._clean.get(key)
            if page is not None:
                self._clean.move_to_end(key)
            elif key in self._deltas:
                page = self._merge_delta(key)
            else:
                led = self._ledgers.get(ledger_id)
                if led is None or not led.on_disk or page_no >= self._disk_pages(led):
                    return None
                page = self._load_page(led, page_no)
                self._clean[key] = page
                led.hold(page_no)
                self._evict()
        return page

    def _peek_page(self, led: _Ledger, page_no: int) -> Page:
        """A page for a whole-ledger walk: from the cache if there, else read without caching it."""
        key = (led.ledger_id, page_no)
        page = self._dirty.get(key)
        if page is None:
            page = self._clean.get(key)
        if page is not None:
            return page
        page = self._load_page(led, page_no)
        _apply(page, self._deltas.get(key, {}))
        return page

    def _mark_clean(self, kept: dict[tuple[int, int], Page]) -> None:
        for (ledger_id, page_no), page in self._dirty.items():
            self._written_whole(ledger_id, page_no)
            self._clean[(ledger_id, page_no)] = page
        self._dirty.clear()
        self._ranges.clear()
        # New pages written whole are in the file now, wholly, as the dirty pages above: a
        # later put to one is never a new page again (its whole-page write of zeros would
        # erase these slots). Those the cache has room for stay cached clean (readers of a
        # ledger's newest entries find them; later puts write ranges).
        for ledger_id, page_no in self._new_deltas:
            self._written_whole(ledger_id, page_no)
        for key, page in kept.items():
            del self._deltas[key]  # held by the clean page now: not released below
            self._clean[key] = page
        self._new_deltas.clear()
        # Written deltas are not kept: the cache never held their pages.
        for ledger_id, page_no in self._deltas:
            self._ledgers[ledger_id].release(page_no)
        self._deltas.clear()
        self._delta_slots = 0
        self._header_dirty.clear()
        self._evict()

    @property
    def bytes_max(self) -> int:
        return self._bytes_max

    @property
    def _delta_bytes(self) -> int:
        return len(self._deltas) * DELTA_PAGE_BYTES + self._delta_slots * DELTA_SLOT_BYTES

    @property
    def cached_bytes(self) -> int:
        return (len(self._dirty) + len(self._clean)) * PAGE_BYTES + self._delta_bytes

    @property
    def dirty_bytes(self) -> int:
        """Memory only a flush can give back: dirty pages and deltas. A dirty page with a
        changed range counts as the delta it can be turned into (its page charge; the
        slots are counted once it is): the cache does that instead of growing."""
        ranges = len(self._ranges)
        return (len(self._dirty) - ranges) * PAGE_BYTES + ranges * DELTA_PAGE_BYTES + self._delta_bytes

    @property
    def needs_flush(self) -> bool:
        """True when dirty pages and deltas alone fill ``bytes_max``: the owner should checkpoint."""
        return self.dirty_bytes >= self._bytes_max

    def _evict(self) -> None:
        over = self.cached_bytes - self._bytes_max
        while over > 0 and self._clean:
            (ledger_id, page_no), _ = self._clean.popitem(last=False)
            self._ledgers[ledger_id].release(page_no)
            over -= PAGE_BYTES
        ranges = self._ranges
        while over > 0 and ranges:
            over -= self._downgrade(next(iter(ranges)))  # the longest dirty first

    def _downgrade(self, key: tuple[int, int]) -> int:
        """A dirty page that equals its file outside its changed range becomes a delta of the
        range's slots (see the module doc, "Changed ranges"); returns the bytes freed.

        Only slots whose check word holds are taken: a damaged slot the page was read with
        stays as it is in the file (written again with a fresh check word it would pass for
        a sound one). Empty slots in the range are empty in the file too."""
        page = self._dirty.pop(key)
        lo, hi = self._ranges.pop(key)
        first = key[1] * PAGE_ENTRIES
        delta: dict[int, int] = {}
        for i in range(lo, hi + 1, 2):
            location = page[i]
            entry_id = first + i // 2
            if location and page[i + 1] == location ^ entry_id ^ SLOT_KEY:
                delta[entry_id] = location
        self._deltas[key] = delta  # the page number stays held (by the delta now)
        self._delta_slots += len(delta)
        return PAGE_BYTES - DELTA_PAGE_BYTES - len(delta) * DELTA_SLOT_BYTES

    def _load_page(self, led: _Ledger, page_no: int) -> Page:
        if not led.on_disk or page_no >= self._disk_pages(led):
            return index.new_page()
        return index.read_page(self._fd(led), page_no)


def _apply(page: Page, delta: dict[int, int]) -> None:
    """Put a delta's slots (entry id -> location) into its page as read from the file."""
    for entry_id, location in delta.items():
        index.set_slot(page, entry_id, location)
