"""What the docs runner takes from a Markdown file: command lines and Python examples.

The rule (docs/operations.md and the other pages follow it):

* A **command line** is a line of a fenced code block whose info string is ``sh``,
  ``bash``, ``shell`` or ``console``.
  - In ``sh``/``bash``/``shell`` blocks every line is a command, except blank lines and
    lines that start with ``#``; a leading ``$ `` prompt is dropped.
  - In ``console`` blocks only the lines that start with ``$ `` are commands; the other
    lines are the output shown.
  - A line that ends in ``\\`` continues on the next one: the two are one command.
  - A trailing ``# comment`` stays part of the line (the shell ignores it).
* A **Python example** is a whole fenced block whose info string is ``python`` (or ``py``).
* Nothing else runs: inline code spans in prose name commands and options without being
  runnable lines, and blocks tagged ``toml``, ``text`` or untagged show files and formats.
  Indented code blocks run neither; :func:`indented_commands` finds command lines hidden
  in one, so that a test can refuse them (fence them as ``sh`` instead).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SHELL_LANGS = frozenset({"sh", "bash", "shell", "console"})
PYTHON_LANGS = frozenset({"python", "py"})
PROMPT = "$ "

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=\S*$")
# The first word of a line that is a command (after any VAR=value prefixes): what the docs
# tell a reader to type. Used only to find commands outside fenced blocks.
_COMMAND_WORDS = frozenset({"zbk", "bash", "sh", "python", "python3", "pytest", "pip", "curl", "cp", "mkdir",
                            "promtool", "prometheus", "git", "cd", "etcd", "sudo"})
_COMMAND_PREFIXES = (".venv/bin/", "bench/", "scripts/", "./")


@dataclass(frozen=True)
class Snippet:
    """One thing the runner runs: a command line (``lang`` "sh") or a Python example."""

    doc: str  # the document's path relative to the repository root, e.g. "docs/chaos.md"
    line: int  # 1-based line of the command (or of the block's first line) in the document
    lang: str  # "sh" or "python"
    text: str  # the command line, continuations joined; or the example's source

    def where(self) -> str:
        return f"{self.doc}:{self.line}"


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # 1-based line of the first line inside the fence
    lang: str
    lines: tuple[str, ...]


def fenced_blocks(path: Path, doc: str) -> list[Block]:
    """Every fenced code block of ``path``, its content dedented by the fence's indent (a
    fence inside a list item is indented like the item's text)."""
    blocks: list[Block] = []
    opened: tuple[int, str, str, int] | None = None  # (indent, fence, lang, first line)
    body: list[str] = []
    for no, raw in enumerate(path.read_text().splitlines(), start=1):
        if opened is None:
            m = _FENCE.match(raw)
            if m:
                opened = (len(m["indent"]), m["fence"], m["info"].lower(), no + 1)
                body = []
            continue
        indent, fence, lang, first = opened
        stripped = raw.strip()
        if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
            blocks.append(Block(doc, first, lang, tuple(body)))
            opened = None
            continue
        # Dedent by the fence's indent only: deeper indentation is the block's own.
        cut = len(raw) - len(raw.lstrip(" "))
        body.append(raw[min(indent, cut):])
    return blocks


def _block_commands(block: Block) -> list[Snippet]:
    out: list[Snippet] = []
    pending: list[str] = []
    start = 0
    for offset, raw in enumerate(block.lines):
        line = raw.strip()
        if not pending:
            if block.lang == "console":
                if not line.startswith(PROMPT):
                    continue  # output shown in the block
                line = line[len(PROMPT):].lstrip()
            elif line.startswith(PROMPT):
                line = line[len(PROMPT):].lstrip()
            if not line or line.startswith("#"):
                continue
            start = block.line + offset
        if line.endswith("\\"):
            pending.append(line[:-1].rstrip())
            continue
        pending.append(line)
        out.append(Snippet(block.doc, start, "sh", " ".join(p for p in pending if p)))
        pending = []
    if pending:  # a continuation at the end of the block: still one (broken) command
        out.append(Snippet(block.doc, start, "sh", " ".join(pending)))
    return out


def commands(path: Path, doc: str) -> list[Snippet]:
    """The command lines of ``path`` (see the module docstring), in document order."""
    return [c for b in fenced_blocks(path, doc) if b.lang in SHELL_LANGS for c in _block_commands(b)]


def python_examples(path: Path, doc: str) -> list[Snippet]:
    """The Python examples of ``path``: one snippet per ``python`` block, in document order."""
    return [Snippet(b.doc, b.line, "python", "\n".join(b.lines) + "\n")
            for b in fenced_blocks(path, doc) if b.lang in PYTHON_LANGS]


def split_comment(line: str) -> tuple[str, str]:
    """``line`` as the shell reads it: (the code, the trailing ``# comment`` or "").
    A ``#`` starts a comment at the start of a word, outside quotes."""
    quote = ""
    escaped = False
    for i, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i:]
    return line.rstrip(), ""


def leading_assignments(code: str) -> tuple[list[str], str]:
    """``VAR=value`` words before the command, and the rest of the line."""
    words = code.split(" ")
    n = 0
    while n < len(words) and (not words[n] or _ASSIGNMENT.match(words[n])):
        n += 1
    return [w for w in words[:n] if w], " ".join(words[n:]).strip()


def looks_like_command(line: str) -> bool:
    """Whether a line reads as something to type at a shell prompt."""
    text = line.strip()
    if text.startswith(PROMPT):
        return True
    _, rest = leading_assignments(split_comment(text)[0])
    word = rest.split(" ", 1)[0]
    return word in _COMMAND_WORDS or word.startswith(_COMMAND_PREFIXES)


def indented_commands(path: Path, doc: str) -> list[Snippet]:
    """Command lines shown in indented code blocks (four spaces after a blank line, outside
    any fence), which the runner would not run."""
    found: list[Snippet] = []
    in_fence = False
    in_block = False
    previous_blank = True
    for no, raw in enumerate(path.read_text().splitlines(), start=1):
        if _FENCE.match(raw):
            in_fence = not in_fence
            in_block, previous_blank = False, False
            continue
        if in_fence:
            continue
        blank = not raw.strip()
        if raw.startswith("    ") and not blank and (previous_blank or in_block):
            in_block = True
            if looks_like_command(raw):
                found.append(Snippet(doc, no, "sh", raw.strip()))
        elif not blank:
            in_block = False
        previous_blank = blank
    return found
