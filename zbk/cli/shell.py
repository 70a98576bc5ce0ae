"""`zbk shell`: admin commands (API.md "Command line").

With --metadata URI: commands against the cluster. With --data-dir DIR: offline tools
over one bookie's files (the bookie must be stopped). --json prints machine-readable
output; otherwise readable tables. Expected failures are one line and an exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from zbk.errors import EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE, BadRequestError, ZbkError

Handler = Callable[[argparse.Namespace], Any]
COMMANDS: dict[str, tuple[Handler, str]] = {}


def command(name: str, help_: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        COMMANDS[name] = (fn, help_)
        return fn
    return deco


def _uri(args: argparse.Namespace) -> str:
    if not args.metadata:
        raise BadRequestError("this command needs --metadata URI")
    return str(args.metadata)


def _store(args: argparse.Namespace) -> Any:
    from zbk.metadata.uri import open_store

    return open_store(_uri(args))


def _client_config(args: argparse.Namespace) -> Any:
    """The ClientConfig of ``--set key=value`` (e.g. the CURVE keys for bookies that need them)."""
    from zbk.config import ClientConfig, load

    return load(ClientConfig, overrides=args.set).validate()


def _connect(args: argparse.Namespace, bookie: str) -> Any:
    """A raw connection to one bookie, with this shell's CURVE keys if any."""
    from zbk.client.raw import BookieConnection
    from zbk.wire.curve import CurveClient

    return BookieConnection(bookie, timeout_s=args.timeout, curve=CurveClient.from_config(_client_config(args)))


def _out(args: argparse.Namespace, data: Any, table: Callable[[Any], str] | None = None) -> None:
    if args.json or table is None:
        print(json.dumps(data, indent=None if args.json else 2, default=_jsonable))
    else:
        print(table(data))


def _jsonable(v: Any) -> Any:
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        try:
            return b.decode()
        except UnicodeDecodeError:
            return b.hex()
    if isinstance(v, tuple):
        return list(v)
    raise TypeError(type(v).__name__)


def _rows(headers: list[str], rows: list[list[Any]]) -> str:
    cells = [headers] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- metadata commands ------------------------------------------------------------------------
@command("listbookies", "list writable (or --readonly) bookies")
def _listbookies(args: argparse.Namespace) -> None:
    from zbk.metadata.registry import list_bookies

    regs = list_bookies(_store(args), readonly=args.readonly)
    data = [{"id": r.bookie_id, "state": r.state, "rack": r.rack, "http": r.http_url} for r in regs]
    _out(args, data, lambda d: _rows(["bookie", "state", "rack", "http"],
                                     [[x["id"], x["state"], x["rack"], x["http"]] for x in d]))


@command("listledgers", "list ledger ids")
def _listledgers(args: argparse.Namespace) -> None:
    from zbk.metadata.registry import LedgerStore

    ids = list(LedgerStore(_store(args)).list_ids())
    _out(args, ids, lambda d: "\n".join(str(i) for i in d) or "(no ledgers)")


def _md_dict(md: Any, version: int) -> dict[str, Any]:
    return {"ledger_id": md.ledger_id, "state": md.state, "ensemble_size": md.ensemble_size,
            "write_quorum": md.write_quorum, "ack_quorum": md.ack_quorum, "digest": md.digest,
            "last_entry_id": md.last_entry_id, "length": md.length,
            "ensembles": {str(k): v for k, v in md.ensembles.items()},
            "custom_metadata": {k: _jsonable(v) for k, v in md.custom_metadata.items()},
            "ctime_ms": md.ctime_ms, "version": version}


@command("ledgermetadata", "show one ledger's metadata")
def _ledgermetadata(args: argparse.Namespace) -> None:
    from zbk.metadata.registry import LedgerStore

    md, version = LedgerStore(_store(args)).read(_lid(args))
    _out(args, _md_dict(md, version))


@command("deleteledger", "delete a ledger's metadata (bookies reclaim its space by GC)")
def _deleteledger(args: argparse.Namespace) -> None:
    from zbk.metadata.registry import LedgerStore

    lid = _lid(args)
    LedgerStore(_store(args)).delete(lid)
    _out(args, {"deleted": lid}, lambda d: f"ledger {d['deleted']} deleted")


@command("instanceid", "show the cluster instance id")
def _instanceid(args: argparse.Namespace) -> None:
    from zbk.metadata.registry import get_or_create_instance_id

    _out(args, {"instance_id": get_or_create_instance_id(_store(args))}, lambda d: d["instance_id"])


@command("cookie", "cookie get|fix BOOKIE: show a bookie's cookie, or mark it for fixing")
def _cookie(args: argparse.Namespace) -> None:
    from zbk.metadata.registry import read_cookie

    if len(args.rest) != 2 or args.rest[0] not in ("get", "fix"):
        raise BadRequestError("usage: cookie get|fix BOOKIE")
    verb, bookie = args.rest
    store = _store(args)
    found = read_cookie(store, bookie)
    if verb == "get":
        if found is None:
            raise ZbkError(f"no cookie for bookie {bookie}")
        c, version = found
        _out(args, {"bookie_id": c.bookie_id, "instance_id": c.instance_id, "journal_dirs": c.journal_dirs,
                    "ledger_dirs": c.ledger_dirs, "index_dirs": c.index_dirs, "incarnation": c.incarnation,
                    "version": version})
        return
    # fix: drop the metadata copy; the bookie's next boot sees a mismatch-free fresh cookie
    # only with its directories' copies removed too, so it runs BP-46 phase one. We remove
    # the metadata copy and tell the operator to start the bookie with auto_fix_cookie.
    from zbk.metadata.registry import delete_cookie

    if found is not None:
        delete_cookie(store, bookie, found[1])
    _out(args, {"bookie_id": bookie, "fixed": True},
         lambda d: f"cookie of {bookie} removed from metadata; start the bookie with "
                   "--set auto_fix_cookie=true to rewrite it (BP-46 phase one fences and limbos its open ledgers)")


# -- auto-recovery ----------------------------------------------------------------------------
@command("listunderreplicated", "ledgers marked under-replicated, with their missing replicas")
def _listunderreplicated(args: argparse.Namespace) -> None:
    from zbk.recovery.underreplication import UnderReplicationRegistry

    registry = UnderReplicationRegistry(_store(args), "zbk-shell")
    marks = [m.as_json() for m in registry.list()]
    repairs = [m.as_json() for m in registry.list_repairs()]
    if args.json:  # the marks, as always; in-place repairs (limbo, damaged replicas) with --repairs
        _out(args, repairs if args.repairs else marks)
        return
    text = _rows(["ledger", "missing replicas"], [[m["ledger_id"], ", ".join(m["missing_bookies"])] for m in marks]) \
        if marks else "(no under-replicated ledgers)"
    if repairs:
        text += "\n\nin-place repairs pending:\n" + _rows(
            ["ledger", "bookie", "why", "detail"], [[r["ledger_id"], r["bookie"], r["why"], r["detail"]] for r in repairs])
    print(text)


@command("whoisauditor", "the auto-recovery process that is the auditor now")
def _whoisauditor(args: argparse.Namespace) -> int:
    from zbk.metadata.coordination import current_leader

    leader = current_leader(_store(args))
    _out(args, {"auditor": leader}, lambda d: d["auditor"] or "(no auditor)")
    return EXIT_OK if leader else EXIT_FAILED


@command("lostbookierecoverydelay", "lostbookierecoverydelay [SECONDS]: show or set the audit delay")
def _lostbookierecoverydelay(args: argparse.Namespace) -> None:
    from zbk.recovery.underreplication import get_recovery_delay, set_recovery_delay

    store = _store(args)
    if args.rest:
        seconds = float(_int(_one(args, "[SECONDS]")))
        if seconds < 0:
            raise BadRequestError("the delay must be >= 0 seconds")
        set_recovery_delay(store, seconds)
    _out(args, {"lost_bookie_recovery_delay_s": get_recovery_delay(store)},
         lambda d: f"{d['lost_bookie_recovery_delay_s']:g} s")


@command("triggeraudit", "run the auditor's periodic check of all ledgers now")
def _triggeraudit(args: argparse.Namespace) -> int:
    import time

    from zbk.metadata import layout
    from zbk.metadata.coordination import current_leader

    store = _store(args)
    store.put(layout.AUDITOR_TRIGGER, str(int(time.time() * 1000)).encode("ascii"))
    leader = current_leader(store)
    _out(args, {"triggered": True, "auditor": leader},
         lambda d: f"audit triggered; auditor {d['auditor']} runs it now" if d["auditor"]
         else "audit triggered, but no auditor is running: it runs when one is elected")
    return EXIT_OK if leader else EXIT_FAILED


@command("recover", "recover BOOKIE: decommission: re-replicate everything BOOKIE holds elsewhere")
def _recover(args: argparse.Namespace) -> int:
    import asyncio

    from zbk.client.bookkeeper import ClientContext
    from zbk.metadata.coordination import LeaseKeeper
    from zbk.recovery.decommission import decommission
    from zbk.recovery.underreplication import UnderReplicationRegistry

    bookie = _one(args, "recover BOOKIE")
    config = _client_config(args)
    store = _store(args)
    keeper = LeaseKeeper(store, 10)
    lease = keeper.start()

    async def run() -> Any:
        ctx = ClientContext.over_zmq(store, config)
        try:
            return await decommission(ctx, UnderReplicationRegistry(store, f"zbk-shell-recover-{bookie}"), lease,
                                      bookie, progress=lambda d, t, what: _progress(args, d, t, what))
        finally:
            await ctx.transport.close()
    try:
        rep = asyncio.run(run())
    finally:
        keeper.stop(revoke=True)
    data = {"bookie": bookie, "ledgers": len(rep.ledgers), "recovered_open_ledgers": rep.recovered_open,
            "entries_copied": rep.entries_copied, "bytes_copied": rep.bytes_copied,
            "seconds": round(rep.seconds, 2), "still_named_by": rep.still_named_by,
            "safe_to_remove": rep.safe_to_remove}
    _out(args, data, lambda d: (
        f"{d['bookie']}: {d['ledgers']} ledger(s) moved, {d['entries_copied']:,} entries "
        f"({d['bytes_copied'] / 1e6:.1f} MB) copied in {d['seconds']} s; "
        + (f"closed {len(d['recovered_open_ledgers'])} open ledger(s) first; " if d["recovered_open_ledgers"] else "")
        + ("SAFE TO REMOVE" if d["safe_to_remove"] else f"NOT safe to remove: still named by {d['still_named_by']}")))
    return EXIT_OK if rep.safe_to_remove else EXIT_FAILED


# -- commands through the client ------------------------------------------------------------
def _progress(args: argparse.Namespace, done: int, total: int, what: str) -> None:
    """A progress bar on stderr for long work (only on a terminal, never in --json)."""
    if args.json or not sys.stderr.isatty() or total <= 0:
        return
    width = 30
    filled = int(width * done / total)
    end = "\n" if done >= total else ""
    print(f"\r{what} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end=end, file=sys.stderr, flush=True)


@command("readledger", "readledger LID [--first N --last M]: entries of a ledger (no recovery, no fencing)")
def _readledger(args: argparse.Namespace) -> int:
    import zbk

    lid = _lid(args)
    with zbk.BookKeeper(_uri(args), config=_client_config(args)) as bk:
        rh = bk.open_ledger(lid, password=args.password.encode(), recovery=False)
        last = rh.last_add_confirmed if args.last is None else args.last
        first = args.first or 0
        rows = []
        if last >= first:
            for e in rh.read(first, last):
                rows.append({"entry_id": e.entry_id, "bytes": len(e.payload), "payload": e.payload})
                _progress(args, e.entry_id - first + 1, last - first + 1, f"ledger {lid}")
    _out(args, rows, lambda rs: "\n".join(f"{r['entry_id']}\t{_jsonable(r['payload'][:80])}" for r in rs)
         or "(no confirmed entries)")
    return EXIT_OK


@command("simpletest", "simpletest [--ensemble --write-quorum --ack-quorum --entries N]: write, read back, delete")
def _simpletest(args: argparse.Namespace) -> int:
    import os
    import time

    import zbk

    n = args.entries
    with zbk.BookKeeper(_uri(args), config=_client_config(args)) as bk:
        lh = bk.create_ledger(args.ensemble, args.write_quorum, args.ack_quorum, password=b"simpletest")
        payloads = [os.urandom(1024) for _ in range(min(n, 64))]
        t0 = time.perf_counter()
        futs = []
        for i in range(n):
            futs.append(lh.append_async(payloads[i % len(payloads)]))
        for i, f in enumerate(futs):
            f.result()
            if i % 100 == 0 or i == n - 1:
                _progress(args, i + 1, n, "writing")
        wrote = time.perf_counter() - t0
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, password=b"simpletest")
        t0 = time.perf_counter()
        bad = sum(1 for e in rh.read(0, n - 1) if e.payload != payloads[e.entry_id % len(payloads)]) if n else 0
        read = time.perf_counter() - t0
        ensemble = rh.metadata.ensembles
        bk.delete_ledger(lh.ledger_id)
    ok = bad == 0
    _out(args, {"ledger_id": lh.ledger_id, "entries": n, "ensembles": {str(k): v for k, v in ensemble.items()},
                "write_entries_per_s": round(n / wrote) if wrote else 0, "read_entries_per_s": round(n / read) if read else 0,
                "mismatches": bad, "ok": ok},
         lambda d: (f"simpletest {'OK' if d['ok'] else 'FAILED'}: ledger {d['ledger_id']}, {d['entries']} entries on "
                    f"{d['ensembles']}; write {d['write_entries_per_s']:,}/s, read {d['read_entries_per_s']:,}/s"
                    + (f", {d['mismatches']} mismatches" if d["mismatches"] else "")))
    return EXIT_OK if ok else EXIT_FAILED


# -- commands against one bookie -----------------------------------------------------------
@command("bookieinfo", "bookieinfo B: a bookie's state, space and ledger counts")
def _bookieinfo(args: argparse.Namespace) -> None:
    from zbk.wire import messages as w

    bookie = _one(args, "bookieinfo BOOKIE")
    with _connect(args, bookie) as c:
        r = c.call(w.BookieInfoRequest(rid=c.next_rid()))
    _out(args, {"bookie_id": bookie, "state": r.state, "free_bytes": r.free_bytes, "total_bytes": r.total_bytes,
                "ledgers": r.ledgers, "limbo_ledgers": r.limbo_ledgers})


@command("readentry", "readentry --bookie B LID EID: one bookie's answer for one entry")
def _readentry(args: argparse.Namespace) -> int:
    from zbk.wire import messages as w
    from zbk.wire.entry import peek_entry_header

    if not args.bookie or len(args.rest) != 2:
        raise BadRequestError("usage: readentry --bookie B LID EID")
    lid, eid = (_int(x) for x in args.rest)
    with _connect(args, args.bookie) as c:
        r = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=lid, first_entry_id=eid))
    data: dict[str, Any] = {"bookie": args.bookie, "ledger_id": lid, "entry_id": eid, "status": r.status.name,
                            "lac": r.lac}
    if r.entries:
        blob = bytes(r.entries[0])
        data["entry_lac"] = peek_entry_header(blob)[2]
        data["bytes"] = len(blob)
        data["blob_hex"] = blob.hex() if args.json else blob[:64].hex() + ("..." if len(blob) > 64 else "")
    _out(args, data)
    return EXIT_OK if r.entries else EXIT_FAILED


@command("ledgerentries", "ledgerentries --bookie B LID: entry ids one bookie holds")
def _ledgerentries(args: argparse.Namespace) -> int:
    from zbk.wire import messages as w

    if not args.bookie or len(args.rest) != 1:
        raise BadRequestError("usage: ledgerentries --bookie B LID")
    lid = _int(args.rest[0])
    with _connect(args, args.bookie) as c:
        r = c.call(w.ListEntriesRequest(rid=c.next_rid(), ledger_id=lid))
    _out(args, {"bookie": args.bookie, "ledger_id": lid, "status": r.status.name,
                "ranges": [list(x) for x in r.entry_ranges]},
         lambda d: f"{d['status']}: " + (", ".join(f"{a}-{b}" if a != b else str(a) for a, b in d["ranges"]) or "none"))
    return EXIT_OK if r.status == 0 else EXIT_FAILED


# -- offline tools ----------------------------------------------------------------------------
@command("readjournal", "offline: list the journal records of --data-dir")
def _readjournal(args: argparse.Namespace) -> None:
    import os

    from zbk.storage.journal import replay
    from zbk.storage.markers import read_last_mark

    d = _data_dir(args)
    mark = read_last_mark(os.path.join(d, "index"))
    out = []
    for rec, m in replay(os.path.join(d, "journal"), mark):
        out.append({"type": rec.type.name, "ledger_id": rec.ledger_id, "entry_id": rec.entry_id,
                    "bytes": len(rec.payload), "mark": list(m)})
    _out(args, out, lambda rows: _rows(["type", "ledger", "entry", "bytes", "mark"],
                                       [[r["type"], r["ledger_id"], r["entry_id"], r["bytes"], r["mark"]] for r in rows]))


@command("readlog", "offline: readlog LOGID: the records of one entry log of --data-dir")
def _readlog(args: argparse.Namespace) -> None:
    import os

    from zbk.storage.entrylog import list_logs, scan_file

    d = _data_dir(args)
    log_id = _int(_one(args, "readlog LOGID"))
    path = list_logs(os.path.join(d, "ledgers")).get(log_id)
    if path is None:
        raise ZbkError(f"no entry log {log_id} in {d}/ledgers")
    rows = [{"ledger_id": lid, "entry_id": eid, "location": loc, "bytes": len(blob)}
            for lid, eid, loc, blob in scan_file(path)]
    _out(args, rows, lambda rs: _rows(["ledger", "entry", "location", "bytes"],
                                      [[r["ledger_id"], r["entry_id"], r["location"], r["bytes"]] for r in rs]))


@command("lastmark", "offline: the last checkpointed journal mark of --data-dir")
def _lastmark(args: argparse.Namespace) -> None:
    import os

    from zbk.storage.markers import read_last_mark

    mark = read_last_mark(os.path.join(_data_dir(args), "index"))
    _out(args, {"segment_id": mark.segment_id, "offset": mark.offset}, lambda d: f"{d['segment_id']}:{d['offset']}")


# -- plumbing ---------------------------------------------------------------------------------
def _data_dir(args: argparse.Namespace) -> str:
    if not args.data_dir:
        raise BadRequestError("offline tools need --data-dir DIR")
    return str(args.data_dir)


def _int(s: str) -> int:
    try:
        return int(s)
    except ValueError:
        raise BadRequestError(f"expected a number, got {s!r}") from None


def _lid(args: argparse.Namespace) -> int:
    return _int(_one(args, "LID"))


def _one(args: argparse.Namespace, usage: str) -> str:
    if len(args.rest) != 1:
        raise BadRequestError(f"usage: {args.shell_command} {usage}")
    return str(args.rest[0])


def _run(args: argparse.Namespace) -> int:
    entry = COMMANDS.get(args.shell_command)
    if entry is None:
        print(f"zbk shell: unknown command {args.shell_command!r}; commands: {', '.join(sorted(COMMANDS))}",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        result = entry[0](args)
    except ZbkError as e:
        print(f"zbk shell {args.shell_command}: {e.code}: {e}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        print(f"zbk shell {args.shell_command}: {e}", file=sys.stderr)
        return EXIT_UNREACHABLE
    return int(result or EXIT_OK)


def add_parser(sub: Any) -> None:
    helps = "\n".join(f"  {name:<16} {h}" for name, (_, h) in sorted(COMMANDS.items()))
    p = sub.add_parser("shell", help="admin commands", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="commands:\n" + helps)
    p.add_argument("--metadata", help="metadata URI")
    p.add_argument("--data-dir", help="a bookie's data directory (offline tools)")
    p.add_argument("--bookie", help="bookie id host:port (readentry, ledgerentries)")
    p.add_argument("--readonly", action="store_true", help="listbookies: read-only bookies")
    p.add_argument("--repairs", action="store_true",
                   help="listunderreplicated --json: the in-place repairs (limbo, damaged replicas) instead")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for a bookie")
    p.add_argument("--first", type=int, help="readledger: first entry id")
    p.add_argument("--last", type=int, help="readledger: last entry id (default: the LAC)")
    p.add_argument("--password", default="", help="readledger: the ledger password")
    p.add_argument("--ensemble", type=int, default=3, help="simpletest: ensemble size")
    p.add_argument("--write-quorum", type=int, default=2, help="simpletest: write quorum")
    p.add_argument("--ack-quorum", type=int, default=2, help="simpletest: ack quorum")
    p.add_argument("--entries", type=int, default=1000, help="simpletest: entries to write")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="client setting (ClientConfig names), e.g. curve_secret_key_file=PATH "
                        "curve_server_public_key_file=PATH for bookies that require CURVE")
    p.add_argument("shell_command", metavar="COMMAND")
    p.add_argument("rest", nargs="*", metavar="ARG")
    p.set_defaults(func=_run)
