"""`zbk shell` as a command line: sub-commands with their own arguments, options in any
order, help with a usage line and an example that run as shown, suggestions for unknown
commands, usage errors with exit code 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers.shell import refused, shell, shell_json

from zbk.cli.shell import COMMANDS, arrange, build_parser, parse
from zbk.cli.shell import _arity as arity_of


@pytest.fixture(scope="module")
def arity() -> dict[str, int]:
    return arity_of(build_parser())


@pytest.mark.parametrize("argv, command, rest", [
    (["readentry", "--bookie", "B", "1", "2"], "readentry", ["1", "2", "--bookie", "B"]),
    (["--bookie", "B", "readentry", "1", "2"], "readentry", ["1", "2", "--bookie", "B"]),
    (["readentry", "1", "--bookie", "B", "2"], "readentry", ["1", "2", "--bookie", "B"]),
    (["--metadata", "U", "--json", "--entries", "300", "simpletest"], "simpletest",
     ["--metadata", "U", "--json", "--entries", "300"]),
    (["--metadata=U", "lostbookierecoverydelay", "-3"], "lostbookierecoverydelay", ["-3", "--metadata=U"]),
    (["--json", "lostbookierecoverydelay", "--metadata", "U", "45"], "lostbookierecoverydelay",
     ["45", "--json", "--metadata", "U"]),
    (["--metadata", "U"], None, ["--metadata", "U"]),
])
def test_arrange_puts_the_command_first_then_its_arguments_then_options(argv, command, rest, arity):
    assert arrange(argv, arity) == (command, rest)


def test_every_option_takes_the_same_number_of_values_in_every_command(arity):
    # _arity asserts it while building; these are the ones the scan before a command relies on
    assert arity["--metadata"] == 1 and arity["--json"] == 0 and arity["--bookie"] == 1 and arity["--force"] == 0


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_example_parses_into_that_command(name):
    example = COMMANDS[name].example.split()
    assert example[:2] == ["zbk", "shell"]
    args = parse(example[2:])
    assert args.shell_command == name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help_with_its_usage_and_an_example(name, capsys):
    with pytest.raises(SystemExit) as done:
        parse([name, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: zbk shell {name} "), text[:200]
    assert f"example:\n  {COMMANDS[name].example}" in text
    assert "--json" in text


def test_the_overview_lists_every_command_and_help_command_works():
    r = shell("--help")
    assert r.returncode == 0
    for name in COMMANDS:
        assert re.search(rf"^  {name}\s", r.stdout, re.M), name
    r = shell("help", "readentry")
    assert r.returncode == 0 and r.stdout.startswith("usage: zbk shell readentry --bookie B LID EID")
    refused(shell("help", "readentri"), 2, "did you mean readentry")
    assert shell("help").returncode == 0
    refused(shell(), 2, "a command is required")
    refused(shell("--json"), 2, "a command is required")


def test_unknown_commands_suggest_the_nearest(tmp_path: Path):
    refused(shell("readentyr", "--bookie", "127.0.0.1:1", "1", "2"), 2, "unknown command 'readentyr'",
            "did you mean readentry")
    refused(shell("--metadata", f"sqlite:///{tmp_path}/m.db", "listledger"), 2, "did you mean listledgers")
    refused(shell("frobnicate"), 2, "unknown command 'frobnicate'", "zbk shell --help")


@pytest.mark.parametrize("argv, words", [
    (["readentry", "--bookie", "127.0.0.1:1", "1"], ["zbk shell readentry: error", "required: EID"]),
    (["readentry", "1", "2"], ["required: --bookie"]),
    (["readentry", "--bookie", "127.0.0.1:1", "1", "-2"], ["EID", "an entry id is >= 0"]),
    (["ledgerentries", "--bookie", "127.0.0.1:1", "x"], ["LID", "expected a number, got 'x'"]),
    (["listbookies"], ["required: --metadata"]),
    (["listledgers", "--metadata", "sqlite:///tmp/x.db", "--meta", "novalue"], ["expected KEY=VALUE"]),
    (["listledgers", "--metadata", "sqlite:///tmp/x.db", "--bogus"], ["unrecognized arguments: --bogus"]),
    (["ledgermetadata", "1", "--metadata", "sqlite:///tmp/x.db", "--dump", "a", "--restore", "b"],
     ["not allowed with argument"]),
    (["cookie", "eat", "127.0.0.1:1", "--metadata", "sqlite:///tmp/x.db"], ["invalid choice: 'eat'"]),
    (["lostbookierecoverydelay", "-3", "--metadata", "sqlite:///tmp/x.db"], ["must be >= 0"]),
    (["simpletest", "--metadata", "sqlite:///tmp/x.db", "--ensemble", "0"], ["expected a number >= 1"]),
    (["localconsistencycheck"], ["required: --data-dir"]),
    (["bookieformat", "--data-dir", "/tmp"], ["required: --metadata"]),
])
def test_wrong_arguments_exit_2_with_the_commands_usage_and_a_message(argv, words):
    r = shell(*argv)
    refused(r, 2, *words)
    assert r.stderr.startswith(f"usage: zbk shell {argv[0]} "), r.stderr


def test_readentry_and_ledgerentries_work_exactly_as_their_help_shows(bookies):
    import zbk

    bks = [bookies(f"b{i}").start() for i in range(3)]
    with zbk.BookKeeper(bookies.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 3, password=b"pw")  # AQ3: every bookie has every entry at the close
        for i in range(10):
            lh.append(b"entry-%d" % i)
        lid = lh.ledger_id
        lh.close()
    b = bks[0].bookie_id

    def usage_of(name: str) -> list[str]:
        first = shell(name, "--help").stdout.splitlines()[0]
        assert first.startswith("usage: ")
        return first[len("usage: "):].removesuffix(" [options]").split()

    values = {"B": b, "LID": str(lid), "EID": "7"}
    line = [values.get(word, word) for word in usage_of("readentry")]
    assert line[:3] == ["zbk", "shell", "readentry"]
    got = shell_json(*line[2:])
    assert got["status"] == "EOK" and got["entry_id"] == 7 and got["ledger_id"] == lid
    r = shell(*line[2:])  # the table for people: the same record, indented
    assert r.returncode == 0 and '"status": "EOK"' in r.stdout

    line = [values.get(word, word) for word in usage_of("ledgerentries")]
    assert line[:3] == ["zbk", "shell", "ledgerentries"]
    assert shell_json(*line[2:])["ranges"] == [[0, 9]]
    r = shell(*line[2:])
    assert r.returncode == 0 and r.stdout.strip() == "EOK: 0-9"

    # The examples the help shows, with this cluster's bookie and ledger.
    for name in ("readentry", "ledgerentries"):
        example = COMMANDS[name].example.replace("127.0.0.1:3181", b).replace(" 42", f" {lid}").split()
        assert shell(*example[2:]).returncode == 0, example

    # Options anywhere: before the command, between its arguments, after them.
    for argv in (["--json", "--bookie", b, "readentry", str(lid), "3"],
                 ["readentry", str(lid), "--bookie", b, "3", "--json"],
                 ["--metadata", bookies.metadata_uri, "readentry", "--json", str(lid), "3", "--bookie", b]):
        r = shell(*argv)
        assert r.returncode == 0, (argv, r.stderr)
    # An entry the bookie does not hold: the answer, and exit code 1.
    assert shell_json("readentry", "--bookie", b, str(lid), "99", code=1)["status"] == "ENOENTRY"
    # A bookie nobody listens on: exit code 3, one line.
    refused(shell("readentry", "--bookie", "127.0.0.1:1", str(lid), "0", "--timeout", "0.5"), 3,
            "zbk shell readentry:")


def test_a_progress_bar_is_drawn_on_a_terminal_only(bookies, tmp_path: Path):
    """simpletest writes with a bar on stderr when stderr is a terminal; never into a pipe."""
    import os
    import pty
    import subprocess
    import sys

    for i in range(3):
        bookies(f"b{i}").start()
    argv = [sys.executable, "-m", "zbk.cli.main", "shell", "simpletest", "--metadata", bookies.metadata_uri,
            "--entries", "200"]
    piped = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and "writing [" not in piped.stderr
    leader, follower = pty.openpty()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=follower, text=True)
    try:
        os.close(follower)
        out, _ = p.communicate(timeout=120)
        chunks = []
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the terminal's other end closed: everything was read
                break
            if not data:
                break
            chunks.append(data)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        os.close(leader)
    assert p.returncode == 0 and "simpletest OK" in out
    drawn = b"".join(chunks).decode(errors="replace")
    assert "writing [" in drawn and "200/200" in drawn, drawn[-300:]
