"""Partitions: entry ranges of one ledger, cut at fragment boundaries and at
``entries_per_partition`` entries, so that each Spark task reads from one ensemble."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from zbk.metadata.ledger import LedgerMetadata


@dataclass(frozen=True)
class LedgerRange(InputPartition):
    """Entries ``first..last`` (inclusive) of one ledger. ``closed``: the ledger was closed
    when the range was planned. ``bookies``: the ensemble of the fragment holding it then."""

    ledger_id: int
    first: int
    last: int
    closed: bool
    bookies: tuple[str, ...]

    @property
    def count(self) -> int:
        return self.last - self.first + 1


def split(md: LedgerMetadata, first: int, last: int, entries_per_partition: int) -> list[LedgerRange]:
    """Ranges covering ``first..last`` of ``md``'s ledger: one per fragment, each fragment's
    part cut into pieces of at most ``entries_per_partition`` entries."""
    assert entries_per_partition >= 1
    out: list[LedgerRange] = []
    if last < first:
        return out
    for i, (frag_first, bookies) in enumerate(md.fragments):
        lo = max(first, frag_first)
        hi = min(last, md.fragment_end(i))
        while lo <= hi:
            end = min(hi, lo + entries_per_partition - 1)
            out.append(LedgerRange(md.ledger_id, lo, end, md.is_closed, tuple(bookies)))
            lo = end + 1
    # Entries past the last fragment's end cannot exist; a gap would be a planning bug.
    assert sum(r.count for r in out) == last - first + 1, (md.ledger_id, first, last, out)
    return out
