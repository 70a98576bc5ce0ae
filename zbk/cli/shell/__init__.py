"""`zbk shell`: admin commands (API.md "Command line"), one sub-command each.

``zbk shell [OPTIONS] COMMAND [ARGS] [OPTIONS]``: every command has its own arguments and
options, ``--help`` with an example, and ``--json``. Options may come anywhere, before the
command or after it, before its arguments or after them: the command line is rearranged
(:func:`arrange`) into ``COMMAND ARGS OPTIONS`` before the command's own parser reads it.
That is the order argparse reads without surprises (it binds an optional positional to
nothing when an option comes first, and cannot take options before a sub-command that
does not know them). An unknown command gets the nearest names as a suggestion.

Exit codes (zbk/errors.py): 0 ok, 1 operation failed, 2 usage error, 3 cannot reach the
metadata or a bookie. Expected failures print one line, never a traceback.

The commands live in the modules of this package by what they touch: cluster metadata
(``metadata``, ``ledgermeta``, ``cluster``), auto-recovery (``recovery``), the client
(``client``), one bookie over the wire (``bookie``), a stopped bookie's files (``offline``,
``checks``).
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from typing import Any, NoReturn

from zbk.cli.shell import bookie, checks, client, cluster, ledgermeta, metadata, offline, recovery
from zbk.cli.shell.common import COMMANDS, GROUPS, Command
from zbk.errors import EXIT_UNREACHABLE, EXIT_USAGE, ZbkError

__all__ = ["add_parser", "arrange", "build_parser", "main", "COMMANDS"]
_MODULES = (bookie, checks, client, cluster, ledgermeta, metadata, offline, recovery)  # each registers its commands

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_HELP = ("-h", "--help")
PROG = "zbk shell"


class ShellUsageError(Exception):
    """A command line the shell cannot even route to a command (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one usage line and the reason, exit code 2
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _common_options(p: argparse.ArgumentParser, cmd: Command) -> None:
    g = p.add_argument_group("options every command takes")
    needs_metadata = cmd.needs in ("metadata", "both")
    g.add_argument("--metadata", metavar="URI", required=needs_metadata,
                   help="metadata URI: sqlite:///path/meta.db or etcd://host:port/scope"
                        + ("" if needs_metadata else " (not used by this command)"))
    g.add_argument("--json", action="store_true", help="machine-readable output: one line of JSON")
    g.add_argument("--timeout", type=float, default=10.0, metavar="S", help="seconds to wait for a bookie (10)")
    g.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="client setting (ClientConfig names), e.g. curve_secret_key_file=PATH "
                        "curve_server_public_key_file=PATH for bookies that require CURVE")
    if cmd.needs in ("data_dir", "both"):
        p.add_argument("--data-dir", metavar="DIR", required=True,
                       help="the bookie's data directory (journal/, ledgers/, index/ below it); the bookie must be stopped")


def command_parser(cmd: Command) -> argparse.ArgumentParser:
    p = _Parser(prog=f"{PROG} {cmd.name}", usage=f"{PROG} {cmd.name} {cmd.usage}".rstrip() + " [options]",
                description=cmd.summary, epilog=f"example:\n  {cmd.example}",
                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    if cmd.configure is not None:
        cmd.configure(p)
    _common_options(p, cmd)
    p.set_defaults(shell_command=cmd.name)
    return p


def build_parser() -> dict[str, argparse.ArgumentParser]:
    """One parser per command, by name."""
    return {name: command_parser(cmd) for name, cmd in COMMANDS.items()}


def _arity(parsers: dict[str, argparse.ArgumentParser]) -> dict[str, int]:
    """How many values each option string takes, over every command (an option means the
    same in every command that has it, so one table serves the scan before the command)."""
    table: dict[str, int] = {}
    for p in parsers.values():
        # argparse keeps the option table private but has for decades; reading it keeps the
        # arity in one place, the add_argument calls.
        for opt, action in p._option_string_actions.items():
            nargs = action.nargs
            assert nargs is None or isinstance(nargs, int), (opt, nargs)  # no optional-valued options
            n = 1 if nargs is None else nargs
            assert table.setdefault(opt, n) == n, f"{opt} takes {n} values in one command, {table[opt]} in another"
    return table


def _is_option(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not _NEGATIVE_NUMBER.match(token)


def _split(tokens: list[str], arity: dict[str, int]) -> tuple[list[str], list[str]]:
    """(arguments, options with their values) of ``tokens``; after ``--`` all are arguments."""
    args: list[str] = []
    opts: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--":
            args.extend(tokens[i:])
            break
        if _is_option(tok):
            n = 0 if "=" in tok else arity.get(tok, 0)  # unknown options: the parser reports them
            opts.extend(tokens[i:i + 1 + n])
            i += 1 + n
        else:
            args.append(tok)
            i += 1
    return args, opts


def arrange(argv: list[str], arity: dict[str, int]) -> tuple[str | None, list[str]]:
    """(command, ``ARGS OPTIONS``) of a shell command line given in any order; the command is
    the first word that is not an option or an option's value (None when there is none)."""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            break
        if not _is_option(tok):
            args, opts = _split(argv[:i] + argv[i + 1:], arity)
            return tok, args + opts
        i += 1 + (0 if "=" in tok else arity.get(tok, 0))
    return None, argv


def overview() -> str:
    lines = [f"usage: {PROG} COMMAND [ARGS] [OPTIONS]   (options before or after the command)", "",
             "admin commands; `zbk shell COMMAND --help` shows a command's arguments, options and an example", ""]
    for group in GROUPS:
        lines.append(f"{group}:")
        lines.extend(f"  {c.name:<24}{c.summary}" for c in sorted(COMMANDS.values(), key=lambda c: c.name)
                     if c.group == group)
        lines.append("")
    lines.append("exit codes: 0 ok, 1 operation failed, 2 usage error, 3 cannot reach the metadata or a bookie")
    return "\n".join(lines)


def suggest(word: str) -> str:
    close = difflib.get_close_matches(word, list(COMMANDS), n=3, cutoff=0.6)
    if not close:
        return f"{PROG}: unknown command {word!r} (`{PROG} --help` lists the commands)"
    return f"{PROG}: unknown command {word!r}; did you mean {' or '.join(close)}?"


def parse(argv: list[str]) -> argparse.Namespace:
    """The namespace of one shell command line; prints help and exits for help requests,
    exits with code 2 on a usage error (as argparse does)."""
    parsers = build_parser()
    name, rest = arrange(argv, _arity(parsers))
    if name == "help":  # BookKeeper's `shell help [COMMAND]`; an unknown COMMAND gets suggestions below
        name, rest = (rest[0], ["--help"]) if rest and not _is_option(rest[0]) else (None, ["--help"])
    if name is None:
        if any(t in _HELP for t in rest):
            print(overview())
            sys.exit(0)
        print(overview(), file=sys.stderr)
        print(f"\n{PROG}: error: a command is required", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    if name not in parsers:
        print(suggest(name), file=sys.stderr)
        sys.exit(EXIT_USAGE)
    return parsers[name].parse_args(rest)


def main(argv: list[str]) -> int:
    args = parse(argv)
    name = args.shell_command
    try:
        result = COMMANDS[name].run(args)
    except ZbkError as e:
        print(f"{PROG} {name}: {e.code}: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        print(f"{PROG} {name}: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    return int(result or 0)


def _run(args: argparse.Namespace) -> int:
    return main(list(args.shell_argv))


def add_parser(sub: Any) -> None:
    """``zbk shell``: the rest of the command line goes to :func:`main` untouched. The
    sub-parser treats no word as an option (``prefix_chars`` a NUL, which no argument can
    hold), so options before the command reach the shell's own parsers instead of failing
    in the ``zbk`` parser."""
    p = sub.add_parser("shell", help="admin commands (zbk shell --help lists them)", prefix_chars="\0",
                       add_help=False)
    p.add_argument("shell_argv", nargs=argparse.REMAINDER, metavar="COMMAND ...")
    p.set_defaults(func=_run)
