"""Opcodes and per-op flags of the wire protocol, each with its one-line meaning.

A request and its response carry the same opcode. ``ERROR`` is response-only: the bookie's
answer to a request it could not (or would not) decode far enough to build the typed response.
Numbers are part of the protocol: never renumber, only add (see docs/protocol.md, versioning).
"""

from __future__ import annotations

from enum import IntEnum, IntFlag


class OpCode(IntEnum):
    ERROR = 0  # response only: the request was rejected before it was understood; carries rid and st
    ADD_ENTRY = 1  # store a batch of entries of one ledger (pipelined adds, recovery adds)
    READ_ENTRY = 2  # read a contiguous range of entries; may fence or long-poll
    READ_LAC = 3  # read the bookie's last-add-confirmed and its last entry; may fence or long-poll
    WRITE_LAC = 4  # record an explicit LAC (a writer idle after its last add advertises the LAC)
    FORCE_LEDGER = 5  # make every entry of a ledger durable (ends DEFERRED_SYNC adds)
    WRITE_CLOSE = 6  # advisory: the writer closed the ledger, rotate its entry log (BP-32)
    GET_BOOKIE_INFO = 7  # disk space, state and ledger counts of the bookie
    GET_LIST_OF_ENTRIES_OF_LEDGER = 8  # entry ids the bookie holds for a ledger, as ranges
    CLEAR_LIMBO = 9  # BP-46 phase two is done for a ledger here: clear its limbo status (durably)
    MULTI_ADD = 10  # several ADD_ENTRY batches of different ledgers in one message, one status each


class AddFlag(IntFlag):
    RECOVERY_ADD = 1  # written by recovery or re-replication: accepted even on a fenced ledger
    DEFERRED_SYNC = 2  # acknowledge without waiting for fsync; durable only after FORCE_LEDGER


class ReadFlag(IntFlag):
    FENCE = 1  # fence the ledger before answering (needs the master key); recovery reads only
    LONG_POLL = 2  # answer once the bookie's LAC exceeds previous_lac, or when timeout_ms passes
    # A ranged read that returns every entry of the range this bookie holds, skipping the ones
    # it does not (a bookie holds only its stripes when WQ < E); entry ids are in the blobs.
    SPARSE = 4


ADD_FLAGS_ALL = AddFlag.RECOVERY_ADD | AddFlag.DEFERRED_SYNC
READ_FLAGS_ALL = ReadFlag.FENCE | ReadFlag.LONG_POLL | ReadFlag.SPARSE
