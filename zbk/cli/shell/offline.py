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
                      [os.path.join(base, SUBDIRS["index"])])
    for d in [*dirs.all(), base]:
        try:
            cookie = read_cookie(d) if os.path.isdir(d) else None
        except CorruptDataError:
            continue  # a damaged copy: another directory's copy, or none, names the set
        if cookie is None:
            continue
        dirs.cookie_found_in = d
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


@command("readjournal", group=GROUP, summary="the journal records after the last mark", usage="--data-dir DIR",
         example="zbk shell readjournal --data-dir /var/zbk/bookie-1", needs="data_dir")
def _readjournal(args: argparse.Namespace) -> None:
    from zbk.storage.journal import replay
    from zbk.storage.markers import read_last_mark

    dirs = bookie_dirs(args.data_dir)
    mark = read_last_mark(dirs.index)
    found = []
    journal = next(iter(_existing(dirs.journal)), dirs.journal[0])  # a bookie journals into its first one
    for rec, m in replay(journal, mark):
        found.append({"type": rec.type.name, "ledger_id": rec.ledger_id, "entry_id": rec.entry_id,
                      "bytes": len(rec.payload), "mark": list(m)})
    out(args, found, lambda rs: rows(["type", "ledger", "entry", "bytes", "mark"],
                                     [[r["type"], r["ledger_id"], r["entry_id"], r["bytes"], r["mark"]] for r in rs]))


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


@command("lastmark", group=GROUP, summary="the last checkpointed journal mark", usage="--data-dir DIR",
         example="zbk shell lastmark --data-dir /var/zbk/bookie-1", needs="data_dir")
def _lastmark(args: argparse.Namespace) -> None:
    from zbk.storage.markers import read_last_mark

    mark = read_last_mark(bookie_dirs(args.data_dir).index)
    out(args, {"segment_id": mark.segment_id, "offset": mark.offset}, lambda d: f"{d['segment_id']}:{d['offset']}")


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
