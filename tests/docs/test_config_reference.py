"""The configuration reference (zbk/config/reference.py) covers every field of every config
dataclass, each with its meaning, and every number with its unit; the type and default
cells are checked against the classes by tests/test_config.py."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from dataclasses import dataclass, field

import zbk.config
from zbk.config import reference
from zbk.config.reference import Key, config_classes, field_docs, keys, render, undocumented


def test_every_field_of_every_config_dataclass_is_documented() -> None:
    assert undocumented() == []


def test_the_reference_covers_every_config_dataclass_of_zbk_config() -> None:
    """A config class that no configuration holds is in no reference: say where it goes."""
    defined = set()
    for info in pkgutil.iter_modules(zbk.config.__path__):
        module = importlib.import_module(f"zbk.config.{info.name}")
        defined |= {obj for _, obj in inspect.getmembers(module, inspect.isclass)
                    if dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
                    and obj.__module__ != reference.__name__}
    assert defined - set(config_classes()) == set()


def test_every_key_is_a_row_of_the_rendered_page_with_its_meaning() -> None:
    page = render()
    for cls in config_classes():
        for key in keys(cls):
            assert f"| `{key.name}` |" in page, (cls.__name__, key.name)
            assert " ".join(key.doc.split())[:60] in page, (cls.__name__, key.name)


def test_units_follow_from_the_names() -> None:
    assert [reference.unit_of(n) for n in ("max_group_wait_ms", "registration_ttl_s", "cache_bytes_max",
                                           "compaction_rate_bytes", "size_limit_mb", "usage_threshold",
                                           "auditor_ledger_verification_percent", "port", "sync_data")] == \
        ["ms", "s", "bytes", "bytes/s", "MiB", "ratio (0 to 1)", "%", "TCP port", ""]


@dataclass(frozen=True, kw_only=True)
class _Documented:
    """A section.

    Attributes:
        wait_ms: How long.
        rate (float): How fast,
            per second.
    """

    wait_ms: int = 5
    rate: float = 1.0
    missing: int = 3
    tags: tuple[str, ...] = field(default_factory=tuple)


def test_the_check_finds_a_field_left_out_and_a_number_without_unit() -> None:
    assert field_docs(_Documented) == {"wait_ms": "How long.", "rate": "How fast, per second."}
    assert reference.summary(_Documented) == "A section."
    got = {k.name: k for k in keys(_Documented)}
    assert got["wait_ms"] == Key(name="wait_ms", flat="wait_ms", type="int", default="`5`", unit="ms",
                                 doc="How long.")
    assert (got["missing"].doc, got["missing"].unit) == ("", "")
    assert got["tags"].type == "list of strings" and got["tags"].default == "`[]`"
    assert reference.problems(_Documented) == [
        "_Documented.rate: a number without a unit (UNIT_NAMES)",
        "_Documented.missing: not in the class docstring's Attributes",
        "_Documented.missing: a number without a unit (UNIT_NAMES)",
        "_Documented.tags: not in the class docstring's Attributes",
    ]


def test_a_class_without_a_docstring_of_its_own_is_found() -> None:
    @dataclass
    class Bare:
        wait_ms: int = 1

    assert Bare.__doc__  # @dataclass made one up: it does not count
    assert reference.problems(Bare)[0] == "Bare: no class docstring"
