"""`zbk sandbox`: the cluster's layout (bookies, ports, data dirs, the auto-recovery
process), saved in ``sandbox.json`` so that a restart on the same data dir brings back
the same cluster, and how a child's exit code reads (zbk/cli/sandbox.py runs it).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import random
import signal
from dataclasses import dataclass
from typing import IO, Any, ClassVar, Protocol

from zbk.cli.ports import AUTO_PORT_HIGH, AUTO_PORT_LOW, port_free
from zbk.errors import EXIT_FAILED, EXIT_UNREACHABLE, EXIT_USAGE, ConfigError, ZbkError

DEFAULT_BASE_PORT = 3181
DEFAULT_DATA_DIR = "zbk-sandbox"
HTTP_PORT_OFFSET = 1000
AUTORECOVERY_PORT_OFFSET = 2000  # above every bookie HTTP port (at most 100 bookies)
LAYOUT_FILE = "sandbox.json"
LOCK_FILE = "sandbox.lock"
LOOPBACK = "127.0.0.1"


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
