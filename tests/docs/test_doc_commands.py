"""Every command line shown in README.md, docs/*.md and docs/guide/*.md runs, and so do
the Python examples of README.md and of the guide pages (tests/docs/markdown.py says what a
command line is; runner.py how they run).

One test per document: its commands and examples run in order in one workspace, against
the cluster its own commands start (README's and each guide page's ``zbk sandbox`` stays up
for the commands and examples after it). What cannot run as written is handled by the
tables below, each entry with its reason; an entry that no longer matches any command fails
``test_every_table_entry_is_used``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from docs.markdown import Snippet, commands, indented_commands, python_examples
from docs.runner import DocRunner, Override, Policy, Workspace, report

REPO = Path(__file__).resolve().parents[2]
GUIDE = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "guide").glob("*.md"))
DOCS = ["README.md", *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")), *GUIDE]
# Documents whose Python examples run too (the others' examples are fragments for now).
PYTHON_DOCS = frozenset({"README.md", *GUIDE})

# Commands that cannot run inside the suite, by document and exact text.
EXEMPT: dict[tuple[str, str], str] = {
    ("README.md", "bash .ci/run"):
        "the whole test suite, this test included; CI runs exactly this command",
    ("README.md", "bash scripts/docs.sh serve"):
        "serves the site until stopped; the next command, bash scripts/docs.sh, runs the same "
        "strict build, and tests/docs/test_site.py checks what it builds",
}

OVERRIDES: tuple[Override, ...] = (
    Override("README.md", r"^bash scripts/demo\.sh$", r"\g<0> --entries 2000",
             "extra arguments go to the workload (zbk/demo.py): 2,000 entries instead of 20,000",
             timeout_s=240.0),
    Override("README.md", r"zbk sandbox --data-dir \./zbk-sandbox$", r"\g<0> --base-port 0",
             "its default ports (3181-3183, 4181-4183, 5181) may be in use by another test on this "
             "machine; --base-port 0 picks free ones, and the commands after it find the cluster "
             "through its metadata as they would on the default ports"),
    Override("README.md", r"--seconds 10\b", "--seconds 1", "the shortest bench run"),
    *(Override(doc, r"zbk sandbox --data-dir \./zbk-sandbox$", r"\g<0> --base-port 0",
               "as README's sandbox: free ports instead of the default ones, which another test may hold; "
               "the page's examples find the cluster through its metadata")
      for doc in ("docs/guide/getting-started.md", "docs/guide/client.md", "docs/guide/errors.md")),
    Override("docs/chaos.md", r"--minutes 30 --settle 600\b", "--minutes 0.75 --settle 120 --dir @ROOT@/chaos",
             "45 s of faults, the shortest run whose plan injects every kind of fault (tests/chaos "
             "checks the plans of 45 s), then the same healing and checks, with the CI test's "
             "bound on the settle (a 45-second run needs no two passes of a 30-minute run's "
             "periodic check); its few hundred MB in the workspace rather than in a new "
             "directory under /tmp",
             timeout_s=420.0),
    Override("*", r"^(?!.*\bZBK_SCHEDULES=1\b).*\.venv/bin/pytest\s.*$", r"\g<0> --collect-only -q",
             "the suite runs these tests in full already (the chaos run alone takes 4 minutes): "
             "collected here, which checks the paths and selections (pytest fails when nothing is "
             "selected), and the runner checks that every ZBK_* variable the line sets is read by "
             "the code; a one-schedule line is cheap and runs for real"),
    Override("docs/reliability.md", r"bench/stall\.py --rounds 6\b", "bench/stall.py --rounds 1",
             "one round of each fault instead of five: the bench's whole path, in a fifth of the time"),
    Override("docs/operations.md", r"^prometheus --config\.file=prometheus/prometheus\.yml$",
             r"\g<0> --web.listen-address=127.0.0.1:@FREE_PORT@ --storage.tsdb.path=@ROOT@/prometheus-data",
             "Prometheus listens on every interface (port 9090) and writes ./data by default; here "
             "on a free loopback port, its data in the workspace"),
)

# Placeholders and production paths of the docs, pointed into the workspace.
SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    ("/path/to/zbk-sandbox", "@ROOT@/zbk-sandbox"),  # the sandbox the document's commands started
    ("/etc/zbk/", "@ROOT@/etc/zbk/"),  # key and config directories of a production host
)

# Files the commands name as given. operations.md's bookie.toml is its "Deploy" example with
# loopback addresses, free ports, embedded metadata and its directories in the workspace.
FIXTURES: dict[str, dict[str, str]] = {
    "docs/operations.md": {"bookie.toml": """\
metadata_uri = "sqlite:///@ROOT@/meta.db"
bind_address = "127.0.0.1"
port = @FREE_PORT@
data_dir = "@ROOT@/bookie-data"
rack = "rack-a"

[http]
port = @FREE_PORT@
bind_address = "127.0.0.1"
"""},
}

POLICY = Policy(exempt=EXEMPT, overrides=OVERRIDES, substitutions=SUBSTITUTIONS, fixtures=FIXTURES)


def snippets(doc: str) -> list[Snippet]:
    found = commands(REPO / doc, doc)
    if doc in PYTHON_DOCS:
        found += python_examples(REPO / doc, doc)
    return sorted(found, key=lambda s: s.line)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("doc", DOCS)
def test_doc_commands_run(doc: str, tmp_path: Path) -> None:
    outcomes = DocRunner(Workspace(REPO, tmp_path), POLICY).run(snippets(doc))
    print(f"\n{doc}:\n" + report(outcomes, keep=lambda _o: True))
    assert all(o.ok for o in outcomes), f"{doc}: commands that failed:\n{report(outcomes)}"


def test_every_table_entry_is_used() -> None:
    every = [s for doc in DOCS for s in snippets(doc)]
    assert POLICY.unused(every) == []
    docs_named = {doc for doc, _ in EXEMPT} | {o.doc for o in OVERRIDES} | set(FIXTURES)
    assert docs_named - {"*"} <= set(DOCS)


def test_no_command_hides_in_an_indented_block() -> None:
    """An indented code block is not run: a command line shown in one escapes this test.
    Fence it as ```sh instead."""
    hidden = [s for doc in DOCS for s in indented_commands(REPO / doc, doc)]
    assert hidden == [], "\n".join(f"{s.where()}: {s.text}" for s in hidden)
