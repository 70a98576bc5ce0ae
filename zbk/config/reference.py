"""The configuration reference, generated from the config dataclasses themselves.

A key's meaning is its entry in the ``Attributes:`` section of its class's docstring (Google
style, as mkdocstrings shows it in the API reference too); its type and default are the
field's own; its unit follows from its name (units come last in names, zbk/limits.py), or
from ``UNIT_NAMES`` for the few names that carry none. The docs site renders ``render()`` at
build time (scripts/mkdocs_hooks.py), and tests/docs/test_config_reference.py fails when a
field has no entry or a number has no unit, so the reference cannot drift from the code.
``python -m zbk.config.reference`` prints it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import re
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

from zbk.config.autorecovery import AutoRecoveryConfig
from zbk.config.bookie import BookieConfig
from zbk.config.client import ClientConfig
from zbk.config.sections import RecoveryConfig, Section

MIB = 1024 * 1024

# Units of the names that do not end in one. A number missing here and without a unit
# suffix fails tests/docs/test_config_reference.py.
UNIT_NAMES: dict[str, str] = {
    "port": "TCP port",
    "http_port": "TCP port",
    "open_max": "files",
    "files_open_max": "files",
    "pending_adds_max": "appends",
    "add_request_entries_max": "entries",
    "add_batches_in_flight_max": "batches",
    "tail_long_polls": "bookies",
    "ensemble_change_attempts_max": "ensemble changes",
    "replicator_workers": "ledgers",
    "min_racks_per_write_quorum": "racks",
    "actor_cpus": "CPU list",
}
# Longest first: "compaction_rate_bytes" is a rate, "max_frame_bytes" a size.
UNIT_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("_rate_bytes", "bytes/s"),
    ("_threshold", "ratio (0 to 1)"),
    ("_percent", "%"),
    ("_bytes", "bytes"),
    ("_ms", "ms"),
    ("_mb", "MiB"),
    ("_s", "s"),
)
# "    name: text" or "    name (type): text", one indent into the section.
_ENTRY = re.compile(r"^ {4}(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?: \([^)]*\))?:(?P<text>.*)$")
TYPE_NAMES: dict[Any, str] = {bool: "bool", int: "int", float: "float", str: "string",
                              tuple[str, ...]: "list of strings"}


@dataclass(frozen=True)
class Key:
    """One key of a configuration, as the reference shows it."""

    name: str  # as written in its table (or at the top level)
    flat: str  # the flat name (API.md) that sets it too; the same at the top level
    type: str
    default: str
    unit: str
    doc: str


def class_doc(cls: type) -> str:
    """``cls``'s own docstring, as written ("" for none: @dataclass makes one up from the
    signature, which is not documentation). Read from the source, since ``cls.__doc__`` of a
    class without one is that made-up text."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    node = next(node for node in tree.body if isinstance(node, ast.ClassDef))
    return ast.get_docstring(node) or ""


def _split(doc: str) -> tuple[str, list[str]]:
    """``doc``'s text before its ``Attributes:`` section, and that section's lines."""
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line.rstrip() == "Attributes:":
            section: list[str] = []
            for item in lines[i + 1:]:
                if item.strip() and not item.startswith(" "):
                    break  # the next section, at the docstring's own indent
                section.append(item)
            return "\n".join(lines[:i]).strip(), section
    return doc.strip(), []


def summary(cls: type) -> str:
    """``cls``'s docstring without its ``Attributes:`` section, on one line."""
    return " ".join(_split(class_doc(cls))[0].split())


def field_docs(cls: type) -> dict[str, str]:
    """The entries of the ``Attributes:`` section of ``cls``'s docstring, by field name, each
    on one line."""
    docs: dict[str, str] = {}
    name = ""
    for line in _split(class_doc(cls))[1]:
        m = _ENTRY.match(line)
        if m:
            name = m["name"]
            docs[name] = m["text"].strip()
        elif name and line.strip():
            docs[name] += " " + line.strip()
    return docs


def unit_of(name: str) -> str:
    """The unit of the key ``name``, from its name ("" when it has none)."""
    if name in UNIT_NAMES:
        return UNIT_NAMES[name]
    stem = name.removesuffix("_max").removesuffix("_min")
    return next((unit for suffix, unit in UNIT_SUFFIXES if stem.endswith(suffix)), "")


def is_section(f: dataclasses.Field[Any]) -> bool:
    """A field that holds a whole section (a TOML table) rather than a key."""
    return f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(f.default_factory)


def config_classes() -> list[type]:
    """Every config dataclass the reference covers: the three configurations and the
    sections they hold."""
    found: list[type] = []
    for cls in (BookieConfig, AutoRecoveryConfig, ClientConfig):
        found.append(cls)
        for f in dataclasses.fields(cls):
            if is_section(f) and f.default_factory not in found:
                found.append(f.default_factory)  # type: ignore[arg-type]
    return found


def type_name(hint: Any) -> str:
    return TYPE_NAMES.get(hint, str(hint))


def default_text(name: str, value: Any) -> str:
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, tuple):
        text = "[" + ", ".join(f'"{v}"' for v in value) + "]"
    elif isinstance(value, str):
        text = f'"{value}"'
    else:
        text = repr(value)
    shown = f"`{text}`"
    if isinstance(value, int) and not isinstance(value, bool) and unit_of(name).startswith("bytes") \
            and value >= MIB and value % MIB == 0:
        shown += f" ({value // MIB} MiB)"
    return shown


@functools.cache
def keys(cls: type) -> tuple[Key, ...]:
    """The keys of ``cls``, in field order, sections left out."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    flat: dict[str, str] = getattr(cls, "FLAT", {}) if issubclass(cls, Section) else {}
    defaults = cls()
    return tuple(
        Key(name=f.name, flat=flat.get(f.name, f.name), type=type_name(hints[f.name]),
            default=default_text(f.name, getattr(defaults, f.name)), unit=unit_of(f.name),
            doc=docs.get(f.name, ""))
        for f in dataclasses.fields(cls) if not is_section(f))


def problems(cls: type) -> list[str]:
    """What the reference would lack for ``cls``: ``Class`` when it has no docstring of its
    own, ``Class.field`` for a key its docstring's ``Attributes:`` does not describe and for
    a number without a unit."""
    missing = [] if class_doc(cls) else [f"{cls.__name__}: no class docstring"]
    for key in keys(cls):
        if not key.doc:
            missing.append(f"{cls.__name__}.{key.name}: not in the class docstring's Attributes")
        if key.type in ("int", "float") and not key.unit:
            missing.append(f"{cls.__name__}.{key.name}: a number without a unit (UNIT_NAMES)")
    return missing


def undocumented() -> list[str]:
    """The problems of every config class (``problems``)."""
    return [p for cls in config_classes() for p in problems(cls)]


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(cls: type, with_flat: bool, skip: frozenset[str] = frozenset()) -> list[str]:
    head = ["key", "flat name", "type", "default", "unit", "meaning"] if with_flat else \
        ["key", "type", "default", "unit", "meaning"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for k in keys(cls):
        if k.name in skip:
            continue
        cells = [f"`{k.name}`", *([f"`{k.flat}`"] if with_flat else []), k.type, k.default, k.unit,
                 _cell(k.doc)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render() -> str:
    """The configuration reference page, in Markdown."""
    out = [
        "# Configuration reference",
        "",
        "Every key of a bookie (`zbk bookie`), of an auto-recovery process (`zbk autorecovery`) "
        "and of a client (`ClientConfig`), with its type, default, unit and meaning. This page is "
        "generated from the config dataclasses in `zbk/config/` when the site is built.",
        "",
        "A bookie or auto-recovery process reads its keys from `--config FILE` (TOML) and "
        "`--set key=value`, later sources winning ([Operations, \"Configure\"](../operations.md#configure)). A key in "
        "a table can be written `table.key` (`--set journal.sync_data=false`), as `key` inside "
        "the table of a file, or by its flat name (`--set journal_sync_data=false`), at the top "
        "level of a file too. Sizes in MiB are 1024 x 1024 bytes.",
        "",
        "## Bookie { #bookie }",
        "",
        summary(BookieConfig),
        "",
        "### Top level { #bookie-top-level }",
        "",
        *_table(BookieConfig, with_flat=False),
    ]
    for f in dataclasses.fields(BookieConfig):
        if not is_section(f):
            continue
        section: Any = f.default_factory
        out += ["", f"### `[{section.TABLE}]` {{ #{section.TABLE} }}", "", summary(section), "",
                *_table(section, with_flat=True)]
    taken = frozenset(k.split(".", 1)[1] for k in AutoRecoveryConfig.KEYS_NOT_TAKEN)
    out += [
        "", "## Auto-recovery process { #autorecovery-process }", "", summary(AutoRecoveryConfig), "",
        "### Top level { #autorecovery-top-level }", "",
        *_table(AutoRecoveryConfig, with_flat=False),
        "", f"### `[{RecoveryConfig.TABLE}]` {{ #autorecovery-process-section }}", "",
        f"The bookie's [`[{RecoveryConfig.TABLE}]`](#{RecoveryConfig.TABLE}) section, but for "
        + ", ".join(f"`{k}`" for k in sorted(taken)) + ", which `zbk autorecovery` refuses:", "",
        *_table(RecoveryConfig, with_flat=True, skip=taken),
        "", "## Client { #clientconfig }", "", summary(ClientConfig), "",
        "Each field is also a keyword of `zbk.BookKeeper(uri, ...)` and `zbk.AsyncBookKeeper(uri, ...)`; "
        "an unknown keyword is a `ConfigError` naming the nearest field.", "",
        *_table(ClientConfig, with_flat=False),
        "",
    ]
    return "\n".join(out)


if __name__ == "__main__":
    print(render())
