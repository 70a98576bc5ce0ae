import pytest

from zbk import errors
from zbk.wire.status import Status

API_NAMES = ["LedgerFencedError", "LedgerClosedError", "NoSuchLedgerError", "NoSuchEntryError",
             "UnauthorizedError", "NotEnoughBookiesError", "DigestMismatchError", "BookieUnavailableError",
             "ZbkTimeoutError", "MetadataVersionError", "BadRequestError", "ReadOnlyError",
             "UnknownLedgerStateError", "ConfigError"]


@pytest.mark.parametrize("name", API_NAMES)
def test_api_error_names_exist_and_derive_from_base(name):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.ZbkError)
    assert cls.code and cls.code.isupper()


def test_codes_are_unique():
    classes = [c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.ZbkError)]
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes))


@pytest.mark.parametrize("status", [s for s in Status if s != Status.EOK])
def test_every_error_status_round_trips(status):
    err = errors.error_for_status(status)
    assert isinstance(err, errors.ZbkError)
    if status != Status.EBADVERSION:
        assert errors.status_for_error(err) == status


def test_bp46_response_classes():
    assert Status.ENOENTRY.is_explicit_negative and Status.ENOLEDGER.is_explicit_negative
    assert not Status.EUNKNOWN.is_explicit_negative
    assert not Status.EIO.is_explicit_negative


def test_exit_codes():
    assert errors.MetadataUnavailableError.exit_code == errors.EXIT_UNREACHABLE
    assert errors.BookieUnavailableError.exit_code == errors.EXIT_UNREACHABLE
    assert errors.ConfigError.exit_code == errors.EXIT_USAGE
    assert errors.LedgerFencedError.exit_code == errors.EXIT_FAILED


def test_unexpected_exception_maps_to_eio():
    assert errors.status_for_error(RuntimeError("x")) == Status.EIO


def test_corrupt_data_names_file_and_offset():
    e = errors.CorruptDataError("bad crc", path="/d/j.jnl", offset=42)
    assert "/d/j.jnl" in str(e) and "42" in str(e) and e.offset == 42
