"""The clients of the power-loss runs: writers that pipeline appends to several ledgers and a
reader, all through zbk's asyncio client wrapped by the recorder (recorded.py), so that
every operation lands in the history that the checker judges.

Each writer is one AsyncBookKeeper with ``ledgers_each`` slots; a slot creates a ledger,
appends bursts to it with up to ``window`` appends in flight, closes it after a seeded
number of entries, and starts the next. A slot whose ledger fails (fenced, no bookies for
an ensemble change, an append timed out) abandons it unclosed and starts another (or stops,
without ``replace_failed``); :func:`recover_all` closes the abandoned ones at the end with a
recorded recovery, as an application would. The reader now and then reads the tail of an
open ledger up to its LAC, without recovery.

Payloads are a function of (seed, ledger, entry), 40..1063 bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import random
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path

from zbk.client.bookkeeper import AsyncBookKeeper
from zbk.config import ClientConfig
from zbk.errors import ZbkError

from .checker import CheckResult, check
from .history import FinalState, History, HistoryRecorder
from .recorded import RecordingClient, RecordingWriter, final_state

PASSWORD = b"powerloss"
# A cut bookie is silent until its add timeout: short, so writers move on within the run.
CLIENT = ClientConfig(add_timeout_ms=1500, read_timeout_ms=1500, speculative_read_ms=300)
SHAPES = ((3, 2, 2), (3, 3, 2))  # E3 WQ2 AQ2 and E3 WQ3 AQ2
SETTLE_S = 30.0  # how long a slot waits for its appends in flight before it gives its ledger up
CLOSE_TIMEOUT_S = 30.0
CREATE_RETRY_S = 0.5
RECOVER_ATTEMPTS = 3
RECOVER_TIMEOUT_S = 30.0
RECOVER_RETRY_S = 1.0
READ_SPAN = 200  # entries a reader reads below the LAC


def payload(seed: int, ledger_id: int, entry_id: int) -> bytes:
    h = hashlib.blake2b(f"{seed}/{ledger_id}/{entry_id}".encode(), digest_size=32).digest()
    size = 40 + (h[0] << 8 | h[1]) % 1024
    head = f"{ledger_id}:{entry_id}:".encode()
    return head + (h * (size // len(h) + 1))[: size - len(head)]


class Writers:
    def __init__(self, uri: str, seed: int, recorder: HistoryRecorder, *, writers: int = 3, ledgers_each: int = 2,
                 ledger_entries: tuple[int, int] = (500, 3000), burst: int = 5, tick_s: float = 0.02,
                 window: int = 200, replace_failed: bool = True, readers: int = 1,
                 log: Callable[[str], None] = print) -> None:
        self.uri = uri
        self.seed = seed
        self.rec = recorder
        self.writers = writers
        self.ledgers_each = ledgers_each
        self.ledger_entries = ledger_entries
        self.burst = burst
        self.tick_s = tick_s
        self.window = window
        self.replace_failed = replace_failed
        self.readers = readers
        self.log = log
        self.rng = random.Random(seed)
        self.acked: dict[int, list[int]] = {}  # ledger -> acknowledged entry ids
        self.shapes: dict[int, tuple[int, int, int]] = {}
        self.open: dict[int, RecordingWriter] = {}  # the ledgers slots are writing now
        self.abandoned: set[int] = set()  # ledgers whose writer did not close them
        self.failures: dict[str, int] = {}  # why slots gave their ledgers up
        self.acks = 0
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # -- control ----------------------------------------------------------------------------
    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._writer(f"w{i}", random.Random(self.rng.random())))
                       for i in range(self.writers)]
        self._tasks += [asyncio.ensure_future(self._reader(f"r{i}", random.Random(self.rng.random())))
                        for i in range(self.readers)]

    async def wait_acks(self, n: int, timeout_s: float) -> None:
        """Until ``n`` appends in all have been acknowledged."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.acks < n:
            if loop.time() > deadline:
                raise AssertionError(f"only {self.acks} of {n} appends acknowledged in {timeout_s}s")
            await asyncio.sleep(0.01)

    async def finish(self, timeout_s: float = 90.0) -> None:
        """Stop appending: each slot settles its appends in flight and closes its ledger."""
        self._stop.set()
        done, pending = await asyncio.wait(self._tasks, timeout=timeout_s)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for t in done:
            t.result()  # a bug in a writer fails the test here
        assert not pending, f"{len(pending)} client task(s) did not finish within {timeout_s}s"

    def ensembles(self) -> dict[int, tuple[str, ...]]:
        """The last ensemble of each ledger being written now."""
        return {lid: tuple(lh.handle.md.last_ensemble) for lid, lh in self.open.items()}

    @property
    def acked_total(self) -> int:
        return sum(len(v) for v in self.acked.values())

    # -- writers ----------------------------------------------------------------------------
    async def _writer(self, name: str, rng: random.Random) -> None:
        bk = await AsyncBookKeeper(self.uri, config=CLIENT).start()
        client = RecordingClient(bk, self.rec, name)
        try:
            await asyncio.gather(*(self._slot(client, random.Random(rng.random()), SHAPES[i % len(SHAPES)])
                                   for i in range(self.ledgers_each)))
        finally:
            await bk.close()

    async def _slot(self, client: RecordingClient, rng: random.Random, shape: tuple[int, int, int]) -> None:
        while not self._stop.is_set():
            try:
                lh = await client.create_ledger(*shape, password=PASSWORD)
            except ZbkError as e:  # no bookies while the power is off: try again
                self.log(f"{client.process}: create failed: {type(e).__name__}: {e}")
                await asyncio.sleep(CREATE_RETRY_S)
                continue
            self.shapes[lh.ledger_id] = shape
            self.acked[lh.ledger_id] = []
            closed = await self._write(lh, rng.randint(*self.ledger_entries))
            if not closed and not self.replace_failed:
                return

    def _on_done(self, lid: int, fut: asyncio.Future[int]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            self.acked[lid].append(fut.result())
            self.acks += 1

    async def _write(self, lh: RecordingWriter, n: int) -> bool:
        """Append ``n`` entries (fewer if stopped) and close; False if the ledger was given up."""
        lid = lh.ledger_id
        inflight: deque[asyncio.Future[int]] = deque()
        failed: BaseException | None = None
        self.open[lid] = lh
        try:
            k = 0
            while k < n and not self._stop.is_set() and failed is None:
                for _ in range(min(self.burst, n - k, self.window - len(inflight))):
                    try:
                        fut = lh.append(payload(self.seed, lid, lh.handle.next_entry_id))
                    except ZbkError as e:  # the handle failed: recorded as fail, never sent
                        failed = e
                        break
                    fut.add_done_callback(functools.partial(self._on_done, lid))
                    inflight.append(fut)
                    k += 1
                await asyncio.sleep(self.tick_s)
                while inflight and inflight[0].done():
                    if (err := _error(inflight.popleft())) is not None:
                        failed = err
            if inflight:
                await asyncio.wait(inflight, timeout=SETTLE_S)
            for fut in inflight:
                if not fut.done():
                    failed = failed or TimeoutError(f"an append was not confirmed in {SETTLE_S}s")
                elif (err := _error(fut)) is not None:
                    failed = failed or err
            if failed is None:
                try:
                    await asyncio.wait_for(lh.close(), CLOSE_TIMEOUT_S)  # recorded by the writer
                    return True
                except (ZbkError, TimeoutError) as e:
                    failed = e
            why = type(failed).__name__
            self.failures[why] = self.failures.get(why, 0) + 1
            self.abandoned.add(lid)
            self.log(f"ledger {lid} given up unclosed: {why}: {failed}")
            return False
        finally:
            self.open.pop(lid, None)

    # -- a reader ---------------------------------------------------------------------------
    async def _reader(self, name: str, rng: random.Random) -> None:
        bk = await AsyncBookKeeper(self.uri, config=CLIENT).start()
        client = RecordingClient(bk, self.rec, name)
        try:
            while not self._stop.is_set():
                await asyncio.sleep(rng.uniform(0.3, 1.0))
                if not self.open:
                    continue
                lid = rng.choice(sorted(self.open))
                with contextlib.suppress(ZbkError, TimeoutError):  # recorded; the power may be off
                    rh = await asyncio.wait_for(client.open_ledger(lid, password=PASSWORD, recovery=False), 10)
                    lac = await asyncio.wait_for(rh.read_last_add_confirmed(), 10)
                    if lac >= 0:
                        await asyncio.wait_for(_drain(rh.read(max(0, lac - READ_SPAN), lac)), 20)
        finally:
            await bk.close()


async def _drain(it: AsyncIterator[object]) -> None:
    async for _ in it:
        pass


def _error(fut: asyncio.Future[int]) -> BaseException | None:
    if fut.cancelled():
        return asyncio.CancelledError()
    return fut.exception()


# -- the end of a run -------------------------------------------------------------------------
async def recover_all(uri: str, recorder: HistoryRecorder, ledgers: Iterable[int], *,
                      attempts: int = RECOVER_ATTEMPTS, log: Callable[[str], None] = print) -> set[int]:
    """Open with recovery (fence, recover, close; recorded) every one of ``ledgers`` that is
    not closed, a few attempts each. Returns those that could not be closed."""
    left: set[int] = set()
    async with AsyncBookKeeper(uri, config=CLIENT) as bk:
        client = RecordingClient(bk, recorder, "recoverer")
        for lid in sorted(set(ledgers)):
            if (await bk.ledger_metadata(lid)).is_closed:
                continue
            for attempt in range(attempts):
                try:
                    await asyncio.wait_for(client.open_ledger(lid, password=PASSWORD), RECOVER_TIMEOUT_S)
                    break
                except (ZbkError, TimeoutError) as e:
                    log(f"recovery of ledger {lid}, attempt {attempt + 1}: {type(e).__name__}: {e}")
                    if attempt + 1 < attempts:
                        await asyncio.sleep(RECOVER_RETRY_S)
            else:
                left.add(lid)
    return left


async def read_all(uri: str, recorder: HistoryRecorder, ledgers: Iterable[int], process: str) -> dict[int, set[int]]:
    """Read each of ``ledgers`` from its first entry to its last (closed) or its LAC, as
    client ``process`` (recorded); returns the ids read. A read that fails raises."""
    got: dict[int, set[int]] = {}
    async with AsyncBookKeeper(uri, config=CLIENT) as bk:
        client = RecordingClient(bk, recorder, process)
        for lid in sorted(set(ledgers)):
            rh = await client.open_ledger(lid, password=PASSWORD, recovery=False)
            last = rh.handle.md.last_entry_id if rh.handle.is_closed else rh.handle.last_add_confirmed
            got[lid] = set()
            if last >= 0:
                async for e in rh.read(0, last):
                    got[lid].add(e.entry_id)
    return got


async def judge(uri: str, history_path: Path) -> tuple[History, FinalState, CheckResult]:
    """The final state of every ledger the history names, read back, saved beside the
    history (``<history>.final.json``), and the checker's verdict on both."""
    history = History.load([history_path])
    async with AsyncBookKeeper(uri, config=CLIENT) as bk:
        final = await final_state(bk, history.ledgers(), password=PASSWORD)
    final.save(history_path.with_suffix(".final.json"))
    return history, final, check(history, final)
