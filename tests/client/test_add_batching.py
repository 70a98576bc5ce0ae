"""The AddDispatcher's flat per-bookie batches (the client side of MULTI_ADD): one
bookie's adds of an event-loop turn are kept as parallel lists (handles, part ends, entries)
and split into messages at the request limits; entries track their bookies as bit masks.

* ``_pack`` splits a batch at the part, entry and byte limits, keeping every part's entries
  together and in order (a part too large for one request continues in the next one).
* Under the simulation (tests/client/sim.py; ``ZBK_SEED=<n>`` replays a run): more ledgers
  than one MULTI_ADD may carry, written in one turn, where one bookie refuses some parts
  of a batch (EIO: only those ledgers change ensemble) or dies with a whole batch in flight
  (every ledger changes ensemble; every entry still confirms, in order, and is readable).
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from zbk import limits
from zbk.client.adds import Batch, PendingAdd
from zbk.client.dispatch import _pack
from zbk.client.writing import LedgerHandle
from zbk.wire import messages as w
from zbk.wire.entry import peek_entry_header
from zbk.wire.status import Status

from . import sim
from .sim import SimCluster, WriteLog, check_persistence

PW = b"secret"
_LOOP = asyncio.new_event_loop()  # the pending adds' futures belong to it; none is awaited


def teardown_module() -> None:
    _LOOP.close()


def _adds(n: int, size: int = 10, first: int = 0) -> list[PendingAdd]:
    return [PendingAdd(first + i, bytes(size), size, 0.0, _LOOP) for i in range(n)]


def _flatten(batches: list[Batch]) -> list[tuple[Any, list[int]]]:
    """(handle, entry ids) per part, parts of consecutive messages of one handle merged."""
    out: list[tuple[Any, list[int]]] = []
    for b in batches:
        for h, part in zip(b.hs, b.parts(), strict=True):
            ids = [a.entry_id for a in part]
            if out and out[-1][0] is h:
                out[-1][1].extend(ids)
            else:
                out.append((h, ids))
    return out


def test_a_batch_within_the_limits_is_one_message() -> None:
    batch = Batch()
    hs = [object() for _ in range(5)]
    for h in hs:
        batch.add(h, _adds(3))  # type: ignore[arg-type]
    assert _pack(batch) == [batch]
    assert batch.ends == [3, 6, 9, 12, 15] and batch.nbytes == 150


def test_pack_splits_at_parts_entries_and_bytes_keeping_each_part_in_order() -> None:
    n_max = limits.entries_per_add_request_max
    parts_max = limits.ledgers_per_multi_add_max
    bytes_max = limits.frame_bytes_max_default // 2
    batch = Batch()
    expected: list[tuple[Any, list[int]]] = []
    for _ in range(parts_max + 300):  # more ledgers than one MULTI_ADD carries, 1 entry each
        h = object()
        a = _adds(1)[0]
        batch.add_one(h, a)  # type: ignore[arg-type]
        expected.append((h, [0]))
    big = object()
    adds = _adds(n_max + 10)  # one part over the entry limit
    batch.add(big, adds)  # type: ignore[arg-type]
    expected.append((big, list(range(n_max + 10))))
    huge = object()
    adds = _adds(5, size=bytes_max // 3 + 1)  # one part over the byte limit
    batch.add(huge, adds)  # type: ignore[arg-type]
    expected.append((huge, list(range(5))))
    msgs = _pack(batch)
    assert len(msgs) > 2
    for m in msgs:
        assert 1 <= len(m.hs) <= parts_max
        assert len(m.ents) <= n_max
        assert m.nbytes <= bytes_max or len(m.ents) == 1
        assert m.nbytes == sum(len(a.blob) for a in m.ents)
        assert m.ends[-1] == len(m.ents) and all(x < y for x, y in zip(m.ends, m.ends[1:], strict=False))
    assert _flatten(msgs) == expected


def test_pack_of_one_entry_parts_cuts_full_messages_in_order() -> None:
    """A batch whose parts all have one entry (many ledgers) is cut by slicing, as the
    general split cuts it: in order, each message within the entry, part and byte limits
    and as full as the next entry allows (an entry over the byte limit goes alone)."""
    import random

    rng = random.Random(7)
    bytes_max = limits.frame_bytes_max_default // 2
    for n_max in (500, limits.entries_per_add_request_max):
        batch = Batch()
        for i in range(2500):
            size = bytes_max // 2 + 1 if i % 397 == 0 else rng.randrange(1, 4000)
            batch.add_one(object(), PendingAdd(0, bytes(size), size, 0.0, _LOOP))
        fast = _pack(batch, n_max)
        assert _flatten(fast) == [(h, [0]) for h in batch.hs]
        cap = min(n_max, limits.ledgers_per_multi_add_max)
        for m, nxt in zip(fast, [*fast[1:], None], strict=True):
            assert m.ends == list(range(1, len(m.ents) + 1)) and len(m.hs) == len(m.ents)
            assert 1 <= len(m.ents) <= cap
            assert m.nbytes == sum(len(a.blob) for a in m.ents)
            assert m.nbytes <= bytes_max or len(m.ents) == 1
            if nxt is not None:  # full: the next entry did not fit
                assert len(m.ents) == cap or m.nbytes + len(nxt.ents[0].blob) > bytes_max


def test_pack_caps_requests_at_the_clients_entry_limit_in_entry_order() -> None:
    batch = Batch()
    one, two = object(), object()
    batch.add(one, _adds(1000))  # type: ignore[arg-type]
    batch.add(two, _adds(30))  # type: ignore[arg-type]
    msgs = _pack(batch, 500)
    assert [len(m.ents) for m in msgs] == [500, 500, 30]
    assert _flatten(msgs) == [(one, list(range(1000))), (two, list(range(30)))]
    assert _pack(batch) == [batch]  # the protocol's own limit: one message


def _append(h: LedgerHandle, log: WriteLog, order: list[int]) -> None:
    """Append the next entry of ``h``; ``order`` gets the entry ids as their futures complete."""

    def done(f: asyncio.Future[int]) -> None:
        if not f.cancelled() and f.exception() is None:
            order.append(f.result())

    log.append(h, f"{h.ledger_id}/{h.next_entry_id}".encode()).add_done_callback(done)


def _fail_parts(bookie: sim.BookieNode, ledgers: set[int], status: Status) -> None:
    """Make ``bookie`` answer ``status`` for the plain-add parts of ``ledgers``, storing
    nothing of them (the other parts of a MULTI_ADD go on to its Server)."""
    bookie.add_status_of.update(dict.fromkeys(ledgers, status))


def test_a_bookie_refusing_some_parts_of_a_batch_replaces_itself_only_for_those_ledgers() -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=4)
        writer = c.client("writer")
        victim = c.bookie(sorted(c.bookies)[0])
        handles: list[LedgerHandle] = []
        while len(handles) < limits.ledgers_per_multi_add_max + 76:  # two MULTI_ADDs to it per turn
            h = await writer.create_ledger(3, 3, 2, password=PW)
            if victim.id in h.md.last_ensemble:
                handles.append(h)
        bad = {h.ledger_id for h in handles[::97]}  # parts in both messages
        _fail_parts(victim, bad, Status.EIO)
        logs = {h.ledger_id: WriteLog() for h in handles}
        orders: dict[int, list[int]] = {h.ledger_id: [] for h in handles}
        for _ in range(3):  # three entries per ledger, each turn one per ledger
            for h in handles:
                _append(h, logs[h.ledger_id], orders[h.ledger_id])
            await asyncio.sleep(0)
        for log in logs.values():
            await log.settle()
        for h in handles:
            log = logs[h.ledger_id]
            assert not log.failed, (h.ledger_id, log.failed)
            assert orders[h.ledger_id] == [0, 1, 2]
            assert h.last_add_confirmed == 2
            if h.ledger_id in bad:
                # Replaced: in a fragment of its own from the entry that failed, or in the
                # first fragment itself when the EIO came before any entry was confirmed.
                assert len(h.md.fragments) <= 2 and victim.id not in h.md.fragments[-1][1], h.md.fragments
            else:
                assert len(h.md.fragments) == 1 and victim.id in h.md.fragments[0][1], (h.ledger_id, h.md.fragments)
        for h in handles[:40] + [h for h in handles if h.ledger_id in bad]:
            await h.close()
            assert await check_persistence(c, h.ledger_id, PW, logs[h.ledger_id]) == []

    sim.run(scenario())


def test_a_bookie_dying_with_a_batch_of_many_ledgers_in_flight() -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=4)
        writer = c.client("writer")
        n = limits.ledgers_per_multi_add_max + 40
        # AQ3: nothing confirms without the dying bookie's replacement.
        handles: list[LedgerHandle] = [await writer.create_ledger(3, 3, 3, password=PW) for _ in range(n)]
        logs = {h.ledger_id: WriteLog() for h in handles}
        orders: dict[int, list[int]] = {h.ledger_id: [] for h in handles}

        def append_all() -> None:
            for h in handles:
                _append(h, logs[h.ledger_id], orders[h.ledger_id])

        append_all()
        for log in logs.values():
            await log.settle()
        # One bookie freezes; a turn of adds to every ledger goes out (to it as well, as
        # MULTI_ADDs it will never answer); two more turns follow; then it dies. Its ledgers
        # time out, change ensemble and resend every pending entry to the replacement.
        victim = c.bookie(sorted(c.bookies)[0])
        victim.pause()
        for _ in range(3):
            append_all()
            await asyncio.sleep(0)
        await asyncio.sleep(0.5)
        victim.crash()
        for log in logs.values():
            await log.settle()
        for h in handles:
            log = logs[h.ledger_id]
            assert not log.failed, (h.ledger_id, log.failed)
            assert orders[h.ledger_id] == [0, 1, 2, 3], orders[h.ledger_id]
            assert h.last_add_confirmed == 3
            assert victim.id not in h.md.last_ensemble
            assert len(h.md.fragments) == (2 if victim.id in h.md.fragments[0][1] else 1)
        for h in handles[:: max(1, n // 30)]:
            await h.close()
            assert await check_persistence(c, h.ledger_id, PW, logs[h.ledger_id]) == []

    sim.run(scenario())


def _record_sends(t: Any) -> list[tuple[list[str], Any]]:
    """Make transport ``t`` record (bookies, message) of every send_all, then send it."""
    calls: list[tuple[list[str], Any]] = []

    def send_all(bookies: list[str], msg: Any, timeout_s: float, callbacks: list[Any], *,
                 fail_if_lost: bool = True) -> None:
        calls.append((list(bookies), msg))
        for b, cb in zip(bookies, callbacks, strict=True):
            t.send(b, msg, timeout_s, cb)

    t.send_all = send_all
    return calls


def test_bookies_that_get_the_same_adds_share_one_message_others_get_their_own() -> None:
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        writer = c.client("writer")
        full = [await writer.create_ledger(3, 3, 2, password=PW) for _ in range(4)]  # WQ == E
        striped = await writer.create_ledger(3, 2, 2, password=PW)  # each bookie its own stripes
        calls = _record_sends(full[0].ctx.transport)
        logs = [WriteLog() for _ in full]
        for _ in range(2):
            for h, log in zip(full, logs, strict=True):
                log.append(h, f"{h.ledger_id}/{h.next_entry_id}".encode())
        for log in logs:
            await log.settle()
        assert len(calls) == 1 and sorted(calls[0][0]) == sorted(c.bookies), calls
        msg = calls[0][1]
        assert isinstance(msg, w.MultiAddRequest) and [len(p.entries) for p in msg.parts] == [2, 2, 2, 2]
        calls.clear()
        slog = WriteLog()
        for _ in range(6):
            slog.append(striped, f"{striped.ledger_id}/{striped.next_entry_id}".encode())
        await slog.settle()
        assert not slog.failed and sorted(slog.acked) == list(range(6))
        assert len(calls) == 3 and all(len(bs) == 1 for bs, _ in calls), calls  # one message per bookie
        for bs, m in calls:
            eids = [peek_entry_header(b)[1] for b in m.entries]
            assert eids == [e for e in range(6) if bs[0] in striped.md.write_set(e)], (bs, eids)
        for h, log in zip(full, logs, strict=True):
            assert not log.failed and sorted(log.acked) == [0, 1]
            await h.close()
            assert await check_persistence(c, h.ledger_id, PW, log) == []

    sim.run(scenario())


def test_handles_with_one_new_entry_share_one_message_per_write_set_and_advance_once() -> None:
    """Many handles with one new entry each (the many-ledgers case) make one batch per write
    set, sent to all of its bookies at once; each handle's _advance runs once per entry (at
    the answer that brings it to AQ), not once per answer. Mixed with a handle of two
    entries and a striped ledger, every bookie still gets one message per turn, with each
    ledger at most once in it, and every entry confirms in order and is readable."""
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        writer = c.client("writer")
        full = [await writer.create_ledger(3, 3, 2, password=PW) for _ in range(50)]
        striped = await writer.create_ledger(3, 2, 2, password=PW)
        calls = _record_sends(full[0].ctx.transport)
        advances: dict[int, int] = {}
        inner = LedgerHandle._advance

        def counting(self: LedgerHandle, *args: Any, **kw: Any) -> None:
            advances[self.ledger_id] = advances.get(self.ledger_id, 0) + 1
            inner(self, *args, **kw)

        LedgerHandle._advance = counting  # type: ignore[method-assign]
        try:
            logs = {h.ledger_id: WriteLog() for h in [*full, striped]}
            orders: dict[int, list[int]] = {h.ledger_id: [] for h in [*full, striped]}
            for h in full:
                _append(h, logs[h.ledger_id], orders[h.ledger_id])
            for log in logs.values():
                await log.settle()
            assert len(calls) == 1 and sorted(calls[0][0]) == sorted(c.bookies), calls
            msg = calls[0][1]
            assert isinstance(msg, w.MultiAddRequest)
            assert [p.ledger_id for p in msg.parts] == [h.ledger_id for h in full]
            assert all(len(p.entries) == 1 for p in msg.parts)
            assert advances == {h.ledger_id: 1 for h in full}, advances

            calls.clear()
            for h in full[:10]:
                _append(h, logs[h.ledger_id], orders[h.ledger_id])
            for _ in range(2):
                _append(full[10], logs[full[10].ledger_id], orders[full[10].ledger_id])
            _append(striped, logs[striped.ledger_id], orders[striped.ledger_id])
            for log in logs.values():
                await log.settle()
            got = sorted(b for bs, _ in calls for b in bs)
            assert got == sorted(c.bookies), calls  # one message per bookie
            for bs, m in calls:
                ids = [p.ledger_id for p in m.parts] if isinstance(m, w.MultiAddRequest) else [m.ledger_id]
                assert len(ids) == len(set(ids)), ids
                assert all((striped.ledger_id in ids) == (b in striped.md.write_set(0)) for b in bs), (bs, ids)
                assert set(ids) - {striped.ledger_id} == {h.ledger_id for h in full[:11]}
        finally:
            LedgerHandle._advance = inner  # type: ignore[method-assign]
        for h in [*full, striped]:
            log = logs[h.ledger_id]
            assert not log.failed, (h.ledger_id, log.failed)
            want = [0, 1, 2] if h is full[10] else [0, 1] if h in full[:10] else [0]
            assert orders[h.ledger_id] == want, (h.ledger_id, orders[h.ledger_id])
        for h in [*full[:12], striped]:
            await h.close()
            assert await check_persistence(c, h.ledger_id, PW, logs[h.ledger_id]) == []

    sim.run(scenario())


def test_close_waits_for_the_adds_in_flight_and_nothing_waits_without_it() -> None:
    """close() right after appends waits until every pending add is confirmed, then closes
    at the last; a handle nobody waits on keeps no drain event (none is set and cleared
    per entry)."""
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        writer = c.client("writer")
        h = await writer.create_ledger(3, 3, 2, password=PW)
        log = WriteLog()
        for i in range(20):
            log.append(h, f"{i}".encode())
        assert h.pending and h._drain_event is None
        await h.close()
        assert not h.pending and h._drain_event is None
        assert all(f.done() and f.result() == i for i, f in enumerate(log.futures))
        assert h.md.is_closed and h.md.last_entry_id == 19 and h.last_add_confirmed == 19
        assert await check_persistence(c, h.ledger_id, PW, log) == []
        h2 = await writer.create_ledger(3, 3, 2, password=PW)
        log2 = WriteLog()
        for _ in range(5):
            log2.append(h2, b"x")
        await log2.settle()
        assert not h2.pending and h2._drain_event is None
        await h2.wait_drained()  # nothing pending: at once

    sim.run(scenario())


def test_handles_share_write_sets_by_ensemble_and_master_keys_by_password() -> None:
    """Thousands of open handles should not each hold their own copy of what they have in
    common: handles on one ensemble share its write sets, handles of one password its master
    key. Every entry still goes to exactly md.write_set(entry) and confirms."""
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        writer = c.client("writer")
        hs = [await writer.create_ledger(3, 2, 2, password=PW) for _ in range(12)]
        other = await writer.create_ledger(3, 2, 2, password=b"another")
        logs = {h.ledger_id: WriteLog() for h in [*hs, other]}
        for h in [*hs, other]:
            for _ in range(4):
                _append(h, logs[h.ledger_id], [])
        for log in logs.values():
            await log.settle()
        for h in [*hs, other]:
            for eid in range(4):
                pairs, mask = h._write_set(eid)
                assert [b for b, _ in pairs] == h.md.write_set(eid)
                assert mask == sum(h._dispatcher.bit(b) for b in h.md.write_set(eid))
        by_ensemble: dict[tuple[str, ...], list[LedgerHandle]] = {}
        for h in [*hs, other]:
            by_ensemble.setdefault(tuple(h.md.last_ensemble), []).append(h)
        # 13 handles on at most 3! = 6 orders of the three bookies: some share one ensemble.
        assert any(len(group) > 1 for group in by_ensemble.values())
        for ensemble, group in by_ensemble.items():
            assert all(h._ws_rot is group[0]._ws_rot for h in group), ensemble
        assert len({id(h._ws_rot) for h in [*hs, other]}) == len(by_ensemble)
        assert all(h.master_key is hs[0].master_key for h in hs)
        assert other.master_key != hs[0].master_key
        for h in [*hs, other]:
            await h.close()
            assert not logs[h.ledger_id].failed
            assert await check_persistence(c, h.ledger_id, b"another" if h is other else PW, logs[h.ledger_id]) == []

    sim.run(scenario())


def test_a_settled_appends_future_holds_none_of_the_entrys_bytes() -> None:
    """append() returns the pending entry itself as the future. Once the entry is confirmed
    (or failed) it lets go of the entry's bytes: futures an application keeps cost it no
    payload."""
    seed = sim.seed_from_env()

    async def scenario() -> None:
        c = SimCluster(seed, bookies=3)
        writer = c.client("writer")
        h = await writer.create_ledger(3, 3, 2, password=PW)
        payload = bytes(5000)

        def held(f: asyncio.Future[int]) -> list[int]:
            return [len(r) for r in gc.get_referents(f) if isinstance(r, bytes) and len(r) >= len(payload)]

        futs = [h.append(payload) for _ in range(6)]
        assert all(held(f) for f in futs)  # unconfirmed: the bytes are still needed
        assert await asyncio.gather(*futs) == list(range(6))
        assert [held(f) for f in futs] == [[]] * 6
        await h.close()

    sim.run(scenario())
