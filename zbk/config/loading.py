"""Reading a config: TOML files, ``--set key=value``, explicit flags and keywords.

A key is written one of three ways, all meaning the same:
- in its table: ``[journal]`` ``sync_data = false`` (a TOML file);
- dotted: ``--set journal.sync_data=false`` (a dotted TOML key is the table form too);
- flat, by its API.md name: ``journal_sync_data = false`` at the top level of a file, or
  ``--set journal_sync_data=false``.
Within one source a key given two ways is an error naming both, since one of the two would
otherwise be silently dropped; across sources the later one wins. Unknown keys are rejected
with the nearest known names, because a typo in a durability setting must never be
silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import tomllib
import types
import typing
from typing import Any, NamedTuple, TypeVar

from zbk.errors import ConfigError

C = TypeVar("C")

_CPU_LIST_KEYS = frozenset({"actor_cpus"})


class _Key(NamedTuple):
    section: str | None  # the field of the section's table, None at the top level
    name: str  # the field within the section (or at the top level)
    type: Any


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _is_section(typ: Any) -> bool:
    return isinstance(typ, type) and dataclasses.is_dataclass(typ) and hasattr(typ, "FLAT")


class _Schema(NamedTuple):
    keys: dict[str, _Key]  # canonical name ("port", "journal.sync_data") -> _Key
    flat: dict[str, str]  # flat name ("journal_sync_data") -> canonical name
    refused: dict[str, str]  # a shared section's key this class does not take (both names) -> why


@functools.cache
def _schema(cls: type) -> _Schema:
    not_taken: dict[str, str] = getattr(cls, "KEYS_NOT_TAKEN", {})
    schema = _Schema({}, {}, {})
    for name, typ in _field_types(cls).items():
        if not _is_section(typ):
            schema.keys[name] = _Key(None, name, typ)
            continue
        for sub, sub_typ in _field_types(typ).items():
            canonical, flat = f"{name}.{sub}", typ.FLAT[sub]
            if canonical in not_taken:
                schema.refused[canonical] = schema.refused[flat] = not_taken[canonical]
            else:
                schema.keys[canonical] = _Key(name, sub, sub_typ)
                schema.flat[flat] = canonical
    return schema


def key_names(cls: type) -> list[str]:
    """Every name a key of ``cls`` can be given by: top-level, dotted and flat."""
    schema = _schema(cls)
    return sorted({*schema.keys, *schema.flat})


def canonical_key(cls: type, name: str) -> str:
    """The one name of the key ``name`` (top-level, dotted or flat) of ``cls``: the dotted
    name for a section's key. Callers that merge settings from several places (test and
    bench harnesses with defaults of their own) compare keys by it, so that a flat and a
    dotted spelling of one key do not collide."""
    schema = _schema(cls)
    if name in schema.keys:
        return name
    if name in schema.flat:
        return schema.flat[name]
    raise _unknown(cls, "config", name, "key")


def _nearest(name: str, candidates: list[str]) -> list[str]:
    return difflib.get_close_matches(name, candidates, n=3) or difflib.get_close_matches(
        name, candidates, n=1, cutoff=0.0)


def _unknown(cls: type, source: str, key: str, what: str) -> ConfigError:
    near = _nearest(key, key_names(cls))
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    return ConfigError(f"{source}: unknown {what} {key!r}{hint}")


def _coerce(source: str, key: str, value: Any, typ: Any, *, strict: bool, cpu_list: bool = False) -> Any:
    """``value`` as ``typ``. Not ``strict`` (files and ``--set``): text is read as the type
    ("true", "3", "a,b"). ``strict`` (Python keywords): the value must have the type."""
    origin = typing.get_origin(typ)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if not strict and isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if not strict and isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif typ is float:
        number: float | None = None
        if isinstance(value, (int, float, str)) and not isinstance(value, bool) and not (
                strict and isinstance(value, str)):
            try:
                number = float(value)
            except (ValueError, OverflowError):  # "abc", or an int beyond a double
                pass
        if number is not None and math.isfinite(number):  # nan passes every "> 0" check
            return number
    elif typ is str:
        if isinstance(value, str):
            return value
        if cpu_list and not strict and isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # actor_cpus = 2 (TOML) or --set actor_cpus=2: one CPU
    elif origin is tuple:
        if not strict and isinstance(value, str):
            return tuple(p for p in (s.strip() for s in value.split(",")) if p)
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
    elif origin is dict or typ is dict or isinstance(typ, types.GenericAlias):
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
    what = "keyword" if strict else "key"
    raise ConfigError(f"{source}: {what} {key!r} expects {getattr(typ, '__name__', typ)}, got {value!r}")


def _canonical(cls: type, values: dict[str, Any], source: str, *, strict: bool = False) -> dict[str, Any]:
    """One source's ``values`` (tables, dotted or flat keys) by canonical name, coerced."""
    keys, flat, refused = _schema(cls)
    what = "keyword" if strict else "key"
    out: dict[str, Any] = {}
    given_as: dict[str, str] = {}

    def put(canonical: str, given: str, value: Any) -> None:
        before = given_as.get(canonical)
        if before is not None and before != given:
            raise ConfigError(f"{source}: {before!r} and {given!r} are the same key ({canonical}); "
                              "give it one way")
        key = keys[canonical]
        out[canonical] = _coerce(source, given, value, key.type, strict=strict,
                                 cpu_list=key.name in _CPU_LIST_KEYS)
        given_as[canonical] = given

    def take(items: dict[str, Any], prefix: str) -> None:
        for key, value in items.items():
            if key in refused:
                raise ConfigError(f"{source}: {prefix + key!r}: {refused[key]}")
            if key in flat:
                put(flat[key], prefix + key, value)
            elif key in keys:
                put(key, prefix + key, value)
            elif any(k.section == key for k in keys.values()):
                if not isinstance(value, dict):
                    raise ConfigError(f"{source}: {prefix + key!r} is a table ([{key}]), got {value!r}")
                for sub, v in value.items():
                    dotted = f"{key}.{sub}"
                    if dotted in refused:
                        raise ConfigError(f"{source}: {prefix + dotted!r}: {refused[dotted]}")
                    if dotted not in keys:
                        raise _unknown(cls, source, dotted, what)
                    put(dotted, prefix + dotted, v)
            elif not prefix and key == "bookie" and isinstance(value, dict) and not strict:
                take(value, "bookie.")  # a [bookie] table holds what the top level would
            else:
                raise _unknown(cls, source, prefix + key, what)

    take(values, "")
    return out


def _apply(base: C, canonical: dict[str, Any]) -> C:
    """``base`` with the canonical keys' values in place."""
    cls: type = type(base)
    keys = _schema(cls).keys
    top: dict[str, Any] = {}
    sections: dict[str, dict[str, Any]] = {}
    for name, value in canonical.items():
        key = keys[name]
        if key.section is None:
            top[key.name] = value
        else:
            sections.setdefault(key.section, {})[key.name] = value
    for section, changes in sections.items():
        top[section] = dataclasses.replace(getattr(base, section), **changes)
    return typing.cast(C, dataclasses.replace(typing.cast(Any, base), **top)) if top else base


def build(cls: type[C], values: dict[str, Any], *, source: str = "config") -> C:
    """Build a config dataclass from one source's ``values``, rejecting unknown keys and
    wrong types."""
    return _apply(cls(), _canonical(cls, values, source))


def with_settings(config: C, settings: dict[str, Any], *, source: str) -> C:
    """``config`` with ``settings`` (Python keywords: values of the field's own type) in
    place; an unknown name is a ConfigError naming the nearest field."""
    return _apply(config, _canonical(type(config), settings, source, strict=True))


def load_toml(path: str) -> dict[str, Any]:
    """Read a TOML file; a missing file or a syntax error is a ConfigError naming the file."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:  # tomllib decodes the whole file first
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``["key=value", ...]`` from ``--set``; values are read as TOML scalars when they parse."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        try:
            out[key] = tomllib.loads(f"v = {raw}")["v"]
        except (tomllib.TOMLDecodeError, RecursionError):
            out[key] = raw
    return out


def load(cls: type[C], *, path: str | None = None, overrides: list[str] | None = None,
         explicit: dict[str, Any] | None = None) -> C:
    """Defaults < TOML file < ``--set`` overrides < explicit flags (flat names; None: not
    given)."""
    canonical: dict[str, Any] = {}
    if path:
        canonical.update(_canonical(cls, load_toml(path), path))
    canonical.update(_canonical(cls, parse_overrides(overrides), "--set"))
    canonical.update(_canonical(cls, {k: v for k, v in (explicit or {}).items() if v is not None},
                                "command line"))
    return _apply(cls(), canonical)
