"""The checks after the faults stop (docs/chaos.md "What is checked").

1. ``recover_all``: every ledger in the metadata that is not CLOSED is opened with
   recovery until it closes (or the deadline passes).
2. ``replication_status``: what still keeps the cluster from "fully replicated":
   under-replication marks (and in-place repair marks), limbo ledgers on any bookie
   (``GET /api/v1/bookie/info`` ``limbo_ledgers``), ledgers not closed, and replica gaps: for
   every fragment of every ledger, each bookie of each entry's write set must hold that
   entry (asked with GET_LIST_OF_ENTRIES_OF_LEDGER). Entries with fewer copies than the ack
   quorum are counted apart: those are durability at risk, not only redundancy.
3. ``persistence``: for each ledger, closed at or after its last acknowledged entry; every
   entry up to the close readable with the writer's bytes; the closed length the sum of
   their sizes; nothing a tailing reader saw beyond the close.
4. ``judge_history``: the history the workload recorded, against the final state read back
   now, by the history checker (tests/faults/checker.py), which trusts nothing above.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from faults.checker import CheckResult, check_files
from faults.history import scan_ledgers
from faults.recorded import final_state

from chaos.workload import PASSWORD, LedgerRecord, payload
from zbk.client.bookkeeper import AsyncBookKeeper
from zbk.errors import MetadataUnavailableError, ZbkError
from zbk.metadata import layout
from zbk.metadata.ledger import LedgerMetadata
from zbk.wire import messages as w
from zbk.wire.status import Status

LIST_TIMEOUT_S = 5.0
READ_ATTEMPTS = 3  # per entry, in a row
READ_FAILURES_MAX = 60  # per ledger
METADATA_PATIENCE_S = 120.0  # per metadata call of the checks

T = TypeVar("T")


async def patient(call: Callable[[], Awaitable[T]]) -> T:
    """A metadata read of the checks, retried while the store does not answer: the checks
    ask whether data survived, and an etcd without a leader for a while (a starved host
    calls elections) says nothing about that. A store silent for METADATA_PATIENCE_S still
    fails the checks (the caller reports it)."""
    deadline = time.monotonic() + METADATA_PATIENCE_S
    while True:
        try:
            return await call()
        except MetadataUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


@dataclass
class ReplicationStatus:
    marks: list[str] = field(default_factory=list)  # under-replication / repair keys
    limbo: dict[str, int] = field(default_factory=dict)  # bookie -> limbo ledgers
    not_closed: list[int] = field(default_factory=list)
    gaps: dict[int, int] = field(default_factory=dict)  # ledger -> entries missing from a write-set bookie
    below_aq: dict[int, int] = field(default_factory=dict)  # ledger -> entries on fewer than AQ bookies
    unreachable: list[str] = field(default_factory=list)
    ledgers: int = 0
    details: list[str] = field(default_factory=list)  # where the gaps are (a few ledgers)
    gaps_scanned: bool = True

    @property
    def ok(self) -> bool:
        return self.gaps_scanned and not (self.marks or self.limbo or self.not_closed or self.gaps
                                          or self.unreachable)

    def describe(self) -> str:
        if self.ok:
            return f"fully replicated ({self.ledgers} ledgers)"
        parts = []
        if self.marks:
            parts.append(f"{len(self.marks)} marks ({', '.join(self.marks[:4])})")
        if self.limbo:
            parts.append(f"limbo {self.limbo}")
        if self.not_closed:
            parts.append(f"{len(self.not_closed)} ledgers not closed ({self.not_closed[:8]})")
        if self.gaps:
            few = dict(sorted(self.gaps.items())[:6])
            parts.append(f"{len(self.gaps)} ledgers with replica gaps ({sum(self.gaps.values())} entries; {few})")
        if self.below_aq:
            parts.append(f"{len(self.below_aq)} ledgers with entries below AQ copies ({sum(self.below_aq.values())})")
        if self.unreachable:
            parts.append(f"unreachable: {self.unreachable[:4]}")
        if not self.gaps_scanned:
            parts.append("replica gaps not scanned yet")
        return "; ".join(parts)


@dataclass
class PersistenceResult:
    ledgers_checked: int = 0
    entries_read: int = 0
    lost: int = 0  # acknowledged entries not readable with the right bytes (or cut off by the close)
    problems: list[str] = field(default_factory=list)


async def all_metadata(bk: AsyncBookKeeper) -> dict[int, LedgerMetadata]:
    out = {}
    for lid in await patient(bk.list_ledgers):
        out[lid] = await patient(lambda lid=lid: bk.ledger_metadata(lid))  # type: ignore[misc]
    return out


RECOVERIES_AT_ONCE = 16


async def recover_all(bk: AsyncBookKeeper, deadline: float, log: Callable[[str], None]) -> list[int]:
    """Recover every ledger that is not CLOSED, up to RECOVERIES_AT_ONCE at a time, as an
    application with hundreds of them to recover would; returns those still not closed at
    the deadline. (One at a time, the ~300 ledgers a 30-minute run leaves open took the
    whole settle time.)"""
    pending = [lid for lid, md in (await all_metadata(bk)).items() if not md.is_closed]
    gate = asyncio.Semaphore(RECOVERIES_AT_ONCE)
    started, total = time.monotonic(), len(pending)

    async def one(lid: int) -> int | None:
        async with gate:
            try:
                await asyncio.wait_for(bk.open_ledger(lid, password=PASSWORD), max(1.0, deadline - time.monotonic()))
                return None
            except (ZbkError, TimeoutError) as e:
                log(f"final recovery of ledger {lid}: {type(e).__name__}: {e}")
                return lid

    while pending and time.monotonic() < deadline:
        pending = [lid for lid in await asyncio.gather(*(one(lid) for lid in pending)) if lid is not None]
        if pending:
            await asyncio.sleep(1.0)
    log(f"chaos: final recovery: {total - len(pending)} of {total} open ledgers closed in "
        f"{time.monotonic() - started:.1f} s")
    return pending


async def _held(bk: AsyncBookKeeper, bookie: str, lid: int) -> set[int] | None:
    assert bk.ctx is not None
    t = bk.ctx.transport
    try:
        resp = await t.request(bookie, w.ListEntriesRequest(rid=t.next_rid(), ledger_id=lid), LIST_TIMEOUT_S)
    except ZbkError:
        return None
    if resp.status in (Status.ENOLEDGER, Status.ENOENTRY):
        return set()
    if resp.status != Status.EOK:
        return None
    return {e for first, last in resp.entry_ranges for e in range(first, last + 1)}


@dataclass
class LedgerGaps:
    missing: int = 0  # entries absent from some bookie of their write set
    below_aq: int = 0  # entries on fewer than AQ bookies of their write set
    unreachable: list[str] = field(default_factory=list)
    where: dict[str, list[int]] = field(default_factory=dict)  # bookie -> entries it lacks


async def ledger_gaps(bk: AsyncBookKeeper, md: LedgerMetadata) -> LedgerGaps:
    """Which entries of a closed ledger some bookie of their write set lacks."""
    out = LedgerGaps()
    bookies = sorted(md.all_bookies())
    held = dict(zip(bookies, await asyncio.gather(*(_held(bk, b, md.ledger_id) for b in bookies)), strict=True))
    out.unreachable = [f"{b} (ledger {md.ledger_id})" for b, h in held.items() if h is None]
    if out.unreachable:
        return out
    for eid in range(md.last_entry_id + 1):
        ws = md.write_set(eid)
        lacking = [b for b in ws if eid not in held[b]]  # type: ignore[operator]
        if lacking:
            out.missing += 1
            for b in lacking:
                out.where.setdefault(b, []).append(eid)
        if len(ws) - len(lacking) < md.ack_quorum:
            out.below_aq += 1
    return out


def _ranges(ids: list[int]) -> str:
    spans: list[list[int]] = []
    for i in ids:
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    text = [str(a) if a == b else f"{a}-{b}" for a, b in spans]
    return ",".join(text[:6]) + (",..." if len(text) > 6 else "")


def describe_gaps(md: LedgerMetadata, g: LedgerGaps) -> str:
    frags = "; ".join(f"{first}: {','.join(ens)}" for first, ens in md.fragments)
    where = "; ".join(f"{b} lacks {len(ids)} [{_ranges(ids)}]" for b, ids in g.where.items())
    return (f"ledger {md.ledger_id} E{md.ensemble_size}/WQ{md.write_quorum}/AQ{md.ack_quorum} "
            f"last {md.last_entry_id}, fragments {{{frags}}}: {where}")


async def replication_status(bk: AsyncBookKeeper, bookie_info: Callable[[], dict[str, dict[str, Any]]], *,
                             gaps_when_clear: bool = False) -> ReplicationStatus:
    """``gaps_when_clear``: scan for replica gaps only if nothing else is pending. The scan
    asks every bookie for every ledger's entries, seconds of work for a loaded cluster; a
    poll that repeats it while marks are still being worked takes that time from the
    replicators it waits for."""
    assert bk.ctx is not None
    st = ReplicationStatus()
    store = bk.ctx.store
    prefixes = [layout.UNDERREPLICATED_LEDGERS] + ([layout.REPAIRS] if hasattr(layout, "REPAIRS") else [])
    for prefix in prefixes:
        kvs = await patient(lambda p=prefix: asyncio.to_thread(store.list, p))  # type: ignore[misc]
        st.marks += [kv.key for kv in kvs]
    infos = await asyncio.to_thread(bookie_info)
    st.limbo = {b: int(i.get("limbo_ledgers", 0)) for b, i in infos.items() if i.get("limbo_ledgers", 0)}
    st.unreachable += [b for b, i in infos.items() if not i]
    mds = await all_metadata(bk)
    st.ledgers = len(mds)
    st.not_closed = sorted(lid for lid, md in mds.items() if not md.is_closed)
    if gaps_when_clear and (st.marks or st.limbo or st.not_closed or st.unreachable):
        st.gaps_scanned = False
        return st
    closed = [md for md in mds.values() if md.is_closed]
    for i in range(0, len(closed), 16):  # a few ledgers at a time: bounded requests in flight
        results = await asyncio.gather(*(ledger_gaps(bk, md) for md in closed[i:i + 16]))
        for md, g in zip(closed[i:i + 16], results, strict=True):
            if g.missing:
                st.gaps[md.ledger_id] = g.missing
                if len(st.details) < 10:
                    st.details.append(describe_gaps(md, g))
            if g.below_aq:
                st.below_aq[md.ledger_id] = g.below_aq
            st.unreachable += g.unreachable
    return st


async def _read_all(bk: AsyncBookKeeper, md: LedgerMetadata) -> dict[int, bytes]:
    """Every readable entry 0..last of a closed ledger. A failing read is retried; an entry
    that fails READ_ATTEMPTS times in a row is skipped (and counted by the caller)."""
    got: dict[int, bytes] = {}
    if md.last_entry_id < 0:
        return got
    rh = await patient(lambda: bk.open_ledger(md.ledger_id, password=PASSWORD, recovery=False))
    nxt, fails_here, fails = 0, 0, 0
    while nxt <= md.last_entry_id and fails < READ_FAILURES_MAX:
        try:
            async for e in rh.read(nxt, md.last_entry_id):
                got[e.entry_id] = e.payload
                nxt, fails_here = e.entry_id + 1, 0
        except ZbkError:
            fails, fails_here = fails + 1, fails_here + 1
            if fails_here >= READ_ATTEMPTS:
                nxt, fails_here = nxt + 1, 0
            else:
                await asyncio.sleep(0.3)
    return got


async def persistence(bk: AsyncBookKeeper, seed: int, records: dict[int, LedgerRecord]) -> PersistenceResult:
    res = PersistenceResult()
    mds = await all_metadata(bk)
    for lid in sorted(set(mds) | set(records)):
        rec = records.get(lid) or LedgerRecord(lid, "?", "?")
        md = mds.get(lid)
        res.ledgers_checked += 1
        if md is None:
            res.lost += rec.acked + 1
            res.problems.append(f"ledger {lid}: metadata gone ({rec.acked + 1} acknowledged entries)")
            continue
        if not md.is_closed:
            res.problems.append(f"ledger {lid}: {md.state}, not closed")
            continue
        if md.last_entry_id < rec.acked:
            res.lost += rec.acked - md.last_entry_id
            res.problems.append(f"ledger {lid} ({rec.shape}): closed at {md.last_entry_id} below its last "
                                f"acknowledged entry {rec.acked}")
        if rec.seen_max > md.last_entry_id:
            res.problems.append(f"ledger {lid}: a tailing reader saw entry {rec.seen_max}, the ledger closed at "
                                f"{md.last_entry_id}")
        got = await _read_all(bk, md)
        res.entries_read += len(got)
        bad = [k for k in range(md.last_entry_id + 1) if got.get(k) != payload(seed, lid, k)]
        lost_here = [k for k in bad if k <= rec.acked]
        res.lost += len(lost_here)
        if bad:
            res.problems.append(f"ledger {lid} ({rec.shape}): {len(bad)} entries unreadable or wrong, "
                                f"{len(lost_here)} of them acknowledged (first {bad[0]}; "
                                f"{'missing' if bad[0] not in got else 'wrong bytes'})")
        length = sum(len(payload(seed, lid, k)) for k in range(md.last_entry_id + 1))
        if md.length != length:
            res.problems.append(f"ledger {lid}: closed length {md.length}, entries 0..{md.last_entry_id} "
                                f"hold {length} bytes")
    return res


async def judge_history(bk: AsyncBookKeeper, history_path: Path, final_path: Path) -> CheckResult:
    """The history checker's verdicts on the recorded history; the final state it was
    judged against is saved beside it, so ``python -m tests.faults.checker`` replays them.
    The history is read a line at a time (a 30-minute run writes several hundred megabytes)."""
    ledgers = await asyncio.to_thread(scan_ledgers, [history_path])
    final = await final_state(bk, ledgers, password=PASSWORD)
    await asyncio.to_thread(final.save, final_path)
    return await asyncio.to_thread(check_files, [history_path], final)
