"""Offline shell commands over a stopped bookie's files: its journal, entry logs, index.

``--data-dir DIR``: a bookie started with ``--data-dir DIR`` keeps its journal, entry logs
and index in ``DIR/journal``, ``DIR/ledgers`` and ``DIR/index``. One configured with
``journal_dirs``, ``ledger_dirs`` and ``index_dirs`` instead names them all in the cookie
it writes into each (zbk/storage/cookie.py): DIR may then be any one of them, and
:func:`bookie_dirs` finds the others through the cookie.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from typing import Any

from zbk.cli.shell.common import command, number, out, rows, size_text
from zbk.errors import BadRequestError, CorruptDataError, ZbkError

GROUP = "offline (a stopped bookie)"
SUBDIRS = {"journal": "journal", "ledgers": "ledgers", "index": "index"}


@dataclass
class BookieDirs:
    journal: list[str] = field(default_factory=list)
    ledgers: list[str] = field(default_factory=list)
    index: list[str] = field(default_factory=list)
    cookie_found_in: str = ""  # a directory holding the bookie's cookie ("" if none)
    missing: list[str] = field(default_factory=list)  # directories the cookie names that are not here
    # The journal directories in journal order (journal i is the i-th: its ledgers and its
    # last mark are found by that position): the cookie's, else DIR/journal.
    journals: list[str] = field(default_factory=list)

    def all(self) -> list[str]:
        return list(dict.fromkeys([*self.journal, *self.ledgers, *self.index]))


def bookie_dirs(data_dir: str) -> BookieDirs:
    """The bookie's directories under ``data_dir``, and those its cookie names (found in
    one of them, or in ``data_dir`` itself).

    The cookie holds the directories as the bookie was configured; a relative one is taken
    from the current directory, and one that does not exist is listed in ``missing``."""
    from zbk.storage.cookie import read_cookie

    if not os.path.isdir(data_dir):
        raise BadRequestError(f"--data-dir {data_dir}: no such directory")
    base = os.path.abspath(data_dir)
    dirs = BookieDirs([os.path.join(base, SUBDIRS["journal"])], [os.path.join(base, SUBDIRS["ledgers"])],
                      [os.path.join(base, SUBDIRS["index"])], journals=[os.path.join(base, SUBDIRS["journal"])])
    for d in [*dirs.all(), base]:
        try:
            cookie = read_cookie(d) if os.path.isdir(d) else None
        except CorruptDataError:
            continue  # a damaged copy: another directory's copy, or none, names the set
        if cookie is None:
            continue
        dirs.cookie_found_in = d
        dirs.journals = [os.path.abspath(x) for x in cookie.journal_dirs]
        for have, named in ((dirs.journal, cookie.journal_dirs), (dirs.ledgers, cookie.ledger_dirs),
                            (dirs.index, cookie.index_dirs)):
            for extra in (os.path.abspath(x) for x in named):
                if extra in have:
                    continue
                if os.path.isdir(extra):
                    have.append(extra)
                else:
                    dirs.missing.append(extra)
        break
    return dirs


def _existing(paths: list[str]) -> list[str]:
    return [p for p in paths if os.path.isdir(p)]


@command("readjournal", group=GROUP, summary="the journal records after the last mark, of every journal",
         usage="--data-dir DIR", example="zbk shell readjournal --data-dir /var/zbk/bookie-1", needs="data_dir")
def _readjournal(args: argparse.Namespace) -> None:
    from zbk.storage.journal import replay
    from zbk.storage.markers import read_last_mark

    dirs = bookie_dirs(args.data_dir)
    found = []
    for j, journal in enumerate(dirs.journals):  # each from its own last mark
        if not os.path.isdir(journal):
            continue
        for rec, m in replay(journal, read_last_mark(dirs.index, journal=j)):
            found.append({"journal": j, "type": rec.type.name, "ledger_id": rec.ledger_id, "entry_id": rec.entry_id,
                          "bytes": len(rec.payload), "mark": list(m)})
    out(args, found, lambda rs: rows(["journal", "type", "ledger", "entry", "bytes", "mark"],
                                     [[r["journal"], r["type"], r["ledger_id"], r["entry_id"], r["bytes"], r["mark"]]
                                      for r in rs]))


def _readlog_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("log_id", type=number, metavar="LOGID", help="entry log id (the file name's hex digits, as a number)")


@command("readlog", group=GROUP, summary="the records of one entry log", usage="LOGID --data-dir DIR",
         example="zbk shell readlog 1 --data-dir /var/zbk/bookie-1", needs="data_dir", configure=_readlog_args)
def _readlog(args: argparse.Namespace) -> None:
    from zbk.storage.entrylog import list_logs, scan_file

    d = args.data_dir
    path = None
    for ledgers in _existing(bookie_dirs(d).ledgers):
        path = list_logs(ledgers).get(args.log_id) or path
    if path is None:
        raise ZbkError(f"no entry log {args.log_id} in {d}/ledgers")
    found = [{"ledger_id": lid, "entry_id": eid, "location": loc, "bytes": len(blob)}
             for lid, eid, loc, blob in scan_file(path)]
    out(args, found, lambda rs: rows(["ledger", "entry", "location", "bytes"],
                                     [[r["ledger_id"], r["entry_id"], r["location"], r["bytes"]] for r in rs]))


@command("lastmark", group=GROUP, summary="the last checkpointed mark of every journal", usage="--data-dir DIR",
         example="zbk shell lastmark --data-dir /var/zbk/bookie-1", needs="data_dir")
def _lastmark(args: argparse.Namespace) -> None:
    from zbk.storage.markers import read_last_marks

    dirs = bookie_dirs(args.data_dir)
    marks = read_last_marks(dirs.index, len(dirs.journals))
    every = [{"journal": j, "dir": d, "segment_id": m.segment_id, "offset": m.offset}
             for j, (d, m) in enumerate(zip(dirs.journals, marks, strict=True))]
    # segment_id and offset: journal 0's (the only one of a bookie with one journal directory).
    doc = {"segment_id": marks[0].segment_id, "offset": marks[0].offset, "journals": every}

    def text(d: dict[str, Any]) -> str:
        if len(d["journals"]) == 1:
            return f"{d['segment_id']}:{d['offset']}"
        return "\n".join(f"journal {j['journal']} {j['dir']}: {j['segment_id']}:{j['offset']}" for j in d["journals"])

    out(args, doc, text)


def _listfiles_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--journal", action="store_true", help="journal segments")
    p.add_argument("--entrylog", action="store_true", help="entry logs")
    p.add_argument("--index", action="store_true", help="index files")


@command("listfilesondisc", group=GROUP, summary="journal segments, entry logs and index files, with sizes",
         usage="--data-dir DIR [--journal] [--entrylog] [--index]",
         example="zbk shell listfilesondisc --data-dir /var/zbk/bookie-1 --entrylog", needs="data_dir",
         configure=_listfiles_args)
def _listfilesondisc(args: argparse.Namespace) -> None:
    everything = not (args.journal or args.entrylog or args.index)
    files = list_files(bookie_dirs(args.data_dir), journal=everything or args.journal,
                       entrylog=everything or args.entrylog, index=everything or args.index)
    out(args, files, _files_table)


def list_files(dirs: BookieDirs, *, journal: bool = True, entrylog: bool = True,
               index: bool = True) -> list[dict[str, Any]]:
    """One row per file: kind (journal, journal-free, entrylog, index), id, bytes, path."""
    from zbk.storage.listing import list_files as listing

    return listing(dirs.journal, dirs.ledgers, dirs.index, journal=journal, entrylog=entrylog, index=index)


def _files_table(files: list[dict[str, Any]]) -> str:
    if not files:
        return "(no files)"
    total = sum(f["bytes"] for f in files)
    body = [[f["kind"], f["id"], size_text(f["bytes"]), f["path"]] for f in files]
    return rows(["kind", "id", "size", "path"], body) + f"\n{len(files)} files, {size_text(total)}"
