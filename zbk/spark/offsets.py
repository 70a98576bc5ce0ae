"""Streaming offsets: ``{"<ledger id>": <last entry id delivered>}`` as JSON.

A micro-batch from offset ``start`` to ``end`` holds, for every ledger in ``end``, the
entries ``start.get(id, -1) + 1 .. end[id]`` - the half-open range (start, end]. A ledger
missing from ``start`` (a new ledger that joined the selector) starts at entry 0. Ends only
ever name confirmed entries (<= the LAC, or the last entry of a closed ledger), which never
change, so replaying a batch from Spark's offset log reads exactly the same entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zbk import limits
from zbk.errors import BadRequestError

Offsets = dict[int, int]


def decode(raw: Mapping[str, Any]) -> Offsets:
    """Offsets from Spark's JSON dict; BadRequestError for anything that is not one of ours."""
    if not isinstance(raw, Mapping):
        raise BadRequestError(f"zbk offset must be a JSON object, got {raw!r}")
    out: Offsets = {}
    for key, value in raw.items():
        text = str(key)
        if not (text.isascii() and text.isdigit()) or int(text) > limits.ledger_id_max:
            raise BadRequestError(f"zbk offset {dict(raw)!r}: {key!r} is not a ledger id")
        if not isinstance(value, int) or isinstance(value, bool) or value < -1:
            raise BadRequestError(f"zbk offset {dict(raw)!r}: ledger {key} has a bad entry id {value!r}")
        out[int(text)] = value
    return out


def encode(offsets: Mapping[int, int]) -> dict[str, int]:
    """Canonical JSON form: string keys in increasing ledger id order."""
    return {str(lid): offsets[lid] for lid in sorted(offsets)}


def backlog(start: Mapping[int, int], available: Mapping[int, int]) -> dict[int, int]:
    """Entries available past ``start``, per ledger that has any."""
    out = {}
    for lid, end in available.items():
        n = end - start.get(lid, -1)
        if n > 0:
            out[lid] = n
    return out


def admit(start: Mapping[int, int], available: Mapping[int, int], max_entries: int | None) -> Offsets:
    """The end offset of the next batch: every available ledger, never behind ``start``,
    with at most ``max_entries`` new entries in all (shared out evenly, then in ledger id
    order; deterministic). Ledgers absent from ``available`` (deleted) are dropped."""
    end = {lid: max(start.get(lid, -1), avail) for lid, avail in available.items()}
    if max_entries is None:
        return end
    todo = backlog(start, end)
    grant = dict.fromkeys(todo, 0)
    budget = max_entries
    active = sorted(todo)
    while budget > 0 and active:
        share = max(1, budget // len(active))
        for lid in list(active):
            g = min(share, todo[lid] - grant[lid], budget)
            grant[lid] += g
            budget -= g
            if grant[lid] == todo[lid]:
                active.remove(lid)
            if budget == 0:
                break
    return {lid: start.get(lid, -1) + grant.get(lid, 0) if lid in todo else end[lid] for lid in end}


def ranges(start: Mapping[int, int], end: Mapping[int, int]) -> list[tuple[int, int, int]]:
    """(ledger id, first, last) of every non-empty (start, end] range, by ledger id."""
    out = []
    for lid in sorted(end):
        first = start.get(lid, -1) + 1
        if end[lid] >= first:
            out.append((lid, first, end[lid]))
    return out
