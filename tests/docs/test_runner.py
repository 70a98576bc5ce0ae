"""The docs runner itself: what it takes from a page, and that it reports what fails (a
broken command planted in a copy of a real page, a failing example, a service that never
gets ready, a hang, a variable no code reads, stale table entries)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from docs.markdown import Snippet, commands, indented_commands, python_examples, split_comment
from docs.runner import DocRunner, Override, Policy, Workspace
from docs.test_doc_commands import POLICY, REPO

PAGE = """\
# A page

Prose naming `zbk shell --metadata URI listbookies` inline: not a command.

```sh
# a comment line
$ zbk --help
zbk shell \\
  --help        # one command over two lines
```

1. In a list:

   ```bash
   echo listed
   ```

```console
$ echo shown
shown
```

```toml
key = "a file, not a command"
```

    zbk --version

```python
print("example")
```
"""


def plant(tmp_path: Path, text: str, name: str = "page.md") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def run(tmp_path: Path, snippets: list[Snippet], policy: Policy = POLICY) -> list:
    return DocRunner(Workspace(REPO, tmp_path / "ws"), policy).run(snippets)


def test_what_counts_as_a_command_line(tmp_path: Path) -> None:
    page = plant(tmp_path, PAGE)
    found = [(s.line, s.text) for s in commands(page, "page.md")]
    assert found == [(7, "zbk --help"), (8, "zbk shell --help        # one command over two lines"),
                     (15, "echo listed"), (19, "echo shown")]
    assert [(s.line, s.text) for s in python_examples(page, "page.md")] == [(30, 'print("example")\n')]
    assert [(s.line, s.text) for s in indented_commands(page, "page.md")] == [(27, "zbk --version")]


def test_comments_end_where_the_shell_ends_them() -> None:
    assert split_comment("zbk bench --seconds 10   # short") == ("zbk bench --seconds 10", "# short")
    assert split_comment("echo '# not' \"# not\" a#b") == ("echo '# not' \"# not\" a#b", "")
    assert split_comment(r"echo \# not") == (r"echo \# not", "")


def test_a_broken_command_planted_in_a_copy_of_a_page_is_reported(tmp_path: Path) -> None:
    copy = tmp_path / "docs" / "reliability.md"
    copy.parent.mkdir()
    shutil.copy(REPO / "docs" / "reliability.md", copy)
    good = "mkdir -p /etc/zbk/authorized\n"
    text = copy.read_text()
    assert text.count(good) == 1
    copy.write_text(text.replace(good, good + "zbk keygen --dir /etc/zbk/keys\n"))  # --name missing
    planted = next(s for s in commands(copy, "docs/reliability.md") if s.text == "zbk keygen --dir /etc/zbk/keys")

    outcomes = run(tmp_path, commands(copy, "docs/reliability.md"))
    failed = [o for o in outcomes if not o.ok]
    assert [o.snippet for o in failed] == [planted]
    assert "exit code 2" in failed[0].detail and "--name" in failed[0].detail
    assert failed[0].describe().startswith(f"docs/reliability.md:{planted.line} FAILED")
    assert len(outcomes) > 1 and all(o.ok for o in outcomes if o is not failed[0])


def test_a_failing_python_example_is_reported(tmp_path: Path) -> None:
    page = plant(tmp_path, "```python\nprint('fine')\n```\n\n```python\nimport sys\nsys.exit(3)\n```\n")
    outcomes = run(tmp_path, python_examples(page, "page.md"))
    assert [o.ok for o in outcomes] == [True, False]
    assert "exit code 3" in outcomes[1].detail


def test_a_service_that_never_gets_ready_is_reported(tmp_path: Path) -> None:
    page = plant(tmp_path, "```sh\nzbk bookie --config no-such.toml\n```\n")
    [outcome] = run(tmp_path, commands(page, "page.md"))
    assert not outcome.ok
    assert "zbk bookie not ready" in outcome.detail and "no-such.toml" in outcome.detail


def test_a_command_that_hangs_is_stopped_and_reported(tmp_path: Path) -> None:
    page = plant(tmp_path, "```sh\nsleep 60\n```\n")
    t0 = time.monotonic()
    [outcome] = run(tmp_path, commands(page, "page.md"), Policy(timeout_s=1.0))
    assert not outcome.ok and "timed out after 1 s" in outcome.detail
    assert time.monotonic() - t0 < 30


def test_a_variable_that_no_code_reads_is_reported(tmp_path: Path) -> None:
    page = plant(tmp_path, "```sh\nZBK_SEED=1 true\nZBK_NO_SUCH_SETTING=1 true\n```\n")
    outcomes = run(tmp_path, commands(page, "page.md"))
    assert [o.ok for o in outcomes] == [True, False]
    assert "ZBK_NO_SUCH_SETTING, which no code reads" in outcomes[1].detail


def test_overrides_substitutions_and_fixtures_apply(tmp_path: Path) -> None:
    page = plant(tmp_path, "```sh\ntest -f /etc/app/conf && grep -q 7 /etc/app/conf   # a comment\n"
                           "echo --seconds 10 > out.txt\n```\n")
    policy = Policy(overrides=(Override("page.md", r"--seconds 10\b", "--seconds 1", "short"),),
                    substitutions=(("/etc/app/", "@ROOT@/etc/"),), fixtures={"page.md": {"etc/conf": "7\n"}})
    outcomes = run(tmp_path, commands(page, "page.md"), policy)
    assert all(o.ok for o in outcomes), [o.describe() for o in outcomes]
    assert (tmp_path / "ws" / "out.txt").read_text() == "--seconds 1\n"


def test_stale_table_entries_are_found(tmp_path: Path) -> None:
    page = plant(tmp_path, "```sh\necho a --seconds 10\necho b\n```\n")
    snippets = commands(page, "page.md")
    policy = Policy(exempt={("page.md", "echo b"): "used", ("page.md", "echo gone"): "stale"},
                    overrides=(Override("page.md", r"--seconds 10", "--seconds 1", "used"),
                               Override("page.md", r"--minutes 30", "--minutes 1", "stale"),
                               Override("other.md", r"--seconds 10", "--seconds 1", "other page")))
    assert policy.unused(snippets) == ["exempt page.md: 'echo gone'", "override page.md: '--minutes 30'",
                                       "override other.md: '--seconds 10'"]


def test_a_sandbox_is_kept_for_the_commands_after_it_at_its_default_addresses(tmp_path: Path) -> None:
    page = plant(tmp_path, "```sh\nzbk sandbox --base-port 0 --bookies 3\n"
                           "curl -sf http://127.0.0.1:4183/heartbeat\n"
                           "zbk shell --metadata sqlite:///$PWD/zbk-sandbox/meta.db bookieinfo 127.0.0.1:3182\n"
                           "curl -sf http://127.0.0.1:5181/heartbeat\n```\n")
    outcomes = run(tmp_path, commands(page, "page.md"))
    assert all(o.ok for o in outcomes), "\n".join(o.describe() for o in outcomes)
    assert [o.snippet.line for o in outcomes] == [2, 3, 4, 5, 2]  # the sandbox's stop comes last
    assert "kept for the commands after it" in outcomes[0].detail
    assert "stopped with SIGINT: clean" in outcomes[-1].detail
    assert "127.0.0.1:4183" not in outcomes[1].ran  # mapped to the port that bookie really has


def test_a_long_running_command_is_started_checked_and_stopped(tmp_path: Path) -> None:
    page = plant(tmp_path, "```sh\nzbk autorecovery --metadata sqlite:///$PWD/meta.db --http-port @FREE_PORT@\n```\n")
    [outcome] = run(tmp_path, commands(page, "page.md"))
    assert outcome.ok, outcome.describe()
    assert "zbk autorecovery started, ready" in outcome.detail and "stopped cleanly" in outcome.detail
