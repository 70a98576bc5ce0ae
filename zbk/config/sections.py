"""The bookie's configuration sections: one frozen dataclass per component, each a TOML
table (``[journal]``, ``[entry_log]``, ...) with its own ``validate()``.

Each section names its table (``TABLE``, also its field name in the config that holds it)
and the flat key of each of its fields (``FLAT``): the names of API.md "Bookie
configuration", which keep working on the command line and as top-level keys of a file.
``RecoveryConfig`` is shared: the bookie's ``[autorecovery]`` and the ``zbk autorecovery``
process read the same class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from zbk import limits
from zbk.config.checks import non_negative, percent, positive, ratio, tcp_port
from zbk.errors import ConfigError

MIB = 1024 * 1024


class Section:
    """What every section declares: its table and the flat names of its keys."""

    TABLE: ClassVar[str]
    FLAT: ClassVar[dict[str, str]]  # field -> flat key (API.md)

    def key(self, name: str) -> str:
        """``name`` as an error message names it: both ways it can be written."""
        return f"{self.TABLE}.{name} ({self.FLAT[name]})"


@dataclass(frozen=True, kw_only=True)
class JournalConfig(Section):
    """[journal]: the write-ahead journal (zbk/storage/journal.py, zbk/actors/journal.py)."""

    TABLE: ClassVar[str] = "journal"
    FLAT: ClassVar[dict[str, str]] = {
        "write_data": "journal_write_data", "sync_data": "journal_sync_data",
        "max_group_wait_ms": "journal_max_group_wait_ms",
        "buffered_writes_threshold_bytes": "journal_buffered_writes_threshold_bytes",
        "max_size_mb": "journal_max_size_mb", "pre_alloc_size_mb": "journal_pre_alloc_size_mb",
        "reuse_files": "journal_reuse_files"}

    # false: entry data is not journalled (BP-46); an unclean stop loses unflushed entries,
    # which recovery then treats as unknown, never as absent.
    write_data: bool = True
    sync_data: bool = True
    max_group_wait_ms: float = float(limits.journal_group_wait_ms_default)
    buffered_writes_threshold_bytes: int = limits.journal_group_bytes_default
    max_size_mb: int = limits.journal_segment_bytes_default // MIB
    # Zeros kept written ahead of the journal's records, so that a small commit's fsync does
    # not also commit the file's growth (zbk/storage/journal.py, "Preallocation"); 0: off.
    pre_alloc_size_mb: int = limits.journal_preallocate_bytes_default // MIB
    # Make new journal segments from retired ones instead of new files, so their pages are
    # already in the page cache (zbk/storage/journal.py, "Recycling"); BookKeeper's
    # journalReuseFiles.
    reuse_files: bool = True

    @property
    def group_wait_s(self) -> float:
        return self.max_group_wait_ms / 1000.0

    @property
    def segment_bytes(self) -> int:
        return self.max_size_mb * MIB

    @property
    def preallocate_bytes(self) -> int:
        return self.pre_alloc_size_mb * MIB

    def validate(self) -> JournalConfig:
        non_negative(self.key("max_group_wait_ms"), self.max_group_wait_ms)
        positive(self.key("buffered_writes_threshold_bytes"), self.buffered_writes_threshold_bytes)
        positive(self.key("max_size_mb"), self.max_size_mb)
        non_negative(self.key("pre_alloc_size_mb"), self.pre_alloc_size_mb)
        return self


@dataclass(frozen=True, kw_only=True)
class EntryLogConfig(Section):
    """[entry_log]: the entry logs that hold entry data (zbk/storage/entrylog.py)."""

    TABLE: ClassVar[str] = "entry_log"
    FLAT: ClassVar[dict[str, str]] = {
        "size_limit_mb": "entry_log_size_limit_mb", "write_buffer_bytes": "entry_log_write_buffer_bytes",
        "flush_bytes": "flush_entry_log_bytes", "keep_cached_mb": "entry_log_keep_cached_mb",
        "per_ledger": "entry_log_per_ledger", "open_max": "entry_logs_open_max",
        "expire_after_access_s": "entry_log_expire_after_access_s"}

    size_limit_mb: int = limits.entry_log_bytes_default // MIB
    # Entries are held in process memory up to this size before they are written to the
    # file: a kill -9 loses them (with the journal off, BP-46's data loss).
    write_buffer_bytes: int = limits.entry_log_write_buffer_bytes_default
    # Start writing each this many bytes of an entry log to disk (asynchronously), so that a
    # checkpoint's fsync finds little left to write; 0: leave it to the kernel and the checkpoint.
    flush_bytes: int = limits.entry_log_flush_bytes_default
    # Of the data the entry logger wrote, the last this many MiB stay in the page cache;
    # older pages are dropped once on disk (zbk/storage/entrylog.py, "Page cache"); 0: the
    # kernel decides.
    keep_cached_mb: int = limits.entry_log_keep_cached_bytes_default // MIB
    per_ledger: bool = False  # one log per ledger (BP-32)
    open_max: int = limits.entry_logs_open_max  # per-ledger logs kept open
    expire_after_access_s: float = float(limits.entry_log_expire_after_access_s)

    @property
    def size_limit_bytes(self) -> int:
        return self.size_limit_mb * MIB

    @property
    def keep_cached_bytes(self) -> int:
        return self.keep_cached_mb * MIB

    def validate(self) -> EntryLogConfig:
        positive(self.key("size_limit_mb"), self.size_limit_mb)
        non_negative(self.key("write_buffer_bytes"), self.write_buffer_bytes)
        non_negative(self.key("flush_bytes"), self.flush_bytes)
        non_negative(self.key("keep_cached_mb"), self.keep_cached_mb)
        positive(self.key("open_max"), self.open_max)
        positive(self.key("expire_after_access_s"), self.expire_after_access_s)
        return self


@dataclass(frozen=True, kw_only=True)
class IndexConfig(Section):
    """[index]: the ledger index and its checkpoints (zbk/storage/ledgercache.py,
    zbk/actors/indexsyncer.py)."""

    TABLE: ClassVar[str] = "index"
    FLAT: ClassVar[dict[str, str]] = {
        "flush_interval_ms": "flush_interval_ms", "cache_bytes_max": "ledger_cache_bytes_max",
        "flush_syncfs": "index_flush_syncfs", "files_open_max": "index_files_open_max"}

    flush_interval_ms: int = 10_000  # how often a checkpoint runs
    cache_bytes_max: int = limits.ledger_cache_bytes_max_default
    # Make an index checkpoint durable with one syncfs per file system of the index
    # directories rather than an fsync per index file written (zbk/storage/ledgercache.py,
    # "Syncing a flush"; only where syncfs reports writeback errors, Linux >= 5.8).
    flush_syncfs: bool = True
    # Index files kept open (least recently used closed first); the bookie takes fewer when
    # its descriptor limit (RLIMIT_NOFILE, raised to the hard limit at start) leaves less.
    files_open_max: int = limits.index_files_open_max_default

    @property
    def flush_interval_s(self) -> float:
        return self.flush_interval_ms / 1000.0

    def validate(self) -> IndexConfig:
        positive(self.key("flush_interval_ms"), self.flush_interval_ms)
        positive(self.key("cache_bytes_max"), self.cache_bytes_max)
        positive(self.key("files_open_max"), self.files_open_max)
        return self


@dataclass(frozen=True, kw_only=True)
class GcConfig(Section):
    """[gc]: garbage collection and compaction of entry logs (zbk/actors/gc.py)."""

    TABLE: ClassVar[str] = "gc"
    FLAT: ClassVar[dict[str, str]] = {
        "wait_time_ms": "gc_wait_time_ms",
        "minor_compaction_threshold": "minor_compaction_threshold",
        "minor_compaction_interval_s": "minor_compaction_interval_s",
        "major_compaction_threshold": "major_compaction_threshold",
        "major_compaction_interval_s": "major_compaction_interval_s",
        "compaction_rate_bytes": "compaction_rate_bytes",
        "overreplicated_ledger_wait_time_ms": "gc_overreplicated_ledger_wait_time_ms"}

    wait_time_ms: int = 60_000
    minor_compaction_threshold: float = 0.2
    minor_compaction_interval_s: float = 3600.0
    major_compaction_threshold: float = 0.8
    major_compaction_interval_s: float = 86_400.0
    compaction_rate_bytes: int = 64 * MIB  # per second
    # BookKeeper's gcOverreplicatedLedgerWaitTime: a local copy that no fragment names is
    # dropped no sooner than this after the bookie was last seen named (zbk/actors/overrep.py).
    overreplicated_ledger_wait_time_ms: int = 86_400_000

    def validate(self) -> GcConfig:
        positive(self.key("wait_time_ms"), self.wait_time_ms)
        ratio(self.key("minor_compaction_threshold"), self.minor_compaction_threshold)
        ratio(self.key("major_compaction_threshold"), self.major_compaction_threshold)
        if self.minor_compaction_threshold > self.major_compaction_threshold:
            raise ConfigError(f"{self.key('minor_compaction_threshold')} must not exceed "
                              f"{self.key('major_compaction_threshold')}")
        positive(self.key("minor_compaction_interval_s"), self.minor_compaction_interval_s)
        positive(self.key("major_compaction_interval_s"), self.major_compaction_interval_s)
        positive(self.key("compaction_rate_bytes"), self.compaction_rate_bytes)
        positive(self.key("overreplicated_ledger_wait_time_ms"), self.overreplicated_ledger_wait_time_ms)
        return self


@dataclass(frozen=True, kw_only=True)
class DiskConfig(Section):
    """[disk]: the disk checker and read-only mode (zbk/actors/loops.py)."""

    TABLE: ClassVar[str] = "disk"
    FLAT: ClassVar[dict[str, str]] = {
        "usage_threshold": "disk_usage_threshold", "usage_warn_threshold": "disk_usage_warn_threshold",
        "check_interval_ms": "disk_check_interval_ms", "read_only_mode_enabled": "read_only_mode_enabled"}

    usage_threshold: float = 0.95  # read-only (with read_only_mode_enabled) above it
    usage_warn_threshold: float = 0.90
    check_interval_ms: int = 10_000
    read_only_mode_enabled: bool = True

    @property
    def check_interval_s(self) -> float:
        return self.check_interval_ms / 1000.0

    def validate(self) -> DiskConfig:
        ratio(self.key("usage_threshold"), self.usage_threshold)
        ratio(self.key("usage_warn_threshold"), self.usage_warn_threshold)
        if self.usage_warn_threshold > self.usage_threshold:
            raise ConfigError(f"{self.key('usage_warn_threshold')} must not exceed {self.key('usage_threshold')}")
        positive(self.key("check_interval_ms"), self.check_interval_ms)
        return self


@dataclass(frozen=True, kw_only=True)
class RecoveryConfig(Section):
    """[autorecovery]: the auditor candidate and replicator workers, in a bookie that runs
    them (``enabled``) and in ``zbk autorecovery`` (AutoRecoveryConfig), which always does
    and so takes no ``enabled`` key (zbk/recovery/process.py)."""

    TABLE: ClassVar[str] = "autorecovery"
    FLAT: ClassVar[dict[str, str]] = {
        "enabled": "autorecovery_enabled", "lost_bookie_recovery_delay_s": "lost_bookie_recovery_delay_s",
        "open_ledger_rereplication_grace_period_s": "open_ledger_rereplication_grace_period_s",
        "auditor_periodic_check_interval_s": "auditor_periodic_check_interval_s",
        "auditor_ledger_verification_percent": "auditor_ledger_verification_percent",
        "replicator_workers": "replicator_workers", "replication_rate_bytes": "replication_rate_bytes"}

    enabled: bool = False
    lost_bookie_recovery_delay_s: float = 0.0
    open_ledger_rereplication_grace_period_s: float = 30.0
    auditor_periodic_check_interval_s: float = 604_800.0
    # Of each replica's entries between the first and the last of a fragment, the share the
    # periodic check reads back (BookKeeper's auditorLedgerVerificationPercentage): 0 reads
    # the two ends only; damage between them is then found only by the clients' reads.
    auditor_ledger_verification_percent: float = 0.0
    replicator_workers: int = 1
    replication_rate_bytes: int = 64 * MIB  # per second

    def validate(self) -> RecoveryConfig:
        non_negative(self.key("lost_bookie_recovery_delay_s"), self.lost_bookie_recovery_delay_s)
        non_negative(self.key("open_ledger_rereplication_grace_period_s"),
                     self.open_ledger_rereplication_grace_period_s)
        positive(self.key("auditor_periodic_check_interval_s"), self.auditor_periodic_check_interval_s)
        percent(self.key("auditor_ledger_verification_percent"), self.auditor_ledger_verification_percent)
        positive(self.key("replicator_workers"), self.replicator_workers)
        positive(self.key("replication_rate_bytes"), self.replication_rate_bytes)
        return self


@dataclass(frozen=True, kw_only=True)
class CurveConfig(Section):
    """[curve]: ZeroMQ CURVE encryption and client authentication (zbk/wire/curve.py)."""

    TABLE: ClassVar[str] = "curve"
    FLAT: ClassVar[dict[str, str]] = {
        "secret_key_file": "curve_secret_key_file", "authorized_keys_dir": "curve_authorized_keys_dir",
        "server_public_key_file": "curve_server_public_key_file", "server_keys_dir": "curve_server_keys_dir"}

    secret_key_file: str = ""  # this bookie's key pair (zbk keygen); enables CURVE
    authorized_keys_dir: str = ""  # the public keys of the clients it accepts
    # How this bookie's own client connections (autorecovery.enabled) reach other CURVE
    # bookies: their public key(s). Unset: this bookie's own public key (bookies sharing one
    # key pair). The bookie's own public key must be in the other bookies' authorized dirs.
    server_public_key_file: str = ""
    server_keys_dir: str = ""

    def validate(self) -> CurveConfig:
        if bool(self.secret_key_file) != bool(self.authorized_keys_dir):
            raise ConfigError(f"{self.key('secret_key_file')} and {self.key('authorized_keys_dir')} go together")
        if (self.server_public_key_file or self.server_keys_dir) and not self.secret_key_file:
            raise ConfigError(f"{self.key('server_public_key_file')} / {self.key('server_keys_dir')} "
                              f"need {self.key('secret_key_file')}")
        return self


@dataclass(frozen=True, kw_only=True)
class HttpConfig(Section):
    """[http]: the bookie's HTTP server (/metrics and the admin API, zbk/metrics/http.py)."""

    TABLE: ClassVar[str] = "http"
    FLAT: ClassVar[dict[str, str]] = {
        "port": "http_port", "bind_address": "http_bind_address", "admin_token": "admin_token"}

    port: int = 8000
    bind_address: str = "127.0.0.1"
    admin_token: str = ""  # set: PUT/POST need "Authorization: Bearer <token>"

    def validate(self) -> HttpConfig:
        tcp_port(self.key("port"), self.port)
        return self
