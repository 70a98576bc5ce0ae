"""Ledger handles: reading (ReadHandle) and writing (LedgerHandle, which can also read).

Write path: each append gets the next entry id and its blob (digest over everything,
piggybacking the current LAC); entries queued in the same event-loop turn, by all the
client's ledger handles together, go out as ONE message per bookie of their write sets
(AddDispatcher: an ADD_ENTRY for one ledger, a MULTI_ADD with a part per ledger for several).
Requests are pipelined: new entries are sent while earlier requests to the same bookie are
still in flight; nothing waits for an answer before sending. An entry is confirmed once AQ bookies
of its write set acknowledged it AND every earlier entry is confirmed; futures complete
strictly in entry order. A bookie that fails (timeout, unreachable, EIO, read-only...)
triggers an ensemble change: a replacement is chosen, a new fragment starting at LAC+1 is
written to metadata by compare-and-set, and every pending entry is resent to the bookies of
its new write set that have not acknowledged it. A CAS conflict that reveals IN_RECOVERY or
CLOSED, or any EFENCED answer, fails the handle with LedgerFencedError: the ledger was
fenced by a recovering reader. Entries already confirmed are on AQ bookies and are kept.

Read path: the write set in order; after speculative_read_ms without an answer the next
replica is asked too; every entry's digest is checked; a negative or corrupt answer moves to
the next replica. Reads stop at the LAC (or the last entry of a closed ledger).
"""


from __future__ import annotations

from zbk.client.dispatch import AddDispatcher, add_batches
from zbk.client.reading import LedgerEntry, ReadHandle
from zbk.client.writing import LedgerHandle

__all__ = ["AddDispatcher", "LedgerEntry", "LedgerHandle", "ReadHandle", "add_batches"]
