"""No work log in the package or its docs: zbk/, docs/ and README.md say what is and why,
never when or in which sitting it came to be. That history lives in ``git log``.

What counts as work-log text, and what does not (the rules below, one pattern each):

* An issue reference: ``issue #8``, ``issues 5 and 9``, or a bare ``#8`` in prose. The reason
  itself belongs in the comment, not a pointer to a tracker the reader may not have.
  Allowed: another project's issue or pull request cited as an external reference, named by
  the project (``BookKeeper #1908``, ``CPython issue #106905``) or as ``owner/repo#N``
  (``python/cpython#106905``; the ``#`` follows a word character there, so the bare-``#``
  rule never sees it); an anchor in a link (``page.md#3``, same reason); a CSS colour
  (``"#333"``, ``color: #000000``: three, four, six or eight digits after a quote, ``=`` or
  ``:``).
* A sitting of work: an ordinal or a pointing word before "session" or "sitting" (``the
  eighth session``, ``this session``, ``last sitting``), a session note, log or summary, a
  work session, a Markdown heading that is an ordinal and then a comma, colon, dash or "at"
  (``## Eighth, at 4d96cd0``; ``## First steps`` is fine), and any ordinal past the tenth
  (``Thirteenth``), which in these texts only ever numbered sittings.
  Allowed: "session" in its technical senses (a ZooKeeper session and its expiry, Spark's
  ``SparkSession``, a process session as in ``start_new_session``, pytest's session), which
  do not come after those words (``the whole session`` and ``the same session`` are not
  flagged for that reason); "sitting" as a verb (``bytes sitting in the page cache``).
* A time of day or a date of work: ``11:21-12:30``, ``11:21 UTC``, ``2026-11-24``. Allowed:
  an ISO timestamp in an example (``2026-01-02T03:04:05Z``, the ``T`` tells it apart).
* A review note: ``Review:``, ``reviewed:``, ``review commit``, ``review note``.

A figure measured on one machine is not caught here (it cannot be told from a figure that
explains a default); the house rule is that such a figure names the bench that produced it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = [ROOT / "zbk", ROOT / "docs", ROOT / "README.md"]
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".json", ".yaml", ".yml", ".cfg", ".ini", ".html", ".css", ".sh"}

_ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
             "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
             r"\d+(?:st|nd|rd|th)")
# Projects whose own issue numbers may be cited as external references.
# Past the tenth, an ordinal in these texts only ever numbered sittings of work.
_HIGH_ORDINALS = ("eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|"
                  "nineteenth|twentieth")
_EXTERNAL = ("BookKeeper|ZooKeeper|etcd|CPython|Python|pyzmq|libzmq|ZeroMQ|Spark|gRPC|grpcio|protobuf|"
             "prometheus_client|NATS|nats-server|cbor2|pytest|hypothesis|mypy|ruff|Linux")
_EXTERNAL_REF = re.compile(rf"\b(?:{_EXTERNAL})(?:'s)?\s+(?:(?:issue|PR|pull request|bug)\s+)?#?\d+\b", re.I)
_HOUR = r"(?:[01]?\d|2[0-3]):[0-5]\d"

RULES: list[tuple[str, re.Pattern[str]]] = [
    ("issue reference", re.compile(r"\b(?:issues?|PR|pull request)\s+#?\d+\b", re.I)),
    ("bare #N issue reference", re.compile(r"(?<![\w/#&.\-])#\d+\b(?![\w-])")),
    ("sitting of work", re.compile(
        rf"\b(?:{_ORDINALS}|this|that|last|previous|next|earlier|later)"
        r"\s+(?:work\s+)?(?:session|sitting)s?\b", re.I)),
    ("sitting of work", re.compile(r"\bsession\s+(?:notes?|logs?|summary|summaries|stops?)\b", re.I)),
    ("sitting of work", re.compile(r"\bwork(?:ing)?\s+sessions?\b", re.I)),
    ("sitting of work", re.compile(r"\bsessions?\s+of\s+(?:work|#?\d)", re.I)),
    ("ordinal heading", re.compile(rf"^#{{1,6}}\s+(?:{_ORDINALS})\s*(?:$|[,:(\u2014]|-\s|at\b)", re.I)),
    ("ordinal sitting", re.compile(rf"\b(?:{_HIGH_ORDINALS})\b", re.I)),
    ("time of day", re.compile(rf"\b{_HOUR}\s*[-\u2013]\s*{_HOUR}\b")),
    ("time of day", re.compile(rf"\b{_HOUR}(?::[0-5]\d)?\s*(?:UTC|GMT|CET|CEST)\b")),
    ("date", re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b(?!T\d)")),
    ("review note", re.compile(r"\breview(?:ed)?\s*:|\breview\s+(?:commits?|notes?)\b", re.I)),
]


def _colour(line: str, m: re.Match[str]) -> bool:
    """``#`` and 3, 4, 6 or 8 digits right after a quote, ``=`` or ``:``: a colour."""
    before = line[:m.start()].rstrip()
    return len(m.group()) - 1 in (3, 4, 6, 8) and before.endswith(("'", '"', "=", ":"))


def _external(line: str, m: re.Match[str]) -> bool:
    """The match lies inside a cited issue of another project."""
    return any(e.start() <= m.start() and m.end() <= e.end() for e in _EXTERNAL_REF.finditer(line))


def findings(path: Path, text: str) -> list[str]:
    out: list[str] = []
    for no, line in enumerate(text.splitlines(), 1):
        spans: list[tuple[int, int]] = []  # what this line was already reported for
        for what, rule in RULES:
            for m in rule.finditer(line):
                if what.endswith("issue reference") and (_external(line, m) or _colour(line, m)):
                    continue
                if any(a < m.end() and m.start() < b for a, b in spans):
                    continue  # "#8" of an "issue #8" already reported
                spans.append(m.span())
                out.append(f"{path.relative_to(ROOT)}:{no}: {what}: {m.group()!r} in {line.strip()!r}")
    return out


def _files() -> list[Path]:
    files: list[Path] = []
    for top in SCANNED:
        if top.is_file():
            files.append(top)
        else:
            files.extend(p for p in sorted(top.rglob("*")) if p.is_file() and p.suffix in TEXT_SUFFIXES)
    return files


def test_no_worklog_text() -> None:
    found: list[str] = []
    for path in _files():
        found.extend(findings(path, path.read_text(encoding="utf-8")))
    assert not found, "work-log text (history belongs in git log):\n" + "\n".join(found)


def test_rules_catch_worklog_lines() -> None:
    planted = [
        "# the cache holds new pages as deltas (issue #8)",
        "Deltas (performance issues 8 and 9): see #12.",
        "## Thirteenth session, at 4d96cd0",
        "Measured in the eighth session on this VM.",
        "This session measured the floor.",
        "at 4d96cd0 (2026-11-26, 11:21-12:30 UTC)",
        "started 09:15 UTC",
        "Review: the two workers share one report.",
        "bde53e2 and the last commit are the review commits",
        "a session note of the twelfth sitting",
        "Thirteenth, at 4d96cd0: the floor",
        "## Eighth, at 4d96cd0",
        "### Third (load 2-4)",
    ]
    for line in planted:
        assert findings(ROOT / "planted.md", line), line


def test_rules_spare_legitimate_words() -> None:
    legitimate = [
        "from pyspark.sql import SparkSession",
        "ZooKeeper disconnection is not a session expiry: the keeper retries",
        "Start a child in its own session (process group)",
        "subprocess.Popen(argv, start_new_session=True)",
        "fixed in BookKeeper #1908 upstream; see python/cpython#106905",
        "CPython issue #106905 makes ast.parse raise",
        "see [the table](docs/performance.md#3) and https://example.org/a#12",
        'palette = {"ok": "#333", "bad": "#000000"}',
        "color: #123456;",
        '{"ts": "2026-01-02T03:04:05.000Z"}',
        "etcd://127.0.0.1:2379,127.0.0.2:2379/zbk",
        "bytes sitting in the page cache until the checkpoint",
        "the first entry of a session-less client",
        "A one-member etcd for the whole session (do not kill it: other tests share it)",
        "the same ZooKeeper session survives a disconnection",
        "## First steps",
        "# the first fsync of a group commits all its files",
        "writes review the keys first",
    ]
    for line in legitimate:
        assert not findings(ROOT / "legit.md", line), line
