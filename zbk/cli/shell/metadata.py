"""Shell commands on cluster metadata: bookies, ledgers, the instance id, cookies."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from zbk.cli.shell.common import Progress, command, key_value, ledger_id, open_metadata, out, rows
from zbk.errors import EXIT_FAILED, EXIT_OK, CorruptMetadataError, ZbkError

GROUP = "cluster metadata"
_EXAMPLE_URI = "--metadata sqlite:///var/zbk/meta.db"


def _listbookies_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--readonly", action="store_true", help="the read-only bookies instead of the writable ones")


@command("listbookies", group=GROUP, summary="the registered writable (or --readonly) bookies",
         usage="--metadata URI [--readonly]", example=f"zbk shell listbookies {_EXAMPLE_URI}",
         needs="metadata", configure=_listbookies_args)
def _listbookies(args: argparse.Namespace) -> None:
    from zbk.metadata.registry import list_bookies

    regs = list_bookies(open_metadata(args), readonly=args.readonly)
    data = [{"id": r.bookie_id, "address": r.wire_address, "state": r.state, "rack": r.rack, "zone": r.zone,
             "group": r.isolation_group, "http": r.http_url} for r in regs]
    out(args, data, lambda d: rows(["bookie", "address", "state", "rack", "zone", "group", "http"],
                                   [[x["id"], x["address"], x["state"], x["rack"], x["zone"], x["group"], x["http"]]
                                    for x in d]))


def _listledgers_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bookie", metavar="B", help="only ledgers with a fragment on bookie B (its id)")
    p.add_argument("--meta", action="append", default=[], type=key_value, metavar="KEY=VALUE",
                   help="only ledgers whose custom metadata has KEY equal to VALUE (repeatable: all must match)")


@command("listledgers", group=GROUP, summary="ledger ids; --bookie B: those with a fragment on B; --meta K=V",
         usage="--metadata URI [--bookie B] [--meta KEY=VALUE ...]",
         example=f"zbk shell listledgers {_EXAMPLE_URI} --bookie 127.0.0.1:3181", needs="metadata",
         configure=_listledgers_args)
def _listledgers(args: argparse.Namespace) -> int:
    store = open_metadata(args)
    if args.bookie is None and not args.meta:
        from zbk.metadata.registry import LedgerStore

        ids = list(LedgerStore(store).list_ids())
        out(args, ids, _id_lines)
        return EXIT_OK
    ids, unreadable = _matching_ledgers(args, store)
    for lid, why in unreadable:
        print(f"zbk shell listledgers: ledger {lid}: {why}", file=sys.stderr)
    out(args, ids, _id_lines)
    return EXIT_FAILED if unreadable else EXIT_OK  # a ledger it could not read might have matched


def _id_lines(ids: list[int]) -> str:
    return "\n".join(str(i) for i in ids) or "(no ledgers)"


def _matching_ledgers(args: argparse.Namespace, store: Any) -> tuple[list[int], list[tuple[int, str]]]:
    """The ids of ledgers on ``--bookie`` with every ``--meta`` pair, and the ledgers whose
    metadata does not decode (with why). One pass over ``ledgers/``: each page of keys comes
    with its values, so no ledger is read twice."""
    from zbk.metadata import layout
    from zbk.metadata.ledger import LedgerMetadata
    from zbk.metadata.store import iter_prefix

    wanted = {k: v.encode() for k, v in args.meta}
    found: list[int] = []
    unreadable: list[tuple[int, str]] = []
    progress = Progress(args, "ledgers scanned")
    for n, kv in enumerate(iter_prefix(store, layout.LEDGERS), 1):
        progress.update(n)
        suffix = kv.key[len(layout.LEDGERS):]
        if not suffix.isdigit():
            continue
        lid = int(suffix)
        try:
            md = LedgerMetadata.decode(kv.value, ledger_id=lid)
        except CorruptMetadataError as e:
            unreadable.append((lid, str(e)))
            continue
        if args.bookie is not None and args.bookie not in md.all_bookies():
            continue
        if any(md.custom_metadata.get(k) != v for k, v in wanted.items()):
            continue
        found.append(lid)
    progress.close()
    return found, unreadable


def _lid_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("ledger_id", type=ledger_id, metavar="LID", help="ledger id")


@command("deleteledger", group=GROUP, summary="delete a ledger's metadata (bookies reclaim its space by GC)",
         usage="LID --metadata URI", example=f"zbk shell deleteledger 42 {_EXAMPLE_URI}", needs="metadata",
         configure=_lid_arg)
def _deleteledger(args: argparse.Namespace) -> None:
    from zbk.metadata.registry import LedgerStore

    LedgerStore(open_metadata(args)).delete(args.ledger_id)
    out(args, {"deleted": args.ledger_id}, lambda d: f"ledger {d['deleted']} deleted")


@command("instanceid", group=GROUP, summary="the cluster's instance id", usage="--metadata URI",
         example=f"zbk shell instanceid {_EXAMPLE_URI}", needs="metadata")
def _instanceid(args: argparse.Namespace) -> None:
    from zbk.metadata.registry import get_or_create_instance_id

    out(args, {"instance_id": get_or_create_instance_id(open_metadata(args))}, lambda d: d["instance_id"])


def _cookie_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("verb", choices=("get", "fix"), help="get: show the cookie; fix: remove it from metadata")
    p.add_argument("bookie", metavar="BOOKIE", help="bookie id host:port")


@command("cookie", group=GROUP, summary="cookie get|fix BOOKIE: show a bookie's cookie, or remove it for fixing",
         usage="get|fix BOOKIE --metadata URI", example=f"zbk shell cookie get 127.0.0.1:3181 {_EXAMPLE_URI}",
         needs="metadata", configure=_cookie_args)
def _cookie(args: argparse.Namespace) -> None:
    from zbk.metadata.registry import delete_cookie, read_cookie

    bookie = args.bookie
    store = open_metadata(args)
    found = read_cookie(store, bookie)
    if args.verb == "get":
        if found is None:
            raise ZbkError(f"no cookie for bookie {bookie}")
        c, version = found
        out(args, {"bookie_id": c.bookie_id, "instance_id": c.instance_id, "journal_dirs": c.journal_dirs,
                   "ledger_dirs": c.ledger_dirs, "index_dirs": c.index_dirs, "incarnation": c.incarnation,
                   "version": version})
        return
    # fix: drop the metadata copy. The bookie's next boot then finds its directories' copies
    # without one in metadata: a mismatch, which auto_fix_cookie resolves with BP-46 phase one.
    if found is not None:
        delete_cookie(store, bookie, found[1])
    out(args, {"bookie_id": bookie, "fixed": True},
        lambda d: f"cookie of {bookie} removed from metadata; start the bookie with "
                  "--set auto_fix_cookie=true to rewrite it (BP-46 phase one fences and limbos its open ledgers)")
