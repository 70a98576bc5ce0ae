"""Step 1 of a bookie's boot: its directories and cookies (ARCHITECTURE.md "Boot sequence").

Every directory holds a copy of the cookie (zbk/storage/cookie.py) and the metadata store
holds one at ``cookies/<bookie id>``. They must agree with each other and with the
configured directories; a mismatch refuses the boot (CookieMismatchError, exit code 4)
unless ``auto_fix_cookie``, which rewrites them all and makes the boot run BP-46 phase one.

Journal directories
    Ledgers map to journals by position (``ledger_id % len(journal_dirs)``,
    zbk/actors/journals.py), and each journal's last mark is kept under its position
    (zbk/storage/markers.py). So the configured journal directories must begin with the
    cookie's, in the cookie's order: removing or reordering one is refused whatever
    ``auto_fix_cookie`` says (a reordered list would replay one journal from another's
    mark). A directory appended to the list is new to the bookie and must hold no journal
    data: it is refused unless it is empty (a ``lost+found`` of a mount point aside).

Expansion (BookKeeper's ``bookie expandstorage``)
    Appending empty journal directories to a bookie whose cookies otherwise all agree is
    accepted without ``auto_fix_cookie`` and without phase one: the cookie, with the same
    incarnation and the longer journal list, is written into every directory, then into the
    metadata store (compare-and-swap on the version read). Until the metadata holds it, a
    crashed expansion is simply done again at the next boot: a directory may then hold
    either cookie, the old or the expanded one. Boot replays every journal and checkpoints
    before any request is served, so the ledgers that now map to the new journal have no
    records left to replay in the old one (zbk/bookie/replay.py).
    Only journal directories expand this way; a changed ledger or index directory is a
    mismatch as before.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import uuid
from collections.abc import Sequence

from zbk.bookie.overrepsource import record_cookie_fix
from zbk.config import BookieConfig
from zbk.errors import CookieMismatchError
from zbk.metadata import layout
from zbk.metadata.registry import get_or_create_instance_id
from zbk.metadata.store import MetadataStore
from zbk.storage import cookie as cookies

log = logging.getLogger("zbk.bookie.boot")

# What a directory new to the bookie may hold: a mount point's lost+found, and a cookie
# written by an expansion that crashed before it reached the metadata store.
_NEW_DIR_ALLOWED = {"lost+found", cookies.COOKIE_FILE}


def all_dirs(cfg: BookieConfig) -> list[str]:
    """Every directory of the bookie, each once: journals, then ledgers, then indexes."""
    return list(dict.fromkeys([*cfg.journal_dirs, *cfg.ledger_dirs, *cfg.index_dirs]))


def added_journal_dirs(recorded: Sequence[str], configured: Sequence[str]) -> list[str]:
    """The journal directories that ``configured`` appends to ``recorded`` (the cookie's).
    CookieMismatchError when it drops any of them or changes their order."""
    recorded, configured = tuple(recorded), tuple(configured)
    if configured[:len(recorded)] == recorded:
        return list(configured[len(recorded):])
    removed = [d for d in recorded if d not in configured]
    what = (f"journal directories {removed} were removed" if removed
            else f"journal directories were reordered (the cookie has {list(recorded)})")
    raise CookieMismatchError(f"{what}: ledgers map to journals by position, so journal directories can only be "
                              f"added at the end of journal_dirs, never removed or reordered; configured: "
                              f"{list(configured)}")


def check_new_journal_dir(directory: str) -> None:
    """CookieMismatchError unless ``directory`` holds nothing a journal could replay."""
    try:
        names = set(os.listdir(directory))
    except FileNotFoundError:
        return
    other = sorted(names - _NEW_DIR_ALLOWED)
    if other:
        shown = ", ".join(other[:5]) + (", ..." if len(other) > 5 else "")
        raise CookieMismatchError(f"journal directory {directory} is new to this bookie but not empty ({shown}): "
                                  "an added journal directory must be empty")


def same_identity(a: cookies.Cookie, b: cookies.Cookie, *, check_incarnation: bool = True) -> bool:
    same = (a.bookie_id == b.bookie_id and a.instance_id == b.instance_id
            and tuple(a.journal_dirs) == tuple(b.journal_dirs) and tuple(a.ledger_dirs) == tuple(b.ledger_dirs)
            and tuple(a.index_dirs) == tuple(b.index_dirs))
    return same and (not check_incarnation or a.incarnation == b.incarnation)


def check_cookies(cfg: BookieConfig, store: MetadataStore) -> bool:
    """Validate (and write where this module says so) the cookies. Returns True when phase
    one is needed (cookie fixed, or brand-new directories); raises CookieMismatchError."""
    instance_id = get_or_create_instance_id(store)
    stored = store.get(layout.cookie_key(cfg.bookie_id))
    dirs = all_dirs(cfg)
    local = {d: cookies.read_cookie(d) for d in dirs}
    expected = cookies.Cookie(bookie_id=cfg.bookie_id, instance_id=instance_id,
                              journal_dirs=tuple(cfg.journal_dirs), ledger_dirs=tuple(cfg.ledger_dirs),
                              index_dirs=tuple(cfg.index_dirs), incarnation=uuid.uuid4().hex)
    if stored is None and all(c is None for c in local.values()):
        # A brand-new bookie: write its identity everywhere. Phase one still runs: if
        # ledgers name this id (its cookie was deleted from metadata and its disks
        # replaced), answering "no such entry" for them could let recovery truncate
        # acknowledged entries. For a truly new id it touches nothing.
        write_cookies(store, cfg, expected, None, dirs)
        return True
    meta_cookie = cookies.Cookie.decode(stored.value) if stored else None
    reference = meta_cookie or next(c for c in local.values() if c is not None)
    added = added_journal_dirs(reference.journal_dirs, cfg.journal_dirs)
    for d in added:
        check_new_journal_dir(d)
    if meta_cookie is not None and stored is not None and added:
        expanded = dataclasses.replace(meta_cookie, journal_dirs=tuple(cfg.journal_dirs))
        if _expansion_only(expected, meta_cookie, expanded, local, added):
            log.info("journal directories added: %s; writing the cookie with them (expansion)", added)
            write_cookies(store, cfg, expanded, stored.version, dirs)
            return False
    reasons: list[str] = []
    if meta_cookie is None:
        reasons.append("no cookie in metadata for this bookie id")
    for d, c in local.items():
        if c is None:
            reasons.append(f"{d}: no cookie (empty or replaced disk?)")
        elif meta_cookie is not None and not same_identity(c, meta_cookie):
            reasons.append(f"{d}: cookie differs from metadata")
    if meta_cookie is not None and not same_identity(meta_cookie, expected, check_incarnation=False):
        reasons.append("configured directories or instance id differ from the cookie in metadata")
    if not reasons:
        return False
    msg = "; ".join(reasons)
    if not cfg.auto_fix_cookie:
        raise CookieMismatchError(f"cookie validation failed for {cfg.bookie_id}: {msg} "
                                  "(run `zbk shell cookie fix` or set auto_fix_cookie = true)")
    log.warning("cookie validation failed (%s): auto_fix_cookie is on, fixing with phase one", msg)
    # Before the cookie: a crash between the two leaves the marker, never a fix without it.
    # Over-replicated ledgers stay until the auditor's next full check (bookie/overrepsource.py).
    record_cookie_fix(store, cfg.bookie_id)
    write_cookies(store, cfg, expected, stored.version if stored else None, dirs)
    return True


def _expansion_only(expected: cookies.Cookie, meta_cookie: cookies.Cookie, expanded: cookies.Cookie,
                    local: dict[str, cookies.Cookie | None], added: list[str]) -> bool:
    """True when the configured directories differ from the cookie in metadata by the
    ``added`` journal directories alone, and every directory holds that cookie or the
    expanded one (an added directory: the expanded one or none)."""
    if not same_identity(expanded, expected, check_incarnation=False):
        return False
    for d, c in local.items():
        if d in added:
            if c is not None and c != expanded:
                return False
        elif c != meta_cookie and c != expanded:
            return False
    return True


def write_cookies(store: MetadataStore, cfg: BookieConfig, cookie: cookies.Cookie, version: int | None,
                  dirs: list[str]) -> None:
    """The cookie into every directory, then into the metadata store (created, or replaced
    at ``version``): the metadata is the last word, so an interrupted write is redone."""
    data = cookie.encode()
    for d in dirs:
        cookies.write_cookie(d, cookie)
    key = layout.cookie_key(cfg.bookie_id)
    if version is None:
        existing = store.get(key)
        if existing is None:
            store.create(key, data)
            return
        version = existing.version
    store.cas(key, data, version)
