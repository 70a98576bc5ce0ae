"""Hosts for fault tests: each host its own Linux network namespace, all on one bridge.

One :class:`Network` creates, and removes again, everything below (``P`` is its prefix):

* ``P-br``: a namespace that holds the bridge ``br0`` (address 127.77.0.254) and, for host
  number ``i``, the veth end ``v<i>`` enslaved to that bridge;
* ``P-<host>``: one namespace per host, with ``lo`` (127.0.0.1/32), ``eth0`` (the other veth
  end) at 127.77.0.<i>/24, and an empty nftables table ``inet zbkfault`` that
  :mod:`faults.netfaults` fills to cut links.

Addresses stay in the loopback range, so no packet could be routed off the machine even by
mistake. Linux treats 127/8 outside ``lo`` as martian unless ``route_localnet`` is set, so it
is set on every interface of every namespace. ``lo`` keeps only 127.0.0.1/32 rather than the
usual /8: with the /8, every 127.x address would be local to every host, and the /24 on
``eth0`` would win only through longest-prefix matching in the kernel's merged local/main
table, which stops holding as soon as a policy rule separates the tables. IPv6 is switched
off inside the hosts, so that nothing (router solicitations, duplicate address detection)
crosses the bridge besides what a test sends.

Names are unique per run: the prefix is ``zbkf<pid>-<n>``, so parallel runs and CI jobs never
collide, and :func:`sweep_stale` can tell the namespaces of a run whose process is gone.
Interface names live inside namespaces, so every host's interface is ``eth0``.

A process can itself join a host (:meth:`Network.join`): the chaos run (bench/chaos.py)
runs its clients in its own process, so it moves into the clients' host before it starts
any thread. A network namespace belongs to a thread, and a thread starts in the namespace
of the thread that creates it: only threads started after the join (ZeroMQ's I/O threads,
gRPC's, the asyncio executors) are in the host, so the join must come first, in a process
with a single thread.

Processes run in a host through ``ip netns exec`` (it enters the namespace and execs the
command, so the PID returned is the command's own). Teardown (:meth:`Network.close`) stops
every process by PID, kills whatever still runs inside the namespaces, deletes every link,
rule and namespace, and checks that none is left. It runs on success and on failure (a
context manager, and the fixture in ``conftest.py``), and on SIGINT, SIGTERM and SIGHUP and at
interpreter exit (handlers installed when the first network is built). A namespace that
cannot be made raises :class:`NetnsError` saying why; tests never skip on it.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO, Any

from zbk.cli.children import spawn_tied, stop_child

IP = shutil.which("ip") or "/usr/sbin/ip"
NFT = shutil.which("nft") or "/usr/sbin/nft"
TC = shutil.which("tc") or "/usr/sbin/tc"
SUBNET = "127.77.0"  # hosts get SUBNET.1, SUBNET.2, ...; the bridge SUBNET.254
BRIDGE_OCTET = 254
HOSTS_MAX = BRIDGE_OCTET - 1
NS_PREFIX = "zbkf"
FAULT_TABLE = "zbkfault"  # the nftables table (family inet) in every host
HOST_IF = "eth0"
BRIDGE_IF = "br0"
COMMAND_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
CLONE_NEWNET = 0x40000000

_HOST_NAME = re.compile(r"^[a-z][a-z0-9]{0,15}$")
_OUR_NS = re.compile(rf"^{NS_PREFIX}(\d+)-")
_counter = itertools.count(1)


class NetnsError(RuntimeError):
    """The harness could not build (or remove) a namespace, a link or a rule."""


def run(argv: Sequence[str], *, stdin: str | None = None, timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """Run one command of the harness (ip, nft, tc); its stdout, or NetnsError with stderr."""
    try:
        r = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError as e:
        raise NetnsError(f"{argv[0]} not found: install iproute2 and nftables (scripts/setup.sh does)") from e
    except subprocess.TimeoutExpired as e:
        raise NetnsError(f"`{' '.join(argv)}` did not finish in {timeout_s} s") from e
    if r.returncode != 0:
        raise NetnsError(f"`{' '.join(argv)}` failed with {r.returncode}: {(r.stderr or r.stdout).strip()}")
    return r.stdout


def list_netns() -> list[str]:
    """Names of every named network namespace (``ip netns list``)."""
    return [line.split()[0] for line in run([IP, "netns", "list"]).splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Delete the namespaces of earlier runs whose process no longer exists (a run killed
    with SIGKILL runs no teardown); returns their names. Live runs' namespaces stay."""
    gone = []
    for name in list_netns():
        m = _OUR_NS.match(name)
        if m and not _alive(int(m.group(1))):
            with contextlib.suppress(NetnsError):
                run([IP, "netns", "delete", name])
                gone.append(name)
    return gone


@dataclass(frozen=True)
class Host:
    name: str
    netns: str
    addr: str  # its address on the bridge, 127.77.0.<i>
    bridge_port: str  # its veth end in the bridge namespace

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this host."""
        return [IP, "netns", "exec", self.netns, *argv]


class Network:
    """Hosts ``names`` (lower-case letters and digits), each in its own namespace; use it as
    a context manager, or call :meth:`create` and then :meth:`close` in a ``finally``."""

    def __init__(self, names: Sequence[str], *, subnet: str = SUBNET) -> None:
        if not names:
            raise ValueError("a network needs at least one host")
        if len(set(names)) != len(names):
            raise ValueError(f"host names must be unique: {list(names)}")
        if len(names) > HOSTS_MAX:
            raise ValueError(f"at most {HOSTS_MAX} hosts, got {len(names)}")
        for n in names:
            if not _HOST_NAME.match(n) or n == "br":
                raise ValueError(f"bad host name {n!r}: lower-case letters and digits, at most 16, not 'br'")
        self.prefix = f"{NS_PREFIX}{os.getpid()}-{next(_counter)}"
        self.subnet = subnet
        self.bridge_netns = f"{self.prefix}-br"
        self.hosts: dict[str, Host] = {
            n: Host(n, f"{self.prefix}-{n}", f"{subnet}.{i}", f"v{i}") for i, n in enumerate(names, start=1)}
        self._made: list[str] = []  # namespaces, in the order they were made
        self._ports: list[str] = []  # veth ends in the bridge namespace
        self._procs: list[subprocess.Popen[Any]] = []
        self._lock = threading.RLock()
        self._closed = False
        self._home_fd: int | None = None  # this process's own namespace while it is joined to a host
        from faults.netfaults import NetFaults

        self.faults = NetFaults(self)

    # --- building -----------------------------------------------------------------------

    def __enter__(self) -> Network:
        return self.create()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def create(self) -> Network:
        for tool in (IP, NFT, TC):
            if not os.access(tool, os.X_OK):
                raise NetnsError(f"{tool} not found: the fault tests need iproute2 and nftables "
                                 "(apt-get install iproute2 nftables; scripts/setup.sh installs them)")
        _install_cleanup()
        with self._lock:
            if self._closed:
                raise NetnsError("this network was closed")
            _live.add(self)
        sweep_stale()
        try:
            self._make_bridge()
            for host in self.hosts.values():
                self._make_host(host)
        except BaseException:
            self.close()
            raise
        return self

    def _add_netns(self, name: str) -> None:
        with self._lock:
            if self._closed:  # a signal's teardown ran while we were building
                raise NetnsError("the network was torn down while it was being built")
            self._made.append(name)
        try:
            run([IP, "netns", "add", name])
        except NetnsError as e:
            self._made.remove(name)
            raise NetnsError(f"cannot create network namespace {name}: {e}. The fault tests need root "
                             "(CAP_SYS_ADMIN and CAP_NET_ADMIN) and a kernel with network namespaces.") from e

    def _sysctls(self, netns: str, ifaces: Iterable[str]) -> None:
        """route_localnet on, IPv6 off (where the kernel has IPv6), inside ``netns``."""
        conf = "/proc/sys/net/ipv4/conf"
        lines = [f"echo 1 > {conf}/{i}/route_localnet" for i in ("all", "default", *ifaces)]
        lines += ["for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; "
                  "do [ -e $f ] && echo 1 > $f; done; true"]
        run([IP, "netns", "exec", netns, "sh", "-ec", "\n".join(lines)])

    def _make_bridge(self) -> None:
        ns = self.bridge_netns
        self._add_netns(ns)
        self._sysctls(ns, ["lo"])
        run([IP, "-n", ns, "-batch", "-"], stdin="\n".join([
            "link set lo up",
            f"link add {BRIDGE_IF} type bridge",
            f"addr add {self.subnet}.{BRIDGE_OCTET}/24 dev {BRIDGE_IF}",
            f"link set {BRIDGE_IF} up", ""]))
        self._sysctls(ns, [BRIDGE_IF])

    def _make_host(self, h: Host) -> None:
        self._add_netns(h.netns)
        self._sysctls(h.netns, ["lo"])
        self._ports.append(h.bridge_port)
        run([IP, "-n", self.bridge_netns, "-batch", "-"], stdin="\n".join([
            f"link add {h.bridge_port} type veth peer name {HOST_IF} netns {h.netns}",
            f"link set {h.bridge_port} master {BRIDGE_IF}",
            f"link set {h.bridge_port} up", ""]))
        run([IP, "-n", h.netns, "-batch", "-"], stdin="\n".join([
            "link set lo up",
            "addr del 127.0.0.1/8 dev lo",
            "addr add 127.0.0.1/32 dev lo",
            f"addr add {h.addr}/24 dev {HOST_IF}",
            f"link set {HOST_IF} up", ""]))
        self._sysctls(h.netns, [HOST_IF])
        self.faults.install(h)

    # --- using ---------------------------------------------------------------------------

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            raise ValueError(f"no host {name!r} in this network (hosts: {sorted(self.hosts)})") from None

    def by_addr(self, addr: str) -> Host:
        """The host whose address is ``addr`` (a bookie id's host part, say)."""
        for h in self.hosts.values():
            if h.addr == addr:
                return h
        raise ValueError(f"no host has address {addr!r}")

    def start(self, host: str, argv: Sequence[str], *, log_path: Path | None = None,
              env: dict[str, str] | None = None, cwd: Path | None = None,
              stdin: int | IO[Any] | None = subprocess.DEVNULL,
              stdout: int | IO[Any] | None = None) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``host``; its Popen (``.pid`` is the command's own PID).

        Output goes to ``log_path`` (stdout and stderr; stderr only when ``stdout`` is given,
        e.g. PIPE). The child runs in its own session, so a Ctrl-C at the terminal reaches the
        test (whose teardown stops it) and not the child first, and it dies with SIGKILL if the
        test process dies without a teardown. Teardown stops it by PID."""
        h = self.host(host)
        with contextlib.ExitStack() as files:
            log = None
            if log_path is not None:
                log_path.parent.mkdir(parents=True, exist_ok=True)
                log = files.enter_context(open(log_path, "ab"))
            out: int | IO[Any] | None = stdout
            err: int | IO[Any] | None = log
            if stdout is None and log is not None:
                out, err = log, subprocess.STDOUT
            with self._lock:
                if self._closed:
                    raise NetnsError("this network was closed")
                proc = spawn_tied(h.argv(argv), death_signal=signal.SIGKILL, stdin=stdin, stdout=out,
                                  stderr=err, env=env, cwd=cwd, start_new_session=True)
                self._procs.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[Any], *, kill: bool = False, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Stop one process this network started, by its PID (SIGTERM, or SIGKILL with
        ``kill``; SIGKILL after ``timeout_s`` in any case)."""
        stop_child(proc, sig=signal.SIGKILL if kill else signal.SIGTERM, timeout_s=timeout_s)

    def run(self, host: str, argv: Sequence[str], *, stdin: str | None = None, timeout_s: float = 60.0,
            env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``host`` to completion; killed (by PID) on timeout or on any
        exception, as subprocess.run does."""
        h = self.host(host)
        r = subprocess.run(h.argv(argv), input=stdin, capture_output=True, text=True, timeout=timeout_s, env=env)
        if check and r.returncode != 0:
            raise NetnsError(f"`{' '.join(argv)}` in host {host} failed with {r.returncode}:\n"
                             f"{r.stderr.strip()}\n{r.stdout.strip()}")
        return r

    def join(self, host: str) -> None:
        """Move the calling thread into ``host``'s namespace until :meth:`leave` (or
        :meth:`close`); threads it starts afterwards are born there. Refused in a process
        that runs more than one thread: the others would stay outside, unseen."""
        if len(os.listdir("/proc/self/task")) != 1:
            raise NetnsError("joining a host needs a process with a single thread: threads started before the "
                             "join stay in the old namespace (start the run in a process of its own)")
        h = self.host(host)
        with self._lock:
            if self._closed or self._home_fd is not None:
                raise NetnsError("this network is closed, or this process has joined one of its hosts already")
            home = os.open("/proc/self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            target = os.open(f"/run/netns/{h.netns}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                _setns(target)
            except BaseException:
                os.close(home)
                raise
            finally:
                os.close(target)
            self._home_fd = home

    def leave(self) -> None:
        """Back to the namespace the calling thread had before :meth:`join`."""
        with self._lock:
            home, self._home_fd = self._home_fd, None
        if home is not None:
            try:
                _setns(home)
            finally:
                os.close(home)

    def pids(self, host: str) -> list[int]:
        """PIDs of every process that runs inside ``host`` now."""
        return _netns_pids(self.host(host).netns)

    def namespaces(self) -> list[str]:
        """This network's namespaces that exist now."""
        return [n for n in list_netns() if n.startswith(self.prefix + "-")]

    # --- teardown ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Remove everything this network made; safe to call twice, and from a signal
        handler. Raises NetnsError (after trying every step) if something is left."""
        self.leave()  # else `ip netns pids` would name this process, and it would be killed
        with self._lock:
            if self._closed:
                return
            self._closed = True
            procs, made, ports = list(self._procs), list(self._made), list(self._ports)
        errors: list[str] = []
        for p in procs:  # SIGTERM to all first, so that none waits on another's shutdown
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGTERM)
        for p in procs:
            if stop_child(p, sig=signal.SIGTERM, timeout_s=STOP_TIMEOUT_S) is None:
                errors.append(f"process {p.pid} would not die")
        for ns in made:  # what our processes forked inside the hosts
            for pid in _netns_pids(ns):
                _kill_wait(pid)
                if _alive(pid):
                    errors.append(f"process {pid} in {ns} would not die")
        host_ns = set(h.netns for h in self.hosts.values())
        for ns in made:
            if ns in host_ns:
                _try(errors, [IP, "netns", "exec", ns, NFT, "delete", "table", "inet", FAULT_TABLE], quiet=True)
                _try(errors, [IP, "netns", "exec", ns, TC, "qdisc", "del", "dev", HOST_IF, "root"], quiet=True)
        if self.bridge_netns in made:
            for port in ports:
                _try(errors, [IP, "-n", self.bridge_netns, "link", "delete", port], quiet=True)
            _try(errors, [IP, "-n", self.bridge_netns, "link", "delete", BRIDGE_IF], quiet=True)
        for ns in reversed(made):
            _try(errors, [IP, "netns", "delete", ns])
        with contextlib.suppress(NetnsError):
            left = self.namespaces()
            if left:
                errors.append(f"namespaces left behind: {left}")
        _live.discard(self)
        if errors:
            raise NetnsError(f"teardown of {self.prefix} was not clean: " + "; ".join(errors))


def _try(errors: list[str], argv: list[str], *, quiet: bool = False) -> None:
    """One teardown step; its failure is recorded unless ``quiet`` (a step whose object may
    already be gone, such as a rule table or a veth whose peer's namespace went first)."""
    try:
        run(argv)
    except NetnsError as e:
        if not quiet:
            errors.append(str(e))


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NetnsError(f"setns failed: {os.strerror(err)}")


def _netns_pids(netns: str) -> list[int]:
    try:
        return [int(p) for p in run([IP, "netns", "pids", netns]).split()]
    except NetnsError:
        return []


def _kill_wait(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


# --- teardown on signals and at exit ---------------------------------------------------------

_live: set[Network] = set()
_at_exit = False
_on_signals = False
_install_lock = threading.Lock()
CLEANUP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def close_all() -> None:
    """Tear down every network of this process that is still up."""
    for net in list(_live):
        with contextlib.suppress(NetnsError):
            net.close()


def _install_cleanup() -> None:
    """atexit, and handlers for the signals that end a run (only the main thread may set
    them). Each handler tears down, then does what the signal did before: raise
    KeyboardInterrupt for SIGINT, or die of the signal."""
    global _at_exit, _on_signals
    with _install_lock:
        if not _at_exit:
            _at_exit = True
            atexit.register(close_all)
        if _on_signals or threading.current_thread() is not threading.main_thread():
            return  # a network built later on the main thread installs them
        _on_signals = True
    for sig in CLEANUP_SIGNALS:
        previous = signal.getsignal(sig)
        if previous is signal.SIG_IGN:
            continue

        def handler(signum: int, frame: FrameType | None, previous: Any = previous) -> None:
            close_all()
            if callable(previous):
                previous(signum, frame)
                return
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        signal.signal(sig, handler)
