"""`zbk shell localconsistencycheck`: the offline check of a stopped bookie's index against
its entry logs (what it checks: zbk/bookie/consistency.py)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from zbk.cli.shell.common import Progress, command, out, rows
from zbk.cli.shell.offline import GROUP, bookie_dirs


@command("localconsistencycheck", group=GROUP,
         summary="every index entry points to a readable record with a valid checksum and digest (exit 1 if not)",
         usage="--data-dir DIR", example="zbk shell localconsistencycheck --data-dir /var/zbk/bookie-1",
         needs="data_dir")
def _localconsistencycheck(args: argparse.Namespace) -> int:
    from zbk.bookie.consistency import check

    dirs = bookie_dirs(args.data_dir)
    progress = Progress(args, "ledgers checked")
    try:
        report = check(dirs.ledgers, dirs.index, progress=lambda done, total: progress.update(done, total))
    finally:
        progress.close()
    data = {"ok": report.ok, "ledgers": report.ledgers, "entries": report.entries,
            "digests_checked": report.digests_checked, "digests_unchecked_hmac": report.digests_unchecked,
            "no_digest": report.no_digest, "bad": [dataclasses.asdict(b) for b in report.bad],
            "missing_dirs": dirs.missing}
    out(args, data, _table)
    return 0 if report.ok and not dirs.missing else 1


def _table(d: dict[str, Any]) -> str:
    lines = [f"{d['ledgers']} ledgers, {d['entries']:,} entries: {d['digests_checked']:,} digests verified, "
             f"{d['digests_unchecked_hmac']:,} hmac digests not checkable without the password, "
             f"{d['no_digest']:,} entries without a digest"]
    if d["missing_dirs"]:
        lines.append("directories the cookie names but missing here (not checked): " + ", ".join(d["missing_dirs"]))
    if d["bad"]:
        lines.append(f"{len(d['bad'])} BAD:")
        lines.append(rows(["ledger", "entry", "problem"],
                          [[b["ledger_id"], "-" if b["entry_id"] is None else b["entry_id"], b["problem"]]
                           for b in d["bad"]]))
    else:
        lines.append("OK")
    return "\n".join(lines)
