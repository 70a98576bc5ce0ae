"""Every public name of ``zbk``, ``zbk.errors`` and ``zbk.spark``, and every public method of
the client and handle classes, has a docstring that the API reference can render.

Docstrings are Google style (mkdocstrings' parser): an ``Args:`` section naming every
parameter, ``Returns:`` (or ``Yields:``) for anything that returns a value, ``Raises:`` for
the calls that can fail, each raised name an exception that exists. A dataclass names each
of its fields under ``Attributes:``. Module-level constants have an attribute docstring (a
string literal right after the assignment), which mkdocstrings shows with them.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import inspect
import re
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import zbk.errors
from zbk.client import (
    AsyncBookKeeper,
    BookKeeper,
    LedgerEntry,
    LedgerHandle,
    ReadHandle,
    SyncLedgerHandle,
    SyncReadHandle,
)
from zbk.config import ClientConfig
from zbk.metadata.ledger import LedgerMetadata

PUBLIC_MODULES = ("zbk", "zbk.errors", "zbk.spark")
# The client, its handles and what their calls take and return, whatever zbk exports.
CLIENT_CLASSES: tuple[type, ...] = (AsyncBookKeeper, BookKeeper, ReadHandle, LedgerHandle, SyncReadHandle,
                                    SyncLedgerHandle, LedgerEntry, ClientConfig, LedgerMetadata)
# Public methods of the client classes that need no ``Raises:`` section, with the reason.
NO_RAISES: dict[str, str] = {
    "AsyncBookKeeper.close": "closing fails no call: pending appends fail through their futures",
    "BookKeeper.close": "as AsyncBookKeeper.close",
    "BookKeeper.async_client": "a property",
    "LedgerHandle.wait_drained": "the appends' futures carry their failures",
    "SyncLedgerHandle.append_async": "never raises: every failure comes through the future",
}
# LedgerMetadata's methods are the metadata layer's, not the client's API: only its class
# docstring and properties are the reference's concern.
PROPERTIES_ONLY = (LedgerMetadata,)
_SECTION = re.compile(r"^(?P<indent> *)(?P<name>Args|Arguments|Returns|Yields|Raises|Attributes):\s*$")
_ITEM = re.compile(r"^(?P<name>\*{0,2}[A-Za-z_][A-Za-z0-9_.]*)(?: \([^)]*\))?:")


def sections(doc: str) -> dict[str, list[str]]:
    """The Google-style sections of ``doc`` and the names each lists (for Returns/Yields,
    whether the section has any text, as [""])."""
    out: dict[str, list[str]] = {}
    lines = inspect.cleandoc(doc).splitlines()
    i = 0
    while i < len(lines):
        m = _SECTION.match(lines[i])
        i += 1
        if not m:
            continue
        base = len(m["indent"])
        items: list[str] = []
        body = False
        item_indent: int | None = None
        while i < len(lines) and (not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > base):
            line = lines[i]
            i += 1
            if not line.strip():
                continue
            body = True
            indent = len(line) - len(line.lstrip())
            if item_indent is None:
                item_indent = indent
            if indent == item_indent and (im := _ITEM.match(line.strip())):
                items.append(im["name"].lstrip("*"))
        out[m["name"].replace("Arguments", "Args")] = items if m["name"] not in ("Returns", "Yields") else (
            [""] if body else [])
    return out


def public_names(module: types.ModuleType) -> list[str]:
    """``__all__``, or else what the module defines without a leading underscore: its
    classes and functions, and its module-level assignments."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    found = [n for n, obj in vars(module).items() if not n.startswith("_") and (
        (inspect.isclass(obj) or inspect.isfunction(obj)) and obj.__module__ == module.__name__)]
    return found + [n for n in assigned_names(module) if not n.startswith("_") and n not in found]


def assigned_names(module: types.ModuleType) -> list[str]:
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    out = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        out += [t.id for t in targets if isinstance(t, ast.Name)]
    return out


def attribute_docstrings(module: types.ModuleType) -> set[str]:
    """Module-level names assigned with a string literal right after the assignment."""
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    out = set()
    for node, nxt in zip(tree.body, tree.body[1:], strict=False):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str) \
                and nxt.value.value.strip():
            out |= {t.id for t in targets if isinstance(t, ast.Name)}
    return out


def own_doc(obj: Any) -> str:
    """The object's own docstring (a class does not inherit its base's here)."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
        # A dataclass without a docstring gets its signature as one: that is not documentation.
        if doc and dataclasses.is_dataclass(obj) and doc.startswith(obj.__name__ + "("):
            return ""
        return doc or ""
    return getattr(obj, "__doc__", None) or ""


def members(cls: type) -> Iterator[tuple[str, Any]]:
    """The public methods and properties ``cls`` defines itself, and ``__init__`` if it does
    (a dataclass's generated one excepted: its fields are its Attributes)."""
    for name, raw in vars(cls).items():
        if name == "__init__" and not dataclasses.is_dataclass(cls):
            yield name, raw
        elif name.startswith("_"):
            continue
        elif isinstance(raw, (property, classmethod, staticmethod)) or inspect.isfunction(raw):
            if cls in PROPERTIES_ONLY and not isinstance(raw, property):
                continue
            yield name, raw


def _function(raw: Any) -> Callable[..., Any] | None:
    if isinstance(raw, property):
        return None
    if isinstance(raw, (classmethod, staticmethod)):
        return raw.__func__  # type: ignore[no-any-return]
    return raw  # type: ignore[no-any-return]


def exception_named(name: str, module: types.ModuleType) -> bool:
    obj = getattr(zbk.errors, name, None) or getattr(builtins, name, None) or getattr(module, name, None)
    if obj is None and "." in name:
        mod, _, attr = name.rpartition(".")
        try:
            obj = getattr(importlib.import_module(mod), attr, None)
        except ImportError:
            obj = None
    return inspect.isclass(obj) and issubclass(obj, BaseException)


def member_problems(cls: type, *, need_raises: bool) -> list[str]:
    problems: list[str] = []
    module = sys.modules[cls.__module__]
    for name, raw in members(cls):
        where = f"{cls.__module__}.{cls.__qualname__}.{name}"
        fn = _function(raw)
        doc = raw.fget.__doc__ if isinstance(raw, property) else (fn.__doc__ if fn else None)
        if name == "__init__" and not doc and "Args" in sections(own_doc(cls)):
            doc = own_doc(cls)  # the constructor's arguments in the class docstring, as mkdocstrings merges them
        if not doc or not doc.strip():
            problems.append(f"{where}: no docstring")
            continue
        if fn is None:
            continue  # a property: its docstring says what it is
        got = sections(doc)
        sig = inspect.signature(fn)
        params = [p for p in list(sig.parameters.values())[1 if not isinstance(raw, staticmethod) else 0:]]
        if name == "__init__" and "Args" not in got:
            got.setdefault("Args", sections(own_doc(cls)).get("Args", []))
        missing = [p.name for p in params if p.name not in got.get("Args", [])]
        if missing:
            problems.append(f"{where}: Args lacks {', '.join(missing)}")
        extra = [a for a in got.get("Args", []) if a not in sig.parameters]
        if extra:
            problems.append(f"{where}: Args names {', '.join(extra)}, which it does not take")
        returns = sig.return_annotation
        if name != "__init__" and returns not in ("None", None, inspect.Signature.empty) \
                and not got.get("Returns") and not got.get("Yields"):
            problems.append(f"{where}: returns {returns} but has no Returns (or Yields) section")
        for raised in got.get("Raises", []):
            if not exception_named(raised, module):
                problems.append(f"{where}: Raises names {raised}, which is no exception")
        # Constructors raise only where they check settings: the clients'.
        raises_expected = name != "__init__" or cls in (BookKeeper, AsyncBookKeeper)
        if need_raises and raises_expected and "Raises" not in got and f"{cls.__qualname__}.{name}" not in NO_RAISES:
            problems.append(f"{where}: no Raises section")
    if dataclasses.is_dataclass(cls):
        listed = sections(own_doc(cls)).get("Attributes", [])
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in listed]
        if missing:
            problems.append(f"{cls.__module__}.{cls.__qualname__}: Attributes lacks {', '.join(missing)}")
    return problems


def public_objects() -> Iterator[tuple[str, Any, types.ModuleType]]:
    for modname in PUBLIC_MODULES:
        module = importlib.import_module(modname)
        for name in public_names(module):
            yield f"{modname}.{name}", getattr(module, name), module


def name_problems() -> list[str]:
    problems = []
    for where, obj, module in public_objects():
        if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.ismodule(obj):
            if not own_doc(obj).strip():
                problems.append(f"{where}: no docstring")
        else:
            name = where.rsplit(".", 1)[1]
            if name.startswith("__") and name.endswith("__"):
                continue  # __version__ and the like: Python's conventions, documented by their name
            if name not in attribute_docstrings(module):
                problems.append(f"{where}: a constant without an attribute docstring")
    return problems


def test_every_public_name_has_a_docstring() -> None:
    problems = name_problems()
    assert problems == [], "\n".join(problems)


def test_every_public_class_documents_its_methods() -> None:
    """Classes exported by the public modules: every public method documented, its
    parameters and return value included (error classes need no Raises)."""
    problems = []
    for _where, obj, _module in public_objects():
        if inspect.isclass(obj):
            problems += member_problems(obj, need_raises=False)
    assert problems == [], "\n".join(problems)


@pytest.mark.parametrize("cls", CLIENT_CLASSES, ids=lambda c: c.__qualname__)
def test_client_classes_document_parameters_returns_and_raises(cls: type) -> None:
    problems = [f"{cls.__qualname__}: no docstring"] if not own_doc(cls).strip() else []
    problems += member_problems(cls, need_raises=cls not in (LedgerEntry, ClientConfig, LedgerMetadata))
    assert problems == [], "\n".join(problems)


def test_every_no_raises_entry_names_a_method() -> None:
    known = {f"{c.__qualname__}.{n}" for c in CLIENT_CLASSES for n, _ in members(c)}
    assert set(NO_RAISES) <= known, set(NO_RAISES) - known


# -- the checker itself finds what it is meant to find ----------------------------------------------

class _Undocumented:
    def method(self, x: int) -> int:
        return x


class _HalfDocumented:
    """A class.

    Args:
        y: Not a parameter of ``__init__``.
    """

    def __init__(self, x: int) -> None:
        self.x = x

    def method(self, x: int, y: int) -> int:
        """Does something.

        Args:
            x: The first.

        Raises:
            NoSuchThingError: Not an exception anywhere.
        """
        return x + y

    def gen(self) -> Iterator[int]:
        """Yields numbers, but says nothing of them in a section."""
        yield 1


@dataclasses.dataclass
class _Fields:
    """Fields.

    Attributes:
        a: Listed.
    """

    a: int
    b: int


def test_the_checker_flags_what_is_missing() -> None:
    assert member_problems(_Undocumented, need_raises=False) == [f"{__name__}._Undocumented.method: no docstring"]
    problems = member_problems(_HalfDocumented, need_raises=True)
    assert f"{__name__}._HalfDocumented.__init__: Args lacks x" in problems  # from the class docstring
    assert f"{__name__}._HalfDocumented.__init__: Args names y, which it does not take" in problems
    assert any("method: Args lacks y" in p for p in problems), problems
    assert any("method: Raises names NoSuchThingError" in p for p in problems), problems
    assert any("gen: returns" in p for p in problems), problems
    assert any("gen: no Raises section" in p for p in problems), problems
    assert member_problems(_Fields, need_raises=False) == [f"{__name__}._Fields: Attributes lacks b"]
    assert own_doc(dataclasses.make_dataclass("D", [("a", int)])) == ""


def test_sections_parse_google_style() -> None:
    doc = '''Summary.

    Args:
        first: The first.
        second (int): The second, on
            two lines.
        **kw: More.

    Returns:
        Something.

    Raises:
        NoSuchLedgerError: When absent.
    '''
    assert sections(doc) == {"Args": ["first", "second", "kw"], "Returns": [""], "Raises": ["NoSuchLedgerError"]}
