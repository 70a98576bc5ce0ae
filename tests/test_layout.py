"""The shape of the package: no module in zbk/ over the size limit, no import cycle among
zbk modules.

Imports counted: every import at module level, including those under ``if TYPE_CHECKING:``
(a type-only cycle still ties two modules together: neither can be read, type-checked or
moved without the other). Imports inside a function or method body are left out: they run
only when called, long after both modules are loaded, and they are the house's way to
reach an optional or heavy dependency lazily (``zbk.recovery`` from the bookie process,
the CLI's subcommands); they cannot make an import fail, and counting them would forbid
the lazy dispatch that keeps start-up light.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "zbk"
LINES_MAX = 600
# Modules allowed over LINES_MAX, with their own limit. Keep empty unless a split would
# cut a single cohesive unit in two.
LINES_MARGIN: dict[str, int] = {}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _toplevel_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Imports at module level, descending into if/try/with blocks (``if TYPE_CHECKING:``
    among them) but not into function or class bodies' functions."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue  # lazy: see the module docstring
        elif isinstance(node, ast.ClassDef):
            todo.extend(node.body)  # a class body runs at import time
        elif isinstance(node, (ast.If, ast.Try, ast.TryStar, ast.With, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody"):
                todo.extend(getattr(node, field, []))
            for handler in getattr(node, "handlers", []):
                todo.extend(handler.body)
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The zbk module an imported name lives in (the longest known prefix)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        is_package = path.name == "__init__.py"
        for node in _toplevel_imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = name.split(".")
                    keep = len(parts) - node.level + (1 if is_package else 0)
                    base = ".".join(parts[:keep] + ([base] if base else []))
                # ``from pkg import mod`` imports the submodule; ``from mod import name`` the module.
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                dep = _resolve(target, modules)
                if dep is not None and dep != name:
                    deps.add(dep)
        graph[name] = deps
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: list[str] = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _cycle_path(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One concrete cycle through ``component``, for the failure message."""
    members = set(component)
    start = component[0]
    path = [start]
    seen = {start}
    while True:
        nxt = sorted(graph[path[-1]] & members)
        if start in nxt and len(path) > 1:
            return [*path, start]
        step = next((m for m in nxt if m not in seen), None)
        if step is None:
            return [*path, "..."]
        path.append(step)
        seen.add(step)


def test_no_import_cycle() -> None:
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import cycles among zbk modules:\n" + "\n".join(
        " -> ".join(_cycle_path(graph, c)) + f"   (component: {', '.join(c)})" for c in cycles)


def test_no_module_over_the_limit() -> None:
    over = []
    for name, path in _modules().items():
        n = len(path.read_text().splitlines())
        if n > LINES_MARGIN.get(name, LINES_MAX):
            over.append(f"{path.relative_to(ROOT)}: {n} lines (limit {LINES_MARGIN.get(name, LINES_MAX)})")
    assert not over, "modules over the size limit:\n" + "\n".join(over)


def test_the_checks_can_fail() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert _cycle_path(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\n"
                     "def f():\n    import y\n")
    assert sorted(n.module or "" if isinstance(n, ast.ImportFrom) else n.names[0].name
                  for n in _toplevel_imports(tree)) == ["typing", "x"]
