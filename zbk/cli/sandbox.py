"""`zbk sandbox`: a whole local cluster in one command (ARCHITECTURE.md "Processes").

Everything listens on 127.0.0.1. With ``--base-port P`` (default 3181) and N bookies
(default 3):

* bookie i (0-based) is a real child process ``python -m zbk.cli.main bookie``, wire
  port P+i (so its bookie id is ``127.0.0.1:<P+i>``) and HTTP port P+1000+i
  (``/metrics``, ``/heartbeat``, ``/api/v1/bookie/info``). ``--base-port 0`` picks a free
  range below the kernel's ephemeral ports.
* metadata is the embedded store ``sqlite:///<data dir>/meta.db`` unless ``--metadata``
  names another (e.g. ``etcd://127.0.0.1:2379/zbk``).
* the data dir (default ``./zbk-sandbox``) holds ``bookie-<i>/`` (journal, ledgers,
  index), ``logs/bookie-<i>.log``, ``sandbox.json`` (bookies, base port and metadata URI,
  so that a restart on the same dir brings back the same cluster: same ports, same bookie
  ids, matching cookies) and ``sandbox.lock`` (one sandbox per data dir).

While it runs it prints a status line (registered writable/readonly bookies and the ledger
count, read from metadata every 2 s): rewritten in place on a terminal, a plain line every
10 s (and on every change) otherwise. A bookie that exits on its own is reported and
restarted with exponential backoff (1, 2, 4... s), at most 5 times in a row (a bookie that
then stays up for a minute earns its retries back); a cookie mismatch is never retried.

SIGINT, SIGTERM or SIGHUP stop the cluster: SIGTERM to every bookie by PID (each then
checkpoints and clears its dirty marker), SIGKILL for any still running after 30 s (or
at once on a second Ctrl-C), each exit code reported. Exit code 0 when
every bookie stopped cleanly, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from zbk.errors import ConfigError, ZbkError

if TYPE_CHECKING:
    from zbk.metadata.store import MetadataStore

DEFAULT_BASE_PORT = 3181
DEFAULT_DATA_DIR = "zbk-sandbox"
HTTP_PORT_OFFSET = 1000
LAYOUT_FILE = "sandbox.json"
LOCK_FILE = "sandbox.lock"
LOOPBACK = "127.0.0.1"

TICK_S = 0.2  # how quickly a dead child or a signal is noticed
STATUS_INTERVAL_S = 2.0  # metadata is read this often
PLAIN_STATUS_INTERVAL_S = 10.0  # a non-terminal gets an unchanged status line this often
STOP_TIMEOUT_S = 30.0  # a bookie's clean stop joins its actors (10 s each at worst)
RESTART_MAX = 5
RESTART_BACKOFF_BASE_S = 1.0
RESTART_BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0
# --base-port 0 searches here: below Linux's ephemeral range (32768+), so that outgoing
# connections cannot be holding the ports we picked by the time the bookies bind them.
AUTO_PORT_LOW, AUTO_PORT_HIGH = 10_000, 31_000


def add_parser(sub: Any) -> None:
    p = sub.add_parser("sandbox", help="a whole local cluster: N bookies on embedded metadata",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bookies", type=int, help="number of bookies (default 3, or as last time on this data dir)")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help=f"cluster directory (default ./{DEFAULT_DATA_DIR})")
    p.add_argument("--metadata", help="metadata URI (default sqlite:///<data dir>/meta.db)")
    p.add_argument("--base-port", type=int,
                   help=f"bookie i listens on BASE+i, its HTTP on BASE+{HTTP_PORT_OFFSET}+i "
                        f"(default {DEFAULT_BASE_PORT}; 0 picks free ports)")
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

    @property
    def name(self) -> str:
        return f"bookie-{self.index}"

    @property
    def bookie_id(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def http_url(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}"


@dataclass(frozen=True)
class Layout:
    data_dir: str
    metadata: str
    base_port: int
    bookies: tuple[BookieSpec, ...]

    def saved(self) -> dict[str, Any]:
        return {"bookies": len(self.bookies), "base_port": self.base_port, "metadata": self.metadata}


def make_layout(data_dir: str, metadata: str, base_port: int, n: int) -> Layout:
    specs = tuple(BookieSpec(i, base_port + i, base_port + HTTP_PORT_OFFSET + i,
                             os.path.join(data_dir, f"bookie-{i}"), os.path.join(data_dir, "logs", f"bookie-{i}.log"))
                  for i in range(n))
    return Layout(data_dir, metadata, base_port, specs)


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
    if not 1024 <= base <= 65535 - HTTP_PORT_OFFSET - n:
        raise ConfigError(f"--base-port must leave room for {n} bookie and HTTP ports "
                          f"(1024..{65535 - HTTP_PORT_OFFSET - n}), got {base}")
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


def port_free(port: int) -> bool:
    # SO_REUSEADDR as the bookie's servers use it: a port in TIME_WAIT from our last run is
    # free for them, a port someone listens on is not.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _ports(base: int, n: int) -> list[int]:
    return [base + i for i in range(n)] + [base + HTTP_PORT_OFFSET + i for i in range(n)]


def pick_free_base_port(n: int, attempts: int = 200) -> int:
    for _ in range(attempts):
        base = random.randrange(AUTO_PORT_LOW, AUTO_PORT_HIGH - HTTP_PORT_OFFSET - n)
        if all(port_free(p) for p in _ports(base, n)):
            return base
    raise ZbkError(f"no free range of {n} + {n} ports found on {LOOPBACK}")


def check_ports(layout: Layout) -> None:
    for b in layout.bookies:
        for port, what in ((b.port, "wire"), (b.http_port, "HTTP")):
            if not port_free(port):
                raise ZbkError(f"port {port} ({b.name} {what}) is in use on {LOOPBACK}: is a bookie of an earlier "
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


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _die_with_parent_hook() -> Callable[[], None] | None:
    """Linux: the child gets SIGTERM (a clean stop) if the sandbox itself is killed (kill -9)
    before it could stop it, instead of living on as an orphan that holds the ports.

    The death signal follows the thread that forked: children are only ever started from
    the main thread, which lives until the sandbox ends."""
    prctl = _PRCTL
    if prctl is None:
        return None
    parent, sigterm = os.getpid(), int(signal.SIGTERM)

    def hook() -> None:  # runs in the child between fork and exec: keep it tiny
        prctl(_PR_SET_PDEATHSIG, sigterm)
        if os.getppid() != parent:  # the sandbox died before prctl took effect
            os.kill(os.getpid(), sigterm)

    return hook


def spawn(argv: list[str], log_path: str) -> subprocess.Popen[bytes]:
    """Start a child in its own session (process group), so that a Ctrl-C in the terminal
    reaches only the sandbox, which then stops the children itself."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True,
                                preexec_fn=_die_with_parent_hook())


def describe_exit(code: int) -> str:
    from zbk.actors.bookie import ACTOR_EXIT_BASE, ACTORS, EXIT_BOOT, EXIT_COOKIE

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


@dataclass
class Supervised:
    """One bookie child and its restart state."""

    spec: BookieSpec
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
        from zbk.actors.bookie import EXIT_COOKIE

        if self.proc is not None:
            code = self.proc.poll()
            if code is None:
                if self.restarts and now - self.started_at > STABLE_AFTER_S:
                    self.restarts = 0
                return
            pid, self.proc = self.proc.pid, None
            if code == EXIT_COOKIE or self.restarts >= RESTART_MAX:
                why = ("its data dir does not belong to this cluster's metadata" if code == EXIT_COOKIE
                       else f"{RESTART_MAX} restarts in a row")
                self.failed = describe_exit(code)
                out.event("failed", f"{self.spec.name} (pid {pid}) {describe_exit(code)}; not restarting: {why}; "
                          f"see {self.spec.log}", bookie=self.spec.name, pid=pid, code=code)
                return
            delay = min(RESTART_BACKOFF_BASE_S * 2 ** self.restarts, RESTART_BACKOFF_MAX_S)
            self.restart_at = now + delay
            out.event("exited", f"{self.spec.name} (pid {pid}) {describe_exit(code)}; restarting in {delay:.0f} s "
                      f"({self.restarts + 1}/{RESTART_MAX}); see {self.spec.log}",
                      bookie=self.spec.name, pid=pid, code=code, restart_in_s=delay)
        elif self.restart_at is not None and now >= self.restart_at:
            self.restarts += 1
            self.start(now)
            out.event("restarted", f"{self.spec.name} restarted (pid {self.pid})", bookie=self.spec.name, pid=self.pid)

    def problem(self, now: float) -> str | None:
        if self.failed:
            return f"{self.spec.name} FAILED ({self.failed})"
        if self.restart_at is not None:
            return f"{self.spec.name} down, restart in {max(0.0, self.restart_at - now):.0f} s"
        return None


# -- output -----------------------------------------------------------------------------------
@dataclass
class Status:
    running: int
    bookies: int
    writable: int
    readonly: int
    ledgers: int | None  # None: metadata unreachable
    problems: list[str] = field(default_factory=list)

    def text(self) -> str:
        # Without metadata (ledgers None) the problems say why; the counts would be made up.
        meta = ([f"{self.writable} writable, {self.readonly} readonly, {self.ledgers} ledgers"]
                if self.ledgers is not None else [])
        return ", ".join([f"{self.running}/{self.bookies} bookies running", *meta, *self.problems])

    def key(self) -> tuple[Any, ...]:  # what counts as a change worth a line (not the ledger count)
        return (self.running, self.writable, self.readonly, self.ledgers is None, tuple(self.problems))


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
        if self.as_json:
            self.lines(json.dumps({"event": "cluster", "metadata": layout.metadata, "data_dir": layout.data_dir,
                                   "base_port": layout.base_port, "pid": os.getpid(),
                                   "bookies": [{"name": b.name, "id": b.bookie_id, "port": b.port,
                                                "http_port": b.http_port, "http": b.http_url,
                                                "metrics": f"{b.http_url}/metrics", "data_dir": b.data_dir,
                                                "log": b.log, "pid": pids[b.name]} for b in layout.bookies]}))
            return
        rows = [f"zbk sandbox: {len(layout.bookies)} bookies, data in {layout.data_dir}",
                f"  metadata  {layout.metadata}"]
        rows += [f"  {b.name}  id {b.bookie_id}  metrics {b.http_url}/metrics  pid {pids[b.name]}  log {b.log}"
                 for b in layout.bookies]
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
                                   "writable": st.writable, "readonly": st.readonly, "ledgers": st.ledgers,
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


class Sandbox:
    def __init__(self, layout: Layout, store: MetadataStore, out: Output, signals: StopSignals, *,
                 settings: list[str], verbose: bool) -> None:
        self.layout, self.store, self.out, self.signals = layout, store, out, signals
        self.children = [Supervised(b, bookie_argv(layout, b, settings, verbose)) for b in layout.bookies]
        # Autorecovery (auditor + replicator workers) is not started yet: `zbk autorecovery`
        # (zbk/recovery/process.py) is still being built. Once it is done, it is started here
        # as one more supervised child (`zbk autorecovery --metadata <uri> --http-port
        # <base+2000>`, a port outside the bookie ranges so that adding bookies later cannot
        # collide with it), restarted and stopped like the bookies.
        self.ready = False

    def run(self) -> int:
        try:
            now = time.monotonic()
            for c in self.children:
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
                next_status = now + STATUS_INTERVAL_S
            time.sleep(TICK_S)

    def status(self, now: float) -> Status:
        from zbk.metadata.registry import LedgerStore, list_bookies

        st = Status(running=sum(c.alive() for c in self.children), bookies=len(self.children), writable=0,
                    readonly=0, ledgers=None, problems=[p for c in self.children if (p := c.problem(now))])
        try:
            writable = {r.bookie_id for r in list_bookies(self.store)}
            readonly = {r.bookie_id for r in list_bookies(self.store, readonly=True)}
            st.ledgers = sum(1 for _ in LedgerStore(self.store).list_ids())
        except Exception as e:  # noqa: BLE001 - a failed status read must not take the cluster down
            st.problems.append(f"metadata: {e}")
            return st
        st.writable, st.readonly = len(writable), len(readonly)
        ours = {c.spec.bookie_id for c in self.children}
        if not self.ready and ours <= writable | readonly:
            self.ready = True
            self.out.event("ready", f"ready: all {len(ours)} bookies registered in {self.layout.metadata}",
                           metadata=self.layout.metadata, bookies=sorted(ours))
        return st

    def stop_all(self) -> int:
        """SIGTERM every running child by PID, wait, SIGKILL stragglers; report each exit."""
        running = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        if running:
            self.out.event("stopping", f"stopping {len(running)} bookies (SIGTERM)...", bookies=len(running))
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        signals_seen = self.signals.count
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while (any(p.poll() is None for p in running) and time.monotonic() < deadline
               and self.signals.count == signals_seen):  # another Ctrl-C: stop waiting
            time.sleep(0.05)
        clean = True
        for c in self.children:
            clean &= self._reap(c, was_running=c.proc in running)
        self.out.event("exit", f"sandbox stopped: {'every bookie stopped cleanly' if clean else 'NOT all clean'}",
                       code=0 if clean else 1)
        return 0 if clean else 1

    def _reap(self, c: Supervised, *, was_running: bool) -> bool:
        """Report how one child ended; True if it was running and stopped cleanly."""
        name, proc = c.spec.name, c.proc
        if proc is None:
            why = c.failed or ("restart pending" if c.restart_at is not None else "not started")
            self.out.event("stopped", f"  {name} {c.spec.bookie_id}: was not running ({why})", bookie=name,
                           pid=None, code=None)
            return False
        killed = proc.poll() is None
        if killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        code = proc.wait()
        note = " after SIGKILL (did not stop in time)" if killed else ""
        if not was_running:
            note = " (it had exited on its own just before the stop)"
        self.out.event("stopped", f"  {name} {c.spec.bookie_id} pid {proc.pid}: {describe_exit(code)}{note}",
                       bookie=name, pid=proc.pid, code=code)
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
