"""Shell commands for auto-recovery: the marks, the auditor, the audit delay, decommission, the
cluster's auto-recovery switch and what is being repaired now."""

from __future__ import annotations

import argparse
from typing import Any

from zbk.cli.shell.common import Progress, client_config, command, open_metadata, out, rows
from zbk.errors import EXIT_FAILED, EXIT_OK

GROUP = "auto-recovery"
_EXAMPLE_URI = "--metadata sqlite:///var/zbk/meta.db"


def _listunderreplicated_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repairs", action="store_true",
                   help="with --json: the in-place repairs (limbo, damaged replicas) instead of the marks")


@command("listunderreplicated", group=GROUP, summary="ledgers marked under-replicated, with their missing replicas",
         usage="--metadata URI [--repairs]", example=f"zbk shell listunderreplicated {_EXAMPLE_URI}",
         needs="metadata", configure=_listunderreplicated_args)
def _listunderreplicated(args: argparse.Namespace) -> None:
    from zbk.recovery.underreplication import UnderReplicationRegistry

    registry = UnderReplicationRegistry(open_metadata(args), "zbk-shell")
    marks = [m.as_json() for m in registry.list()]
    repairs = [m.as_json() for m in registry.list_repairs()]
    if args.json:  # the marks, as always; in-place repairs (limbo, damaged replicas) with --repairs
        out(args, repairs if args.repairs else marks)
        return
    text = rows(["ledger", "missing replicas"], [[m["ledger_id"], ", ".join(m["missing_bookies"])] for m in marks]) \
        if marks else "(no under-replicated ledgers)"
    if repairs:
        text += "\n\nin-place repairs pending:\n" + rows(
            ["ledger", "bookie", "why", "detail"], [[r["ledger_id"], r["bookie"], r["why"], r["detail"]] for r in repairs])
    print(text)


@command("whoisauditor", group=GROUP, summary="the auto-recovery process that is the auditor now (exit 1 if none)",
         usage="--metadata URI", example=f"zbk shell whoisauditor {_EXAMPLE_URI}", needs="metadata")
def _whoisauditor(args: argparse.Namespace) -> int:
    from zbk.metadata.coordination import current_leader

    leader = current_leader(open_metadata(args))
    out(args, {"auditor": leader}, lambda d: d["auditor"] or "(no auditor)")
    return EXIT_OK if leader else EXIT_FAILED


def _seconds(s: str) -> float:
    try:
        value = float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {s!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"the delay must be >= 0 seconds, got {s}")
    return value


def _delay_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("seconds", nargs="?", type=_seconds, metavar="SECONDS", help="set the delay (default: show it)")


@command("lostbookierecoverydelay", group=GROUP, summary="show, or set, how long the auditor waits for a lost bookie",
         usage="[SECONDS] --metadata URI", example=f"zbk shell lostbookierecoverydelay 600 {_EXAMPLE_URI}",
         needs="metadata", configure=_delay_args)
def _lostbookierecoverydelay(args: argparse.Namespace) -> None:
    from zbk.recovery.underreplication import get_recovery_delay, set_recovery_delay

    store = open_metadata(args)
    if args.seconds is not None:
        set_recovery_delay(store, args.seconds)
    out(args, {"lost_bookie_recovery_delay_s": get_recovery_delay(store)},
        lambda d: f"{d['lost_bookie_recovery_delay_s']:g} s")


@command("triggeraudit", group=GROUP, summary="run the auditor's periodic check of all ledgers now",
         usage="--metadata URI", example=f"zbk shell triggeraudit {_EXAMPLE_URI}", needs="metadata")
def _triggeraudit(args: argparse.Namespace) -> int:
    import time

    from zbk.metadata import layout
    from zbk.metadata.coordination import current_leader

    store = open_metadata(args)
    store.put(layout.AUDITOR_TRIGGER, str(int(time.time() * 1000)).encode("ascii"))
    leader = current_leader(store)
    out(args, {"triggered": True, "auditor": leader},
        lambda d: f"audit triggered; auditor {d['auditor']} runs it now" if d["auditor"]
        else "audit triggered, but no auditor is running: it runs when one is elected")
    return EXIT_OK if leader else EXIT_FAILED


def _recover_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("bookie", metavar="BOOKIE", help="the bookie to decommission (its id)")


@command("recover", group=GROUP, summary="decommission: re-replicate everything BOOKIE holds elsewhere",
         usage="BOOKIE --metadata URI", example=f"zbk shell recover 127.0.0.1:3181 {_EXAMPLE_URI}",
         needs="metadata", configure=_recover_args)
def _recover(args: argparse.Namespace) -> int:
    from zbk import eventloop
    from zbk.client.bookkeeper import ClientContext
    from zbk.metadata.coordination import LeaseKeeper
    from zbk.recovery.decommission import decommission
    from zbk.recovery.underreplication import UnderReplicationRegistry

    bookie = args.bookie
    config = client_config(args)
    store = open_metadata(args)
    keeper = LeaseKeeper(store, 10)
    lease = keeper.start()
    progress = Progress(args, f"moving {bookie}")

    async def run() -> Any:
        ctx = ClientContext.over_zmq(store, config)
        try:
            return await decommission(ctx, UnderReplicationRegistry(store, f"zbk-shell-recover-{bookie}"), lease,
                                      bookie, progress=lambda d, t, what: progress.update(d, t, what))
        finally:
            await ctx.transport.close()
    try:
        rep = eventloop.run(run())
    finally:
        progress.close()
        keeper.stop(revoke=True)
    data = {"bookie": bookie, "ledgers": len(rep.ledgers), "recovered_open_ledgers": rep.recovered_open,
            "entries_copied": rep.entries_copied, "bytes_copied": rep.bytes_copied,
            "seconds": round(rep.seconds, 2), "still_named_by": rep.still_named_by,
            "safe_to_remove": rep.safe_to_remove}
    out(args, data, lambda d: (
        f"{d['bookie']}: {d['ledgers']} ledger(s) moved, {d['entries_copied']:,} entries "
        f"({d['bytes_copied'] / 1e6:.1f} MB) copied in {d['seconds']} s; "
        + (f"closed {len(d['recovered_open_ledgers'])} open ledger(s) first; " if d["recovered_open_ledgers"] else "")
        + ("SAFE TO REMOVE" if d["safe_to_remove"] else f"NOT safe to remove: still named by {d['still_named_by']}")))
    return EXIT_OK if rep.safe_to_remove else EXIT_FAILED


def _switch_args(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group()
    what.add_argument("--enable", action="store_true", help="switch auto-recovery on: audits and repairs resume")
    what.add_argument("--disable", action="store_true",
                      help="switch it off: the auditor marks no ledger, replicators repair none")
    what.add_argument("--status", action="store_true", help="show whether it is on (the default)")


def _since(ms: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _switch_text(d: dict[str, Any]) -> str:
    if d["enabled"]:
        return "auto-recovery is on"
    by = f" by {d['disabled_by']}" if d["disabled_by"] else ""
    return f"auto-recovery is OFF (since {_since(d['disabled_ms'])}{by}): nothing is audited or repaired" \
        if d["disabled_ms"] else f"auto-recovery is OFF{by}: nothing is audited or repaired"


def operator_name(tool: str) -> str:
    """Who switched something, as metadata records it: the tool, the user and the host."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's): the host still says where
        user = "?"
    return f"{tool} ({user}@{socket.gethostname()})"


@command("autorecovery", group=GROUP, summary="switch auto-recovery on or off for the cluster, or show whether it is on",
         usage="[--enable | --disable | --status] --metadata URI",
         example=f"zbk shell autorecovery --disable {_EXAMPLE_URI}", needs="metadata", configure=_switch_args)
def _autorecovery(args: argparse.Namespace) -> None:
    from zbk.recovery.switch import read_switch, set_enabled

    store = open_metadata(args)
    if args.enable or args.disable:
        state = set_enabled(store, args.enable, by=operator_name("zbk shell"))
    else:
        state = read_switch(store)
    out(args, state.as_json(), _switch_text)


def _query_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--verbose", action="store_true", help="also list the marked ledgers that wait for a worker")


@command("queryautorecoverystatus", group=GROUP, summary="what auto-recovery is repairing now, and which worker does it",
         usage="--metadata URI [--verbose]", example=f"zbk shell queryautorecoverystatus {_EXAMPLE_URI}",
         needs="metadata", configure=_query_args)
def _queryautorecoverystatus(args: argparse.Namespace) -> None:
    from zbk.recovery.switch import read_switch
    from zbk.recovery.underreplication import UnderReplicationRegistry

    store = open_metadata(args)
    registry = UnderReplicationRegistry(store, "zbk-shell")
    switch = read_switch(store)
    marks = {m.ledger_id: m for m in registry.list()}
    repairs: dict[int, list[Any]] = {}
    for r in registry.list_repairs():
        repairs.setdefault(r.ledger_id, []).append(r)
    working = registry.held_locks()  # ledger -> the worker holding its lock
    in_progress = [{"ledger_id": lid, "worker": worker,
                    "missing_bookies": list(marks[lid].missing_bookies) if lid in marks else [],
                    "repairs": [{"bookie": r.bookie_id, "why": r.why} for r in repairs.get(lid, [])]}
                   for lid, worker in sorted(working.items())]
    waiting = sorted((set(marks) | set(repairs)) - set(working))
    data: dict[str, Any] = {**switch.as_json(), "in_progress": in_progress,
                            "waiting": {"under_replicated": sum(1 for lid in waiting if lid in marks),
                                        "in_place_repairs": sum(len(repairs.get(lid, [])) for lid in waiting)}}
    if args.verbose:
        data["waiting"]["ledgers"] = waiting
    out(args, data, _query_text)


def _what(row: dict[str, Any]) -> str:
    parts = [f"lost {', '.join(row['missing_bookies'])}"] if row["missing_bookies"] else []
    parts += [f"{r['why']} on {r['bookie']}" for r in row["repairs"]]
    return "; ".join(parts) or "(its mark is gone: finishing)"


def _query_text(d: dict[str, Any]) -> str:
    lines = [_switch_text(d)]
    if d["in_progress"]:
        lines.append(rows(["ledger", "worker", "repairing"],
                          [[r["ledger_id"], r["worker"], _what(r)] for r in d["in_progress"]]))
    else:
        lines.append("(no ledger is being repaired now)")
    w = d["waiting"]
    lines.append(f"waiting: {w['under_replicated']} under-replicated ledger(s), {w['in_place_repairs']} in-place "
                 "repair(s)" + (f": {w['ledgers']}" if w.get("ledgers") else ""))
    return "\n".join(lines)
