"""The files of a bookie's directories: journal segments (and recycled ones), entry logs and
index files, with their sizes. `zbk shell listfilesondisc` shows them for a stopped bookie,
``GET /api/v1/bookie/list_disk_file`` for a running one (where a file may go while it is
listed: such a file is left out)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


def list_files(journal_dirs: Sequence[str], ledger_dirs: Sequence[str], index_dirs: Sequence[str], *,
               journal: bool = True, entrylog: bool = True, index: bool = True) -> list[dict[str, Any]]:
    """One row per file: kind (journal, journal-free, entrylog, index), id, bytes, path.
    Directories that do not exist are skipped."""
    from zbk.storage.entrylog import list_logs
    from zbk.storage.index import list_index_files
    from zbk.storage.journal import list_free, list_segments, segment_name
    from zbk.storage.journalformat import FREE_SUFFIX

    def existing(dirs: Sequence[str]) -> list[str]:
        return [d for d in dirs if os.path.isdir(d)]

    found: list[tuple[str, int, str]] = []
    for d in existing(journal_dirs) if journal else []:
        found += [("journal", sid, os.path.join(d, segment_name(sid))) for sid in list_segments(d)]
        found += [("journal-free", sid, os.path.join(d, segment_name(sid) + FREE_SUFFIX)) for sid in list_free(d)]
    for d in existing(ledger_dirs) if entrylog else []:
        found += [("entrylog", lid, path) for lid, path in sorted(list_logs(d).items())]
    for d in existing(index_dirs) if index else []:
        found += [("index", lid, path) for lid, path in sorted(list_index_files(d).items())]
    result: list[dict[str, Any]] = []
    for kind, ident, path in found:
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            continue  # removed while listing (a checkpoint or a GC of a running bookie)
        result.append({"kind": kind, "id": ident, "bytes": size, "path": path})
    return result
