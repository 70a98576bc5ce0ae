"""Ensemble changes of a writing ledger: when a bookie of the last ensemble fails, the
writer replaces it in the metadata (a new fragment from the LAC on) and sends the pending
entries again where they are missing. Functions of a LedgerHandle (zbk/client/writing.py),
whose state they read and change as its own methods would.
"""

from __future__ import annotations

import logging

from zbk.client import metrics as cm
from zbk.client.adds import PendingAdd
from zbk.client.writing import _NO_BOOKIES, LedgerHandle
from zbk.errors import LedgerFencedError, MetadataVersionError, NotEnoughBookiesError, ZbkError
from zbk.metadata.ledger import LedgerMetadata

log = logging.getLogger("zbk.client.handles")  # as the rest of the write path


def bookie_failed(h: LedgerHandle, bookie: str, adds: list[PendingAdd], why: str) -> None:
    """``bookie`` did not take ``adds`` (no answer, or an error status): they count as not
    sent there, and unless a change under way replaces it already, a change starts."""
    if h.failed is not None or bookie not in h.md.last_ensemble:
        return  # a late answer from a bookie already replaced
    keep = ~h._dispatcher.bit(bookie)
    for a in adds:
        a.sent &= keep
    if bookie in h._to_replace:
        return  # another of its requests failed first: the change under way replaces it
    if h.closing and not h.pending and not h._changing:
        # Every entry is confirmed and close() is writing the metadata: a change now
        # would only race it (the ledger closes under-replicated; the auditor repairs it).
        log.info("ledger %d: bookie %s failed (%s) while closing, all entries confirmed", h.ledger_id,
                 bookie, why)
        return
    log.warning("ledger %d: bookie %s failed (%s): ensemble change", h.ledger_id, bookie, why)
    h._to_replace |= {bookie}
    if not h._changing:
        h._changing = True
        h._spawn(_change_ensemble(h))


async def _change_ensemble(h: LedgerHandle) -> None:
    """Replace every failed bookie of the last ensemble, then confirm what the bookies that
    stayed acknowledged and send the pending entries again where they are missing."""
    try:
        while h._to_replace & set(h.md.last_ensemble) and h.failed is None:
            h._changes_without_progress += 1
            if h._changes_without_progress > h.ctx.config.ensemble_change_attempts_max:
                raise NotEnoughBookiesError(f"ledger {h.ledger_id}: {h._changes_without_progress - 1} "
                                            "ensemble changes without confirming an entry")
            await _change_once(h)
    except ZbkError as e:
        h._fail(e)
        return
    finally:
        h._changing = False
        if not h.pending:
            h._drained()
    if h.failed is None:
        h._advance()
        h._schedule_flush()


async def _change_once(h: LedgerHandle) -> None:
    ensemble = list(h.md.last_ensemble)
    positions = [i for i, b in enumerate(ensemble) if b in h._to_replace]
    replaced = [ensemble[i] for i in positions]
    try:
        ensemble = await h.ctx.replacements(h.md, ensemble, positions, exclude=h._to_replace,
                                            first_attempt=h._changes_without_progress == 1)
    except NotEnoughBookiesError:
        # No spare bookie, but the silent one may just be fenced by a recovering reader:
        # then the writer must learn that it lost the ledger, not that bookies are short.
        await fresh_metadata_unless_fenced(h)
        raise
    first = h.lac + 1
    new_md = h.md.with_fragment(first, ensemble)
    if not h.recovery:
        try:
            h.version = await h.ctx.write_metadata(new_md, h.version)
        except MetadataVersionError:
            h.md, h.version = await fresh_metadata_unless_fenced(h)
            return  # retry on the fresh metadata
    # Ledger recovery keeps its ensemble changes in memory and writes them with the close
    # (as BookKeeper's ReadOnlyLedgerHandle does). Written now, they would send the
    # recovery reads of later entries, and any later recovery, to replacement bookies
    # that never saw the writer's copies: their "no such entry" would truncate acked ones.
    h.md = new_md
    h._to_replace = h._to_replace - set(replaced) or _NO_BOOKIES
    cm.ENSEMBLE_CHANGES.inc()
    log.info("ledger %d: ensemble change at entry %d: %s -> %s", h.ledger_id, first, replaced,
             [b for b in ensemble if b not in h.md.fragments[0][1]] or ensemble)
    # Acks and sends count only for bookies of each entry's new write set.
    write_set = h._write_set
    for a in h.pending:
        ws = write_set(a.entry_id)[1]
        a.acked &= ws
        a.sent &= ws


async def fresh_metadata_unless_fenced(h: LedgerHandle) -> tuple[LedgerMetadata, int]:
    """The current metadata; LedgerFencedError if a recovering reader has taken over."""
    current, version = await h.ctx.read_metadata(h.ledger_id)
    if current.state != "OPEN" and not (h.recovery and current.state == "IN_RECOVERY"):
        raise LedgerFencedError(f"ledger {h.ledger_id} is {current.state}: fenced by a recovering reader")
    return current, version
