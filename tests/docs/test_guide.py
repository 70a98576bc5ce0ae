"""The guide pages (docs/guide/) stay true to the code they describe: their examples run
(test_doc_commands.py runs them against the sandbox each page starts), and the facts they
state in tables are those of the code: the settings' defaults, and every error class with
its code, exit code and HTTP status."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import zbk.errors
from docs.markdown import commands, python_examples
from docs.test_doc_commands import DOCS, GUIDE, PYTHON_DOCS, REPO
from zbk.config import ClientConfig

ERRORS_PAGE = REPO / "docs" / "guide" / "errors.md"
CLIENT_PAGE = REPO / "docs" / "guide" / "client.md"
_ROW = re.compile(r"^\|(.*)\|\s*$")


def error_classes() -> dict[str, type[zbk.errors.ZbkError]]:
    return {name: cls for name, cls in vars(zbk.errors).items()
            if inspect.isclass(cls) and issubclass(cls, zbk.errors.ZbkError)}


def table_rows(path: Path, header: str) -> list[list[str]]:
    """The rows of the first table after the Markdown heading ``header``, without its header
    row, each cell without backticks and surrounding spaces."""
    lines = path.read_text().splitlines()
    start = lines.index(header)
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        m = _ROW.match(line)
        if m is None:
            if rows:
                break
            continue
        cells = [c.replace("`", "").strip() for c in m[1].split("|")]
        if set("".join(cells)) <= set("-: "):
            continue  # the separator row
        rows.append(cells)
    assert rows, f"{path.name}: no table after {header!r}"
    return rows[1:]  # without the header row


def test_every_guide_page_runs_its_examples_against_its_own_sandbox() -> None:
    assert {"docs/guide/getting-started.md", "docs/guide/client.md", "docs/guide/errors.md"} <= set(GUIDE)
    for doc in GUIDE:
        assert doc in DOCS and doc in PYTHON_DOCS, doc
        examples = python_examples(REPO / doc, doc)
        assert examples, f"{doc}: no Python example"
        sandbox = [c for c in commands(REPO / doc, doc) if "zbk sandbox" in c.text]
        assert sandbox and sandbox[0].line < examples[0].line, f"{doc}: no sandbox started before its first example"


def test_the_error_codes_table_is_that_of_zbk_errors() -> None:
    rows = table_rows(ERRORS_PAGE, "## Codes, exit codes and HTTP statuses")
    shown = {name: (code, int(exit_code), int(http)) for name, code, exit_code, http in rows}
    actual = {name: (cls.code, cls.exit_code, cls.http_status) for name, cls in error_classes().items()}
    assert shown == actual


def test_the_errors_page_names_every_error_and_no_other() -> None:
    text = ERRORS_PAGE.read_text()
    named = set(re.findall(r"`([A-Z][A-Za-z]*Error)`", text))
    classes = set(error_classes())
    assert named - classes == set(), "names that are no class of zbk.errors"
    # Each class is in the table of what calls raise, or in the list of those no call raises.
    raised = {row[0] for row in table_rows(ERRORS_PAGE, "## What each call can raise")}
    raised = {name.removesuffix(" itself") for name in raised}
    section = text[text.index("## Errors no client call raises"):text.index("## Codes, exit codes")]
    items = section.split("\n- ")[1:]  # each list item, its continuation lines included
    not_raised = {name for item in items for name in re.findall(r"`([A-Z][A-Za-z]*Error)`", item.split(": ", 1)[0])}
    assert raised & not_raised == set(), "classes placed both among the raised and the not raised"
    assert classes - raised - not_raised == set(), "classes the page does not place"


def test_the_settings_table_of_the_client_guide_shows_the_defaults() -> None:
    rows = table_rows(CLIENT_PAGE, "## When a call fails: timeouts and what is known")
    defaults = {f.name: f.default for f in dataclasses.fields(ClientConfig)}
    assert rows
    for field, default, *_ in rows:
        assert field in defaults, f"{field} is no ClientConfig field"
        assert int(default) == defaults[field], field
