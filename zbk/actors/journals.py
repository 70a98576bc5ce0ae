"""Which journal a ledger's records go to, and what the journal actors are called.

A bookie runs one JournalWriter actor per directory of ``journal_dirs``. Every record of a
ledger (its adds, fence, master key, limbo and explicit-LAC records) goes to journal
``ledger_id % len(journal_dirs)``, as BookKeeper assigns ledgers to journals. Keeping all of
a ledger's records in one journal keeps them in order without any ordering between the
journals: replay can take the journals one after the other, and a FORCE_LEDGER waits for one
journal only.

The assignment is positional, which is why the cookie refuses removing or reordering
journal directories (zbk/bookie/cookiecheck.py). Adding one is safe: boot replays every
journal and checkpoints before the actors start, so no record written under the old
assignment is replayed again after the first record of the new one.

With one journal the actor keeps its historical name ``journal`` (thread ``zbk-journal``,
pipes ``...-to-journal``); with several they are ``journal-0``, ``journal-1``, ...
"""

from __future__ import annotations

from collections.abc import Sequence

JOURNAL = "journal"


def journal_index(ledger_id: int, journals: int) -> int:
    """The journal of ``ledger_id`` among ``journals`` (never negative)."""
    return ledger_id % journals


def journal_name(index: int, journals: int) -> str:
    """The actor name of journal ``index`` among ``journals``."""
    assert 0 <= index < journals, (index, journals)
    return JOURNAL if journals == 1 else f"{JOURNAL}-{index}"


def journal_names(journals: int) -> list[str]:
    return [journal_name(i, journals) for i in range(journals)]


def journal_of_actor(name: str) -> int | None:
    """The index of the journal actor called ``name``; None when it is not a journal."""
    if name == JOURNAL:
        return 0
    prefix, _, index = name.partition("-")
    return int(index) if prefix == JOURNAL and index.isdigit() else None


def journals_touched(ledger_ids: Sequence[int], journals: int) -> int:
    """How many journals the records of ``ledger_ids`` go to (the Synced messages an add
    batch of these ledgers waits for)."""
    if journals == 1 or not ledger_ids:
        return min(1, len(ledger_ids))
    first = ledger_ids[0] % journals
    if ledger_ids[-1] % journals == first and all(lid % journals == first for lid in ledger_ids):
        return 1
    return len({lid % journals for lid in ledger_ids})


def split_by_journal(ledger_ids: Sequence[int], journals: int) -> list[tuple[int, list[int]]]:
    """The positions of ``ledger_ids`` grouped by journal: (journal index, positions in
    order), journals in ascending order. One group when they all go to one journal."""
    groups: dict[int, list[int]] = {}
    for pos, lid in enumerate(ledger_ids):
        groups.setdefault(lid % journals, []).append(pos)
    return sorted(groups.items())
