"""Wire status codes: each with its one-line meaning (API.md "Wire status codes").

BP-46 response classes: EOK is positive; ENOLEDGER and ENOENTRY are explicit negatives;
every other code is "unknown" and must never be taken as proof that an entry is absent.
"""

from __future__ import annotations

from enum import IntEnum


# Numbers are part of the wire protocol (docs/protocol.md, "Status codes"): add new codes at
# the end, never renumber or reuse one. Clients treat any code they do not know as "unknown".
class Status(IntEnum):
    EOK = 0  # the request succeeded
    ENOLEDGER = 1  # explicit negative: this bookie has never stored anything of the ledger
    ENOENTRY = 2  # explicit negative: the ledger is known but this entry was never stored here
    EBADREQ = 3  # the request is malformed, truncated, oversized or of an unknown version
    EIO = 4  # the bookie failed to read or write its disks
    EUA = 5  # the master key (derived from the ledger password) does not match
    EBADVERSION = 6  # the protocol version is not one this bookie speaks
    EFENCED = 7  # the ledger is fenced here: plain adds are refused, recovery adds are accepted
    EREADONLY = 8  # the bookie is read-only (disk full or set by an operator): adds are refused
    ETOOMANYREQUESTS = 9  # the bookie's bounded queues are full: retry later
    EUNKNOWN = 10  # limbo ledger (BP-46): the bookie may have lost this entry, so it cannot say "absent"

    @property
    def is_explicit_negative(self) -> bool:
        return self in (Status.ENOLEDGER, Status.ENOENTRY)
