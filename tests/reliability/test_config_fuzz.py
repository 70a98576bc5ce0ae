"""Random configuration files and --set overrides: a config or a ConfigError, never another
exception, and never an accepted config with a non-finite number in it.

Inputs: arbitrary bytes as a TOML file (invalid UTF-8, deep nesting, junk), and generated
TOML documents that use the real key names of every config class (top-level, dotted and
flat, and the section tables) with values of every TOML type (huge ints, nan/inf, strings,
arrays, tables, dates). Hypothesis prints the seed and
the shrunk input on failure (replay with --hypothesis-seed).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zbk.config import AutoRecoveryConfig, BookieConfig, ClientConfig, build, key_names, load, parse_overrides
from zbk.errors import ConfigError

FUZZ = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CLASSES = [BookieConfig, ClientConfig, AutoRecoveryConfig]
KEYS = sorted({k for cls in CLASSES for k in key_names(cls)})
TABLES = sorted({k.split(".", 1)[0] for k in KEYS if "." in k})
SUBKEYS = sorted({k.split(".", 1)[1] for k in KEYS if "." in k})


def _toml_key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "_-" for c in key) and key.isascii() else json.dumps(key)


def _toml_value(v: Any) -> str:
    """A TOML literal for a value drawn below (json.dumps writes valid TOML basic strings)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"


scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, 1, -1, 2**31, 65535, 65536, 10**18]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["", "true", "1", "1e400", "nan", "inf", "-0", "0x10", "/tmp/x", "sqlite:///tmp/m.db",
                     "a,b", "1_000"]),
    st.datetimes(timezones=st.none()),
    st.dates(),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.text(max_size=5), inner, max_size=3),
), max_leaves=6)
keys = st.one_of(st.sampled_from(KEYS), st.sampled_from(KEYS).map(lambda k: k + "x"), st.text(max_size=12),
                 st.just("bookie"))


@st.composite
def toml_documents(draw: st.DrawFn) -> str:
    doc = draw(st.dictionaries(keys, values, max_size=8))
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in doc.items()]
    if draw(st.booleans()):  # the [bookie] table form
        table = draw(st.dictionaries(keys, values, max_size=5))
        lines.append("[bookie]")
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items()]
    for name in draw(st.lists(st.sampled_from(TABLES), max_size=3, unique=True)):  # section tables
        table = draw(st.dictionaries(st.one_of(st.sampled_from(SUBKEYS), keys), values, max_size=4))
        lines.append(f"[{draw(st.sampled_from(['', 'bookie.']))}{name}]")
        lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _load_and_validate(cls: type, path: str | None = None, overrides: list[str] | None = None) -> None:
    try:
        cfg = load(cls, path=path, overrides=overrides)
        cfg = cfg.validate()
    except ConfigError:
        return
    _assert_finite(cls.__name__, cfg)


def _assert_finite(path: str, cfg: Any) -> None:
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            _assert_finite(f"{path}.{f.name}", value)
        elif isinstance(value, float):
            assert math.isfinite(value), f"{path}.{f.name} accepted {value!r}"


def _with_file(data: bytes, fn: Any) -> None:
    fd, path = tempfile.mkstemp(suffix=".toml")
    try:
        os.write(fd, data)
        os.close(fd)
        fn(path)
    finally:
        os.unlink(path)


@FUZZ
@given(st.sampled_from(CLASSES), toml_documents())
def test_generated_toml_gives_a_config_or_config_error(cls: type, text: str) -> None:
    _with_file(text.encode("utf-8", "surrogatepass"), lambda path: _load_and_validate(cls, path=path))


@FUZZ
@given(st.sampled_from(CLASSES), st.binary(max_size=300))
def test_arbitrary_bytes_give_config_error_or_a_config(cls: type, data: bytes) -> None:
    _with_file(data, lambda path: _load_and_validate(cls, path=path))


def test_pathological_files() -> None:
    required = b'data_dir = "/tmp/x"\nmetadata_uri = "sqlite:///tmp/m.db"\n'
    cases = [
        b"\xff\xfe = 1",  # not UTF-8
        b"a = " + b"[" * 5000 + b"]" * 5000,  # nested past the recursion limit
        b"a = " + b"{b = " * 3000 + b"1" + b"}" * 3000,
        required + b"journal_max_group_wait_ms = nan",  # nan passes every "> 0" check
        required + b"lost_bookie_recovery_delay_s = inf",
        required + b"journal_max_group_wait_ms = " + b"9" * 400,  # an int beyond a double
        b"port = 99999999999999999999999",
        b"\x00" * 10,
        b"[bookie]\n[bookie.x]\n",
    ]
    for data in cases:
        for cls in CLASSES:
            _with_file(data, lambda path, cls=cls: _load_and_validate(cls, path=path))


@FUZZ
@given(st.sampled_from(CLASSES), st.lists(st.one_of(
    st.tuples(st.sampled_from(KEYS), st.text(max_size=20)).map(lambda kv: f"{kv[0]}={kv[1]}"),
    st.tuples(st.sampled_from(KEYS), values.map(_toml_value)).map(lambda kv: f"{kv[0]}={kv[1]}"),
    st.text(max_size=30),
), max_size=4))
def test_random_overrides_give_a_config_or_config_error(cls: type, items: list[str]) -> None:
    _load_and_validate(cls, overrides=items)


def test_deeply_nested_override_is_a_config_error_or_a_string() -> None:
    out = parse_overrides(["x=" + "[" * 5000])
    assert out == {"x": "[" * 5000}
    try:
        build(BookieConfig, parse_overrides(["port=" + "[" * 5000 + "]" * 5000]))
    except ConfigError:
        pass
