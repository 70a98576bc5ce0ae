"""The one error tree of zbk.

Every expected failure is a subclass of `ZbkError` with

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

EXIT_OK = 0
"""Done, or stopped cleanly."""
EXIT_FAILED = 1
"""The operation failed (a CLI command), or a lease was lost or a worker crashed (autorecovery)."""
EXIT_USAGE = 2
"""A bad command line or configuration."""
EXIT_UNREACHABLE = 3
"""Metadata or bookies cannot be reached."""
EXIT_COOKIE = 4
"""Bookie: its directories do not match its cookie in metadata."""
EXIT_BOOT = 5
"""Bookie: any other boot failure (corrupt journal, unreachable metadata...)."""
EXIT_ACTOR_BASE = 10
"""Bookie: it exits with 10 + n when its actor n crashed (zbk/bookie/process.py, ``ACTORS``)."""


class ZbkError(Exception):
    """Base of every expected zbk failure.

    Catch it to handle any failure zbk foresees; anything else that escapes a zbk call is
    a bug. Each subclass sets the four class attributes below.

    Attributes:
        code: A stable name of the failure (``"LEDGER_FENCED"``), for scripts and logs.
        wire_status: The wire status a bookie answers for it, or ``None`` when it never
            crosses the wire.
        exit_code: The exit code of a CLI command that fails with it.
        http_status: The status the admin HTTP API answers for it.
    """

    code: str = "ZBK_ERROR"
    wire_status: Status | None = None
    exit_code: int = EXIT_FAILED
    http_status: int = 500


class LedgerFencedError(ZbkError):
    """The ledger was fenced by a recovering reader: this handle may no longer add entries.

    Raised by the appends (and the ``close()``) of a writer whose ledger another client
    opened with recovery. Every later call on the handle raises it again. The ledger is
    (or soon will be) closed by the recoverer at an entry no lower than the last one this
    writer saw confirmed. Do not retry on this ledger: open it with recovery to learn where
    it ended, then write what is missing to a new ledger, or stop if another writer took over.
    """

    code = "LEDGER_FENCED"
    http_status = 409
    wire_status = Status.EFENCED


class LedgerClosedError(ZbkError):
    """The ledger is closed: no entry can be added to it.

    Raised by an append on a handle that was closed (by ``close()``), or on a ledger that
    reached its last possible entry id. Entries confirmed before stay stored. Write to a
    new ledger.
    """

    code = "LEDGER_CLOSED"
    http_status = 409


class NoSuchLedgerError(ZbkError):
    """The ledger does not exist (in metadata, or on the bookie that answered).

    Raised by ``open_ledger``, ``delete_ledger`` and ``ledger_metadata`` for an id that has
    no metadata (never created, or deleted), and by a writer whose ledger was deleted under
    it. Retrying does not help.
    """

    code = "NO_SUCH_LEDGER"
    http_status = 404
    wire_status = Status.ENOLEDGER


class NoSuchEntryError(ZbkError):
    """The entry does not exist (beyond the ledger's end, or absent on the bookie that answered).

    Raised by ``read`` for a bad range or an entry beyond the last add confirmed (or the
    last entry of a closed ledger), and when every replica of an entry says that it lacks
    it. A reader of an open ledger can read the entry once the LAC has passed it.
    """

    code = "NO_SUCH_ENTRY"
    http_status = 404
    wire_status = Status.ENOENTRY


class UnauthorizedError(ZbkError):
    """Wrong ledger password (master key mismatch) or an unauthenticated client.

    ``open_ledger`` with a password other than the ledger's raises it before any request is
    sent: nothing is fenced. A bookie that refuses the master key, or a CURVE key, makes
    reads and appends fail with it. Retrying with the same credentials does not help.
    """

    code = "UNAUTHORIZED"
    http_status = 403
    wire_status = Status.EUA


class NotEnoughBookiesError(ZbkError):
    """Fewer writable bookies are registered than the ensemble needs, or too few of them
    meet the placement policy (isolation groups, an enforced minimum of racks).

    Raised by ``create_ledger``, and by a writer whose ensemble change found no
    replacement for a failed bookie (or made ``ensemble_change_attempts_max`` changes
    without confirming an entry): the handle is then failed. Retry later, once bookies are
    back, with a new ledger; a failed writer's ledger is settled by opening it with recovery.
    """

    code = "NOT_ENOUGH_BOOKIES"
    http_status = 503
    exit_code = EXIT_UNREACHABLE


class DigestMismatchError(ZbkError):
    """An entry's digest does not match its contents: the copy is corrupt or forged.

    Raised by ``zbk.wire.entry.parse_entry``. The client's reads never pass it on: a bad
    copy is logged and the entry is read from another replica; when no replica has a good
    copy the read fails with `BookieUnavailableError`.
    """

    code = "DIGEST_MISMATCH"
    http_status = 502


class BookieUnavailableError(ZbkError):
    """A bookie did not answer or could not be reached.

    Raised by reads when no replica of an entry answered with it, by
    ``read_last_add_confirmed`` when no bookie answered, by ``open_ledger`` with recovery
    when fencing reached too few bookies, by ``force()``, and by calls on a client that is
    closing. Whether the entry (or the fence) exists is unknown: retry after a pause.
    """

    code = "BOOKIE_UNAVAILABLE"
    http_status = 503
    exit_code = EXIT_UNREACHABLE


class ZbkTimeoutError(ZbkError):
    """An operation did not complete in time.

    Raised by the one-bookie admin requests (``zbk shell`` commands that ask one bookie,
    the bookie's admin API). The ledger calls of the client do not raise it: a bookie that
    does not answer in time is replaced (appends) or skipped (reads).
    """

    code = "TIMEOUT"
    http_status = 504


class MetadataVersionError(ZbkError):
    """A compare-and-set on metadata lost against a concurrent writer (or the key already exists).

    A client-side failure, as BookKeeper's MetadataVersionException: bookies do not write
    metadata while serving requests, so it never crosses the wire (no ``wire_status``; a
    bookie that met one anyway would answer EIO, as for any failure without a status).
    EBADVERSION is not its status: that one means a protocol version the peer does not speak
    (`ProtocolVersionError`)."""

    code = "METADATA_VERSION"
    http_status = 409


class KeyExistsError(MetadataVersionError):
    """Create-if-absent found the key already present (a bookie id registered twice, a
    ledger id taken)."""

    code = "KEY_EXISTS"
    http_status = 409


class BadRequestError(ZbkError):
    """A malformed request, frame or argument.

    Raised by the client for bad arguments: E, WQ and AQ not in
    ``64 >= E >= WQ >= AQ >= 1``, an unknown digest, a password that is not bytes,
    custom metadata that is not str to bytes, either too large, the reserved custom
    metadata key ``zbk.placement``, a negative ledger id. Fix the call; retrying it
    unchanged fails again.
    """

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
    """The bookie is read-only and refuses adds.

    A writer meeting it replaces the bookie (an ensemble change); it does not reach the
    application.
    """

    code = "READ_ONLY"
    http_status = 409
    wire_status = Status.EREADONLY


class UnknownLedgerStateError(ZbkError):
    """BP-46 EUNKNOWN: the bookie cannot tell whether it holds the entry (limbo ledger).

    Raised by reads when a replica in limbo (a bookie that restarted after losing data) may
    have lost the entry, and by ``open_ledger`` with recovery when it cannot tell whether an
    entry exists, rather than truncate the ledger on doubt. Retry later: the limbo clears
    once auto-recovery has repaired the bookie.
    """

    code = "UNKNOWN_LEDGER_STATE"
    http_status = 503
    wire_status = Status.EUNKNOWN


class TooManyRequestsError(ZbkError):
    """A bounded queue is full: a bookie's, or a writer's own.

    A bookie whose queues are full sheds requests with ETOOMANYREQUESTS; the client treats
    that as a failed bookie (adds) or an unknown answer (reads). An append on a ledger that
    already has ``pending_adds_max`` appends unconfirmed raises it at once: wait for earlier
    appends to complete, then append again.
    """

    code = "TOO_MANY_REQUESTS"
    http_status = 429
    wire_status = Status.ETOOMANYREQUESTS


class BookieIOError(ZbkError):
    """The bookie failed to read or write its disks.

    A writer meeting it replaces the bookie, a reader asks another replica; it does not
    reach the application.
    """

    code = "BOOKIE_IO"
    http_status = 500
    wire_status = Status.EIO


class ConfigError(ZbkError):
    """A configuration file, key or value is invalid.

    Raised by ``BookKeeper(...)`` and ``AsyncBookKeeper(...)`` for an unknown keyword (the
    message names the nearest field), a value of the wrong type or out of range, a
    malformed metadata URI, or a sqlite file in a directory that does not exist. Fix the
    configuration.
    """

    code = "CONFIG"
    http_status = 400
    exit_code = EXIT_USAGE


class MetadataError(ZbkError):
    """The metadata store failed.

    Any call that reads or writes ledger metadata (creating, opening, closing, deleting a
    ledger, an ensemble change) can raise it or a subclass. Whether a write took effect is
    unknown: read the metadata again before acting on it.
    """

    code = "METADATA"
    http_status = 502


class MetadataUnavailableError(MetadataError):
    """The metadata store cannot be reached.

    Raised when the client cannot open or reach the store (a sqlite file it cannot open,
    an etcd cluster without a reachable member). Retry after a pause.
    """

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
    """A file on disk failed its checksum or format check; carries the file and offset.

    Args:
        message: What is wrong.
        path: The file, when known; it and ``offset`` are appended to the message.
        offset: The byte offset in the file where the check failed.
    """

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
    """The typed error a client raises for a non-EOK wire status.

    Args:
        status: A wire status other than ``EOK``.
        message: The error's message; the status's name when empty.

    Returns:
        An instance of the error class of that status (`ZbkError` for a status
        without a class of its own), not raised.
    """
    assert status != Status.EOK, "EOK is not an error"
    cls = _BY_STATUS.get(status, ZbkError)
    return cls(message or status.name)


def status_for_error(err: BaseException) -> Status:
    """The wire status a bookie answers for an error raised while serving a request.

    Args:
        err: What serving the request raised.

    Returns:
        The error's ``wire_status``; ``EIO`` for any error without one.
    """
    if isinstance(err, ZbkError) and err.wire_status is not None:
        return err.wire_status
    return Status.EIO
