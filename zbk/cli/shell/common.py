"""What every `zbk shell` command shares: the command registry, output (tables for people,
JSON for scripts), the progress bar, and the ways to reach the cluster and a bookie.

A command is a function ``run(args) -> exit code | None`` registered with :func:`command`,
which also names its arguments (``configure``), a one-line summary, its usage line and an
example. The parser (zbk/cli/shell/__init__.py) builds one sub-parser per command from
that; the usage line and example are what ``zbk shell COMMAND --help`` shows, so they must
work as written (tests/ops/test_shell_cli.py parses every example and runs the usage lines
and examples of readentry and ledgerentries against real bookies).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from zbk import limits
from zbk.errors import BadRequestError

Handler = Callable[[argparse.Namespace], "int | None"]
Configure = Callable[[argparse.ArgumentParser], None]
# What a command needs: "metadata" makes --metadata required; "data_dir" adds a required
# --data-dir; "bookie" commands talk to one bookie, found through its registration when
# --metadata is given (a bookie with a name id needs it), else at its id (host:port).
Needs = Literal["metadata", "data_dir", "both", "bookie"]


@dataclass(frozen=True)
class Command:
    name: str
    group: str  # the heading it is listed under in `zbk shell --help`
    summary: str
    usage: str  # after "zbk shell NAME"; the options every command takes are added by the parser
    example: str  # a full command line
    needs: Needs
    run: Handler
    configure: Configure | None


COMMANDS: dict[str, Command] = {}
GROUPS = ("cluster metadata", "auto-recovery", "through the client", "one bookie", "offline (a stopped bookie)")


def command(name: str, *, group: str, summary: str, usage: str, example: str, needs: Needs,
            configure: Configure | None = None) -> Callable[[Handler], Handler]:
    assert group in GROUPS, group
    assert example.startswith("zbk shell ") and f" {name}" in example, (name, example)

    def deco(fn: Handler) -> Handler:
        assert name not in COMMANDS, name
        COMMANDS[name] = Command(name, group, summary, usage, example, needs, fn, configure)
        return fn
    return deco


# -- reaching the cluster --------------------------------------------------------------------
def uri(args: argparse.Namespace) -> str:
    if not args.metadata:  # the parser requires it for "metadata" commands; a guard for the rest
        raise BadRequestError(f"{args.shell_command} needs --metadata URI")
    return str(args.metadata)


def open_metadata(args: argparse.Namespace) -> Any:
    from zbk.metadata.uri import open_store

    return open_store(uri(args))


def client_config(args: argparse.Namespace) -> Any:
    """The ClientConfig of ``--set key=value`` (e.g. the CURVE keys for bookies that need them)."""
    from zbk.config import ClientConfig, load

    return load(ClientConfig, overrides=args.set).validate()


def connect(args: argparse.Namespace, bookie: str) -> Any:
    """A raw connection to one bookie, with this shell's CURVE keys if any: at the address
    its registration records when --metadata is given (zbk/metadata/resolver.py), else at
    its id, which must then be host:port."""
    from zbk.bookieid import is_address
    from zbk.client.raw import BookieConnection
    from zbk.wire.curve import CurveClient

    address = bookie
    if args.metadata:
        from zbk.metadata.resolver import resolve

        store = open_metadata(args)
        try:
            address = resolve(store, bookie)
        finally:
            store.close()
    elif not is_address(bookie):
        raise BadRequestError(f"bookie {bookie} is a name, not host:port: give --metadata URI to find its address")
    return BookieConnection(bookie, timeout_s=args.timeout, curve=CurveClient.from_config(client_config(args)),
                            address=address)


# -- output --------------------------------------------------------------------------------------
def out(args: argparse.Namespace, data: Any, table: Callable[[Any], str] | None = None) -> None:
    """``data`` as one line of JSON with --json; otherwise ``table(data)``, or indented JSON
    for records that read well as they are."""
    if args.json or table is None:
        print(json.dumps(data, indent=None if args.json else 2, default=jsonable))
    else:
        print(table(data))


def jsonable(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        try:
            return b.decode()
        except UnicodeDecodeError:
            return b.hex()
    if isinstance(v, tuple):
        return list(v)
    raise TypeError(type(v).__name__)


def rows(headers: list[str], body: list[list[Any]]) -> str:
    """An aligned text table with a rule under the headers."""
    cells = [headers] + [[str(c) for c in r] for r in body]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


class Progress:
    """A progress bar on stderr for long work: only when stderr is a terminal and the output
    is not --json, so that logs and pipes never fill with carriage returns. Without a known
    total it counts. Redraws at most every ``_REDRAW_S`` seconds (a bar is for people)."""

    _REDRAW_S = 0.1
    _WIDTH = 30

    def __init__(self, args: argparse.Namespace, what: str, total: int | None = None,
                 stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = not args.json and self.stream.isatty()
        self.what = what
        self.total = total
        self._drawn = 0.0
        self._shown = False

    def update(self, done: int, total: int | None = None, what: str | None = None) -> None:
        """``done`` of ``total`` (None: the total given before); a new ``what`` starts a new line."""
        if not self.enabled:
            return
        if what is not None and what != self.what:
            self.close()
            self.what = what
            self._drawn = 0.0
        if total is not None:
            self.total = total
        now = time.monotonic()
        finished = self.total is not None and done >= self.total
        if not finished and now - self._drawn < self._REDRAW_S:
            return
        self._drawn = now
        self._shown = True
        if self.total:
            filled = min(self._WIDTH, int(self._WIDTH * done / self.total))
            text = f"{self.what} [{'#' * filled}{'.' * (self._WIDTH - filled)}] {done}/{self.total}"
        else:
            text = f"{self.what}: {done}"
        print(f"\r{text}", end="", file=self.stream, flush=True)

    def close(self) -> None:
        """End the bar's line (the next output starts on a fresh line)."""
        if self._shown:
            print(file=self.stream, flush=True)
            self._shown = False


# -- argument types (argparse turns their ValueError/ArgumentTypeError into a usage error) --
def ledger_id(s: str) -> int:
    value = number(s)
    if not 0 <= value <= limits.ledger_id_max:
        raise argparse.ArgumentTypeError(f"a ledger id is 0..{limits.ledger_id_max}, got {s}")
    return value


def entry_id(s: str) -> int:
    value = number(s)
    if value < 0:
        raise argparse.ArgumentTypeError(f"an entry id is >= 0, got {s}")
    return value


def count(s: str) -> int:
    value = number(s)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a count >= 0, got {s}")
    return value


def number(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None


def key_value(s: str) -> tuple[str, str]:
    key, eq, value = s.partition("=")
    if not eq or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {s!r}")
    return key, value
