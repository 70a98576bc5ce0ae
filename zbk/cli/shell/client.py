"""Shell commands that go through the client: read a ledger, write and read back a test ledger."""

from __future__ import annotations

import argparse

from zbk.cli.shell.common import (
    Progress,
    client_config,
    command,
    count,
    entry_id,
    jsonable,
    ledger_id,
    out,
    uri,
)

GROUP = "through the client"


def _readledger_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("ledger_id", type=ledger_id, metavar="LID", help="ledger id")
    p.add_argument("--first", type=entry_id, metavar="N", help="first entry id (0)")
    p.add_argument("--last", type=entry_id, metavar="M", help="last entry id (the last add confirmed)")
    p.add_argument("--password", default="", help="the ledger's password")


@command("readledger", group=GROUP, summary="a ledger's entries (no recovery, no fencing)",
         usage="LID --metadata URI [--password PASSWORD] [--first N] [--last M]",
         example="zbk shell readledger 42 --metadata sqlite:///var/zbk/meta.db --password secret --first 0 --last 9",
         needs="metadata", configure=_readledger_args)
def _readledger(args: argparse.Namespace) -> int:
    import zbk

    lid = args.ledger_id
    rows = []
    with zbk.BookKeeper(uri(args), config=client_config(args)) as bk:
        rh = bk.open_ledger(lid, password=args.password.encode(), recovery=False)
        last = rh.last_add_confirmed if args.last is None else args.last
        first = args.first or 0
        if last >= first:
            progress = Progress(args, f"ledger {lid}", last - first + 1)
            for e in rh.read(first, last):
                rows.append({"entry_id": e.entry_id, "bytes": len(e.payload), "payload": e.payload})
                progress.update(e.entry_id - first + 1)
            progress.close()
    out(args, rows, lambda rs: "\n".join(f"{r['entry_id']}\t{jsonable(r['payload'][:80])}" for r in rs)
        or "(no confirmed entries)")
    return 0


def _positive(s: str) -> int:
    try:
        value = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {s}")
    return value


def _simpletest_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ensemble", type=_positive, default=3, metavar="E", help="ensemble size (3)")
    p.add_argument("--write-quorum", type=_positive, default=2, metavar="WQ", help="write quorum (2)")
    p.add_argument("--ack-quorum", type=_positive, default=2, metavar="AQ", help="ack quorum (2)")
    p.add_argument("--entries", type=count, default=1000, metavar="N", help="entries to write (1000)")


@command("simpletest", group=GROUP, summary="write a ledger, read it back, delete it",
         usage="--metadata URI [--ensemble E] [--write-quorum WQ] [--ack-quorum AQ] [--entries N]",
         example="zbk shell simpletest --metadata sqlite:///var/zbk/meta.db --entries 1000", needs="metadata",
         configure=_simpletest_args)
def _simpletest(args: argparse.Namespace) -> int:
    import os
    import time

    import zbk

    n = args.entries
    with zbk.BookKeeper(uri(args), config=client_config(args)) as bk:
        lh = bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, password=b"simpletest")
        payloads = [os.urandom(1024) for _ in range(min(n, 64))]
        t0 = time.perf_counter()
        futs = [lh.append_async(payloads[i % len(payloads)]) for i in range(n)]
        progress = Progress(args, "writing", n)
        for i, f in enumerate(futs):
            f.result()
            progress.update(i + 1)
        progress.close()
        wrote = time.perf_counter() - t0
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, password=b"simpletest")
        t0 = time.perf_counter()
        bad = sum(1 for e in rh.read(0, n - 1) if e.payload != payloads[e.entry_id % len(payloads)]) if n else 0
        read = time.perf_counter() - t0
        ensemble = rh.metadata.ensembles
        bk.delete_ledger(lh.ledger_id)
    ok = bad == 0
    out(args, {"ledger_id": lh.ledger_id, "entries": n, "ensembles": {str(k): v for k, v in ensemble.items()},
               "write_entries_per_s": round(n / wrote) if wrote else 0, "read_entries_per_s": round(n / read) if read else 0,
               "mismatches": bad, "ok": ok},
        lambda d: (f"simpletest {'OK' if d['ok'] else 'FAILED'}: ledger {d['ledger_id']}, {d['entries']} entries on "
                   f"{d['ensembles']}; write {d['write_entries_per_s']:,}/s, read {d['read_entries_per_s']:,}/s"
                   + (f", {d['mismatches']} mismatches" if d["mismatches"] else "")))
    return 0 if ok else 1
