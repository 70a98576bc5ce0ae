"""`zbk shell ledgermetadata LID [--dump FILE | --restore FILE]`.

Dump file (JSON, format 1), written with mode 0600 because it holds the ledger password
(auto-recovery needs it in metadata, so a faithful copy must too)::

    {"zbk_ledger_metadata": 1,          format of this file
     "ledger_id": 42,                   the ledger it was dumped from
     "version": 1234,                   the metadata's version (CAS token) at the dump
     "metadata": {"state": "CLOSED", "ensemble_size": 3, "write_quorum": 2, "ack_quorum": 2,
                  "digest": "crc32c", "last_entry_id": 99, "length": 4096,
                  "fragments": [[0, ["127.0.0.1:3181", ...]], ...],
                  "custom_metadata_hex": {"key": "hex of the value bytes"},
                  "password_hex": "...", "ctime_ms": 0, "creator_token_hex": "..."}}

Restore writes the file's metadata back with a version check, so that it never silently
overwrites a change it has not seen:

* the ledger is absent (deleted since): it is created; a concurrent create wins and the
  restore fails with KEY_EXISTS;
* it exists: the write is a compare-and-set against the file's ``version``, so it succeeds
  only if nothing changed the ledger since the dump (dump, edit, restore). ``--any-version``
  sets against the version read just before the write instead (restoring a backup over a
  ledger that changed), which still fails if the ledger changes in between.

A file dumped from another ledger is refused unless ``--allow-other-ledger``; its version
means nothing for this ledger, so an existing ledger is then overwritten only with
``--any-version``. A malformed file is BAD_REQUEST (exit code 2), a refusal
OPERATION_REFUSED, a lost compare-and-set METADATA_VERSION (exit code 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
from typing import Any

from zbk.cli.shell.common import command, ledger_id, open_metadata, out
from zbk.errors import BadRequestError, MetadataVersionError, OperationRefusedError

FILE_FORMAT = 1
_FORMAT_KEY = "zbk_ledger_metadata"


def _args(p: argparse.ArgumentParser) -> None:
    p.add_argument("ledger_id", type=ledger_id, metavar="LID", help="ledger id")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--dump", metavar="FILE", help="write the metadata to FILE (JSON, mode 0600: it holds the password)")
    what.add_argument("--restore", metavar="FILE", help="write the metadata in FILE back, with a version check")
    p.add_argument("--allow-other-ledger", action="store_true",
                   help="--restore: accept a file dumped from another ledger")
    p.add_argument("--any-version", action="store_true",
                   help="--restore: overwrite the ledger whatever its version now (default: only if unchanged since the dump)")


@command("ledgermetadata", group="cluster metadata", summary="one ledger's metadata; --dump FILE, --restore FILE",
         usage="LID --metadata URI [--dump FILE | --restore FILE [--any-version] [--allow-other-ledger]]",
         example="zbk shell ledgermetadata 42 --metadata sqlite:///var/zbk/meta.db --dump ledger-42.json",
         needs="metadata", configure=_args)
def _ledgermetadata(args: argparse.Namespace) -> None:
    from zbk.metadata.registry import LedgerStore

    if (args.allow_other_ledger or args.any_version) and not args.restore:
        raise BadRequestError("--allow-other-ledger and --any-version go with --restore FILE")
    store = open_metadata(args)
    if args.restore:
        out(args, restore(store, args.ledger_id, args.restore, allow_other_ledger=args.allow_other_ledger,
                          any_version=args.any_version),
            lambda d: f"ledger {d['ledger_id']} {'created' if d['created'] else 'restored'} from {d['restored_from']} "
                      f"(version {d['version']})")
        return
    md, version = LedgerStore(store).read(args.ledger_id)
    if args.dump:
        write_dump(args.dump, document(md, version))
        out(args, {"ledger_id": md.ledger_id, "dumped_to": args.dump, "version": version},
            lambda d: f"ledger {d['ledger_id']} (version {d['version']}) dumped to {d['dumped_to']}")
        return
    out(args, md.as_json(version))


def document(md: Any, version: int) -> dict[str, Any]:
    return {_FORMAT_KEY: FILE_FORMAT, "ledger_id": md.ledger_id, "version": version, "metadata": {
        "state": md.state, "ensemble_size": md.ensemble_size, "write_quorum": md.write_quorum,
        "ack_quorum": md.ack_quorum, "digest": md.digest, "last_entry_id": md.last_entry_id, "length": md.length,
        "fragments": [[first, list(bookies)] for first, bookies in md.fragments],
        "custom_metadata_hex": {k: v.hex() for k, v in md.custom_metadata.items()},
        "password_hex": md.password.hex(), "ctime_ms": md.ctime_ms, "creator_token_hex": md.creator_token.hex()}}


def write_dump(path: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` to ``path`` atomically (a temporary file renamed over it), mode 0600."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".zbk-dump-", dir=directory)  # mkstemp creates it 0600
    except OSError as e:
        raise BadRequestError(f"cannot write {path}: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def read_dump(path: str) -> tuple[Any, int, int]:
    """(metadata, ledger id, version) of a dump file; BadRequestError if it is not one."""
    from zbk.metadata.ledger import LedgerMetadata

    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise BadRequestError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise BadRequestError(f"{path} is not JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get(_FORMAT_KEY) != FILE_FORMAT:
        raise BadRequestError(f"{path} is not a ledger metadata dump of format {FILE_FORMAT} "
                              f"(made by `zbk shell ledgermetadata LID --dump FILE`)")
    try:
        m = doc["metadata"]
        lid, version = _int(doc["ledger_id"]), _int(doc["version"])
        md = LedgerMetadata(
            ledger_id=lid, ensemble_size=_int(m["ensemble_size"]), write_quorum=_int(m["write_quorum"]),
            ack_quorum=_int(m["ack_quorum"]), digest=_str(m["digest"]), password=bytes.fromhex(m["password_hex"]),
            state=_str(m["state"]), last_entry_id=_int(m["last_entry_id"]), length=_int(m["length"]),
            fragments=tuple((_int(first), tuple(_str(b) for b in bookies)) for first, bookies in m["fragments"]),
            custom_metadata={_str(k): bytes.fromhex(v) for k, v in m["custom_metadata_hex"].items()},
            ctime_ms=_int(m["ctime_ms"]), creator_token=bytes.fromhex(m["creator_token_hex"]))
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise BadRequestError(f"{path}: malformed ledger metadata dump ({e!r})") from None
    md.validate()  # BadRequestError naming what is out of range
    return md, lid, version


def _int(v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        raise TypeError(f"expected a number, got {v!r}")
    return v


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected text, got {v!r}")
    return v


def restore(store: Any, lid: int, path: str, *, allow_other_ledger: bool = False,
            any_version: bool = False) -> dict[str, Any]:
    """Write the dump in ``path`` to ledger ``lid`` (rules in the module docstring)."""
    from zbk.metadata import layout

    md, dumped_id, dumped_version = read_dump(path)
    if dumped_id != lid and not allow_other_ledger:
        raise OperationRefusedError(f"{path} holds ledger {dumped_id}, not {lid}; "
                                    "pass --allow-other-ledger to restore it as ledger " + str(lid))
    md = dataclasses.replace(md, ledger_id=lid)
    data = md.encode()
    key = layout.ledger_key(lid)
    current = store.get(key)
    if current is None:
        version = store.create(key, data)  # KeyExistsError if created meanwhile
        return {"ledger_id": lid, "restored_from": path, "version": version, "created": True}
    if any_version:
        expected = current.version
    elif dumped_id != lid:
        raise OperationRefusedError(f"ledger {lid} exists and {path} was dumped from ledger {dumped_id}, whose "
                                    "version says nothing about this one; pass --any-version to overwrite it")
    else:
        expected = dumped_version
    try:
        version = store.cas(key, data, expected)
    except MetadataVersionError:
        if any_version:
            raise MetadataVersionError(f"ledger {lid} changed while it was being restored; try again") from None
        raise MetadataVersionError(
            f"ledger {lid} changed since the dump (version {current.version} now, {dumped_version} in {path}); "
            "dump it again, or pass --any-version to overwrite it anyway") from None
    return {"ledger_id": lid, "restored_from": path, "version": version, "created": False}
