"""Shell commands that create or destroy: a cluster's metadata, a bookie's data.

``bookieformat`` wipes a stopped bookie's directories and its cookie, so that it boots
again as a new, empty bookie (the cookie check at boot, zbk/bookie/boot.py, sees a
brand-new bookie when neither its directories nor the metadata hold a cookie). Order of
the steps, so that an interrupted format can simply be run again: the cookie in metadata
goes first (the local copies still name the bookie for the next run), then the data
files, then the local cookies.
"""

from __future__ import annotations

import argparse
import os
import shutil
from typing import Any

from zbk.cli.shell.common import command, open_metadata, out, size_text
from zbk.cli.shell.offline import BookieDirs, bookie_dirs
from zbk.errors import BookieIOError, CorruptDataError, OperationRefusedError

GROUP = "cluster metadata"
_EXAMPLE_URI = "--metadata sqlite:///var/zbk/meta.db"


@command("initnewcluster", group=GROUP, summary="create a new cluster's metadata (refused if one exists)",
         usage="--metadata URI", example=f"zbk shell initnewcluster {_EXAMPLE_URI}", needs="metadata")
def _initnewcluster(args: argparse.Namespace) -> None:
    from zbk.metadata.cluster import init_new_cluster

    store = open_metadata(args)
    instance_id = init_new_cluster(store)
    out(args, {"initialized": True, "metadata": store.uri, "instance_id": instance_id},
        lambda d: f"new cluster {d['instance_id']} in {d['metadata']}")


def _nuke_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="delete without checking the instance id")
    p.add_argument("--instanceid", metavar="ID", help="delete only if the cluster's instance id is ID")


@command("nukeexistingcluster", group=GROUP,
         summary="delete all of a cluster's metadata (needs --force or --instanceid; refused while bookies run)",
         usage="--metadata URI --force | --instanceid ID", example=f"zbk shell nukeexistingcluster {_EXAMPLE_URI} --force",
         needs="metadata", configure=_nuke_args)
def _nukeexistingcluster(args: argparse.Namespace) -> None:
    from zbk.metadata.cluster import nuke_cluster

    store = open_metadata(args)
    deleted = nuke_cluster(store, force=args.force, instance_id=args.instanceid)
    out(args, {"nuked": True, "metadata": store.uri, "keys_deleted": deleted},
        lambda d: f"cluster in {d['metadata']} nuked: {d['keys_deleted']} keys deleted")


def _format_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--force", action="store_true", help="really wipe (without it, nothing changes)")


@command("bookieformat", group="offline (a stopped bookie)",
         summary="wipe a stopped bookie's data and its cookie (needs --force; refused while it is registered)",
         usage="--data-dir DIR --metadata URI --force",
         example=f"zbk shell bookieformat --data-dir /var/zbk/bookie-1 {_EXAMPLE_URI} --force", needs="both",
         configure=_format_args)
def _bookieformat(args: argparse.Namespace) -> None:
    from zbk.metadata import layout
    from zbk.metadata.registry import delete_cookie, read_cookie

    dirs = bookie_dirs(args.data_dir)
    local = _local_cookie(dirs)
    bookie = local.bookie_id if local is not None else None
    files, size = _inventory(dirs)
    if not args.force:
        raise OperationRefusedError(
            f"bookieformat wipes {files} files ({size_text(size)}) in {', '.join(dirs.all())}"
            + (f" and the cookie of bookie {bookie} in metadata" if bookie else "") + "; pass --force to do it")
    store = open_metadata(args)
    cookie_state = "no local cookie: the bookie id is unknown, metadata untouched"
    if bookie is not None:
        for key in (layout.writable_key(bookie), layout.readonly_key(bookie)):
            if store.get(key) is not None:
                raise OperationRefusedError(f"bookie {bookie} is registered ({key}): it is running, or died less "
                                            "than its registration TTL ago; stop it first. Nothing was changed")
        found = read_cookie(store, bookie)
        if found is None:
            cookie_state = "absent"
        elif local is not None and found[0].incarnation != local.incarnation:
            # Another incarnation of this id (the directories were copied, or re-formatted
            # elsewhere): its cookie is not this disk's to delete.
            cookie_state = f"kept: it belongs to incarnation {found[0].incarnation}, not this disk's"
        else:
            delete_cookie(store, bookie, found[1])
            cookie_state = "deleted"
    _wipe(dirs.all())
    out(args, {"bookie_id": bookie, "wiped_dirs": dirs.all(), "files_removed": files, "bytes_removed": size,
               "metadata_cookie": cookie_state, "missing_dirs": dirs.missing},
        lambda d: f"bookie {d['bookie_id'] or '(unknown id)'}: {d['files_removed']} files "
                  f"({size_text(d['bytes_removed'])}) removed; cookie in metadata: {d['metadata_cookie']}"
                  + (f"; not found, so not wiped: {', '.join(d['missing_dirs'])}" if d["missing_dirs"] else ""))


def _local_cookie(dirs: BookieDirs) -> Any:
    """The cookie the bookie's directories hold; OperationRefusedError if they name different
    bookies (mixed-up disks: wiping them by one id would leave the other's state behind)."""
    from zbk.storage.cookie import read_cookie

    found = {}
    for d in dirs.all():
        try:
            c = read_cookie(d) if os.path.isdir(d) else None
        except CorruptDataError:
            continue  # damaged: it is wiped with the rest
        if c is not None:
            found[c.bookie_id] = c
    if len(found) > 1:
        raise OperationRefusedError(f"the directories hold cookies of different bookies ({', '.join(sorted(found))}); "
                                    "format each bookie's own directories")
    return next(iter(found.values()), None)


def _inventory(dirs: BookieDirs) -> tuple[int, int]:
    files = size = 0
    for d in dirs.all():
        for root, _, names in os.walk(d):
            for name in names:
                try:
                    size += os.lstat(os.path.join(root, name)).st_size
                except FileNotFoundError:
                    continue
                files += 1
    return files, size


def _wipe(dirs: list[str]) -> None:
    """Empty each directory (keep it: it may be a mount point), the cookies last."""
    try:
        _empty(dirs)
    except OSError as e:  # permissions, a read-only mount: what is left is named, run it again once fixed
        raise BookieIOError(f"wiping failed: {e}; the rest is left as it was, run bookieformat again") from None


def _empty(dirs: list[str]) -> None:
    from zbk.storage.cookie import COOKIE_FILE

    for d in dirs:
        if not os.path.isdir(d):
            continue
        for entry in os.scandir(d):
            if entry.name == COOKIE_FILE:
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
    for d in dirs:
        try:
            os.unlink(os.path.join(d, COOKIE_FILE))
        except FileNotFoundError:
            pass
