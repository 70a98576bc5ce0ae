"""The processes of bench/openloop.py other than the orchestrator: the fixed-rate writer (one
per measured run: zbk, NATS, or a no-op that measures the generator itself), the tailing
readers of the end-to-end runs, and the prefill writer, catch-up readers and CPU burners of
the reads-beside-writes runs. Each runs in its own process, started by `openloop.py --worker
KIND`, and prints one JSON object as its last stdout line.

The generator is one asyncio loop: at each wake-up it sends every entry whose intended send
time has come, then sleeps until the next one. The loop runs on a SelectSelector, whose
``select()`` takes its timeout in microseconds: the default epoll selector rounds a timeout
up to the next millisecond, which would make every send up to 1 ms late and add that to
every latency at low rates (uvloop's timers, in milliseconds too, would do the same). The
other workers run on the loop zbk's own programs choose (zbk/eventloop.py), both systems'
tailing readers alike. Each entry carries its intended send time and its index in its
first 16 bytes (little-endian int64s), which the tailing readers take their latency from.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from array import array
from collections.abc import Callable
from typing import Any

from _openloop_stats import (
    FAILED,
    HOLD_P99_MS,
    NS_PER_S,
    burst_spacing_ms,
    due_count,
    intended_ns,
    late_bursts,
    latency_summary,
    naive_latencies_ns,
    rank_ms,
    window_stats,
)
from _procs import RawLedger, cpu_seconds, machine_cpu_ticks

from zbk import eventloop
from zbk.cli.children import spawn_tied, stop_child

PASSWORD = b"zbk-openloop"
HEADER_BYTES = 16  # intended send time (ns), index
INFLIGHT_MAX = 100_000  # as zbk's client_pending_adds_max: the same bound on both systems
BATCH_MAX = 256  # entries sent before the loop lets completions in, when behind
COOLDOWN_S = 0.2  # load kept on after the measured window (see writer())
LATE_GAP_NS = 50_000_000  # late entries less than this apart (intended times) are one burst
LATE_BURSTS_KEPT = 50  # bursts kept in a run's report
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openloop.py")


def new_loop() -> asyncio.AbstractEventLoop:
    return asyncio.SelectorEventLoop(selectors.SelectSelector())


def run_async(coro: Any) -> Any:
    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(coro)


def io_read_bytes(pid: int) -> int:
    """Bytes the process made the storage layer fetch (``read_bytes`` of /proc/PID/io):
    reads served from the page cache do not count."""
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("read_bytes:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def snapshot(server_pids: list[int]) -> dict[str, Any]:
    """CPU seconds of the servers and of this process, the machine's CPU ticks and the
    servers' storage reads, at one moment (monotonic ns)."""
    return {"t_ns": time.monotonic_ns(), "servers_cpu_s": sum(cpu_seconds(p) for p in server_pids),
            # this process by process_time(): ns resolution, where /proc counts 10 ms ticks
            "client_cpu_s": time.process_time(), "machine_ticks": machine_cpu_ticks(),
            "servers_read_bytes": sum(io_read_bytes(p) for p in server_pids)}


def cost(a: dict[str, Any], b: dict[str, Any], entries: int) -> dict[str, Any]:
    """CPU between two snapshots: cores busy (servers, this client, the whole machine, and
    the rest of the machine: other processes, other jobs of a shared machine) and
    microseconds per entry."""
    secs = (b["t_ns"] - a["t_ns"]) / NS_PER_S
    srv, cli = b["servers_cpu_s"] - a["servers_cpu_s"], b["client_cpu_s"] - a["client_cpu_s"]
    ticks = [y - x for x, y in zip(a["machine_ticks"], b["machine_ticks"], strict=True)]
    busy = (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
    per = (lambda s: round(s / entries * 1e6, 1)) if entries else (lambda s: None)
    return {"server_cores": round(srv / secs, 2), "client_cores": round(cli / secs, 2),
            "machine_cores": round(busy / secs, 2), "other_cores": round(max(0.0, busy - srv - cli) / secs, 2),
            "server_cpu_us_per_entry": per(srv), "client_cpu_us_per_entry": per(cli),
            "servers_read_mb_per_s": round((b["servers_read_bytes"] - a["servers_read_bytes"]) / secs / 1e6, 1)}


# -- targets: what the generator appends to ---------------------------------------------------
class NoopTarget:
    """An append that does nothing: its future completes on the loop's next turn. Measures
    the generator's own ceiling and the latency floor it adds."""

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()

    async def send(self, payload: bytes) -> asyncio.Future[Any]:
        fut = self.loop.create_future()
        self.loop.call_soon(fut.set_result, None)
        return fut

    def reader_argv(self) -> list[str]:
        raise ValueError("the no-op target has no reader")

    async def finish(self) -> None:
        pass

    async def cleanup(self) -> None:
        pass


class ZbkTarget:
    """One ledger, E3 WQ3 AQ2, appended to with AsyncBookKeeper's ``append``."""

    def __init__(self, metadata: str, explicit_lac_ms: int, settings: dict[str, Any] | None = None) -> None:
        from zbk.client.bookkeeper import AsyncBookKeeper

        self.metadata, self.settings = metadata, settings or {}
        self.bk = AsyncBookKeeper(metadata, explicit_lac_interval_ms=explicit_lac_ms, **self.settings)

    async def start(self) -> None:
        await self.bk.start()
        self.lh = await self.bk.create_ledger(3, 3, 2, password=PASSWORD)

    async def send(self, payload: bytes) -> asyncio.Future[Any]:
        return self.lh.append(payload)

    def reader_argv(self) -> list[str]:
        return ["--metadata", self.metadata, "--ledger", str(self.lh.ledger_id),
                *(f"--client-set={k}={v}" for k, v in self.settings.items())]

    async def finish(self) -> None:
        """Close the ledger: a tailing reader's ``tail()`` ends after its last entry."""
        await self.lh.close()

    async def cleanup(self) -> None:
        try:
            await self.bk.delete_ledger(self.lh.ledger_id)
        finally:
            await self.bk.close()


class FloorTarget:
    """A writer without the client library, to three servers (``--servers``: zbk's bookies,
    or bench/_floor_server.py's floor servers). Each append is one AddRequest, its entry
    built (header, digest) as the library builds it, sent to the three servers over raw
    DEALER sockets and confirmed by two EOK answers (E3 WQ3 AQ2); the loop watches the
    sockets' FDs, as the library's transport does. What the library costs at a rate comes on
    top of this. The ledger has no metadata (RawLedger)."""

    ACK_QUORUM = 2

    def __init__(self, servers: str) -> None:
        self.bookies = servers.split(",")

    async def start(self) -> None:
        import zmq

        from zbk.client.raw import BookieConnection

        self.ledger = RawLedger(PASSWORD)
        self.ctx = zmq.Context()
        self.conns = [BookieConnection(b, ctx=self.ctx) for b in self.bookies]
        self.events_opt, self.pollin = int(zmq.EVENTS), int(zmq.POLLIN)
        self.loop = asyncio.get_running_loop()
        self.next_entry = 0
        self.lac = -1
        self.confirmed: set[int] = set()
        self.pending: dict[int, list[Any]] = {}  # entry id -> [future, EOK answers]
        self.fds = [int(c.sock.getsockopt(zmq.FD)) for c in self.conns]
        for fd, c in zip(self.fds, self.conns, strict=True):
            self.loop.add_reader(fd, self._readable, c.sock)

    def _readable(self, sock: Any) -> None:
        from zbk.wire.codec import decode_response

        while int(sock.get(self.events_opt)) & self.pollin:
            r = decode_response(sock.recv_multipart())
            p = self.pending.get(r.rid - 1)  # entry e goes out as request e + 1 (RawLedger)
            if p is None:  # the third answer, after the entry was confirmed
                continue
            if r.status != 0:
                del self.pending[r.rid - 1]
                p[0].set_exception(RuntimeError(f"entry {r.rid - 1}: status {r.status}"))
                continue
            p[1] += 1
            if p[1] == self.ACK_QUORUM:
                eid = r.rid - 1
                del self.pending[eid]
                self.confirmed.add(eid)
                while self.lac + 1 in self.confirmed:
                    self.lac += 1
                    self.confirmed.discard(self.lac)
                p[0].set_result(eid)

    async def send(self, payload: bytes) -> asyncio.Future[Any]:
        eid = self.next_entry
        self.next_entry += 1
        frames = self.ledger.add_frames(eid, self.lac, payload)
        fut = self.loop.create_future()
        self.pending[eid] = [fut, 0]
        for c in self.conns:
            c.sock.send_multipart(frames)
        for c in self.conns:  # a ZeroMQ FD signals only new activity: look after each send
            self._readable(c.sock)
        return fut

    def reader_argv(self) -> list[str]:
        raise NotImplementedError("the floor has no tailing reader: it writes a ledger without metadata")

    async def finish(self) -> None:
        pass

    async def cleanup(self) -> None:
        for fd, c in zip(self.fds, self.conns, strict=True):
            self.loop.remove_reader(fd)
            c.close()
        self.ctx.term()


class NatsTarget:
    """A new stream of 3 replicas (file storage), published to with ``publish_async`` by a
    client connected to the stream leader's server (NATS's best case: no extra hop)."""

    def __init__(self, servers: str) -> None:
        self.servers = dict(s.split("=", 1) for s in servers.split(","))
        self.stream = f"OPENLOOP{os.getpid()}"
        self.subject = f"openloop.{os.getpid()}"

    async def start(self) -> None:
        import nats
        from nats.js.api import StorageType, StreamConfig

        self.admin = await nats.connect(servers=list(self.servers.values()), connect_timeout=5)
        ajs = self.admin.jetstream(timeout=30)
        await ajs.add_stream(StreamConfig(name=self.stream, subjects=[self.subject], num_replicas=3,
                                          storage=StorageType.FILE))
        deadline = time.monotonic() + 30
        while True:
            info = await ajs.stream_info(self.stream)
            if info.cluster and info.cluster.leader:
                self.leader_url = self.servers[info.cluster.leader]
                break
            if time.monotonic() > deadline:
                raise RuntimeError("no stream leader elected")
            await asyncio.sleep(0.1)
        self.nc = await nats.connect(servers=[self.leader_url], connect_timeout=5, pending_size=64 * 1024 * 1024)
        self.js = self.nc.jetstream(timeout=30, publish_async_max_pending=INFLIGHT_MAX + 1)

    async def send(self, payload: bytes) -> asyncio.Future[Any]:
        return await self.js.publish_async(self.subject, payload)

    def reader_argv(self) -> list[str]:
        return ["--servers", self.leader_url, "--subject", self.subject]

    async def finish(self) -> None:
        """An empty message after the last one: the tailing reader's sign to stop."""
        await self.js.publish(self.subject, b"")

    async def cleanup(self) -> None:
        try:
            await self.nc.close()
            await self.admin.jetstream(timeout=30).delete_stream(self.stream)
        finally:
            await self.admin.close()


# -- the generator ------------------------------------------------------------------------------
async def drive(target: Any, rate: int, t0_ns: int, n: int, size: int, done: array[int], sent: array[int],
                marks: dict[int, Callable[[], None]]) -> int:
    """Send entries 0..n-1 at their intended times (``t0_ns + i / rate``), recording each
    one's actual send time in ``sent`` and its confirmation time (or FAILED) in ``done``;
    ``marks[i]`` runs just before entry i goes out. Returns the number of sends that raised."""
    tail = os.urandom(max(0, size - HEADER_BYTES))
    inflight = 0
    send_errors = 0
    now_ns = time.monotonic_ns

    def finished(i: int, fut: asyncio.Future[Any]) -> None:
        nonlocal inflight
        inflight -= 1
        if fut.cancelled() or fut.exception() is not None:
            done[i] = FAILED
        else:
            done[i] = now_ns()

    i = 0
    while i < n:
        due = min(n, due_count(t0_ns, now_ns(), rate))
        stop = min(due, i + BATCH_MAX)
        while i < stop and inflight < INFLIGHT_MAX:
            mark = marks.get(i)
            if mark is not None:
                mark()
            payload = intended_ns(t0_ns, i, rate).to_bytes(8, "little") + i.to_bytes(8, "little") + tail
            sent[i] = now_ns()
            try:
                fut = await target.send(payload)
            except Exception:  # noqa: BLE001  (a failed ledger or connection: counted, not retried)
                done[i] = FAILED
                send_errors += 1
            else:
                inflight += 1
                fut.add_done_callback(functools.partial(finished, i))
            i += 1
        if inflight >= INFLIGHT_MAX:
            await asyncio.sleep(0.001)  # the bound is reached: wait for confirmations (the schedule keeps running)
        elif i < due:
            await asyncio.sleep(0)  # behind the schedule: let completions in, then go on
        elif i < n:
            delay = intended_ns(t0_ns, i, rate) - now_ns()
            await asyncio.sleep(delay / NS_PER_S if delay > 0 else 0)
    return send_errors


def client_settings(args: argparse.Namespace) -> dict[str, int]:
    """The zbk clients' ``ClientConfig`` fields given by ``--client-set KEY=VALUE``."""
    return {k: int(v) for k, v in (kv.split("=", 1) for kv in args.client_set)}


def make_target(args: argparse.Namespace) -> Any:
    if args.worker == "noop":
        return NoopTarget()
    if args.worker == "zbk":
        return ZbkTarget(args.metadata, args.explicit_lac_ms, client_settings(args))
    if args.worker in ("zbk-floor", "server-floor"):
        return FloorTarget(args.servers)
    return NatsTarget(args.servers)


async def writer(args: argparse.Namespace) -> dict[str, Any]:
    """One run at ``args.rate``: ``--warmup`` seconds, then the measured window of
    ``--seconds``, then ``COOLDOWN_S`` more of the same load (so that the window's last
    entries meet the steady state, not an idle system, and a tailing reader sees them by the
    LAC the next adds carry), then up to ``--drain`` seconds of waiting for what is in flight."""
    rate = args.rate
    w0 = round(args.warmup * rate)
    w1 = w0 + max(1, round(args.seconds * rate))
    n = w1 + max(1, round(COOLDOWN_S * rate))  # at least entry w1: its send marks the window's end
    server_pids = [int(p) for p in args.server_pids.split(",") if p]
    target = make_target(args)
    await target.start()
    reader = None
    try:
        if args.e2e:
            reader = start_tail_reader(args, target.reader_argv(), w0, w1)
            line = await asyncio.to_thread(reader.stdout.readline)  # type: ignore[union-attr]
            if line.strip() != b"READY":
                raise RuntimeError(f"tailing reader did not start: {line!r}")
        done, sent = array("q", bytes(8 * n)), array("q", bytes(8 * n))
        snaps: dict[str, dict[str, Any]] = {}
        marks = {w0: lambda: snaps.__setitem__("start", snapshot(server_pids)),
                 w1: lambda: snaps.__setitem__("end", snapshot(server_pids))}
        t0 = time.monotonic_ns() + 20_000_000
        send_errors = await drive(target, rate, t0, n, args.size, done, sent, marks)
        deadline = time.monotonic() + args.drain
        while 0 in done and time.monotonic() < deadline:  # NOT_DONE: still in flight
            await asyncio.sleep(0.01)
        end_ns = time.monotonic_ns()
        await target.finish()
        tail_report = finish_tail_reader(reader) if reader is not None else None
        reader = None
    finally:
        if reader is not None:
            stop_child(reader, sig=signal.SIGKILL)
        await target.cleanup()

    st = window_stats(t0, rate, done, w0, w1, grace_ns=int(HOLD_P99_MS * 1e6), end_ns=end_ns)
    inside = round(st.achieved_per_s * (w1 - w0) / rate)
    lag = sorted(sent[i] - intended_ns(t0, i, rate) for i in range(w0, w1) if sent[i])
    naive = sorted(naive_latencies_ns(sent, done, w0, w1))
    report: dict[str, Any] = {
        "system": args.worker, "rate": rate, "seconds": args.seconds, "warmup": args.warmup, "entry_size": args.size,
        "offered": st.offered, "completed_in_time": st.completed_in_time, "completed": st.completed,
        "failed": st.failed, "send_errors": send_errors, "censored": st.censored,
        "achieved_per_s": round(st.achieved_per_s, 1), **latency_summary(st.latencies_ns),
        # Latency from the actual send: what a closed-loop bench would report.
        "naive_p50_ms": rank_ms(naive, 0.50), "naive_p99_ms": rank_ms(naive, 0.99),
        # How late the generator sent (actual - intended): its own share of the latency.
        "send_lag_p50_ms": rank_ms(lag, 0.50), "send_lag_p99_ms": rank_ms(lag, 0.99),
        "send_lag_max_ms": round(lag[-1] / 1e6, 3) if lag else 0.0,
        **cost(snaps["start"], snaps["end"], inside),
    }
    # When the entries over the holding bound came, and whether the generator's own lateness
    # explains them: what to look at when a rate is not held.
    bursts = late_bursts(t0, rate, sent, done, w0, w1, over_ns=int(HOLD_P99_MS * 1e6), gap_ns=LATE_GAP_NS,
                         end_ns=end_ns)
    report["late"] = {"over_ms": HOLD_P99_MS, "entries": sum(b["entries"] for b in bursts), "bursts": len(bursts),
                      "spacing_ms": burst_spacing_ms(bursts), "first": bursts[:LATE_BURSTS_KEPT]}
    if tail_report is not None:
        report["e2e"] = tail_report
    return report


def start_tail_reader(args: argparse.Namespace, target_argv: list[str], w0: int, w1: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, SCRIPT, "--worker", f"{args.worker}-tail", "--w0", str(w0), "--w1", str(w1),
            "--server-pids", args.server_pids, *target_argv]
    return spawn_tied(argv, death_signal=signal.SIGKILL, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                      start_new_session=True)


def finish_tail_reader(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> dict[str, Any]:
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_child(proc, sig=signal.SIGKILL)
        raise RuntimeError(f"the tailing reader did not end within {timeout_s:.0f} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"the tailing reader exited {proc.returncode}")
    lines = [ln for ln in out.decode().splitlines() if ln.startswith("{")]
    return json.loads(lines[-1])  # type: ignore[no-any-return]


# -- the tailing readers (end-to-end latency) --------------------------------------------------
class TailCounter:
    """What a tailing reader saw of the window ``w0 <= index < w1``: each entry's latency
    from the intended send time written into it to its receipt here, and this process's
    CPU between the window's first and last entry."""

    def __init__(self, w0: int, w1: int, server_pids: list[int]) -> None:
        self.w0, self.w1 = w0, w1
        self.server_pids = server_pids
        self.lat: list[int] = []
        self.snaps: dict[str, dict[str, Any]] = {}

    def got(self, payload: bytes) -> None:
        now = time.monotonic_ns()
        idx = int.from_bytes(payload[8:16], "little")
        if self.w0 <= idx < self.w1:
            self.lat.append(now - int.from_bytes(payload[:8], "little"))
            if idx == self.w0:
                self.snaps["start"] = snapshot([])
            elif idx == self.w1 - 1:
                self.snaps["end"] = snapshot([])

    def report(self) -> dict[str, Any]:
        out = {"received": len(self.lat), "expected": self.w1 - self.w0, **latency_summary(self.lat)}
        if "start" in self.snaps and "end" in self.snaps:
            c = cost(self.snaps["start"], self.snaps["end"], len(self.lat))
            out["reader_cpu_us_per_entry"] = c["client_cpu_us_per_entry"]
            out["reader_cores"] = c["client_cores"]
        return out


async def zbk_tail(args: argparse.Namespace) -> dict[str, Any]:
    """``tail()`` on the open ledger, from entry 0, until the writer closes it."""
    from zbk.client.bookkeeper import AsyncBookKeeper

    counter = TailCounter(args.w0, args.w1, [])
    async with AsyncBookKeeper(args.metadata, **client_settings(args)) as bk:
        rh = await bk.open_ledger(args.ledger, password=PASSWORD, recovery=False)
        print("READY", flush=True)
        async for e in rh.tail(0):
            counter.got(e.payload)
    return counter.report()


async def nats_tail(args: argparse.Namespace) -> dict[str, Any]:
    """An ordered push consumer (no acks, flow control) on the stream, until the empty
    message that follows the writer's last one."""
    import nats

    counter = TailCounter(args.w0, args.w1, [])
    ended = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        if len(msg.data) < HEADER_BYTES:
            ended.set()
        else:
            counter.got(msg.data)

    nc = await nats.connect(servers=[args.servers], connect_timeout=5)
    try:
        js = nc.jetstream(timeout=30)
        sub = await js.subscribe(args.subject, cb=on_msg, ordered_consumer=True)
        print("READY", flush=True)
        await asyncio.wait_for(ended.wait(), timeout=args.max_seconds)
        await sub.unsubscribe()
    finally:
        await nc.close()
    return counter.report()


# -- reads beside writes ------------------------------------------------------------------------
async def prefill(args: argparse.Namespace) -> dict[str, Any]:
    """``--entries`` entries of ``--size`` bytes over ``--ledger-count`` ledgers (E3 WQ3 AQ2),
    1,000 appends in flight, each ledger closed: the old data the catch-up readers read."""
    from zbk.client.bookkeeper import AsyncBookKeeper

    per = args.entries // args.ledger_count
    payload = os.urandom(args.size)
    ids = []
    t0 = time.monotonic()
    async with AsyncBookKeeper(args.metadata) as bk:
        for _ in range(args.ledger_count):
            lh = await bk.create_ledger(3, 3, 2, password=PASSWORD)
            sem = asyncio.Semaphore(1000)
            for _ in range(per):
                await sem.acquire()
                lh.append(payload).add_done_callback(functools.partial(_release, sem))
            await lh.close()
            ids.append(lh.ledger_id)
    return {"ledgers": ids, "entries": per * args.ledger_count, "seconds": round(time.monotonic() - t0, 1)}


def _release(sem: asyncio.Semaphore, _fut: asyncio.Future[Any]) -> None:
    sem.release()


async def catchup(args: argparse.Namespace) -> dict[str, Any]:
    """Read the closed ledgers ``--ledger-ids`` from their first entry to their last, one
    after the other and round again, as fast as the bookies serve them, until SIGTERM."""
    from zbk.client.bookkeeper import AsyncBookKeeper

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    count = 0
    ids = [int(x) for x in args.ledger_ids.split(",")]
    async with AsyncBookKeeper(args.metadata) as bk:
        handles = [await bk.open_ledger(lid, password=PASSWORD, recovery=False) for lid in ids]
        cpu0, t0 = time.process_time(), time.monotonic()

        async def read_all() -> None:
            nonlocal count
            k = args.start
            while True:
                h = handles[k % len(handles)]
                async for _ in h.read(0, h.md.last_entry_id):
                    count += 1
                k += 1

        task = asyncio.create_task(read_all())
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait([task, waiter], timeout=args.max_seconds, return_when=asyncio.FIRST_COMPLETED)
        elapsed = time.monotonic() - t0
        cpu = time.process_time() - cpu0
        task.cancel()
        waiter.cancel()
        if task.done() and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    return {"entries": count, "seconds": round(elapsed, 2), "entries_per_s": round(count / elapsed, 1),
            "reader_cpu_us_per_entry": round(cpu / count * 1e6, 1) if count else None}


def burn(args: argparse.Namespace) -> dict[str, Any]:
    """Take ``--duty`` of a core doing nothing but arithmetic, until SIGTERM: in every 5 ms
    of wall time, spin until this process has used ``duty`` of them in CPU time, then sleep
    the rest. Descheduled time does not count as burnt, so the burner takes up to its duty,
    as much of it as the machine gives it, the way a reader takes what it can."""
    stopped = False

    def on_term(*_: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, on_term)
    period, duty = 0.005, min(1.0, max(0.0, args.duty))
    cpu0, t0 = time.process_time(), time.monotonic()
    deadline, x = t0, 0
    while not stopped and time.monotonic() - t0 < args.max_seconds:
        deadline += period
        c = time.process_time()
        while time.process_time() - c < duty * period:
            x = (x * 1103515245 + 12345) & 0xFFFFFFFF
        rest = deadline - time.monotonic()
        if rest > 0:
            time.sleep(rest)
        else:
            deadline = time.monotonic()
    secs = time.monotonic() - t0
    return {"duty": duty, "seconds": round(secs, 2), "cores": round((time.process_time() - cpu0) / secs, 3)}


def worker_main(args: argparse.Namespace) -> int:
    kind = args.worker
    if kind in ("noop", "zbk", "zbk-floor", "server-floor", "nats"):
        report = run_async(writer(args))
    elif kind == "zbk-tail":
        report = eventloop.run(zbk_tail(args))
    elif kind == "nats-tail":
        report = eventloop.run(nats_tail(args))
    elif kind == "zbk-prefill":
        report = eventloop.run(prefill(args))
    elif kind == "zbk-catchup":
        report = eventloop.run(catchup(args))
    elif kind == "burn":
        report = burn(args)
    else:
        raise ValueError(f"unknown worker {kind!r}")
    print(json.dumps(report), flush=True)
    return 0
