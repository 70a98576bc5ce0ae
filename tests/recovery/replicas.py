"""What one bookie really serves of a ledger, checked entry by entry (real-process tests)."""

from __future__ import annotations

from collections.abc import Callable

from zbk.client.digest import make_digest
from zbk.client.raw import BookieConnection
from zbk.errors import DigestMismatchError
from zbk.metadata.ledger import LedgerMetadata
from zbk.recovery.repair import expected_entries
from zbk.wire import messages as w
from zbk.wire.entry import parse_entry
from zbk.wire.status import Status


def unreadable_on(bookie: str, md: LedgerMetadata, payload_of: Callable[[int], bytes] | None = None) -> list[int]:
    """Entries ``md`` assigns to ``bookie`` that it does not return intact (digest checked),
    or, given ``payload_of`` (entry id -> what was written), with another payload."""
    digest = make_digest(md.digest, md.password)
    bad = []
    with BookieConnection(bookie, timeout_s=5) as c:
        for e in expected_entries(md, bookie, closed_fragments_only=True):
            r = c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=md.ledger_id, first_entry_id=e))
            if r.status != Status.EOK or not r.entries:
                bad.append(e)
                continue
            try:
                got = parse_entry(bytes(r.entries[0]), digest, ledger_id=md.ledger_id, entry_id=e)
            except DigestMismatchError:
                bad.append(e)
                continue
            if payload_of is not None and bytes(got.payload) != payload_of(e):
                bad.append(e)
    return bad
