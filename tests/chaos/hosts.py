"""The chaos cluster on hosts of its own, for the fault kinds that loopback cannot make:
network partitions, power cuts and clock jumps (tests/chaos/faults.py ``HOST_KINDS``).

It reuses the fault-test machinery of tests/faults/ as it is:

* every etcd member, every bookie and each of the two autorecovery slots is a host of a
  :class:`faults.netns.Network` (a network namespace on one bridge, addresses 127.77.0.x);
  the clients (the workload and the end checks, in this process) are host ``c``, which this
  process joins (:meth:`Network.join`) before it starts any thread. Partitions are the
  nftables drops of :mod:`faults.netfaults`, each lifted alone when its fault ends;
* the bookies of ``ClusterSettings.power_loss`` keep their data directory on a power-loss
  layer (:class:`faults.powerloss_mount.PowerLossMount`): a power cut kills the bookie and
  drops what its disk held unsynced; the restart mounts what was durable;
* every bookie and autorecovery process runs under libfaketime with its host's wall clock
  (:class:`faults.faketime.FakeTime`): a clock jump moves one host's clock while it runs.
  etcd, a Go program, keeps the real clock (libfaketime does not reach it), and it is etcd
  that times the leases.

Every process is started in its host through the network, which stops each one by PID at
teardown at the latest; :meth:`Hosts.close` also unmounts every layer, removes
libfaketime's files of every process, and leaves no namespace behind.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from faults.faketime import FakeTime, release
from faults.netcluster import (
    BOOKIE_HTTP_PORT,
    BOOKIE_PORT,
    ETCD_CLIENT_PORT,
    REPO,
    bookie_argv,
    child_env,
    etcd_argv,
)
from faults.netns import Network
from faults.powerloss_mount import PowerLossMount
from helpers.bookie import BookieProcess
from helpers.procs import tail

CLIENT_HOST = "c"
AR_HTTP_PORT_BASE = 8100  # autorecovery processes of one host: 8100, 8101, ... (a new port per process)
MOUNT_TIMEOUT_S = 30.0


def etcd_host(i: int) -> str:
    return f"e{i}"


def bookie_host(i: int) -> str:
    return f"b{i}"


def ar_host(k: int) -> str:
    return f"a{k}"


class Hosts:
    """The network, the power-loss layers and the clocks of one run."""

    def __init__(self, root: Path, *, etcd_members: int, bookies: int, autorecovery: int,
                 power_loss: frozenset[int]) -> None:
        self.root = root
        self.etcd_hosts = [etcd_host(i) for i in range(etcd_members)]
        self.bookie_hosts = [bookie_host(i) for i in range(bookies)]
        self.ar_hosts = [ar_host(k) for k in range(autorecovery)]
        self.net = Network([*self.etcd_hosts, *self.bookie_hosts, *self.ar_hosts, CLIENT_HOST])
        # One wall clock per host of zbk processes (clock_jump targets: bookies, then autorecovery).
        self.clock_hosts = [*self.bookie_hosts, *self.ar_hosts]
        self.clocks: dict[str, FakeTime] = {}
        self.disks: dict[int, PowerLossMount] = {
            i: PowerLossMount(root / f"b{i}.disk", root / f"b{i}", log_path=root / f"b{i}.powerloss.log")
            for i in sorted(power_loss)}
        self.faketime_pids: list[int] = []
        self._ar_ports: dict[str, int] = {}

    def create(self) -> None:
        """Namespaces (this process joins the clients' host), clocks at 0, layers mounted."""
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            self.net.create()
            self.net.join(CLIENT_HOST)
            self.clocks = {h: FakeTime(self.root / f"{h}.clock") for h in self.clock_hosts}
            for disk in self.disks.values():
                disk.mount(MOUNT_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Every layer unmounted, every process stopped and the network removed; all are
        tried before the first error is raised."""
        errors: list[BaseException] = []
        for disk in self.disks.values():
            try:
                disk.unmount()
            except Exception as e:  # noqa: BLE001 - the rest must still go
                errors.append(e)
        try:
            self.net.close()
        except Exception as e:  # noqa: BLE001
            errors.append(e)
        for pid in self.faketime_pids:
            release(pid)
        if errors:
            raise errors[0]

    def addr(self, host: str) -> str:
        return self.net.host(host).addr

    def start(self, host: str, argv: Sequence[str], log: Path, *, clock: bool) -> subprocess.Popen[bytes]:
        """``argv`` in ``host`` (a zbk process: this tree on its path), on the host's clock."""
        env = child_env()
        if clock and host in self.clocks:
            env = self.clocks[host].env(env)
        proc = self.net.start(host, argv, log_path=log, env=env, cwd=REPO)
        if clock:
            self.faketime_pids.append(proc.pid)
        return proc

    def ar_port(self, host: str) -> int:
        """A port no earlier autorecovery process of ``host`` used (a killed one's may linger)."""
        port = self._ar_ports.get(host, AR_HTTP_PORT_BASE)
        self._ar_ports[host] = port + 1
        return port


class HostEtcdMember:
    """One etcd member in its host (the shape of helpers.etcd.EtcdMember that the chaos
    cluster uses)."""

    def __init__(self, hosts: Hosts, host: str, token: str, timing: tuple[int, int]) -> None:
        self.hosts = hosts
        self.name = host
        self.argv = etcd_argv(hosts.net, host, hosts.etcd_hosts, hosts.root / f"{host}.etcd", token=token,
                              timing=timing)
        self.log = hosts.root / f"{host}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"{self.hosts.addr(self.name)}:{ETCD_CLIENT_PORT}"

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is running"
        self.proc = self.hosts.net.start(self.name, self.argv, log_path=self.log)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.hosts.net.stop(self.proc, kill=True)

    def stop(self) -> None:
        if self.proc is not None:
            self.hosts.net.stop(self.proc, kill=True)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.endpoint}/health", timeout=1.0) as resp:
                return b'"true"' in resp.read()
        except OSError:
            return False

    def wait_healthy(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.healthy():
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"etcd {self.name} exited with {self.proc.returncode}:\n{tail(self.log)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"etcd {self.name} not healthy in {timeout_s}s:\n{tail(self.log)}")
            time.sleep(0.2)


class HostEtcdCluster:
    def __init__(self, hosts: Hosts, timing: tuple[int, int]) -> None:
        token = f"zbk-chaos-{uuid.uuid4().hex[:8]}"
        self.members = [HostEtcdMember(hosts, h, token, timing) for h in hosts.etcd_hosts]

    def start(self) -> HostEtcdCluster:
        for m in self.members:
            m.start()
        for m in self.members:
            m.wait_healthy(60.0)
        return self

    def uri(self, scope: str) -> str:
        return f"etcd://{','.join(m.endpoint for m in self.members)}/{scope}"

    def stop(self) -> None:
        for m in self.members:
            m.stop()


class HostBookie(BookieProcess):
    """A bookie in its host, bound to the host's address, on the host's clock (and on its
    power-loss layer when it has one: its data directory is the layer's mount point)."""

    def __init__(self, hosts: Hosts, index: int, metadata_uri: str, settings: dict[str, object]) -> None:
        super().__init__(hosts.root, metadata_uri, port=BOOKIE_PORT, name=bookie_host(index), settings=settings)
        self.hosts = hosts
        self.host = bookie_host(index)
        self.http_port = BOOKIE_HTTP_PORT
        self.disk = hosts.disks.get(index)

    @property
    def bookie_id(self) -> str:
        return self.address

    @property
    def address(self) -> str:
        return f"{self.hosts.addr(self.host)}:{self.port}"

    @property
    def http_host(self) -> str:
        return self.hosts.addr(self.host)

    def argv(self) -> list[str]:
        return bookie_argv(self.metadata_uri, self.hosts.addr(self.host), self.data_dir, self.settings,
                           port=self.port, http_port=self.http_port) + self.extra_argv

    def start(self, *, wait: bool = True, timeout_s: float = 30.0) -> HostBookie:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        self.proc = self.hosts.start(self.host, self.argv(), self.log, clock=True)
        if wait:
            self.wait_ready(timeout_s)
        return self

    def power_cut(self, *, torn: bool, seed: int) -> dict[str, Any]:
        """SIGKILL and the loss of everything its disk held unsynced, at one instant."""
        assert self.disk is not None and self.proc is not None, f"{self.host} has no power-loss layer"
        report = self.disk.cut(torn=torn, seed=seed, kill_pids=(self.proc.pid,))
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        return report

    def power_on(self) -> None:
        """The layer mounted again on what was durable, and the bookie started on it."""
        assert self.disk is not None
        if self.proc is not None and self.proc.poll() is None:
            self.hosts.net.stop(self.proc, kill=True)
        self.disk.restart()
        self.start(wait=False)

