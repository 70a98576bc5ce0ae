"""`zbk sandbox`: a whole local cluster in one command (ARCHITECTURE.md "Processes").

Everything listens on 127.0.0.1. With ``--base-port P`` (default 3181) and N bookies
(default 3):

* bookie i (0-based) is a real child process ``python -m zbk.cli.main bookie``, wire
  port P+i (so its bookie id is ``127.0.0.1:<P+i>``) and HTTP port P+1000+i
  (``/metrics``, ``/heartbeat``, ``/api/v1/bookie/info``). ``--base-port 0`` picks a free
  range below the kernel's ephemeral ports.
* one auto-recovery process (auditor candidate and replicator workers), a real child
  ``python -m zbk.cli.main autorecovery`` with HTTP port P+2000 (``/metrics``,
  ``/api/v1/autorecovery/...``; its auditor candidate id is ``127.0.0.1:<P+2000>``), a port
  outside the bookie ranges so that adding bookies later cannot collide with it. It starts
  once every bookie has registered (or was given up on): started earlier, on a restart
  with data, its auditor would count the not yet registered bookies as lost and mark
  their ledgers under-replicated.
* metadata is the embedded store ``sqlite:///<data dir>/meta.db`` unless ``--metadata``
  names another (e.g. ``etcd://127.0.0.1:2379/zbk``).
* the data dir (default ``./zbk-sandbox``) holds ``bookie-<i>/`` (journal, ledgers,
  index), ``logs/bookie-<i>.log``, ``logs/autorecovery.log``, ``sandbox.json`` (bookies,
  base port and metadata URI, so that a restart on the same dir brings back the same
  cluster: same ports, same bookie ids, matching cookies) and ``sandbox.lock`` (one
  sandbox per data dir).

While it runs it prints a status line (running bookies, the auto-recovery process and
who is the auditor, registered writable/readonly bookies, the ledger count and the
under-replicated ledger count, read from metadata every 2 s): rewritten in place on a
terminal, a plain line every 10 s (and on every change) otherwise. "ready" is printed
once every bookie has registered and an auditor is elected. A child that exits on its own
is reported and restarted with exponential backoff (1, 2, 4... s), at most 5 times in a
row (a child that then stays up for a minute earns its retries back); a bookie's cookie
mismatch and an auto-recovery configuration error are never retried.

SIGINT, SIGTERM or SIGHUP stop the cluster, by PID: SIGTERM to the auto-recovery process
first (it resigns leadership and releases its ledger locks; stopped bookies must not look
lost to a running auditor), then SIGTERM to every bookie (each then checkpoints and clears
its dirty marker); SIGKILL for any child still running 30 s after its SIGTERM (or at once
on a second Ctrl-C), each exit code reported. Exit code 0 when every started process
stopped cleanly, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, ClassVar, Protocol

from zbk.cli.children import spawn_tied
from zbk.cli.ports import AUTO_PORT_HIGH, AUTO_PORT_LOW, port_free
from zbk.errors import EXIT_FAILED, EXIT_UNREACHABLE, EXIT_USAGE, ConfigError, ZbkError

if TYPE_CHECKING:
    from zbk.metadata.store import MetadataStore

DEFAULT_BASE_PORT = 3181
DEFAULT_DATA_DIR = "zbk-sandbox"
HTTP_PORT_OFFSET = 1000
AUTORECOVERY_PORT_OFFSET = 2000  # above every bookie HTTP port (at most 100 bookies)
LAYOUT_FILE = "sandbox.json"
LOCK_FILE = "sandbox.lock"
LOOPBACK = "127.0.0.1"

TICK_S = 0.2  # how quickly a dead child or a signal is noticed
STATUS_INTERVAL_S = 2.0  # metadata is read this often
READY_POLL_S = 0.5  # ... and this often until the cluster is ready
PLAIN_STATUS_INTERVAL_S = 10.0  # a non-terminal gets an unchanged status line this often
STOP_TIMEOUT_S = 30.0  # a bookie's clean stop joins its actors (10 s each at worst); per stop phase
RESTART_MAX = 5
RESTART_BACKOFF_BASE_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sandbox", help="a whole local cluster: N bookies and auto-recovery on embedded metadata",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bookies", type=int, help="number of bookies (default 3, or as last time on this data dir)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"cluster directory (default ./{DEFAULT_DATA_DIR})")
    p.add_argument("--metadata", help="metadata URI (default sqlite:///<data dir>/meta.db)")
    p.add_argument("--base-port", type=int,
                   help=f"bookie i listens on BASE+i, its HTTP on BASE+{HTTP_PORT_OFFSET}+i, auto-recovery's "
                        f"HTTP on BASE+{AUTORECOVERY_PORT_OFFSET} (default {DEFAULT_BASE_PORT}; 0 picks free ports)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="bookie config override passed to every bookie, this run only (repeatable)")
    p.add_argument("--json", action="store_true",
                   help="first line: the cluster as one JSON object; then one JSON object per event")
    p.add_argument("--no-status", action="store_true", help="no status lines (events are still printed)")
    p.set_defaults(func=run)


# -- the cluster's layout ---------------------------------------------------------------------
@dataclass(frozen=True)
class BookieSpec:
    index: int
    port: int
    http_port: int
    data_dir: str
    log: str

    kind: ClassVar[str] = "bookie"

    @property
    def name(self) -> str:
        return f"bookie-{self.index}"

    @property
    def bookie_id(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def ident(self) -> str:
        return self.bookie_id

    @property
    def http_url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"

    def describe_exit(self, code: int) -> str:
        return describe_exit(code)

    def permanent_failure(self, code: int) -> str | None:
        from zbk.bookie.process import EXIT_COOKIE

        return "its data dir does not belong to this cluster's metadata" if code == EXIT_COOKIE else None

    def event_fields(self) -> dict[str, Any]:
        return {"process": self.name, "bookie": self.name}


@dataclass(frozen=True)
class AutoRecoverySpec:
    http_port: int
    log: str

    kind: ClassVar[str] = "autorecovery"
    name: ClassVar[str] = "autorecovery"

    @property
    def candidate_id(self) -> str:
        """Its auditor candidate id, as `zbk shell whoisauditor` shows it (zbk/recovery/process.py)."""
        return f"{LOOPBACK}:{self.http_port}"

    @property
    def ident(self) -> str:
        return self.candidate_id

    @property
    def http_url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"

    def describe_exit(self, code: int) -> str:
        return describe_autorecovery_exit(code)

    def permanent_failure(self, code: int) -> str | None:
        return "its configuration is invalid" if code == EXIT_USAGE else None

    def event_fields(self) -> dict[str, Any]:
        return {"process": self.name}


class ChildSpec(Protocol):
    """What the supervisor needs to know about one kind of child process."""

    kind: ClassVar[str]

    @property
    def name(self) -> str: ...

    @property
    def log(self) -> str: ...

    @property
    def ident(self) -> str: ...  # how stop lines name it: a bookie id, an auditor candidate id

    def describe_exit(self, code: int) -> str: ...

    def permanent_failure(self, code: int) -> str | None: ...  # why an exit must not be retried

    def event_fields(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Layout:
    data_dir: str
    metadata: str
    base_port: int
    bookies: tuple[BookieSpec, ...]
    autorecovery: AutoRecoverySpec

    def saved(self) -> dict[str, Any]:
        return {"bookies": len(self.bookies), "base_port": self.base_port, "metadata": self.metadata}


def make_layout(data_dir: str, metadata: str, base_port: int, n: int) -> Layout:
    logs = os.path.join(data_dir, "logs")
    specs = tuple(BookieSpec(i, base_port + i, base_port + HTTP_PORT_OFFSET + i,
                             os.path.join(data_dir, f"bookie-{i}"), os.path.join(logs, f"bookie-{i}.log"))
                  for i in range(n))
    ar = AutoRecoverySpec(base_port + AUTORECOVERY_PORT_OFFSET, os.path.join(logs, "autorecovery.log"))
    return Layout(data_dir, metadata, base_port, specs, ar)


def resolve_layout(args: argparse.Namespace) -> Layout:
    """The layout from the arguments and what this data dir was created with. Bookie ids
    are host:port and sit in cookies, so a data dir keeps its ports and its metadata."""
    data_dir = os.path.abspath(args.data_dir)
    saved = _load_saved(data_dir)
    for name, given in (("base_port", args.base_port), ("metadata", args.metadata)):
        if given not in (None, 0) and name in saved and saved[name] != given:
            raise ConfigError(f"{data_dir} was created with --{name.replace('_', '-')} {saved[name]}; its bookies "
                              f"are registered under that, so it cannot change (use a new --data-dir)")
    n = args.bookies if args.bookies is not None else int(saved.get("bookies", 3))
    if not 1 <= n <= 100:
        raise ConfigError(f"--bookies must be 1..100, got {n}")
    metadata = args.metadata or saved.get("metadata") or f"sqlite:///{data_dir}/meta.db"
    base = int(saved["base_port"]) if "base_port" in saved else args.base_port
    if base is None:
        base = DEFAULT_BASE_PORT
    elif base == 0:
        base = pick_free_base_port(n)
    if not 1024 <= base <= 65535 - AUTORECOVERY_PORT_OFFSET:
        raise ConfigError(f"--base-port must leave room for the bookie, HTTP and auto-recovery ports "
                          f"(1024..{65535 - AUTORECOVERY_PORT_OFFSET}), got {base}")
    return make_layout(data_dir, metadata, base, n)


def _load_saved(data_dir: str) -> dict[str, Any]:
    path = os.path.join(data_dir, LAYOUT_FILE)
    try:
        with open(path) as f:
            saved = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: unreadable ({e}); it records this cluster's ports and metadata") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return saved


def save_layout(layout: Layout) -> None:
    path = os.path.join(layout.data_dir, LAYOUT_FILE)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(layout.saved(), f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def _ports(base: int, n: int) -> list[int]:
    return ([base + i for i in range(n)] + [base + HTTP_PORT_OFFSET + i for i in range(n)]
            + [base + AUTORECOVERY_PORT_OFFSET])


def pick_free_base_port(n: int, attempts: int = 200) -> int:
    for _ in range(attempts):
        base = random.randrange(AUTO_PORT_LOW, AUTO_PORT_HIGH - AUTORECOVERY_PORT_OFFSET)
        if all(port_free(p) for p in _ports(base, n)):
            return base
    raise ZbkError(f"no free set of {n} + {n} + 1 ports found on {LOOPBACK}")


def check_ports(layout: Layout) -> None:
    wanted = [(port, f"{b.name} {what}") for b in layout.bookies
              for port, what in ((b.port, "wire"), (b.http_port, "HTTP"))]
    wanted.append((layout.autorecovery.http_port, "autorecovery HTTP"))
    for port, what in wanted:
        if not port_free(port):
            raise ZbkError(f"port {port} ({what}) is in use on {LOOPBACK}: is a process of an earlier "
                           f"sandbox still running? (or choose another --base-port with a new --data-dir)")


def lock_data_dir(data_dir: str) -> IO[str]:
    """Hold an exclusive lock on the data dir for the sandbox's lifetime (released by the
    kernel when we exit, however we exit)."""
    f = open(os.path.join(data_dir, LOCK_FILE), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "?"
        f.close()
        raise ZbkError(f"another zbk sandbox (pid {holder}) is running on {data_dir}") from None
    f.seek(0)
    f.truncate()
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


# -- child processes ------------------------------------------------------------------------
def bookie_argv(layout: Layout, b: BookieSpec, settings: list[str], verbose: bool) -> list[str]:
    argv = [sys.executable, "-m", "zbk.cli.main", *(["-v"] if verbose else []), "bookie",
            "--metadata", layout.metadata, "--data-dir", b.data_dir, "--port", str(b.port),
            "--http-port", str(b.http_port)]
    for kv in settings:
        argv += ["--set", kv]
    return argv


def autorecovery_argv(layout: Layout, verbose: bool) -> list[str]:
    return [sys.executable, "-m", "zbk.cli.main", *(["-v"] if verbose else []), "autorecovery",
            "--metadata", layout.metadata, "--http-port", str(layout.autorecovery.http_port)]


def spawn(argv: list[str], log_path: str) -> subprocess.Popen[bytes]:
    """Start a child in its own session (process group), so that a Ctrl-C in the terminal
    reaches only the sandbox, which then stops the children itself."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as log:
        # Tied to the sandbox: SIGTERM (a clean stop) if the sandbox is killed before it could
        # stop its children, instead of orphans that hold the ports.
        return spawn_tied(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)


def describe_exit(code: int) -> str:
    from zbk.bookie.process import ACTOR_EXIT_BASE, ACTORS, EXIT_BOOT, EXIT_COOKIE

    if code == 0:
        return "exit 0 (clean stop)"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    if code == EXIT_COOKIE:
        return f"exit {code} (cookie mismatch)"
    if code == EXIT_BOOT:
        return f"exit {code} (boot failed)"
    if ACTOR_EXIT_BASE <= code < ACTOR_EXIT_BASE + len(ACTORS):
        return f"exit {code} (actor {ACTORS[code - ACTOR_EXIT_BASE]} crashed)"
    return f"exit {code}"


def describe_autorecovery_exit(code: int) -> str:
    """Exit codes of `zbk autorecovery` (zbk/recovery/process.py and zbk/cli/main.py)."""
    if code <= 0:
        return describe_exit(code)
    why = {EXIT_FAILED: "lease lost or a worker crashed", EXIT_USAGE: "bad configuration",
           EXIT_UNREACHABLE: "cannot reach metadata"}.get(code)
    return f"exit {code} ({why})" if why else f"exit {code}"


@dataclass
class Supervised:
    """One child process (a bookie or the auto-recovery process) and its restart state."""

    spec: ChildSpec
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0  # restarts in a row; reset once the child stays up STABLE_AFTER_S
    restart_at: float | None = None
    failed: str | None = None  # why we gave up on it

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, now: float) -> None:
        self.proc = spawn(self.argv, self.spec.log)
        self.started_at, self.restart_at = now, None

    def supervise(self, now: float, out: Output) -> None:
        """Notice an unexpected exit and schedule (or give up on) a restart; restart when due."""
        spec = self.spec
        if self.proc is not None:
            code = self.proc.poll()
            if code is None:
                if self.restarts and now - self.started_at > STABLE_AFTER_S:
                    self.restarts = 0
                return
            pid, self.proc = self.proc.pid, None
            why = spec.permanent_failure(code) or (f"{RESTART_MAX} restarts in a row"
                                                   if self.restarts >= RESTART_MAX else None)
            if why is not None:
                self.failed = spec.describe_exit(code)
                out.event("failed", f"{spec.name} (pid {pid}) {self.failed}; not restarting: {why}; "
                          f"see {spec.log}", **spec.event_fields(), pid=pid, code=code)
                return
            delay = min(RESTART_BACKOFF_BASE_S * 2 ** self.restarts, RESTART_BACKOFF_MAX_S)
            self.restart_at = now + delay
            out.event("exited", f"{spec.name} (pid {pid}) {spec.describe_exit(code)}; restarting in {delay:.0f} s "
                      f"({self.restarts + 1}/{RESTART_MAX}); see {spec.log}",
                      **spec.event_fields(), pid=pid, code=code, restart_in_s=delay)
        elif self.restart_at is not None and now >= self.restart_at:
            self.restarts += 1
            self.start(now)
            out.event("restarted", f"{spec.name} restarted (pid {self.pid})", **spec.event_fields(), pid=self.pid)

    def problem(self, now: float) -> str | None:
        if self.failed:
            return f"{self.spec.name} FAILED ({self.failed})"
        if self.restart_at is not None:
            return f"{self.spec.name} down, restart in {max(0.0, self.restart_at - now):.0f} s"
        return None


# -- output -----------------------------------------------------------------------------------
AR_RUNNING, AR_WAITING, AR_DOWN = "running", "waiting", "down"


@dataclass
class Status:
    running: int
    bookies: int
    autorecovery: str  # AR_RUNNING | AR_WAITING (for the bookies to register) | AR_DOWN (see problems)
    writable: int
    readonly: int
    ledgers: int | None  # None: metadata unreachable
    under_replicated: int | None = None
    auditor: str | None = None
    problems: list[str] = field(default_factory=list)

    def text(self) -> str:
        parts = [f"{self.running}/{self.bookies} bookies running"]
        if self.autorecovery == AR_RUNNING:
            parts.append("autorecovery running")
        elif self.autorecovery == AR_WAITING:
            parts.append("autorecovery waits for the bookies")
        # Without metadata (ledgers None) the problems say why; the counts would be made up.
        if self.ledgers is not None:
            parts.append(f"{self.writable} writable, {self.readonly} readonly, {self.ledgers} ledgers, "
                         f"{self.under_replicated} under-replicated, auditor {self.auditor or 'none'}")
        return ", ".join([*parts, *self.problems])

    def key(self) -> tuple[Any, ...]:  # what counts as a change worth a line (not the ledger count)
        return (self.running, self.autorecovery, self.writable, self.readonly, self.ledgers is None,
                self.under_replicated, self.auditor, tuple(self.problems))


class Output:
    """Human lines (a status line rewritten in place on a terminal) or JSON lines."""

    def __init__(self, *, as_json: bool, show_status: bool, stream: IO[str] = sys.stdout) -> None:
        self.as_json, self.show_status, self.stream = as_json, show_status, stream
        self.tty = stream.isatty() and not as_json
        self._line_shown = False
        self._last_key: tuple[Any, ...] | None = None
        self._last_plain = 0.0

    def _write(self, text: str) -> None:
        if self.stream.closed:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except OSError:
            # The terminal went away (SIGHUP) or the reader of a pipe quit: keep supervising
            # and stopping the children, silently, rather than die and orphan them.
            with contextlib.suppress(OSError):
                self.stream.close()

    def _clear_line(self) -> None:
        if self._line_shown:
            self._write("\r\x1b[K")
            self._line_shown = False

    def lines(self, text: str) -> None:
        self._clear_line()
        self._write(text + "\n")

    def description(self, layout: Layout, pids: dict[str, int | None]) -> None:
        ar = layout.autorecovery
        if self.as_json:
            self.lines(json.dumps({"event": "cluster", "metadata": layout.metadata, "data_dir": layout.data_dir,
                                   "base_port": layout.base_port, "pid": os.getpid(),
                                   "bookies": [{"name": b.name, "id": b.bookie_id, "port": b.port,
                                                "http_port": b.http_port, "http": b.http_url,
                                                "metrics": f"{b.http_url}/metrics", "data_dir": b.data_dir,
                                                "log": b.log, "pid": pids[b.name]} for b in layout.bookies],
                                   "autorecovery": {"name": ar.name, "id": ar.candidate_id, "http_port": ar.http_port,
                                                    "http": ar.http_url, "metrics": f"{ar.http_url}/metrics",
                                                    "log": ar.log, "pid": pids[ar.name]}}))
            return
        rows = [f"zbk sandbox: {len(layout.bookies)} bookies and auto-recovery, data in {layout.data_dir}",
                f"  metadata  {layout.metadata}"]
        rows += [f"  {b.name}  id {b.bookie_id}  metrics {b.http_url}/metrics  pid {pids[b.name]}  log {b.log}"
                 for b in layout.bookies]
        ar_pid = pids[ar.name]
        rows.append(f"  {ar.name}  auditor candidate {ar.candidate_id}  metrics {ar.http_url}/metrics  "
                    f"{f'pid {ar_pid}' if ar_pid else 'starts once the bookies have registered'}  log {ar.log}")
        rows.append("Ctrl-C stops the cluster.")
        self.lines("\n".join(rows))

    def event(self, kind: str, message: str, **fields: Any) -> None:
        self.lines(json.dumps({"event": kind, **fields}) if self.as_json else message)

    def status(self, st: Status, now: float) -> None:
        if not self.show_status:
            return
        if self.tty:
            width = shutil.get_terminal_size().columns - 1  # a wrapped line cannot be rewritten with \r
            self._write("\r\x1b[K" + st.text()[:width])
            self._line_shown = True
            return
        if st.key() == self._last_key and now - self._last_plain < PLAIN_STATUS_INTERVAL_S:
            return
        self._last_key, self._last_plain = st.key(), now
        if self.as_json:
            self.lines(json.dumps({"event": "status", "running": st.running, "bookies": st.bookies,
                                   "autorecovery": st.autorecovery, "writable": st.writable,
                                   "readonly": st.readonly, "ledgers": st.ledgers,
                                   "under_replicated": st.under_replicated, "auditor": st.auditor,
                                   "problems": st.problems}))
        else:
            self.lines(f"[{time.strftime('%H:%M:%S')}] {st.text()}")

    def end(self) -> None:
        self._clear_line()


# -- the sandbox ------------------------------------------------------------------------------
class StopSignals:
    """SIGINT, SIGTERM and SIGHUP (terminal closed) all ask for a clean stop; a second one
    asks to stop waiting and SIGKILL the children."""

    def __init__(self) -> None:
        self.count = 0

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.count += 1


@dataclass
class ClusterView:
    """What metadata says about the cluster, read once per status tick."""

    writable: set[str]
    readonly: set[str]
    ledgers: int
    under_replicated: int
    auditor: str | None


class Sandbox:
    def __init__(self, layout: Layout, store: MetadataStore, out: Output, signals: StopSignals, *,
                 settings: list[str], verbose: bool) -> None:
        self.layout, self.store, self.out, self.signals = layout, store, out, signals
        self.bookies = [Supervised(b, bookie_argv(layout, b, settings, verbose)) for b in layout.bookies]
        # Restarted and stopped like the bookies, but started only once they have registered
        # (see the module docstring), and stopped before them.
        self.autorecovery = Supervised(layout.autorecovery, autorecovery_argv(layout, verbose))
        self.autorecovery_started = False
        self.ready = False

    @property
    def children(self) -> list[Supervised]:
        return [*self.bookies, self.autorecovery]

    def run(self) -> int:
        try:
            now = time.monotonic()
            for c in self.bookies:
                c.start(now)
            self.out.description(self.layout, {c.spec.name: c.pid for c in self.children})
            self._loop()
        finally:
            # Also on an unexpected error: never leave a child behind.
            self.out.end()
            code = self.stop_all()
        return code

    def _loop(self) -> None:
        next_status = 0.0
        while not self.signals.count:
            now = time.monotonic()
            for c in self.children:
                c.supervise(now, self.out)
            if now >= next_status:
                self.out.status(self.status(now), now)
                # Until ready, look more often: starting auto-recovery and saying "ready"
                # should not wait for the slow status cadence.
                next_status = now + (STATUS_INTERVAL_S if self.ready else READY_POLL_S)
            time.sleep(TICK_S)

    def read_cluster(self) -> ClusterView:
        from zbk.metadata.coordination import current_leader
        from zbk.metadata.registry import LedgerStore, list_bookies
        from zbk.recovery.underreplication import UnderReplicationRegistry

        return ClusterView(writable={r.bookie_id for r in list_bookies(self.store)},
                           readonly={r.bookie_id for r in list_bookies(self.store, readonly=True)},
                           ledgers=sum(1 for _ in LedgerStore(self.store).list_ids()),
                           under_replicated=UnderReplicationRegistry(self.store, "zbk-sandbox").count(),
                           auditor=current_leader(self.store))

    def status(self, now: float) -> Status:
        """Read metadata, start auto-recovery or say "ready" when due, and sum it all up."""
        view: ClusterView | None = None
        error = None
        try:
            view = self.read_cluster()
        except Exception as e:  # noqa: BLE001 - a failed status read must not take the cluster down
            error = f"metadata: {e}"
        if view is not None:
            self._advance(view, now)
        ar = self.autorecovery
        st = Status(running=sum(c.alive() for c in self.bookies), bookies=len(self.bookies),
                    autorecovery=(AR_RUNNING if ar.alive() else AR_DOWN if self.autorecovery_started else AR_WAITING),
                    writable=0, readonly=0, ledgers=None,
                    problems=[p for c in self.children if (p := c.problem(now))])
        if view is None:
            st.problems.append(str(error))
            return st
        st.writable, st.readonly, st.ledgers = len(view.writable), len(view.readonly), view.ledgers
        st.under_replicated, st.auditor = view.under_replicated, view.auditor
        return st

    def _advance(self, view: ClusterView, now: float) -> None:
        registered = view.writable | view.readonly
        settled = all(b.bookie_id in registered or c.failed for b, c in zip(self.layout.bookies, self.bookies,
                                                                            strict=True))
        if settled and not self.autorecovery_started:
            ar, spec = self.autorecovery, self.layout.autorecovery
            ar.start(now)
            self.autorecovery_started = True
            self.out.event("started", f"{spec.name} started (pid {ar.pid}): auditor candidate {spec.candidate_id}, "
                           f"metrics {spec.http_url}/metrics", **spec.event_fields(), pid=ar.pid,
                           http=spec.http_url)
        ours = {b.bookie_id for b in self.layout.bookies}
        if not self.ready and ours <= registered and view.auditor is not None:
            self.ready = True
            self.out.event("ready", f"ready: all {len(ours)} bookies registered in {self.layout.metadata}, "
                           f"auditor {view.auditor}", metadata=self.layout.metadata, bookies=sorted(ours),
                           auditor=view.auditor)

    def stop_all(self) -> int:
        """Stop auto-recovery, then the bookies (see the module docstring); report each exit."""
        signals_seen = self.signals.count
        clean = self._stop_group([self.autorecovery], "autorecovery", signals_seen)
        clean &= self._stop_group(self.bookies, f"{len(self.bookies)} bookies", signals_seen)
        self.out.event("exit", f"sandbox stopped: {'every process stopped cleanly' if clean else 'NOT all clean'}",
                       code=0 if clean else 1)
        return 0 if clean else 1

    def _stop_group(self, group: list[Supervised], what: str, signals_seen: int) -> bool:
        """SIGTERM every running child of ``group`` by PID, wait, SIGKILL stragglers; True
        if every child that was started stopped cleanly."""
        running = [c.proc for c in group if c.proc is not None and c.proc.poll() is None]
        if running:
            self.out.event("stopping", f"stopping {what} (SIGTERM)...", group=group[0].spec.kind,
                           processes=len(running))
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while (any(p.poll() is None for p in running) and time.monotonic() < deadline
               and self.signals.count == signals_seen):  # another Ctrl-C: stop waiting
            time.sleep(0.05)
        clean = True
        for c in group:
            clean &= self._reap(c, was_running=c.proc in running)
        return clean

    def _reap(self, c: Supervised, *, was_running: bool) -> bool:
        """Report how one child ended; True if it stopped cleanly (or was never due to start)."""
        spec, proc = c.spec, c.proc
        if proc is None:
            never = c is self.autorecovery and not self.autorecovery_started
            why = ("not started: the bookies had not all registered" if never
                   else c.failed or ("restart pending" if c.restart_at is not None else "not started"))
            self.out.event("stopped", f"  {spec.name} {spec.ident}: was not running ({why})", **spec.event_fields(),
                           pid=None, code=None)
            return never
        killed = proc.poll() is None
        if killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        code = proc.wait()
        note = " after SIGKILL (did not stop in time)" if killed else ""
        if not was_running:
            note = " (it had exited on its own just before the stop)"
        self.out.event("stopped", f"  {spec.name} {spec.ident} pid {proc.pid}: {spec.describe_exit(code)}{note}",
                       **spec.event_fields(), pid=proc.pid, code=code)
        return code == 0 and not killed and was_running


def run(args: argparse.Namespace) -> int:
    from zbk.metadata.uri import open_store

    signals = StopSignals()
    signals.install()  # before any child exists: a Ctrl-C from here on stops them in order
    layout = resolve_layout(args)
    os.makedirs(layout.data_dir, exist_ok=True)
    lock = lock_data_dir(layout.data_dir)
    try:
        check_ports(layout)
        store = open_store(layout.metadata)  # a bad URI or an unreachable etcd fails here, before any child
        try:
            save_layout(layout)  # only a layout that worked binds this data dir
            out = Output(as_json=args.json, show_status=not args.no_status)
            return Sandbox(layout, store, out, signals, settings=args.set, verbose=args.verbose).run()
        finally:
            store.close()
    finally:
        lock.close()
