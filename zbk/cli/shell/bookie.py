"""Shell commands that ask one bookie over the wire protocol (metadata only to find a bookie by its id)."""

from __future__ import annotations

import argparse

from zbk.cli.shell.common import command, connect, entry_id, ledger_id, out
from zbk.errors import EXIT_FAILED, EXIT_OK

GROUP = "one bookie"


def _bookieinfo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bookie", metavar="B", help="bookie id: host:port, or a name (then give --metadata)")


@command("bookieinfo", group=GROUP, summary="a bookie's state, space and ledger counts", usage="B",
         example="zbk shell bookieinfo 127.0.0.1:3181", needs="bookie", configure=_bookieinfo_args)
def _bookieinfo(args: argparse.Namespace) -> None:
    from zbk.wire import messages as w

    with connect(args, args.bookie) as c:
        r = c.call(w.BookieInfoRequest(rid=c.next_rid()))
    out(args, {"bookie_id": args.bookie, "state": r.state, "free_bytes": r.free_bytes, "total_bytes": r.total_bytes,
               "ledgers": r.ledgers, "limbo_ledgers": r.limbo_ledgers})


def _readentry_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bookie", metavar="B", required=True, help="bookie id: host:port, or a name (then give --metadata)")
    p.add_argument("ledger_id", type=ledger_id, metavar="LID", help="ledger id")
    p.add_argument("entry_id", type=entry_id, metavar="EID", help="entry id")


@command("readentry", group=GROUP, summary="one bookie's answer for one entry: status, LAC, the stored blob",
         usage="--bookie B LID EID", example="zbk shell readentry --bookie 127.0.0.1:3181 42 0", needs="bookie",
         configure=_readentry_args)
def _readentry(args: argparse.Namespace) -> int:
    from zbk.wire import messages as w
    from zbk.wire.entry import peek_entry_header

    lid, eid = args.ledger_id, args.entry_id
    with connect(args, args.bookie) as c:
        r = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=lid, first_entry_id=eid))
    data: dict[str, object] = {"bookie": args.bookie, "ledger_id": lid, "entry_id": eid, "status": r.status.name,
                               "lac": r.lac}
    if r.entries:
        blob = bytes(r.entries[0])
        data["entry_lac"] = peek_entry_header(blob)[2]
        data["bytes"] = len(blob)
        data["blob_hex"] = blob.hex() if args.json else blob[:64].hex() + ("..." if len(blob) > 64 else "")
    out(args, data)
    return EXIT_OK if r.entries else EXIT_FAILED


def _ledgerentries_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bookie", metavar="B", required=True, help="bookie id: host:port, or a name (then give --metadata)")
    p.add_argument("ledger_id", type=ledger_id, metavar="LID", help="ledger id")


@command("ledgerentries", group=GROUP, summary="the entry ids one bookie holds of a ledger", usage="--bookie B LID",
         example="zbk shell ledgerentries --bookie 127.0.0.1:3181 42", needs="bookie", configure=_ledgerentries_args)
def _ledgerentries(args: argparse.Namespace) -> int:
    from zbk.wire import messages as w

    lid = args.ledger_id
    with connect(args, args.bookie) as c:
        r = c.call(w.ListEntriesRequest(rid=c.next_rid(), ledger_id=lid))
    data = {"bookie": args.bookie, "ledger_id": lid, "status": r.status.name, "ranges": [list(x) for x in r.entry_ranges]}
    out(args, data, lambda d: f"{d['status']}: " + (", ".join(f"{a}-{b}" if a != b else str(a)
                                                              for a, b in d["ranges"]) or "none"))
    return EXIT_OK if r.status == 0 else EXIT_FAILED

