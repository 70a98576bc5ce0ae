"""The chaos run's clients: writers, tailing readers and a recoverer, on one asyncio loop
in one thread, each with its own AsyncBookKeeper (its own sockets and metadata connection).

Every payload is a function of (seed, ledger, entry id) — :func:`payload` — so a check can
tell the right bytes of any entry without storing them. A writer appends entry ``k`` of a
fresh ledger as its ``k``-th append; the client must confirm it as entry id ``k``.

* **Writers** (E3/WQ2/AQ2 and E3/WQ3/AQ2) write ledgers of a seeded random length at a
  bounded rate, in bursts (one loop turn each, so one ADD request per bookie), and close
  them. An acknowledgement is recorded by a callback on the append's future the moment it
  completes, so every entry the client ever confirmed is counted, even one confirmed after
  the writer gave up on its ledger. A writer whose ledger fails (fenced, no bookies, any
  error) hands the ledger to the recoverer and starts a new one.
* **Tailing readers** open writers' current ledgers without recovery and follow them with
  ``tail()`` (long-poll LAC reads) until they close; every entry seen must be the next id
  and carry the right bytes, and the highest seen id is kept for the end check (nothing a
  reader saw may change or vanish).
* **The recoverer** opens failed ledgers with recovery (fence + recover + close), retrying
  until it succeeds, as an application would.

Every wait is bounded: appends that stay unconfirmed for ``STUCK_S`` and tails idle for
``TAIL_IDLE_S`` are abandoned and reported.

Given a ``history`` (tests/faults/history.py), every create, append, close, recovery, open
and tail step is recorded there as it happens, for the history checker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import random
import threading
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from faults.history import HistoryRecorder
from faults.recorded import record_error
from helpers.tasks import await_chain

from zbk.client.bookkeeper import AsyncBookKeeper
from zbk.client.handles import LedgerHandle
from zbk.client.reading import retrieved
from zbk.config import ClientConfig
from zbk.errors import ZbkError

PASSWORD = b"chaos"
CLIENT = ClientConfig(add_timeout_ms=3000, read_timeout_ms=3000, speculative_read_ms=500)
STUCK_S = 60.0  # an append unconfirmed this long (while its handle has not failed) is a finding
TAIL_IDLE_S = 15.0
TICK_S = 0.05  # a writer appends one burst per tick
WINDOW = 400  # appends in flight per writer at most
CLOSE_TIMEOUT_S = 60.0
OPEN_TIMEOUT_S = 60.0
RECOVERY_RETRY_S = 2.0
CLIENT_START_ATTEMPTS = 30


def payload(seed: int, ledger_id: int, entry_id: int) -> bytes:
    """The bytes of entry ``entry_id`` of ``ledger_id`` in the run of ``seed``: 40..1063 bytes."""
    h = hashlib.blake2b(f"{seed}/{ledger_id}/{entry_id}".encode(), digest_size=32).digest()
    size = 40 + (h[0] << 8 | h[1]) % 1024
    head = f"{ledger_id}:{entry_id}:".encode()
    body = (h * (size // len(h) + 1))[: size - len(head)]
    return head + body


@dataclass(frozen=True)
class WriterSpec:
    name: str
    ensemble: int
    write_quorum: int
    ack_quorum: int

    @property
    def shape(self) -> str:
        return f"E{self.ensemble}/WQ{self.write_quorum}/AQ{self.ack_quorum}"


DEFAULT_WRITERS = (WriterSpec("w0", 3, 2, 2), WriterSpec("w1", 3, 3, 2), WriterSpec("w2", 3, 2, 2),
                   WriterSpec("w3", 3, 3, 2))


@dataclass
class LedgerRecord:
    ledger_id: int
    writer: str
    shape: str
    acked: int = -1  # highest acknowledged entry id (acks complete in entry order)
    appended: int = -1  # highest entry id handed to append()
    failed: str = ""  # why the writer's handle failed ("" = the writer closed it)
    recovered: bool = False  # closed by a recovery (ours or auto-recovery's), not by its writer
    seen_max: int = -1  # highest entry id a tailing reader saw
    tails: int = 0


@dataclass
class Stats:
    ledgers_created: int = 0
    closed_by_writer: int = 0
    writer_failures: dict[str, int] = field(default_factory=dict)
    recoveries_ok: int = 0
    recovery_attempts_failed: int = 0
    tails_started: int = 0
    tails_to_close: int = 0
    tails_idle: int = 0
    tail_errors: int = 0
    entries_seen: int = 0
    create_errors: int = 0


class Workload:
    def __init__(self, uri: str, seed: int, *, writers: tuple[WriterSpec, ...] = DEFAULT_WRITERS, readers: int = 2,
                 rate_per_writer: float = 250.0, ledger_entries: tuple[int, int] = (200, 3000),
                 log: Callable[[str], None] = print, history: HistoryRecorder | None = None) -> None:
        self.uri = uri
        self.seed = seed
        self.writers = writers
        self.readers = readers
        self.rate = rate_per_writer
        self.ledger_entries = ledger_entries
        self.log = log
        self.history = history or HistoryRecorder(None)  # None: records nothing
        self.ledgers: dict[int, LedgerRecord] = {}
        self.current: dict[str, int] = {}  # writer -> its open ledger
        self._tailing: set[int] = set()  # ledgers a reader follows now (one reader each)
        self._tails: dict[str, Any] = {}  # view -> its tail() generator, while it runs
        self.violations: list[str] = []  # broken guarantees seen while running
        self.client_errors: list[str] = []  # exceptions outside the ZbkError tree, stuck calls
        self.stats = Stats()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_writers = threading.Event()
        self._stop_readers = threading.Event()
        self._recover_q: asyncio.Queue[int] | None = None
        self._writers_done = threading.Event()
        self._done = threading.Event()

    # -- control from the main thread -------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="chaos-workload", daemon=True)
        self._thread.start()

    def finish(self, timeout_s: float) -> None:
        """Stop writing (each writer closes its ledger), let readers reach the closes, let the
        recoverer drain its queue; bounded by ``timeout_s``."""
        self._stop_writers.set()
        self._writers_done.wait(timeout_s / 2)
        self._stop_readers.set()
        if not self._done.wait(timeout_s / 2) and self._loop is not None:
            try:
                pending = asyncio.run_coroutine_threadsafe(_pending_tasks(self._tails), self._loop).result(5)
            except Exception as e:  # noqa: BLE001 - the loop itself is stuck: say so
                pending = f"(could not list the pending tasks: {type(e).__name__}: {e})"
            self.client_errors.append(f"workload did not finish within {timeout_s}s: cancelled; "
                                      f"still waiting:\n{pending}")
            self._loop.call_soon_threadsafe(_cancel_everything)
        if self._thread is not None:
            self._thread.join(30)

    @property
    def entries_acked(self) -> int:
        return sum(r.acked + 1 for r in self.ledgers.values())

    # -- the loop ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException:  # noqa: BLE001 - reported, never lost with the thread
            self.client_errors.append("workload crashed: " + traceback.format_exc())
        finally:
            self._writers_done.set()
            self._done.set()

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        # Metadata calls run in threads; a call waiting out an etcd failover must not starve
        # the others (the default pool has cpu + 4 threads).
        loop.set_default_executor(ThreadPoolExecutor(32, thread_name_prefix="chaos-meta"))
        self._recover_q = asyncio.Queue()
        rng = random.Random(self.seed)
        writers = [asyncio.ensure_future(self._writer(spec, random.Random(rng.random()))) for spec in self.writers]
        readers = [asyncio.ensure_future(self._reader(f"r{i}", random.Random(rng.random())))
                   for i in range(self.readers)]
        recoverer = asyncio.ensure_future(self._recoverer())
        results = await asyncio.gather(*writers, return_exceptions=True)
        self._writers_done.set()
        results += await asyncio.gather(*readers, recoverer, return_exceptions=True)
        self.client_errors += [f"a client task ended with {type(r).__name__}: {r}" for r in results
                               if isinstance(r, BaseException)]

    async def _client(self) -> AsyncBookKeeper:
        for _ in range(CLIENT_START_ATTEMPTS):
            try:
                return await asyncio.wait_for(AsyncBookKeeper(self.uri, config=CLIENT).start(), OPEN_TIMEOUT_S)
            except (ZbkError, TimeoutError) as e:
                self.log(f"client start failed ({e}); retrying")
                await asyncio.sleep(1.0)
        raise ZbkError(f"no client could reach {self.uri} in {CLIENT_START_ATTEMPTS} attempts")

    # -- writers ----------------------------------------------------------------------------
    async def _writer(self, spec: WriterSpec, rng: random.Random) -> None:
        bk = await self._client()
        try:
            while not self._stop_writers.is_set():
                lh = await self._create(bk, spec)
                if lh is None:
                    continue
                rec = LedgerRecord(lh.ledger_id, spec.name, spec.shape)
                self.ledgers[lh.ledger_id] = rec
                self.current[spec.name] = lh.ledger_id
                try:
                    await self._write_ledger(lh, rec, rng.randint(*self.ledger_entries))
                except Exception as e:  # noqa: BLE001 - a bug in the client (or here): reported, go on
                    self.client_errors.append(f"writer {spec.name}, ledger {rec.ledger_id}: {traceback.format_exc()}")
                    self._writer_failed(rec, e)
                finally:
                    self.current.pop(spec.name, None)
        finally:
            await bk.close()

    async def _create(self, bk: AsyncBookKeeper, spec: WriterSpec) -> LedgerHandle | None:
        op = self.history.invoke(spec.name, "create")
        try:
            lh = await asyncio.wait_for(bk.create_ledger(spec.ensemble, spec.write_quorum, spec.ack_quorum,
                                                         password=PASSWORD, custom_metadata={"chaos": b"1"}),
                                        OPEN_TIMEOUT_S)
            self.history.ok(op, ledger=lh.ledger_id)
            self.stats.ledgers_created += 1
            return lh
        except (ZbkError, TimeoutError) as e:
            record_error(self.history, op, e, effect=True)
            self.stats.create_errors += 1
            self.log(f"{spec.name}: create failed: {type(e).__name__}: {e}")
            await asyncio.sleep(0.5)
            return None

    def _on_ack(self, rec: LedgerRecord, k: int, fut: asyncio.Future[int]) -> None:
        if fut.cancelled():
            return
        if fut.exception() is not None:
            return
        eid = fut.result()
        if eid != k:
            self.violations.append(f"ledger {rec.ledger_id}: append #{k} was confirmed as entry {eid}")
        if eid != rec.acked + 1:
            self.violations.append(f"ledger {rec.ledger_id}: entry {eid} confirmed after {rec.acked} (out of order)")
        rec.acked = max(rec.acked, eid)

    async def _write_ledger(self, lh: LedgerHandle, rec: LedgerRecord, n: int) -> None:
        inflight: deque[asyncio.Future[int]] = deque()
        burst = max(1, round(self.rate * TICK_S))
        try:
            k = 0
            while k < n and not self._stop_writers.is_set():
                for _ in range(min(burst, n - k, WINDOW - len(inflight))):
                    data = payload(self.seed, rec.ledger_id, k)
                    op = self.history.invoke(rec.writer, "append", ledger=rec.ledger_id, entry=lh.next_entry_id,
                                             payload=data)
                    try:
                        fut = lh.append(data)
                    except ZbkError as e:
                        self.history.fail(op, e)  # refused before it was sent
                        raise
                    self.history.watch_append(op, fut)
                    fut.add_done_callback(functools.partial(self._on_ack, rec, k))
                    inflight.append(fut)
                    rec.appended = k
                    k += 1
                await asyncio.sleep(TICK_S)
                while inflight and (inflight[0].done() or len(inflight) >= WINDOW):
                    await self._settle(inflight.popleft(), rec)
            while inflight:
                await self._settle(inflight.popleft(), rec)
            op = self.history.invoke(rec.writer, "close", ledger=rec.ledger_id)
            try:
                await asyncio.wait_for(lh.close(), CLOSE_TIMEOUT_S)
            except (ZbkError, TimeoutError) as e:
                record_error(self.history, op, e, effect=True)
                raise
            self.history.ok(op, last=lh.md.last_entry_id)
            self.stats.closed_by_writer += 1
        except (ZbkError, TimeoutError) as e:
            self._writer_failed(rec, e)
        finally:
            for fut in inflight:  # their outcome reaches _on_ack; nothing is left unretrieved
                fut.add_done_callback(retrieved)

    async def _settle(self, fut: asyncio.Future[int], rec: LedgerRecord) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(fut), STUCK_S)
        except TimeoutError:
            self.client_errors.append(f"ledger {rec.ledger_id}: an append stayed unconfirmed for {STUCK_S}s")
            raise

    def _writer_failed(self, rec: LedgerRecord, e: BaseException) -> None:
        kind = type(e).__name__
        rec.failed = f"{kind}: {e}"
        self.stats.writer_failures[kind] = self.stats.writer_failures.get(kind, 0) + 1
        assert self._recover_q is not None
        self._recover_q.put_nowait(rec.ledger_id)

    # -- recoverer --------------------------------------------------------------------------
    async def _recoverer(self) -> None:
        assert self._recover_q is not None
        bk = await self._client()
        try:
            # Once told to stop, it finishes the recovery under way and leaves its queue to the
            # end checks, which recover every ledger still open (checks.recover_all): after
            # a run with many failed writers the queue can hold minutes of recoveries, which
            # are not the workload's to finish within its bounded stop.
            while not self._stop_readers.is_set():
                try:
                    lid = await asyncio.wait_for(self._recover_q.get(), 0.5)
                except TimeoutError:
                    continue
                if not await self.recover(bk, lid) and not self._stop_readers.is_set():
                    asyncio.get_running_loop().call_later(RECOVERY_RETRY_S, self._recover_q.put_nowait, lid)
        finally:
            await bk.close()

    async def recover(self, bk: AsyncBookKeeper, lid: int) -> bool:
        op = self.history.invoke("recoverer", "open_recover", ledger=lid)
        try:
            rh = await asyncio.wait_for(bk.open_ledger(lid, password=PASSWORD), OPEN_TIMEOUT_S)
            self.history.ok(op, last=rh.md.last_entry_id, closed=True)
        except (ZbkError, TimeoutError) as e:
            record_error(self.history, op, e, effect=True)
            self.stats.recovery_attempts_failed += 1
            self.log(f"recovery of ledger {lid} failed (will retry): {type(e).__name__}: {e}")
            return False
        except Exception as e:  # noqa: BLE001
            record_error(self.history, op, e, effect=True)
            self.client_errors.append(f"recovery of ledger {lid} raised: {traceback.format_exc()}")
            return False
        rec = self.ledgers.get(lid)
        if rec is not None and not rec.recovered:
            rec.recovered = True
            self.stats.recoveries_ok += 1
        return True

    # -- tailing readers --------------------------------------------------------------------
    async def _reader(self, name: str, rng: random.Random) -> None:
        bk = await self._client()
        try:
            while not self._stop_readers.is_set():
                candidates = sorted(set(self.current.values()) - self._tailing)
                if not candidates:
                    await asyncio.sleep(0.3)
                    continue
                lid = rng.choice(candidates)
                self._tailing.add(lid)
                try:
                    await self._tail(bk, self.ledgers[lid], name)
                finally:
                    self._tailing.discard(lid)
        except Exception:  # noqa: BLE001
            self.client_errors.append(f"reader crashed: {traceback.format_exc()}")
        finally:
            await bk.close()

    async def _tail(self, bk: AsyncBookKeeper, rec: LedgerRecord, reader: str) -> None:
        lid = rec.ledger_id
        self.stats.tails_started += 1
        rec.tails += 1
        op = self.history.invoke(reader, "open", ledger=lid)
        try:
            rh = await asyncio.wait_for(bk.open_ledger(lid, password=PASSWORD, recovery=False), OPEN_TIMEOUT_S)
        except (ZbkError, TimeoutError) as err:
            record_error(self.history, op, err, effect=False)
            self.stats.tail_errors += 1
            return
        self.history.ok(op, last=rh.md.last_entry_id if rh.is_closed else rh.last_add_confirmed, closed=rh.is_closed)
        agen: Any = rh.tail(0)
        expected = 0
        view = f"{reader}/{self.stats.tails_started}"
        self._tails[view] = agen
        try:
            while True:
                op = self.history.invoke(reader, "tail", ledger=lid, first=expected, view=view)
                try:
                    e = await asyncio.wait_for(agen.__anext__(), TAIL_IDLE_S)
                except StopAsyncIteration:
                    self.history.ok(op, entries=[], end=True)
                    self.stats.tails_to_close += 1
                    return
                except BaseException as err:
                    record_error(self.history, op, err, effect=False)
                    if not isinstance(err, TimeoutError):
                        raise
                    self.stats.tails_idle += 1
                    return
                self.history.ok(op, entries=[(e.entry_id, e.payload)])
                if e.entry_id != expected:
                    self.violations.append(f"ledger {lid}: tail gave entry {e.entry_id}, expected {expected}")
                if e.payload != payload(self.seed, lid, e.entry_id):
                    self.violations.append(f"ledger {lid}: tail saw wrong bytes for entry {e.entry_id}")
                rec.seen_max = max(rec.seen_max, e.entry_id)
                self.stats.entries_seen += 1
                expected = e.entry_id + 1
        except ZbkError as err:
            self.stats.tail_errors += 1
            self.log(f"tail of ledger {lid} failed at {expected}: {type(err).__name__}: {err}")
        finally:
            self._tails.pop(view, None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(agen.aclose(), 5)


async def _pending_tasks(tails: dict[str, Any]) -> str:
    """Every task of the workload loop but this one, with the chain of awaits it is parked
    in (innermost last): what a workload that does not finish is waiting for. A task that
    steps an async generator shows no frames of it, so the running tail() generators are
    listed too, with theirs."""
    me = asyncio.current_task()
    lines = []
    for task in asyncio.all_tasks():
        if task is not me:
            lines.append(f"  {task.get_name()}: {await_chain(task.get_coro(), 12) or repr(task)}")
    lines += [f"  tail {view}: {await_chain(agen, 12) or '(not running)'}" for view, agen in tails.items()]
    return "\n".join(sorted(lines)) or "  (none)"


def _cancel_everything() -> None:
    for task in asyncio.all_tasks():
        task.cancel()

