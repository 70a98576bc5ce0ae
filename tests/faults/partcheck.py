"""Test-side helpers of the partition tests: talking to :mod:`faults.partclient` in a host,
and checking what it acknowledged against what a ledger holds after healing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from faults import partclient
from faults.netcluster import ClientSession
from faults.partclient import digest, payload

PARTCLIENT = Path(partclient.__file__)
FENCED = "LEDGER_FENCED"


def command(session: ClientSession, line: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """Send one command to a partclient session; its answer."""
    session.send(line)
    return session.read(timeout_s=timeout_s)


def acked(*reports: dict[str, Any]) -> dict[int, str]:
    """Entry id -> digest of every acknowledged append in a ledger's reports."""
    out: dict[int, str] = {}
    for r in reports:
        out.update({int(e): d for e, d in r["acked"].items()})
    return out


def check_closed_ledger(read: dict[str, Any], acks: dict[int, str]) -> None:
    """A ledger read back whole (partclient's read_whole) against its acknowledged entries:
    closed at or after every ack; every ack reads back with its payload; every entry up to
    the close is one the writer sent, with the payload it sent for that id (no phantom)."""
    lid, last = read["ledger_id"], read["last_entry_id"]
    assert "error" not in read, read
    assert read["closed"], read
    if acks:
        assert last >= max(acks), f"ledger {lid} closed at {last}, below the acknowledged entry {max(acks)}"
    entries = {int(e): d for e, d in read["entries"].items()}
    assert sorted(entries) == list(range(last + 1)), f"ledger {lid} entries are not 0..{last}"
    assert {e: entries.get(e) for e in acks} == acks, f"ledger {lid}: an acknowledged entry changed or missing"
    phantoms = {e: d for e, d in entries.items() if d != digest(payload(lid, e))}
    assert not phantoms, f"ledger {lid}: entries with payloads the writer never sent: {phantoms}"
