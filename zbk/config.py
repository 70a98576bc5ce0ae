"""Configuration: one frozen dataclass per component, each with ``validate()``.

Sources, later ones winning: defaults, a TOML file (``--config``), ``--set key=value``
overrides, then explicit command-line flags. Unknown keys are rejected with the closest
known names, because a typo in a durability setting must never be silently ignored.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import tomllib
import types
import typing
from dataclasses import dataclass
from typing import Any, TypeVar

from zbk import limits
from zbk.errors import ConfigError
from zbk.osthread import allowed_cpus, can_pin, parse_cpu_list

C = TypeVar("C")


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{name} must be > 0, got {value!r}")


def _non_negative(name: str, value: float) -> None:
    if value < 0:
        raise ConfigError(f"{name} must be >= 0, got {value!r}")


def _ratio(name: str, value: float) -> None:
    if not 0.0 < value <= 1.0:
        raise ConfigError(f"{name} must be in (0, 1], got {value!r}")


def _port(name: str, value: int) -> None:
    if not 0 <= value <= 65535:
        raise ConfigError(f"{name} must be a TCP port (0-65535), got {value!r}")


@dataclass(frozen=True, kw_only=True)
class BookieConfig:
    """Every key of API.md "Bookie configuration"."""

    bookie_id: str = ""  # default: "<bind_address>:<port>"
    bind_address: str = "127.0.0.1"
    port: int = 3181
    http_port: int = 8000
    http_bind_address: str = "127.0.0.1"
    metadata_uri: str = ""
    data_dir: str = ""
    journal_dirs: tuple[str, ...] = ()  # default: <data_dir>/journal
    ledger_dirs: tuple[str, ...] = ()  # default: <data_dir>/ledgers
    index_dirs: tuple[str, ...] = ()  # default: <data_dir>/index
    rack: str = ""
    journal_write_data: bool = True
    journal_sync_data: bool = True
    journal_max_group_wait_ms: float = float(limits.journal_group_wait_ms_default)
    journal_buffered_writes_threshold_bytes: int = limits.journal_group_bytes_default
    journal_max_size_mb: int = limits.journal_segment_bytes_default // (1024 * 1024)
    # Zeros kept written ahead of the journal's records, so that a small commit's fsync does
    # not also commit the file's growth (zbk/storage/journal.py, "Preallocation"); 0: off.
    journal_pre_alloc_size_mb: int = limits.journal_preallocate_bytes_default // (1024 * 1024)
    # Make new journal segments from retired ones instead of new files, so their pages are
    # already in the page cache (zbk/storage/journal.py, "Recycling"); BookKeeper's
    # journalReuseFiles.
    journal_reuse_files: bool = True
    entry_log_size_limit_mb: int = limits.entry_log_bytes_default // (1024 * 1024)
    entry_log_write_buffer_bytes: int = limits.entry_log_write_buffer_bytes_default
    # Start writing each this many bytes of an entry log to disk (asynchronously), so that a
    # checkpoint's fsync finds little left to write; 0: leave it to the kernel and the checkpoint.
    flush_entry_log_bytes: int = limits.entry_log_flush_bytes_default
    # Of the data the entry logger wrote, the last this many MiB stay in the page cache;
    # older pages are dropped once on disk (zbk/storage/entrylog.py, "Page cache"); 0: the
    # kernel decides.
    entry_log_keep_cached_mb: int = limits.entry_log_keep_cached_bytes_default // (1024 * 1024)
    entry_log_per_ledger: bool = False
    entry_logs_open_max: int = limits.entry_logs_open_max
    entry_log_expire_after_access_s: float = float(limits.entry_log_expire_after_access_s)
    ledger_cache_bytes_max: int = limits.ledger_cache_bytes_max_default
    # Make an index checkpoint durable with one syncfs per file system of the index
    # directories rather than an fsync per index file written (zbk/storage/ledgercache.py,
    # "Syncing a flush"; only where syncfs reports writeback errors, Linux >= 5.8).
    index_flush_syncfs: bool = True
    # Index files kept open (least recently used closed first); the bookie takes fewer when
    # its descriptor limit (RLIMIT_NOFILE, raised to the hard limit at start) leaves less.
    index_files_open_max: int = limits.index_files_open_max_default
    flush_interval_ms: int = 10_000
    gc_wait_time_ms: int = 60_000
    minor_compaction_threshold: float = 0.2
    minor_compaction_interval_s: float = 3600.0
    major_compaction_threshold: float = 0.8
    major_compaction_interval_s: float = 86_400.0
    compaction_rate_bytes: int = 64 * 1024 * 1024
    disk_usage_threshold: float = 0.95
    disk_usage_warn_threshold: float = 0.90
    disk_check_interval_ms: int = 10_000
    read_only_mode_enabled: bool = True
    auto_fix_cookie: bool = False
    registration_ttl_s: int = limits.metadata_lease_ttl_s_default
    autorecovery_enabled: bool = False
    lost_bookie_recovery_delay_s: float = 0.0
    open_ledger_rereplication_grace_period_s: float = 30.0
    auditor_periodic_check_interval_s: float = 604_800.0
    max_frame_bytes: int = limits.frame_bytes_max_default
    curve_secret_key_file: str = ""
    curve_authorized_keys_dir: str = ""
    # How this bookie's own client connections (autorecovery_enabled) reach other CURVE
    # bookies: their public key(s). Unset: this bookie's own public key (bookies sharing one
    # key pair). The bookie's own public key must be in the other bookies' authorized dirs.
    curve_server_public_key_file: str = ""
    curve_server_keys_dir: str = ""
    admin_token: str = ""
    # The CPUs the actor threads (journal, entry logger, index, GC, Server) are confined to,
    # as taskset -c takes them ("2", "0-1"); empty: wherever the kernel schedules them. One
    # CPU saves the cross-CPU hand-overs of the GIL between them (docs/operations.md,
    # "CPU affinity").
    actor_cpus: str = ""

    def resolved(self) -> BookieConfig:
        """Fill the defaults that derive from other keys (bookie id, directories)."""
        changes: dict[str, Any] = {}
        if not self.bookie_id:
            changes["bookie_id"] = f"{self.bind_address}:{self.port}"
        if self.data_dir:
            for key, sub in (("journal_dirs", "journal"), ("ledger_dirs", "ledgers"), ("index_dirs", "index")):
                if not getattr(self, key):
                    changes[key] = (os.path.join(self.data_dir, sub),)
        return dataclasses.replace(self, **changes) if changes else self

    def validate(self) -> BookieConfig:
        cfg = self.resolved()
        if not cfg.journal_dirs or not cfg.ledger_dirs or not cfg.index_dirs:
            raise ConfigError("data_dir (or journal_dirs, ledger_dirs and index_dirs) must be set")
        if not cfg.metadata_uri:
            raise ConfigError("metadata_uri must be set (sqlite:///path/meta.db or etcd://host:port/scope)")
        _port("port", cfg.port)
        _port("http_port", cfg.http_port)
        if ":" not in cfg.bookie_id:
            raise ConfigError(f"bookie_id must be host:port, got {cfg.bookie_id!r}")
        _non_negative("journal_max_group_wait_ms", cfg.journal_max_group_wait_ms)
        _positive("journal_buffered_writes_threshold_bytes", cfg.journal_buffered_writes_threshold_bytes)
        _positive("journal_max_size_mb", cfg.journal_max_size_mb)
        _non_negative("journal_pre_alloc_size_mb", cfg.journal_pre_alloc_size_mb)
        _positive("entry_log_size_limit_mb", cfg.entry_log_size_limit_mb)
        _non_negative("entry_log_write_buffer_bytes", cfg.entry_log_write_buffer_bytes)
        _non_negative("flush_entry_log_bytes", cfg.flush_entry_log_bytes)
        _non_negative("entry_log_keep_cached_mb", cfg.entry_log_keep_cached_mb)
        _positive("entry_logs_open_max", cfg.entry_logs_open_max)
        _positive("index_files_open_max", cfg.index_files_open_max)
        _positive("entry_log_expire_after_access_s", cfg.entry_log_expire_after_access_s)
        _positive("ledger_cache_bytes_max", cfg.ledger_cache_bytes_max)
        _positive("flush_interval_ms", cfg.flush_interval_ms)
        _positive("gc_wait_time_ms", cfg.gc_wait_time_ms)
        _ratio("minor_compaction_threshold", cfg.minor_compaction_threshold)
        _ratio("major_compaction_threshold", cfg.major_compaction_threshold)
        if cfg.minor_compaction_threshold > cfg.major_compaction_threshold:
            raise ConfigError("minor_compaction_threshold must not exceed major_compaction_threshold")
        _positive("minor_compaction_interval_s", cfg.minor_compaction_interval_s)
        _positive("major_compaction_interval_s", cfg.major_compaction_interval_s)
        _positive("compaction_rate_bytes", cfg.compaction_rate_bytes)
        _ratio("disk_usage_threshold", cfg.disk_usage_threshold)
        _ratio("disk_usage_warn_threshold", cfg.disk_usage_warn_threshold)
        if cfg.disk_usage_warn_threshold > cfg.disk_usage_threshold:
            raise ConfigError("disk_usage_warn_threshold must not exceed disk_usage_threshold")
        _positive("disk_check_interval_ms", cfg.disk_check_interval_ms)
        _positive("registration_ttl_s", cfg.registration_ttl_s)
        _non_negative("lost_bookie_recovery_delay_s", cfg.lost_bookie_recovery_delay_s)
        _non_negative("open_ledger_rereplication_grace_period_s", cfg.open_ledger_rereplication_grace_period_s)
        _positive("auditor_periodic_check_interval_s", cfg.auditor_periodic_check_interval_s)
        if not 1024 <= cfg.max_frame_bytes <= limits.frame_bytes_max_ceiling:
            raise ConfigError(f"max_frame_bytes must be in [1024, {limits.frame_bytes_max_ceiling}]")
        cfg.actor_cpu_set()
        if bool(cfg.curve_secret_key_file) != bool(cfg.curve_authorized_keys_dir):
            raise ConfigError("curve_secret_key_file and curve_authorized_keys_dir go together")
        if (cfg.curve_server_public_key_file or cfg.curve_server_keys_dir) and not cfg.curve_secret_key_file:
            raise ConfigError("curve_server_public_key_file / curve_server_keys_dir need curve_secret_key_file")
        return cfg

    def actor_cpu_set(self) -> frozenset[int]:
        """``actor_cpus`` as a set (empty: not confined); ConfigError when it is not a CPU list
        or names a CPU this process may not run on."""
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
        """``autorecovery_enabled``: the settings of the auditor candidate and replicators
        this bookie runs, its HTTP routes on ``http_port``. With CURVE they connect to the
        other bookies with this bookie's key pair."""
        server_key = self.curve_server_public_key_file
        if self.curve_secret_key_file and not server_key and not self.curve_server_keys_dir:
            server_key = self.curve_secret_key_file  # bookies share one key pair (its public half)
        return AutoRecoveryConfig(
            metadata_uri=self.metadata_uri, http_port=http_port, http_bind_address=self.http_bind_address,
            lease_ttl_s=self.registration_ttl_s, lost_bookie_recovery_delay_s=self.lost_bookie_recovery_delay_s,
            open_ledger_rereplication_grace_period_s=self.open_ledger_rereplication_grace_period_s,
            auditor_periodic_check_interval_s=self.auditor_periodic_check_interval_s, admin_token=self.admin_token,
            curve_secret_key_file=self.curve_secret_key_file, curve_server_public_key_file=server_key,
            curve_server_keys_dir=self.curve_server_keys_dir).validate()


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    add_timeout_ms: int = limits.client_add_timeout_ms_default
    read_timeout_ms: int = limits.client_read_timeout_ms_default
    speculative_read_ms: int = limits.client_speculative_read_ms_default
    pending_adds_max: int = limits.client_pending_adds_max
    add_request_entries_max: int = limits.client_add_request_entries_default
    ensemble_change_attempts_max: int = limits.client_ensemble_change_attempts_max
    heartbeat_timeout_ms: int = limits.client_heartbeat_timeout_ms_default  # a silent bookie fails after this; 0: never
    curve_server_keys_dir: str = ""  # per-bookie public keys: <host>_<port>.key, or server.key
    curve_server_public_key_file: str = ""  # one public key for every bookie
    curve_secret_key_file: str = ""  # this client's key pair (zbk keygen); enables CURVE

    def validate(self) -> ClientConfig:
        _positive("add_timeout_ms", self.add_timeout_ms)
        _positive("read_timeout_ms", self.read_timeout_ms)
        _positive("speculative_read_ms", self.speculative_read_ms)
        _positive("pending_adds_max", self.pending_adds_max)
        if not 1 <= self.add_request_entries_max <= limits.entries_per_add_request_max:
            raise ConfigError(f"add_request_entries_max must be in [1, {limits.entries_per_add_request_max}]")
        _positive("ensemble_change_attempts_max", self.ensemble_change_attempts_max)
        if not 0 <= self.heartbeat_timeout_ms <= limits.client_heartbeat_timeout_ms_max:
            raise ConfigError(f"heartbeat_timeout_ms must be in [0, {limits.client_heartbeat_timeout_ms_max}]")
        server_key = bool(self.curve_server_public_key_file or self.curve_server_keys_dir)
        if bool(self.curve_secret_key_file) != server_key:
            raise ConfigError("CURVE: curve_secret_key_file goes with curve_server_public_key_file "
                              "or curve_server_keys_dir")
        return self


@dataclass(frozen=True, kw_only=True)
class AutoRecoveryConfig:
    metadata_uri: str = ""
    http_port: int = 8100
    http_bind_address: str = "127.0.0.1"
    # host others reach this process's HTTP API at; it names the process as auditor and lock
    # owner, so it must be unique ("" = http_bind_address, or the host name for 0.0.0.0 / ::)
    advertised_address: str = ""
    lease_ttl_s: int = limits.metadata_lease_ttl_s_default
    lost_bookie_recovery_delay_s: float = 0.0
    open_ledger_rereplication_grace_period_s: float = 30.0
    auditor_periodic_check_interval_s: float = 604_800.0
    replicator_workers: int = 1
    replication_rate_bytes: int = 64 * 1024 * 1024
    admin_token: str = ""
    # CURVE towards bookies that require it (the ClientConfig keys of the same names)
    curve_secret_key_file: str = ""
    curve_server_public_key_file: str = ""
    curve_server_keys_dir: str = ""

    def client_config(self) -> ClientConfig:
        """The client settings the auditor's checks and the replicators use."""
        return ClientConfig(curve_secret_key_file=self.curve_secret_key_file,
                            curve_server_public_key_file=self.curve_server_public_key_file,
                            curve_server_keys_dir=self.curve_server_keys_dir).validate()

    def validate(self) -> AutoRecoveryConfig:
        if not self.metadata_uri:
            raise ConfigError("metadata_uri must be set")
        _port("http_port", self.http_port)
        _positive("lease_ttl_s", self.lease_ttl_s)
        _non_negative("lost_bookie_recovery_delay_s", self.lost_bookie_recovery_delay_s)
        _non_negative("open_ledger_rereplication_grace_period_s", self.open_ledger_rereplication_grace_period_s)
        _positive("auditor_periodic_check_interval_s", self.auditor_periodic_check_interval_s)
        _positive("replicator_workers", self.replicator_workers)
        _positive("replication_rate_bytes", self.replication_rate_bytes)
        return self


# --- loading ------------------------------------------------------------------------------


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


_CPU_LIST_KEYS = frozenset({"actor_cpus"})


def _coerce(cls_name: str, key: str, value: Any, typ: Any) -> Any:
    origin = typing.get_origin(typ)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif typ is float:
        number: float | None = None
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            try:
                number = float(value)
            except (ValueError, OverflowError):  # "abc", or an int beyond a double
                pass
        if number is not None and math.isfinite(number):  # nan passes every "> 0" check
            return number
    elif typ is str:
        if isinstance(value, str):
            return value
        if key in _CPU_LIST_KEYS and isinstance(value, int) and not isinstance(value, bool):
            return str(value)  # actor_cpus = 2 (TOML) or --set actor_cpus=2: one CPU
    elif origin is tuple:
        if isinstance(value, str):
            return tuple(p for p in (s.strip() for s in value.split(",")) if p)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
    elif origin is dict or typ is dict or isinstance(typ, types.GenericAlias):
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
    raise ConfigError(f"{cls_name}: key {key!r} expects {getattr(typ, '__name__', typ)}, got {value!r}")


def build(cls: type[C], values: dict[str, Any], *, source: str = "config") -> C:
    """Build a config dataclass from ``values``, rejecting unknown keys and wrong types."""
    types_ = _field_types(cls)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in types_:
            near = difflib.get_close_matches(key, list(types_), n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise ConfigError(f"{source}: unknown key {key!r}{hint}")
        kwargs[key] = _coerce(cls.__name__, key, value, types_[key])
    return cls(**kwargs)


def load_toml(path: str) -> dict[str, Any]:
    """Read a TOML file; a missing file or a syntax error is a ConfigError naming the file."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:  # tomllib decodes the whole file first
        raise ConfigError(f"{path}: not valid TOML: not UTF-8 ({e.reason} at byte {e.start})") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    # A [bookie] table is accepted as well as top-level keys.
    if "bookie" in data and isinstance(data["bookie"], dict):
        flat = dict(data)
        flat.update(flat.pop("bookie"))
        return flat
    return data


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``["key=value", ...]`` from ``--set``; values are read as TOML scalars when they parse."""
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        try:
            out[key] = tomllib.loads(f"v = {raw}")["v"]
        except (tomllib.TOMLDecodeError, RecursionError):
            out[key] = raw
    return out


def load(cls: type[C], *, path: str | None = None, overrides: list[str] | None = None,
         explicit: dict[str, Any] | None = None) -> C:
    """Defaults < TOML file < ``--set`` overrides < explicit flags."""
    values: dict[str, Any] = {}
    if path:
        values.update(load_toml(path))
    values.update(parse_overrides(overrides))
    values.update({k: v for k, v in (explicit or {}).items() if v is not None})
    return build(cls, values, source=path or "--set")
