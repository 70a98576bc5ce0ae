"""Real bookies, each on its own power-loss layer, sharing one embedded metadata store.

Every bookie's data directory (journal, entry logs, index) is the mount point of a layer
(tests/faults/powerloss.py, driven by powerloss_mount.PowerLossMount). The metadata store
is an SQLite file beside them, on no layer: the metadata service does not lose power in
these runs, the bookies do.

A power cut of several bookies is one instant: every victim is stopped (SIGSTOP) first, so
that none of them makes anything more durable, or answers anything more, once the first
layer has dropped its volatile state; then each layer kills its bookie (SIGKILL) and drops
what was not durable. :meth:`PowerCluster.restart` mounts each layer again on what
survived and boots the bookie on it.

:meth:`PowerCluster.stop` kills every process by PID (bookies, autorecovery) and removes
every mount; it is meant for a ``finally`` and tries everything before it raises.
"""

from __future__ import annotations

import os
import random
import signal
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from helpers.bookie import BookieProcess, wait_registered
from helpers.procs import stop_process
from recovery.conftest import AutoRecoveryProcess

from zbk.client.raw import BookieConnection
from zbk.wire import messages as w

from .powerloss_mount import PowerLossMount, require_fuse

BOOT_TIMEOUT_S = 90.0  # a bookie replaying its journal through the (Python) layer on a busy machine


class PowerCluster:
    def __init__(self, root: Path, n: int, settings: dict[str, object]) -> None:
        require_fuse()
        self.root = root
        self.uri = f"sqlite:///{root}/meta.db"
        self.bookies = [BookieProcess(root, self.uri, name=f"b{i}", settings=settings) for i in range(n)]
        self.disks = [PowerLossMount(root / f"b{i}.disk", b.data_dir, log_path=root / f"b{i}.powerloss.log")
                      for i, b in enumerate(self.bookies)]
        self.autorecovery: list[AutoRecoveryProcess] = []
        self.cuts: list[dict[str, Any]] = []  # the layers' reports, for the test's output

    @property
    def ids(self) -> list[str]:
        return [b.bookie_id for b in self.bookies]

    def index(self, bookie_id: str) -> int:
        return self.ids.index(bookie_id)

    def start(self) -> PowerCluster:
        for disk in self.disks:
            disk.mount()
        for b in self.bookies:
            b.start(wait=False)
        for b in self.bookies:
            b.wait_ready(BOOT_TIMEOUT_S)
        wait_registered(self.uri, self.ids, timeout_s=BOOT_TIMEOUT_S)
        return self

    def cut(self, bookie_ids: Iterable[str], *, torn: bool, rng: random.Random) -> list[dict[str, Any]]:
        """Cut the power of ``bookie_ids`` at one instant (see the module's doc). The layers
        answer EIO until :meth:`restart`."""
        victims = [self.index(b) for b in bookie_ids]
        for i in victims:  # first freeze them all: nothing more becomes durable or is answered
            proc = self.bookies[i].proc
            assert proc is not None and proc.poll() is None, f"{self.ids[i]} is not running"
            os.kill(proc.pid, signal.SIGSTOP)
        reports = []
        for i in victims:
            proc = self.bookies[i].proc
            assert proc is not None
            report = self.disks[i].cut(torn=torn, seed=rng.randrange(1 << 31), kill_pids=(proc.pid,))
            reports.append({"bookie": self.ids[i], "torn": torn, **report})
        for i in victims:
            proc = self.bookies[i].proc
            assert proc is not None
            proc.wait(10)
        self.cuts += reports
        return reports

    def restart(self, bookie_ids: Iterable[str]) -> None:
        """Mount each layer again on what was durable and boot its bookie on it."""
        idx = [self.index(b) for b in bookie_ids]
        for i in idx:
            self.disks[i].restart()
            self.bookies[i].start(wait=False)
        for i in idx:
            self.bookies[i].wait_ready(BOOT_TIMEOUT_S)
        wait_registered(self.uri, [self.ids[i] for i in idx], timeout_s=BOOT_TIMEOUT_S)

    def limbo_ledgers(self, bookie_id: str) -> int:
        """How many ledgers ``bookie_id`` says are in limbo (GET_BOOKIE_INFO)."""
        with BookieConnection(bookie_id, timeout_s=10) as c:
            resp = c.call(w.BookieInfoRequest(rid=c.next_rid()))
        assert isinstance(resp, w.BookieInfoResponse), resp
        return int(resp.limbo_ledgers)

    def metric(self, bookie_id: str, name: str) -> float:
        """A gauge or counter without labels from the bookie's /metrics."""
        b = self.bookies[self.index(bookie_id)]
        with urllib.request.urlopen(f"http://127.0.0.1:{b.http_port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{bookie_id} exports no metric {name}")

    def start_autorecovery(self, **settings: object) -> AutoRecoveryProcess:
        ar = AutoRecoveryProcess(self.root, self.uri, f"ar{len(self.autorecovery)}", settings)
        self.autorecovery.append(ar)
        return ar.start()

    def logs(self, lines: int = 20) -> str:
        return "\n".join(f"--- {b.bookie_id} ({b.log.name})\n{b.log_tail(lines)}" for b in self.bookies)

    def stop(self) -> None:
        """Every process killed by PID, then every mount removed; all are tried before the
        first error is raised."""
        errors: list[BaseException] = []
        for ar in self.autorecovery:
            if ar.proc is not None:
                try:
                    stop_process(ar.proc, kill=True)
                except Exception as e:  # noqa: BLE001 - the rest must still be stopped
                    errors.append(e)
        for b in self.bookies:
            if b.proc is not None and b.proc.poll() is None:
                try:  # SIGKILL also ends a bookie left frozen by a cut that failed half-way
                    stop_process(b.proc, kill=True)
                except Exception as e:  # noqa: BLE001
                    errors.append(e)
        for disk in self.disks:
            try:
                disk.unmount()
            except Exception as e:  # noqa: BLE001
                errors.append(e)
        if errors:
            raise errors[0]
