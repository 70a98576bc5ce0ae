"""Raw-protocol helpers for the reliability tests (deterministic payloads, checked reads)."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from helpers.bookie import BookieProcess

from zbk.client.digest import make_digest, master_key
from zbk.client.raw import BookieConnection
from zbk.wire import messages as w
from zbk.wire.entry import build_entry, parse_entry
from zbk.wire.ops import AddFlag

MK = master_key(b"pw")
DIGEST = make_digest("crc32c", b"pw")
NO_FLAGS = AddFlag(0)


def payload(lid: int, eid: int, size: int) -> bytes:
    return (f"{lid}:{eid}:".encode() * (size // 4 + 1))[:size]


def add(c: BookieConnection, lid: int, eids: list[int], size: int = 256) -> w.AddResponse:
    return c.call(w.AddRequest(rid=c.next_rid(), ledger_id=lid, master_key=MK, flags=NO_FLAGS,
                               entries=[build_entry(lid, e, e - 1, payload(lid, e, size), DIGEST) for e in eids]))


def read(c: BookieConnection, lid: int, first: int, count: int = 1) -> w.ReadResponse:
    return c.call(w.ReadRequest(rid=c.next_rid(), ledger_id=lid, first_entry_id=first, count=count))


def checked(resp: w.ReadResponse, lid: int, size: int) -> list[int]:
    """Entry ids of the response, each parsed with its digest and compared byte for byte."""
    out = []
    for i, blob in enumerate(resp.entries):
        eid = resp.first_entry_id + i
        e = parse_entry(blob, DIGEST, ledger_id=lid, entry_id=eid)
        assert bytes(e.payload) == payload(lid, eid, size), f"ledger {lid} entry {eid}: wrong bytes served"
        out.append(eid)
    return out


def read_all(c: BookieConnection, lid: int, last: int, size: int = 256) -> None:
    """Entries 0..last of the ledger are all there, each byte for byte."""
    got = 0
    while got <= last:
        r = read(c, lid, got, 1000)
        assert r.entries, f"ledger {lid} entry {got}: {r.status!r}"
        got += len(checked(r, lid, size))


def rss_bytes(pid: int) -> int:
    m = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    assert m
    return int(m.group(1)) * 1024


def metric(bk: BookieProcess, name: str, labels: str = "") -> float:
    """Sum of the samples of ``name`` whose label text contains ``labels``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{bk.http_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and labels in line:
            total += float(line.rsplit(" ", 1)[1])
    return total
