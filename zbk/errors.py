"""The one error tree of zbk.

Every expected failure is a subclass of :class:`ZbkError` with

* ``code``: a stable string that scripts and logs may rely on,
* ``wire_status``: the wire status a bookie answers for it (``None`` when it never crosses the wire),
* ``exit_code``: the CLI exit code (API.md: 1 operation failed, 2 usage error, 3 cannot reach
  metadata or bookies),
* ``http_status``: the status the admin HTTP API answers for it (zbk/metrics/http.py): 400 bad
  input, 403 refused credentials, 404 absent, 409 a conflict with the current state, 429 shed
  load, 5xx a failure here or of a dependency (502 a bad answer, 503 unreachable, 504 too slow).

Every exit code of every zbk process is defined here, with what it means.

Programmer bugs are ``assert`` statements, never members of this tree.
"""

from __future__ import annotations

from zbk.wire.status import Status

EXIT_OK = 0  # done, or stopped cleanly
EXIT_FAILED = 1  # the operation failed (a CLI command), or a lease was lost / a worker crashed (autorecovery)
EXIT_USAGE = 2  # a bad command line or configuration
EXIT_UNREACHABLE = 3  # metadata or bookies cannot be reached
EXIT_COOKIE = 4  # bookie: its directories do not match its cookie in metadata
EXIT_BOOT = 5  # bookie: any other boot failure (corrupt journal, unreachable metadata...)
EXIT_ACTOR_BASE = 10  # bookie: 10 + n when its actor n crashed (zbk/bookie/process.py, ACTORS)


class ZbkError(Exception):
    """Base of every expected zbk failure."""

    code: str = "ZBK_ERROR"
    wire_status: Status | None = None
    exit_code: int = EXIT_FAILED
    http_status: int = 500


class LedgerFencedError(ZbkError):
    """The ledger was fenced by a recovering reader: this handle may no longer add entries."""

    code = "LEDGER_FENCED"
    http_status = 409
    wire_status = Status.EFENCED


class LedgerClosedError(ZbkError):
    """The ledger is closed: no entry can be added to it."""

    code = "LEDGER_CLOSED"
    http_status = 409


class NoSuchLedgerError(ZbkError):
    """The ledger does not exist (in metadata, or on the bookie that answered)."""

    code = "NO_SUCH_LEDGER"
    http_status = 404
    wire_status = Status.ENOLEDGER


class NoSuchEntryError(ZbkError):
    """The entry does not exist (beyond the ledger's end, or absent on the bookie that answered)."""

    code = "NO_SUCH_ENTRY"
    http_status = 404
    wire_status = Status.ENOENTRY


class UnauthorizedError(ZbkError):
    """Wrong ledger password (master key mismatch) or an unauthenticated client."""

    code = "UNAUTHORIZED"
    http_status = 403
    wire_status = Status.EUA


class NotEnoughBookiesError(ZbkError):
    """Fewer writable bookies are registered than the ensemble needs, or too few of them
    meet the placement policy (isolation groups, an enforced minimum of racks)."""

    code = "NOT_ENOUGH_BOOKIES"
    http_status = 503
    exit_code = EXIT_UNREACHABLE


class DigestMismatchError(ZbkError):
    """An entry's digest does not match its contents: the copy is corrupt or forged."""

    code = "DIGEST_MISMATCH"
    http_status = 502


class BookieUnavailableError(ZbkError):
    """A bookie did not answer or could not be reached."""

    code = "BOOKIE_UNAVAILABLE"
    http_status = 503
    exit_code = EXIT_UNREACHABLE


class ZbkTimeoutError(ZbkError):
    """An operation did not complete in time."""

    code = "TIMEOUT"
    http_status = 504


class MetadataVersionError(ZbkError):
    """A compare-and-set on metadata lost against a concurrent writer (or the key already exists).

    A client-side failure, as BookKeeper's MetadataVersionException: bookies do not write
    metadata while serving requests, so it never crosses the wire (no ``wire_status``; a
    bookie that met one anyway would answer EIO, as for any failure without a status).
    EBADVERSION is not its status: that one means a protocol version the peer does not speak
    (:class:`ProtocolVersionError`)."""

    code = "METADATA_VERSION"
    http_status = 409


class KeyExistsError(MetadataVersionError):
    """Create-if-absent found the key already present."""

    code = "KEY_EXISTS"
    http_status = 409


class BadRequestError(ZbkError):
    """A malformed request, frame or argument."""

    code = "BAD_REQUEST"
    http_status = 400
    wire_status = Status.EBADREQ
    exit_code = EXIT_USAGE


class ProtocolVersionError(BadRequestError):
    """The peer speaks another version of the wire protocol (EBADVERSION)."""

    code = "PROTOCOL_VERSION"
    http_status = 400
    wire_status = Status.EBADVERSION


class ReadOnlyError(ZbkError):
    """The bookie is read-only and refuses adds."""

    code = "READ_ONLY"
    http_status = 409
    wire_status = Status.EREADONLY


class UnknownLedgerStateError(ZbkError):
    """BP-46 EUNKNOWN: the bookie cannot tell whether it holds the entry (limbo ledger)."""

    code = "UNKNOWN_LEDGER_STATE"
    http_status = 503
    wire_status = Status.EUNKNOWN


class TooManyRequestsError(ZbkError):
    """The bookie's bounded queues are full."""

    code = "TOO_MANY_REQUESTS"
    http_status = 429
    wire_status = Status.ETOOMANYREQUESTS


class BookieIOError(ZbkError):
    """The bookie failed to read or write its disks."""

    code = "BOOKIE_IO"
    http_status = 500
    wire_status = Status.EIO


class ConfigError(ZbkError):
    """A configuration file, key or value is invalid."""

    code = "CONFIG"
    http_status = 400
    exit_code = EXIT_USAGE


class MetadataError(ZbkError):
    """The metadata store failed."""

    code = "METADATA"
    http_status = 502


class MetadataUnavailableError(MetadataError):
    """The metadata store cannot be reached."""

    code = "METADATA_UNAVAILABLE"
    http_status = 503
    exit_code = EXIT_UNREACHABLE


class CorruptMetadataError(MetadataError):
    """A metadata value cannot be decoded (corrupt, or of an unknown format version)."""

    code = "CORRUPT_METADATA"
    http_status = 500


class InvalidStateTransitionError(MetadataError):
    """Ledger states move only OPEN -> IN_RECOVERY -> CLOSED (or OPEN -> CLOSED)."""

    code = "INVALID_STATE_TRANSITION"
    http_status = 409


class LeaseExpiredError(MetadataError):
    """A lease is gone: the keys bound to it have vanished."""

    code = "LEASE_EXPIRED"
    http_status = 409


class WatchCompactedError(MetadataError):
    """A watch asked to resume from a revision the store has already compacted away."""

    code = "WATCH_COMPACTED"
    http_status = 410


class CorruptDataError(ZbkError):
    """A file on disk failed its checksum or format check; carries the file and offset."""

    code = "CORRUPT_DATA"
    http_status = 500
    wire_status = Status.EIO

    def __init__(self, message: str, *, path: str = "", offset: int = -1) -> None:
        where = f" ({path} at offset {offset})" if path else ""
        super().__init__(message + where)
        self.path = path
        self.offset = offset


class CookieMismatchError(ZbkError):
    """The bookie's directories do not match its cookie in metadata (BP-46)."""

    code = "COOKIE_MISMATCH"
    http_status = 409
    exit_code = EXIT_COOKIE


class OperationRefusedError(ZbkError):
    """An admin operation that would be unsafe now (e.g. decommissioning a writable bookie)."""

    code = "OPERATION_REFUSED"
    http_status = 409


class RepairIncompleteError(ZbkError):
    """A repaired bookie still lacks entries after the copy (it lost them again, or refused them)."""

    code = "REPAIR_INCOMPLETE"
    http_status = 500


_BY_STATUS: dict[Status, type[ZbkError]] = {
    Status.ENOLEDGER: NoSuchLedgerError,
    Status.ENOENTRY: NoSuchEntryError,
    Status.EBADREQ: BadRequestError,
    Status.EIO: BookieIOError,
    Status.EUA: UnauthorizedError,
    Status.EBADVERSION: ProtocolVersionError,
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
