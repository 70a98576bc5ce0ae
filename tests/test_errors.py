import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import zbk
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
    assert errors.status_for_error(err) == status


def test_ebadversion_is_a_protocol_version_mismatch_not_a_metadata_conflict():
    """EBADVERSION: the peer speaks another protocol version. A lost metadata compare-and-set
    is a client-side failure that never crosses the wire (a bookie would answer EIO)."""
    err = errors.error_for_status(Status.EBADVERSION)
    assert type(err) is errors.ProtocolVersionError
    assert isinstance(err, errors.BadRequestError)  # callers that catch bad requests still do
    assert not isinstance(err, errors.MetadataVersionError)
    assert errors.MetadataVersionError.wire_status is None
    assert errors.KeyExistsError.wire_status is None
    assert errors.status_for_error(errors.MetadataVersionError("lost the race")) == Status.EIO
    assert errors.status_for_error(errors.KeyExistsError("there already")) == Status.EIO
    assert [s for s, c in errors._BY_STATUS.items() if issubclass(c, errors.MetadataVersionError)] == []


def test_bp46_response_classes():
    assert Status.ENOENTRY.is_explicit_negative and Status.ENOLEDGER.is_explicit_negative
    assert not Status.EUNKNOWN.is_explicit_negative
    assert not Status.EIO.is_explicit_negative


def test_exit_codes():
    assert errors.CookieMismatchError.exit_code == errors.EXIT_COOKIE
    assert errors.MetadataUnavailableError.exit_code == errors.EXIT_UNREACHABLE
    assert errors.BookieUnavailableError.exit_code == errors.EXIT_UNREACHABLE
    assert errors.ConfigError.exit_code == errors.EXIT_USAGE
    assert errors.LedgerFencedError.exit_code == errors.EXIT_FAILED


def test_unexpected_exception_maps_to_eio():
    assert errors.status_for_error(RuntimeError("x")) == Status.EIO


def test_corrupt_data_names_file_and_offset():
    e = errors.CorruptDataError("bad crc", path="/d/j.jnl", offset=42)
    assert "/d/j.jnl" in str(e) and "42" in str(e) and e.offset == 42


def _all_modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(zbk.__path__, "zbk.")]


def _every_error_class() -> list[type[errors.ZbkError]]:
    for name in _all_modules():
        importlib.import_module(name)  # every error class of zbk is defined by now

    def below(cls: type[errors.ZbkError]) -> list[type[errors.ZbkError]]:
        return [c for sub in cls.__subclasses__() for c in (sub, *below(sub))]

    return [errors.ZbkError, *below(errors.ZbkError)]


HTTP_ERROR_STATUSES = {400, 403, 404, 409, 410, 429, 500, 502, 503, 504}


def test_every_error_class_has_an_http_status_of_its_own():
    """Total: every error of zbk, in any module, answers a status decided for it (or for a
    typed parent other than the ZbkError root), never the root's generic 500 by default."""
    classes = _every_error_class()
    assert {"FrameError", "ProtocolVersionError", "MetadataVersionError"} <= {c.__name__ for c in classes}
    undecided = []
    for cls in classes:
        assert cls.http_status in HTTP_ERROR_STATUSES, (cls, cls.http_status)
        owner = next(c for c in cls.__mro__ if "http_status" in vars(c))
        if owner is errors.ZbkError and cls is not errors.ZbkError:
            undecided.append(cls.__qualname__)
        if cls.__module__ == "zbk.errors":
            assert "http_status" in vars(cls), f"{cls.__name__}: say its http_status in zbk/errors.py"
    assert not undecided, undecided


@pytest.mark.parametrize("name,status", [
    ("BadRequestError", 400), ("ConfigError", 400), ("ProtocolVersionError", 400), ("UnauthorizedError", 403),
    ("NoSuchLedgerError", 404), ("NoSuchEntryError", 404), ("MetadataVersionError", 409),
    ("KeyExistsError", 409), ("LedgerFencedError", 409), ("TooManyRequestsError", 429),
    ("MetadataUnavailableError", 503), ("BookieUnavailableError", 503), ("NotEnoughBookiesError", 503),
    ("ZbkTimeoutError", 504),
])
def test_http_statuses_say_what_kind_of_failure(name, status):
    assert getattr(errors, name).http_status == status


def test_every_exit_code_is_defined_in_errors_and_means_one_thing():
    codes = {n: v for n, v in vars(errors).items() if n.startswith("EXIT_")}
    assert len(set(codes.values())) == len(codes), codes
    assert codes["EXIT_ACTOR_BASE"] > max(v for n, v in codes.items() if n != "EXIT_ACTOR_BASE")
    elsewhere = []
    for path in sorted(Path(zbk.__file__).parent.rglob("*.py")):
        if path.name == "errors.py" and path.parent.name == "zbk":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            elsewhere += [f"{path}: {t.id}" for t in targets
                          if isinstance(t, ast.Name) and "EXIT" in t.id.upper()]
    assert not elsewhere, elsewhere
