"""zbk/limits.py is the one home of bounds and defaults (TigerBeetle's rule).

An ``ast`` scan of every module of zbk finds the module-level numeric constants (a number,
or arithmetic of numbers) whose names look like bounds. Outside limits.py only the
allow-listed ones may exist: facts of a disk format, of the wire protocol or of the
kernel, which no one tunes. limits.py itself defines each name once and says why each
value is what it is.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

ZBK = Path(__file__).resolve().parent.parent / "zbk"
LIMITS = ZBK / "limits.py"

# Words of a name (split at "_") that make it look like a bound, a default or a retry policy.
_BOUND_WORDS = {
    "max", "min", "s", "ms", "us", "ns", "bytes", "default", "ceiling", "limit", "timeout", "deadline",
    "attempts", "retries", "retry", "backoff", "interval", "size", "delay", "wait", "poll", "tick",
    "chunk", "batch", "budget", "rate", "hwm", "capacity", "step", "group", "puts", "rows", "cached",
    "threads", "workers", "ttl", "pause",
}

# (module relative to zbk/, name) -> why it is not a bound.
ALLOWED: dict[tuple[str, str], str] = {
    ("storage/index.py", "SLOT_BYTES"): "disk format: an index slot is two 64-bit words",
    ("storage/index.py", "MASTER_KEY_BYTES_MAX"): "disk format: the index header's fixed 64-byte key field",
    ("storage/index.py", "_TORN_SIZE_GRANULE"): "kernel fact: a crash leaves a file's size on a page boundary",
    ("storage/ledgerpages.py", "DELTA_PAGE_BYTES"): "a measured CPython object size charged to the cache bound",
    ("storage/ledgerpages.py", "DELTA_SLOT_BYTES"): "a measured CPython object size charged to the cache bound",
    ("wire/messages.py", "MASTER_KEY_BYTES"): "protocol: a master key is a SHA-256 digest",
    ("wire/ranges.py", "RANGE_BYTES"): "protocol: a packed entry range is two 64-bit ids",
    ("wire/ranges.py", "_INT64_MAX"): "protocol: the range of the wire's signed 64-bit integers",
    ("wire/entry.py", "_INT64_MAX"): "protocol: the range of the wire's signed 64-bit integers",
    ("wire/codec.py", "_I64_MAX"): "protocol: the range of the wire's signed 64-bit integers",
    ("wire/codec.py", "_U64_MAX"): "protocol: the range of the wire's unsigned 64-bit integers",
    ("wire/cborwriter.py", "_MAJOR_BYTES"): "CBOR format (RFC 8949): the major type of byte strings",
    ("metadata/uri.py", "ETCD_DEFAULT_PORT"): "protocol: etcd's registered client port",
    ("osthread.py", "_NAME_BYTES_MAX"): "kernel ABI: a thread name is 16 bytes with its NUL",
    ("osthread.py", "CPU_MAX"): "kernel ABI: Linux builds for at most 8,192 CPUs",
}


def _is_number(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (int, float)) and not isinstance(node.value, bool)
    if isinstance(node, ast.UnaryOp):
        return _is_number(node.operand)
    if isinstance(node, ast.BinOp):
        return _is_number(node.left) and _is_number(node.right)
    return False


def _module_statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements run at import: the module's own, and those inside its if/try blocks."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            yield from _module_statements(stmt.body)
            yield from _module_statements(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *(h.body for h in stmt.handlers)):
                yield from _module_statements(block)


def numeric_constants(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """(name, line) of every module-level name bound to a number or to arithmetic of numbers."""
    for stmt in _module_statements(tree.body):
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and _is_number(value):
                yield target.id, stmt.lineno
            elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                for t, v in zip(target.elts, value.elts, strict=False):
                    if isinstance(t, ast.Name) and _is_number(v):
                        yield t.id, stmt.lineno


def looks_like_bound(name: str) -> bool:
    return bool(_BOUND_WORDS & set(name.lower().strip("_").split("_")))


def _modules() -> list[Path]:
    return sorted(p for p in ZBK.rglob("*.py") if p != LIMITS)


def test_the_scan_finds_bounds() -> None:
    """The scan itself: it must see what it is meant to forbid."""
    tree = ast.parse("a_timeout_s = 5\nB_MAX: int = 2 ** 10\nc_bytes_default = -(4 * 1024)\n"
                     "x_min, y = 1, 'y'\nif True:\n    RETRY_ATTEMPTS = 3\nNAME = 'n'\nFLAG = 4\n"
                     "z_s = other.z_s\n")
    found = {name for name, _ in numeric_constants(tree) if looks_like_bound(name)}
    assert found == {"a_timeout_s", "B_MAX", "c_bytes_default", "x_min", "RETRY_ATTEMPTS"}


def test_no_bound_lives_outside_limits() -> None:
    offenders = []
    for path in _modules():
        rel = path.relative_to(ZBK).as_posix()
        for name, line in numeric_constants(ast.parse(path.read_text(), str(path))):
            if looks_like_bound(name) and (rel, name) not in ALLOWED:
                offenders.append(f"zbk/{rel}:{line}: {name}")
    assert not offenders, ("bounds belong in zbk/limits.py (or, if not a bound, in ALLOWED with the "
                           "reason):\n" + "\n".join(offenders))


def test_every_allowed_name_still_exists_and_says_why() -> None:
    """A stale allow-list entry would let a bound of that name come back unnoticed."""
    for (rel, name), why in ALLOWED.items():
        assert why.strip(), (rel, name)
        names = {n for n, _ in numeric_constants(ast.parse((ZBK / rel).read_text()))}
        assert name in names, f"zbk/{rel} no longer defines {name}: drop it from ALLOWED"


def _limits_assignments() -> list[tuple[str, int]]:
    out = []
    for stmt in ast.parse(LIMITS.read_text()).body:
        targets = stmt.targets if isinstance(stmt, ast.Assign) else \
            [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        for t in targets:
            for n in (t.elts if isinstance(t, ast.Tuple) else [t]):
                assert isinstance(n, ast.Name)
                out.append((n.id, stmt.lineno))
    return out


def test_no_name_is_defined_twice_in_limits() -> None:
    counts = Counter(name for name, _ in _limits_assignments())
    assert not [n for n, c in counts.items() if c > 1]


def test_every_limit_says_why() -> None:
    """Each value has a comment on its line, or belongs to a run of assignments right below a
    comment (a group explained once)."""
    lines = LIMITS.read_text().splitlines()
    unexplained = []
    for name, lineno in _limits_assignments():
        i = lineno - 1
        if "#" in lines[i]:
            continue
        j = i - 1
        while j >= 0 and re.match(r"^[A-Za-z_][\w, ]*=", lines[j]):
            j -= 1  # other assignments of the same group
        if j < 0 or not lines[j].lstrip().startswith("#") or lines[j].startswith("# ---"):
            unexplained.append(f"zbk/limits.py:{lineno}: {name}")
    assert not unexplained, "\n".join(unexplained)


@pytest.mark.parametrize("word", ["issue #", "Issue #"])
def test_limits_comments_are_reasons_not_history(word: str) -> None:
    assert word not in LIMITS.read_text()
