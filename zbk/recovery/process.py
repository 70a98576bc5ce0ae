"""`zbk autorecovery`: the auditor candidate, replicator workers and the HTTP admin API.

    zbk autorecovery --metadata URI [--http-port 8100] [--set key=value ...]

Keys for ``--set`` are those of :class:`zbk.config.AutoRecoveryConfig`: its own at the
top level, the auditor's and replicators' in ``[autorecovery]`` (``--set
autorecovery.replicator_workers=4`` or flat, ``--set replicator_workers=4``). One lease (TTL
``lease_ttl_s``) binds this process's auditor leadership and ledger locks: if the process
dies they vanish with it; if the lease is lost while running, the process exits with code 1
rather than keep working without it (crash, don't limp). SIGTERM / SIGINT stop it cleanly:
workers finish their step, leadership and locks are released, the lease revoked.

HTTP (loopback by default): /metrics, /heartbeat and the cluster-wide admin routes,
``/api/v1/autorecovery/*`` and ``/api/v1/ledger/*`` (zbk/metrics/clusterapi.py). Run inside a
bookie (``autorecovery.enabled``), the bookie's HTTP server has those routes already.
The process's candidate id is ``<host>:<http port>`` of its admin API, the host being
``advertised_address``, else the bind address, else (bound to a wildcard) the host name.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import threading
from typing import TYPE_CHECKING, Any

from zbk import eventloop, limits
from zbk.errors import EXIT_FAILED, EXIT_OK

if TYPE_CHECKING:
    from zbk.config import AutoRecoveryConfig

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("autorecovery", help="run the auditor and replicator workers")
    p.add_argument("--metadata", help="metadata URI: sqlite:///path/meta.db or etcd://host:port/scope")
    p.add_argument("--http-port", type=int, help="HTTP port for /metrics and the admin API (default 8100; 0: any)")
    p.add_argument("--config", help="a TOML file of AutoRecoveryConfig keys")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config key (repeatable)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from zbk.config import AutoRecoveryConfig, load

    cfg = load(AutoRecoveryConfig, path=args.config, overrides=args.set,
               explicit={"metadata_uri": args.metadata, "http_port": args.http_port}).validate()
    return run_autorecovery(cfg)


def advertised_host(cfg: AutoRecoveryConfig) -> str:
    """The host part of this process's id: two processes must never share an id, since it
    owns ledger locks. A wildcard bind address says nothing about the host: use its name."""
    import socket

    if cfg.advertised_address:
        return str(cfg.advertised_address)
    if cfg.http_bind_address in ("0.0.0.0", "::", ""):
        return socket.getfqdn()
    return str(cfg.http_bind_address)


class AutoRecovery:
    """The parts of one autorecovery process, started and stopped in order."""

    def __init__(self, cfg: AutoRecoveryConfig, *, stop_event: threading.Event | None = None, http: Any = None) -> None:
        """``http``: an AdminHttpServer to add the routes to (a bookie's, with
        ``autorecovery.enabled``); by default the process serves its own."""
        from zbk.metadata.coordination import LeaseKeeper
        from zbk.metadata.uri import open_store
        from zbk.metrics.http import AdminHttpServer

        self.cfg = cfg
        self.stop_event = stop_event or threading.Event()
        self.exit_code = EXIT_OK
        self.store = open_store(cfg.metadata_uri)
        self.lease = LeaseKeeper(self.store, cfg.lease_ttl_s, on_lost=self._lease_lost)
        self._own_http = http is None
        self.http = http if http is not None else AdminHttpServer(cfg.http_bind_address, cfg.http_port,
                                                                  token=cfg.admin_token)
        self.candidate_id = f"{advertised_host(cfg)}:{self.http.port}"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._replicator: Any = None
        self._replicator_thread: threading.Thread | None = None
        self.auditor: Any = None
        self.api: Any = None  # zbk.metrics.clusterapi.ClusterApi, on an HTTP server of our own

    def _lease_lost(self) -> None:
        log.error("autorecovery %s: lease lost; exiting", self.candidate_id)
        self.exit_code = EXIT_FAILED
        self.stop_event.set()

    def start(self) -> None:
        from zbk.metrics.clusterapi import ClusterApi
        from zbk.recovery import metrics as rm
        from zbk.recovery.auditor import Auditor
        from zbk.recovery.switch import is_enabled
        from zbk.recovery.underreplication import UnderReplicationRegistry, init_recovery_delay

        lease = self.lease.start()
        self.registry = UnderReplicationRegistry(self.store, self.candidate_id)
        init_recovery_delay(self.store, self.cfg.autorecovery.lost_bookie_recovery_delay_s)
        rm.AUTORECOVERY_ENABLED.set(1 if is_enabled(self.store) else 0)  # then each replicator pass
        if self._own_http:
            self.api = ClusterApi(self.store, owner=f"autorecovery {self.candidate_id}",
                                  client_config=self.cfg.client_config())
            self.api.install(self.http)
            self.http.start()
        self.auditor = Auditor(self.store, self.registry, lease, self.candidate_id,
                               default_delay_s=self.cfg.autorecovery.lost_bookie_recovery_delay_s,
                               check_interval_s=self.cfg.autorecovery.auditor_periodic_check_interval_s,
                               verification_percent=self.cfg.autorecovery.auditor_ledger_verification_percent,
                               on_crash=self._crashed,
                               client_config=self.cfg.client_config())
        self.auditor.start()
        self._replicator_thread = threading.Thread(target=self._run_replicator, args=(lease,),
                                                   name="zbk-replicator", daemon=True)
        self._replicator_thread.start()
        log.info("autorecovery %s: running (%d replicator worker(s))", self.candidate_id,
                 self.cfg.autorecovery.replicator_workers)

    def _crashed(self) -> None:
        self.exit_code = EXIT_FAILED
        self.stop_event.set()

    def _run_replicator(self, lease: int) -> None:
        try:
            eventloop.run(self._replicate(lease))
        except BaseException:
            log.exception("replicator crashed")
            self._crashed()

    async def _replicate(self, lease: int) -> None:
        from zbk.client.bookkeeper import ClientContext
        from zbk.recovery.replicator import Replicator

        client_cfg = self.cfg.client_config()
        ctx = ClientContext.over_zmq(self.store, client_cfg)
        self._loop = asyncio.get_running_loop()
        rc = self.cfg.autorecovery
        self._replicator = Replicator(ctx, self.registry, lease, workers=rc.replicator_workers,
                                      grace_period_s=rc.open_ledger_rereplication_grace_period_s,
                                      rate_bytes_per_s=rc.replication_rate_bytes)
        if self.stop_event.is_set():
            self._replicator.stop()
        try:
            await self._replicator.run()
        finally:
            await ctx.transport.close()

    def stop(self) -> None:
        """Release everything others wait for: leadership first, then ledger locks."""
        if self.auditor is not None:
            self.auditor.stop()
        if self._loop is not None and self._replicator is not None:
            # The loop is closed already if the replicator saw the stop event at start-up.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._replicator.stop)
        if self._replicator_thread is not None:
            self._replicator_thread.join(limits.autorecovery_stop_timeout_s)
        if self._own_http:
            self.http.stop()
        if self.api is not None:
            self.api.close()
        self.lease.stop(revoke=True)  # deletes any lock key a stuck worker still held
        self.store.close()


def run_autorecovery(cfg: AutoRecoveryConfig) -> int:
    """Run until SIGTERM/SIGINT (or a lost lease); returns the exit code."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    ar = AutoRecovery(cfg, stop_event=stop)
    try:
        ar.start()
        while not stop.wait(limits.process_stop_poll_s):
            pass
    finally:
        ar.stop()
    log.info("autorecovery %s: stopped", ar.candidate_id)
    return ar.exit_code
