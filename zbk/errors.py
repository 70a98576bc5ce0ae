"""The one error tree of zbk.

Every expected failure is a subclass of :class:`ZbkError` with

* ``code``: a stable string that scripts and logs may rely on,
* ``wire_status``: the wire status a bookie answers for it (``None`` when it never crosses the wire),
* ``exit_code``: the CLI exit code (API.md: 1 operation failed, 2 usage error, 3 cannot reach
  metadata or bookies).

Programmer bugs are ``assert`` statements, never members of this tree.
"""

from __future__ import annotations

from zbk.wire.status import Status

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


class ZbkError(Exception):
    """Base of every expected zbk failure."""

    code: str = "ZBK_ERROR"
    wire_status: Status | None = None
    exit_code: int = EXIT_FAILED


class LedgerFencedError(ZbkError):
    """The ledger was fenced by a recovering reader: this handle may no longer add entries."""

    code = "LEDGER_FENCED"
    wire_status = Status.EFENCED


class LedgerClosedError(ZbkError):
    """The ledger is closed: no entry can be added to it."""

    code = "LEDGER_CLOSED"


class NoSuchLedgerError(ZbkError):
    """The ledger does not exist (in metadata, or on the bookie that answered)."""

    code = "NO_SUCH_LEDGER"
    wire_status = Status.ENOLEDGER


class NoSuchEntryError(ZbkError):
    """The entry does not exist (beyond the ledger's end, or absent on the bookie that answered)."""

    code = "NO_SUCH_ENTRY"
    wire_status = Status.ENOENTRY


class UnauthorizedError(ZbkError):
    """Wrong ledger password (master key mismatch) or an unauthenticated client."""

    code = "UNAUTHORIZED"
    wire_status = Status.EUA


class NotEnoughBookiesError(ZbkError):
    """Fewer writable bookies are registered than the ensemble needs."""

    code = "NOT_ENOUGH_BOOKIES"
    exit_code = EXIT_UNREACHABLE


class DigestMismatchError(ZbkError):
    """An entry's digest does not match its contents: the copy is corrupt or forged."""

    code = "DIGEST_MISMATCH"


class BookieUnavailableError(ZbkError):
    """A bookie did not answer or could not be reached."""

    code = "BOOKIE_UNAVAILABLE"
    exit_code = EXIT_UNREACHABLE


class ZbkTimeoutError(ZbkError):
    """An operation did not complete in time."""

    code = "TIMEOUT"


class MetadataVersionError(ZbkError):
    """A compare-and-set on metadata lost against a concurrent writer (or the key already exists)."""

    code = "METADATA_VERSION"
    wire_status = Status.EBADVERSION


class KeyExistsError(MetadataVersionError):
    """Create-if-absent found the key already present."""

    code = "KEY_EXISTS"


class BadRequestError(ZbkError):
    """A malformed request, frame or argument."""

    code = "BAD_REQUEST"
    wire_status = Status.EBADREQ
    exit_code = EXIT_USAGE


class ReadOnlyError(ZbkError):
    """The bookie is read-only and refuses adds."""

    code = "READ_ONLY"
    wire_status = Status.EREADONLY


class UnknownLedgerStateError(ZbkError):
    """BP-46 EUNKNOWN: the bookie cannot tell whether it holds the entry (limbo ledger)."""

    code = "UNKNOWN_LEDGER_STATE"
    wire_status = Status.EUNKNOWN


class TooManyRequestsError(ZbkError):
    """The bookie's bounded queues are full."""

    code = "TOO_MANY_REQUESTS"
    wire_status = Status.ETOOMANYREQUESTS


class BookieIOError(ZbkError):
    """The bookie failed to read or write its disks."""

    code = "BOOKIE_IO"
    wire_status = Status.EIO


class ConfigError(ZbkError):
    """A configuration file, key or value is invalid."""

    code = "CONFIG"
    exit_code = EXIT_USAGE


class MetadataError(ZbkError):
    """The metadata store failed."""

    code = "METADATA"


class MetadataUnavailableError(MetadataError):
    """The metadata store cannot be reached."""

    code = "METADATA_UNAVAILABLE"
    exit_code = EXIT_UNREACHABLE


class CorruptMetadataError(MetadataError):
    """A metadata value cannot be decoded (corrupt, or of an unknown format version)."""

    code = "CORRUPT_METADATA"


class InvalidStateTransitionError(MetadataError):
    """Ledger states move only OPEN -> IN_RECOVERY -> CLOSED (or OPEN -> CLOSED)."""

    code = "INVALID_STATE_TRANSITION"


class LeaseExpiredError(MetadataError):
    """A lease is gone: the keys bound to it have vanished."""

    code = "LEASE_EXPIRED"


class WatchCompactedError(MetadataError):
    """A watch asked to resume from a revision the store has already compacted away."""

    code = "WATCH_COMPACTED"


class CorruptDataError(ZbkError):
    """A file on disk failed its checksum or format check; carries the file and offset."""

    code = "CORRUPT_DATA"
    wire_status = Status.EIO

    def __init__(self, message: str, *, path: str = "", offset: int = -1) -> None:
        where = f" ({path} at offset {offset})" if path else ""
        super().__init__(message + where)
        self.path = path
        self.offset = offset


class CookieMismatchError(ZbkError):
    """The bookie's directories do not match its cookie in metadata (BP-46)."""

    code = "COOKIE_MISMATCH"


class OperationRefusedError(ZbkError):
    """An admin operation that would be unsafe now (e.g. decommissioning a writable bookie)."""

    code = "OPERATION_REFUSED"


class RepairIncompleteError(ZbkError):
    """A repaired bookie still lacks entries after the copy (it lost them again, or refused them)."""

    code = "REPAIR_INCOMPLETE"


_BY_STATUS: dict[Status, type[ZbkError]] = {
    Status.ENOLEDGER: NoSuchLedgerError,
    Status.ENOENTRY: NoSuchEntryError,
    Status.EBADREQ: BadRequestError,
    Status.EIO: BookieIOError,
    Status.EUA: UnauthorizedError,
    Status.EBADVERSION: BadRequestError,
    Status.EFENCED: LedgerFencedError,
    Status.EREADONLY: ReadOnlyError,
    Status.ETOOMANYREQUESTS: TooManyRequestsError,
    Status.EUNKNOWN: UnknownLedgerStateError,
}


def error_for_status(status: Status, message: str = "") -> ZbkError:
    """The typed error a client raises for a non-EOK wire status."""
    assert status != Status.EOK, "EOK is not an error"
    cls = _BY_STATUS.get(status, ZbkError)
    return cls(message or status.name)


def status_for_error(err: BaseException) -> Status:
    """The wire status a bookie answers for an error raised while serving a request."""
    if isinstance(err, ZbkError) and err.wire_status is not None:
        return err.wire_status
    return Status.EIO
