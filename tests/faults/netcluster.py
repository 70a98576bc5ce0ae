"""A zbk cluster laid out on the hosts of a :class:`faults.netns.Network`: etcd members and
bookies each in a host of their own, clients in client hosts.

Every process binds its host's address (127.77.0.x), so the faults of ``net.faults`` fall
between them as between machines. Each host has its own ports, so every member uses etcd's
usual ports and every bookie the same wire port: a bookie's id is ``<host address>:3181``.
Processes are started through the network, which stops each one by PID at teardown;
:meth:`NetCluster.stop_bookie` and :meth:`NetCluster.kill_bookie` stop one sooner.

The test process never joins a namespace: it reaches the cluster only through clients run
inside a host (:mod:`faults.zbkclient`, which reports JSON on stdout).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from helpers.etcd import ETCD_BIN, FAST_TIMING
from helpers.procs import tail

from faults.netns import Network

REPO = Path(__file__).resolve().parents[2]
CLIENT_SCRIPT = Path(__file__).with_name("zbkclient.py")
ETCD_CLIENT_PORT = 2379
ETCD_PEER_PORT = 2380
BOOKIE_PORT = 3181
BOOKIE_HTTP_PORT = 8000
# Bookie settings for tests: a short lease so that a bookie cut off from etcd is seen gone
# within seconds; GC slowed down as in helpers.bookie (tests write ledgers GC must not touch).
BOOKIE_SETTINGS: dict[str, object] = {"registration_ttl_s": 2, "disk_check_interval_ms": 1000,
                                      "gc_wait_time_ms": 3_600_000}


def child_env() -> dict[str, str]:
    """Environment of zbk processes in the hosts: this tree on the path, no proxies (gRPC
    honours them, and a proxy outside the namespaces is unreachable from inside)."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'tests'}", PYTHONUNBUFFERED="1",
               GRPC_ENABLE_FORK_SUPPORT="false")
    return env


def etcd_argv(net: Network, host: str, members: Sequence[str], data_dir: Path, *, token: str,
              timing: tuple[int, int] = FAST_TIMING) -> list[str]:
    """The command of the etcd member in ``host``, one of ``members`` (hosts) of a cluster
    named by ``token``; the same command starts it again on its data dir."""
    peers = {h: f"http://{net.host(h).addr}:{ETCD_PEER_PORT}" for h in members}
    client = f"http://{net.host(host).addr}:{ETCD_CLIENT_PORT}"
    return [ETCD_BIN, "--name", host, "--data-dir", str(data_dir),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peers[host], "--initial-advertise-peer-urls", peers[host],
            "--initial-cluster", ",".join(f"{h}={url}" for h, url in peers.items()),
            "--initial-cluster-token", token, "--initial-cluster-state", "new",
            "--heartbeat-interval", str(timing[0]), "--election-timeout", str(timing[1]),
            "--logger", "zap", "--log-level", "warn"]


def bookie_argv(uri: str, addr: str, data_dir: Path, settings: dict[str, object], *,
                port: int = BOOKIE_PORT, http_port: int = BOOKIE_HTTP_PORT) -> list[str]:
    """`zbk bookie` bound (wire and HTTP) to ``addr``, a host's address."""
    merged = {**settings, "bind_address": addr, "http_bind_address": addr}
    argv = [sys.executable, "-m", "zbk.cli.main", "bookie", "--metadata", uri, "--data-dir", str(data_dir),
            "--port", str(port), "--http-port", str(http_port)]
    for k, v in merged.items():
        argv += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    return argv


class NetCluster:
    def __init__(self, net: Network, root: Path, *, etcd_hosts: Sequence[str], bookie_hosts: Sequence[str]) -> None:
        self.net = net
        self.root = root
        self.etcd_hosts = list(etcd_hosts)
        self.bookie_hosts = list(bookie_hosts)
        self.scope = f"netns{uuid.uuid4().hex[:8]}"
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def uri(self) -> str:
        endpoints = ",".join(f"{self.net.host(h).addr}:{ETCD_CLIENT_PORT}" for h in self.etcd_hosts)
        return f"etcd://{endpoints}/{self.scope}"

    def bookie_id(self, host: str) -> str:
        return f"{self.net.host(host).addr}:{BOOKIE_PORT}"

    def host_of(self, bookie_id: str) -> str:
        return self.net.by_addr(bookie_id.rsplit(":", 1)[0]).name

    # --- etcd ----------------------------------------------------------------------------

    def start_etcd(self, timing: tuple[int, int] = FAST_TIMING) -> None:
        """Every member, one per etcd host, as one new cluster (not waited for: ``wait``)."""
        token = f"zbk-netns-{uuid.uuid4().hex[:8]}"
        for h in self.etcd_hosts:
            argv = etcd_argv(self.net, h, self.etcd_hosts, self.root / f"{h}.etcd", token=token, timing=timing)
            self.procs[h] = self.net.start(h, argv, log_path=self.root / f"{h}.log")

    # --- bookies -------------------------------------------------------------------------

    def start_bookie(self, host: str, **settings: object) -> subprocess.Popen[bytes]:
        """A bookie in ``host``, bound (wire and HTTP) to the host's address."""
        argv = bookie_argv(self.uri, self.net.host(host).addr, self.root / host, {**BOOKIE_SETTINGS, **settings})
        proc = self.net.start(host, argv, log_path=self.root / f"{host}.log", env=child_env(), cwd=REPO)
        self.procs[host] = proc
        return proc

    def start(self) -> NetCluster:
        """etcd and every bookie; returns once a client sees every bookie registered."""
        self.start_etcd()
        for h in self.bookie_hosts:
            self.start_bookie(h)
        return self

    def stop_bookie(self, host: str, *, kill: bool = False) -> None:
        self.net.stop(self.procs[host], kill=kill)

    def stop(self) -> None:
        """Stop the bookies (all at once, SIGTERM) while etcd still runs, then kill etcd. The
        network's teardown would stop everything together, and a bookie whose clean shutdown
        cannot reach etcd (to revoke its lease) waits out the stop timeout before it is
        killed; so does an etcd leader that tries to hand over its leadership to members
        stopping beside it. The tests keep nothing etcd holds."""
        bookies = [p for h, p in self.procs.items() if h in self.bookie_hosts]
        for p in bookies:
            if p.poll() is None:
                p.terminate()
        for p in bookies:
            self.net.stop(p)
        for p in self.procs.values():
            self.net.stop(p, kill=True)

    def logs(self) -> str:
        """The tail of every process's log, for failure messages."""
        return "\n".join(f"--- {h}\n{tail(self.root / f'{h}.log', 15)}" for h in self.procs)

    # --- clients -------------------------------------------------------------------------

    def client_argv(self, *args: str, script: Path = CLIENT_SCRIPT) -> list[str]:
        return [sys.executable, str(script), "--metadata", self.uri, *args]

    def client(self, host: str, *args: str, timeout_s: float = 120.0, script: Path = CLIENT_SCRIPT) -> dict[str, Any]:
        """Run one command of a client script (zbkclient by default) inside ``host``; its
        (last) JSON line."""
        r = self.net.run(host, self.client_argv(*args, script=script), env=child_env(), timeout_s=timeout_s,
                         check=False)
        lines = r.stdout.strip().splitlines()
        if r.returncode != 0 or not lines:
            raise AssertionError(f"client {args} in {host} exited {r.returncode}:\n{r.stderr[-3000:]}\n"
                                 f"{self.logs()}")
        out: dict[str, Any] = json.loads(lines[-1])
        return out

    def wait_ready(self, client_host: str, timeout_s: float = 60.0) -> list[str]:
        """Until etcd answers ``client_host`` and lists every running bookie as writable."""
        ids = [self.bookie_id(h) for h in self.bookie_hosts]
        out = self.client(client_host, "wait", *ids, "--timeout", str(timeout_s), timeout_s=timeout_s + 30)
        return list(out["registered"])

    def session(self, host: str, *args: str, script: Path = CLIENT_SCRIPT) -> ClientSession:
        """A client script's command inside ``host`` that the test talks to through its stdin
        and stdout (stopped by PID at teardown at the latest)."""
        log = self.root / f"client-{host}-{uuid.uuid4().hex[:6]}.log"
        proc = self.net.start(host, self.client_argv(*args, script=script), log_path=log, env=child_env(), cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return ClientSession(self, proc, log)


class ClientSession:
    def __init__(self, cluster: NetCluster, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.cluster = cluster
        self.proc = proc
        self.log = log

    def read(self, timeout_s: float) -> dict[str, Any]:
        """The next JSON line the client prints, within ``timeout_s``."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            state = "exited " + str(self.proc.poll()) if self.proc.poll() is not None else f"silent for {timeout_s} s"
            raise AssertionError(f"client {state}:\n{tail(self.log, 40)}\n{self.cluster.logs()}")
        out: dict[str, Any] = json.loads(line)
        return out

    def send(self, line: str = "go") -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def wait(self, timeout_s: float = 60.0) -> int:
        return self.proc.wait(timeout_s)
