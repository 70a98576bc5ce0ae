"""``BookieConfig``: the bookie's identity and process keys at the top level, one section
per component below them (zbk/config/sections.py)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from zbk import limits
from zbk.bookieid import WILDCARD_HOSTS, check_bookie_id, check_host, is_address, join_address
from zbk.config.autorecovery import AutoRecoveryConfig
from zbk.config.checks import positive, tcp_port
from zbk.config.sections import (
    CurveConfig,
    DiskConfig,
    EntryLogConfig,
    GcConfig,
    HttpConfig,
    IndexConfig,
    JournalConfig,
    RecoveryConfig,
)
from zbk.errors import ConfigError
from zbk.osthread import allowed_cpus, can_pin, parse_cpu_list


@dataclass(frozen=True, kw_only=True)
class BookieConfig:
    """Every key of API.md "Bookie configuration": identity, addresses, directories and process-wide
    keys here; the rest in the section of the component it configures.

    Attributes:
        bookie_id: The id clients and the metadata know this bookie by: ``host:port``, or a name
            such as ``bookie-a`` (printable, no ``/`` or white space, at most 128 characters)
            that stays when the address changes (BP-41; docs/operations.md, "Bookie ids").
            Empty: ``<advertised_address>:<port>``. Never change it: the cookie records it.
        bind_address: The address the wire port binds.
        port: The wire protocol's port (``--port``).
        advertised_address: The host clients connect to, recorded with ``port`` in the
            bookie's registration (empty: ``bind_address``; a ``host:port`` ``bookie_id`` is
            then itself the address).
        metadata_uri: Required: ``sqlite:///path/meta.db`` or
            ``etcd://host:port[,host:port...]/scope`` (``--metadata``).
        data_dir: The directory under which ``journal/``, ``ledgers/`` and ``index/`` go, for the
            ``*_dirs`` not given (``--data-dir``).
        journal_dirs: The journals' directories, at most 16 (empty: ``<data_dir>/journal``): one
            journal and thread each, ledger ``l``'s records in journal ``l % len(journal_dirs)``.
            Directories can be appended later, never removed or reordered (docs/operations.md, "Several
            journals"); each belongs on a disk of its own, since every add waits for its journal's
            fsync.
        ledger_dirs: The entry logs' directories (empty: ``<data_dir>/ledgers``).
        index_dirs: The index files' directories (empty: ``<data_dir>/index``).
        rack: The bookie's rack: placement spreads each write set over racks.
        zone: The zone (availability zone, data centre) its rack lies in: placement spreads each
            write set over zones where it can.
        isolation_group: The one isolation group the bookie belongs to ("": none): clients whose
            ``isolation_groups`` name it may use it, and no other client with ``isolation_groups`` does.
        auto_fix_cookie: On a cookie mismatch, write the cookie again and run phase one instead of
            refusing to start (exit code 4).
        registration_ttl_s: The lease of the bookie's registration: how long after a crash it still
            looks registered.
        max_frame_bytes: The largest wire frame accepted, 1024 bytes to 256 MiB.
        actor_cpus: The CPUs the actor threads (journal, entry logger, index, GC, Server) are
            confined to, as ``taskset -c`` takes them (``"3"``, ``"0-1"``); empty: wherever the kernel
            schedules them. One CPU saves the cross-CPU hand-overs of the GIL between them
            (docs/operations.md, "CPU affinity"), at the risk of sharing it with a busy neighbour.
        start_read_only: Start read-only (``zbk bookie --readonly``), as an operator's ``PUT
            /api/v1/bookie/state {"state": "readonly"}`` would: the state is kept on disk and lasts,
            across restarts too, until an operator switches the bookie back to writable
            (zbk/storage/operatorstate.py).
        journal: The ``[journal]`` table (JournalConfig).
        entry_log: The ``[entry_log]`` table (EntryLogConfig).
        index: The ``[index]`` table (IndexConfig).
        gc: The ``[gc]`` table (GcConfig).
        disk: The ``[disk]`` table (DiskConfig).
        autorecovery: The ``[autorecovery]`` table (RecoveryConfig).
        curve: The ``[curve]`` table (CurveConfig).
        http: The ``[http]`` table (HttpConfig).
    """

    bookie_id: str = ""
    bind_address: str = "127.0.0.1"
    port: int = 3181
    # The host clients connect to, which the registration records with ``port``
    # ("" = bind_address); behind NAT or a wildcard bind it is not the bind address.
    advertised_address: str = ""
    metadata_uri: str = ""
    data_dir: str = ""
    # The directories are the bookie's identity as much as its id: the cookie records them.
    journal_dirs: tuple[str, ...] = ()
    ledger_dirs: tuple[str, ...] = ()
    index_dirs: tuple[str, ...] = ()
    # Where the bookie stands, for placement (zbk/client/placement.py): a rack lies in one
    # zone, and a bookie belongs to at most one isolation group.
    rack: str = ""
    zone: str = ""
    isolation_group: str = ""
    auto_fix_cookie: bool = False
    registration_ttl_s: int = limits.metadata_lease_ttl_s_default
    max_frame_bytes: int = limits.frame_bytes_max_default
    actor_cpus: str = ""
    start_read_only: bool = False

    journal: JournalConfig = field(default_factory=JournalConfig)
    entry_log: EntryLogConfig = field(default_factory=EntryLogConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    gc: GcConfig = field(default_factory=GcConfig)
    disk: DiskConfig = field(default_factory=DiskConfig)
    autorecovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    curve: CurveConfig = field(default_factory=CurveConfig)
    http: HttpConfig = field(default_factory=HttpConfig)

    def resolved(self) -> BookieConfig:
        """Fill the defaults that derive from other keys (bookie id, directories).

        Returns:
            A copy with ``bookie_id`` and the ``*_dirs`` filled in where they were empty
            (this config itself when nothing was).
        """
        changes: dict[str, Any] = {}
        if not self.bookie_id:
            changes["bookie_id"] = join_address(self.advertised_address or self.bind_address, self.port)
        if self.data_dir:
            for key, sub in (("journal_dirs", "journal"), ("ledger_dirs", "ledgers"), ("index_dirs", "index")):
                if not getattr(self, key):
                    changes[key] = (os.path.join(self.data_dir, sub),)
        return dataclasses.replace(self, **changes) if changes else self

    def validate(self) -> BookieConfig:
        """Check every key and every section, and the keys together.

        Returns:
            The config with its derived defaults filled in (``resolved()``).

        Raises:
            ConfigError: A value out of range, a missing ``metadata_uri`` or directory, a
                journal directory named twice, or ``actor_cpus`` naming a CPU this process
                may not run on.
        """
        cfg = self.resolved()
        if not cfg.journal_dirs or not cfg.ledger_dirs or not cfg.index_dirs:
            raise ConfigError("data_dir (or journal_dirs, ledger_dirs and index_dirs) must be set")
        # One journal writer per directory: two on one directory would write the same segments.
        if len(set(map(os.path.normpath, cfg.journal_dirs))) != len(cfg.journal_dirs):
            raise ConfigError(f"journal_dirs names a directory twice: {list(cfg.journal_dirs)}")
        if len(cfg.journal_dirs) > limits.journal_dirs_max:
            raise ConfigError(f"journal_dirs: at most {limits.journal_dirs_max} directories, got {len(cfg.journal_dirs)}")
        if not cfg.metadata_uri:
            raise ConfigError("metadata_uri must be set (sqlite:///path/meta.db or etcd://host:port/scope)")
        tcp_port("port", cfg.port)
        if cfg.advertised_address:
            check_host(cfg.advertised_address, key="advertised_address")
            if cfg.advertised_address in WILDCARD_HOSTS:
                raise ConfigError(f"advertised_address {cfg.advertised_address!r} is no address to connect to")
        elif not is_address(cfg.bookie_id):
            check_host(cfg.bind_address, key="bind_address")
            if cfg.bind_address in WILDCARD_HOSTS:
                raise ConfigError(f"bookie_id {cfg.bookie_id!r} is a name, not host:port, and bind_address "
                                  f"{cfg.bind_address!r} is no address to connect to: set advertised_address")
        check_bookie_id(cfg.bookie_id)  # after the address: a bad one makes a bad default id
        positive("registration_ttl_s", cfg.registration_ttl_s)
        if "," in cfg.isolation_group:
            # Clients name groups as a comma-separated list (--set isolation_groups=a,b).
            raise ConfigError(f"isolation_group is one group name (no commas), got {cfg.isolation_group!r}")
        if not 1024 <= cfg.max_frame_bytes <= limits.frame_bytes_max_ceiling:
            raise ConfigError(f"max_frame_bytes must be in [1024, {limits.frame_bytes_max_ceiling}]")
        cfg.actor_cpu_set()
        for section in (cfg.journal, cfg.entry_log, cfg.index, cfg.gc, cfg.disk, cfg.autorecovery, cfg.curve,
                        cfg.http):
            section.validate()
        return cfg

    @property
    def wire_address(self) -> str:
        """host:port where clients reach this bookie, which its registration records:
        ``advertised_address:port``; without advertised_address, a host:port bookie_id
        itself (what clients connected to before stable ids, NAT and all), else
        ``bind_address:port``."""
        if self.advertised_address:
            return join_address(self.advertised_address, self.port)
        if is_address(self.bookie_id):
            return self.bookie_id
        return join_address(self.bind_address, self.port)

    def actor_cpu_set(self) -> frozenset[int]:
        """``actor_cpus`` as a set of CPU numbers.

        Returns:
            The CPUs the actor threads are confined to; empty: not confined.

        Raises:
            ConfigError: ``actor_cpus`` is not a CPU list, or names a CPU this process may
                not run on, or this platform cannot confine threads.
        """
        try:
            cpus = parse_cpu_list(self.actor_cpus)
        except ValueError as e:
            raise ConfigError(f"actor_cpus: {e}") from None
        if cpus and not can_pin():
            raise ConfigError("actor_cpus: this platform cannot confine threads to CPUs (Linux can); leave it empty")
        allowed = allowed_cpus()
        if cpus and allowed is not None and not cpus <= allowed:
            raise ConfigError(f"actor_cpus: CPU(s) {sorted(cpus - allowed)} are not available to this process "
                              f"(it may run on {sorted(allowed)})")
        return cpus

    def autorecovery_config(self, http_port: int) -> AutoRecoveryConfig:
        """The settings of the auditor candidate and replicators this bookie runs with
        ``autorecovery.enabled``. With CURVE they connect to the other bookies with this
        bookie's key pair.

        Args:
            http_port: The port of the bookie's HTTP server, which serves their routes.

        Returns:
            The auto-recovery settings, validated.

        Raises:
            ConfigError: The resulting settings are not valid.
        """
        curve = self.curve
        server_key = curve.server_public_key_file
        if curve.secret_key_file and not server_key and not curve.server_keys_dir:
            server_key = curve.secret_key_file  # bookies share one key pair (its public half)
        return AutoRecoveryConfig(
            metadata_uri=self.metadata_uri, http_port=http_port, http_bind_address=self.http.bind_address,
            lease_ttl_s=self.registration_ttl_s, admin_token=self.http.admin_token, autorecovery=self.autorecovery,
            curve_secret_key_file=curve.secret_key_file, curve_server_public_key_file=server_key,
            curve_server_keys_dir=curve.server_keys_dir).validate()
