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
    """[journal]: the write-ahead journal (zbk/storage/journal.py, zbk/actors/journal.py).

    Attributes:
        write_data: False: entry data is not journalled (BP-46); an unclean shutdown loses the
            unflushed entries, which recovery then treats as unknown, never as absent.
        sync_data: False: an add is acknowledged before its journal record is fsynced; after an
            unclean stop the bookie runs phase one, as with ``write_data`` off.
        max_group_wait_ms: How long a group commit waits for more records before its fsync: the
            latency of a lone add against entries per fsync under load.
        buffered_writes_threshold_bytes: A group commit is written at once when this many bytes
            wait.
        max_size_mb: The size of a journal segment; a checkpoint retires the segments before its
            mark.
        pre_alloc_size_mb: Zeros kept written ahead of the journal's records, so that a small
            commit's fsync flushes data only and not also the file's growth (zbk/storage/journal.py,
            "Preallocation"); 0: off.
        reuse_files: Retired segments (up to 1 GiB, 2-16 files) are kept as ``<id>.jnl.free`` and
            reused for new segments, whose pages are then already in the page cache (only segments the
            running bookie wrote are kept; those of a previous run are removed); BookKeeper's
            ``journalReuseFiles``. False: retired segments are removed (docs/storage.md).
        direct_io: Write the journal with ``O_DIRECT``, past the page cache (zbk/storage/journal.py,
            "Direct I/O"): the bookies' CPU per entry at window 1,000 falls by about a tenth. A
            file system that refuses ``O_DIRECT`` gets buffered writes; so does a journal with
            ``sync_data`` off, whose writes would otherwise wait for the disk. False: always buffered.
    """

    TABLE: ClassVar[str] = "journal"
    FLAT: ClassVar[dict[str, str]] = {
        "write_data": "journal_write_data", "sync_data": "journal_sync_data",
        "max_group_wait_ms": "journal_max_group_wait_ms",
        "buffered_writes_threshold_bytes": "journal_buffered_writes_threshold_bytes",
        "max_size_mb": "journal_max_size_mb", "pre_alloc_size_mb": "journal_pre_alloc_size_mb",
        "reuse_files": "journal_reuse_files", "direct_io": "journal_direct_io"}

    write_data: bool = True
    sync_data: bool = True
    max_group_wait_ms: float = float(limits.journal_group_wait_ms_default)
    buffered_writes_threshold_bytes: int = limits.journal_group_bytes_default
    max_size_mb: int = limits.journal_segment_bytes_default // MIB
    pre_alloc_size_mb: int = limits.journal_preallocate_bytes_default // MIB
    reuse_files: bool = True
    direct_io: bool = True

    @property
    def group_wait_s(self) -> float:
        """``max_group_wait_ms`` in seconds."""
        return self.max_group_wait_ms / 1000.0

    @property
    def segment_bytes(self) -> int:
        """``max_size_mb`` in bytes."""
        return self.max_size_mb * MIB

    @property
    def preallocate_bytes(self) -> int:
        """``pre_alloc_size_mb`` in bytes."""
        return self.pre_alloc_size_mb * MIB

    def validate(self) -> JournalConfig:
        """Check every key.

        Returns:
            This section, unchanged.

        Raises:
            ConfigError: A value out of range, naming the key both ways it can be written.
        """
        non_negative(self.key("max_group_wait_ms"), self.max_group_wait_ms)
        positive(self.key("buffered_writes_threshold_bytes"), self.buffered_writes_threshold_bytes)
        positive(self.key("max_size_mb"), self.max_size_mb)
        non_negative(self.key("pre_alloc_size_mb"), self.pre_alloc_size_mb)
        return self


@dataclass(frozen=True, kw_only=True)
class EntryLogConfig(Section):
    """[entry_log]: the entry logs that hold entry data (zbk/storage/entrylog.py).

    Attributes:
        size_limit_mb: An entry log is rotated at this size.
        write_buffer_bytes: Entries are held in process memory up to this size before they are
            written to the file; a kill -9 loses them (with the journal off, that is BP-46's data loss).
        flush_bytes: With buffered writes, writeback of an entry log starts every this many bytes
            (asynchronously, no wait), so that a checkpoint's fsync finds little left to write and
            does not stall the journals behind it; 0: left to the kernel and the checkpoint.
        keep_cached_mb: With buffered writes, of the data the entry logger wrote, the newest this many
            MiB stay in the page cache; older pages are dropped once on disk, so that writing does not
            keep taking new memory (reads of older entries then come from disk;
            zbk/storage/entrylog.py, "Page cache"); 0: the kernel decides.
        per_ledger: One entry log per ledger (BP-32): deleting ledgers is cheap.
        open_max: With ``per_ledger``, the logs kept open at once (least recently used rotated
            first).
        expire_after_access_s: With ``per_ledger``, a log idle this long is rotated.
        direct_io: Write the entry logs with ``O_DIRECT``, past the page cache
            (zbk/storage/entrylog.py, "Direct I/O"): the copy into the page cache was a third of one
            bookie's CPU at window 1,000, its writeback the kernel's. Reads then come from the disk, except
            tailing readers' (the Server keeps the newest entries of long-polled ledgers), and
            ``flush_bytes`` and ``keep_cached_mb`` have nothing to do. Logs per ledger
            (``per_ledger``), and a file system that refuses ``O_DIRECT``, get buffered writes.
            A direct write waits for the disk, once per ``write_buffer_bytes`` on the add path:
            with ledger directories on a disk much slower than the journal's, set it false.
            False: always buffered.
    """

    TABLE: ClassVar[str] = "entry_log"
    FLAT: ClassVar[dict[str, str]] = {
        "size_limit_mb": "entry_log_size_limit_mb", "write_buffer_bytes": "entry_log_write_buffer_bytes",
        "flush_bytes": "flush_entry_log_bytes", "keep_cached_mb": "entry_log_keep_cached_mb",
        "per_ledger": "entry_log_per_ledger", "open_max": "entry_logs_open_max",
        "expire_after_access_s": "entry_log_expire_after_access_s", "direct_io": "entry_log_direct_io"}

    size_limit_mb: int = limits.entry_log_bytes_default // MIB
    write_buffer_bytes: int = limits.entry_log_write_buffer_bytes_default
    flush_bytes: int = limits.entry_log_flush_bytes_default
    keep_cached_mb: int = limits.entry_log_keep_cached_bytes_default // MIB
    per_ledger: bool = False
    open_max: int = limits.entry_logs_open_max
    expire_after_access_s: float = float(limits.entry_log_expire_after_access_s)
    direct_io: bool = True

    @property
    def size_limit_bytes(self) -> int:
        """``size_limit_mb`` in bytes."""
        return self.size_limit_mb * MIB

    @property
    def keep_cached_bytes(self) -> int:
        """``keep_cached_mb`` in bytes."""
        return self.keep_cached_mb * MIB

    def validate(self) -> EntryLogConfig:
        """Check every key.

        Returns:
            This section, unchanged.

        Raises:
            ConfigError: A value out of range, naming the key both ways it can be written.
        """
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
    zbk/actors/indexsyncer.py).

    Attributes:
        flush_interval_ms: How often a checkpoint runs, and so how much journal a restart replays.
        cache_bytes_max: Index pages kept in memory (dirty pages are never dropped).
        flush_syncfs: A checkpoint makes its index writes durable with one ``syncfs`` per file
            system of the index directories instead of an fsync per index file (10,000 dirty ledgers:
            0.2 s instead of 1.2 s; zbk/storage/ledgercache.py, "Syncing a flush"), used only where
            syncfs reports writeback errors (Linux >= 5.8). Set false when the index directories share a
            file system with other programs' heavy writes, which a syncfs would wait for. The boot log
            says which way is in use.
        files_open_max: Index files kept open (one per ledger written lately; least recently used
            closed first), so that a checkpoint does not open them again. The bookie raises its open-
            files limit (``RLIMIT_NOFILE``) to the hard limit at start and keeps 1,024 descriptors (plus
            ``entry_log.open_max``) for everything else; under a lower limit it takes fewer and logs a
            warning.
    """

    TABLE: ClassVar[str] = "index"
    FLAT: ClassVar[dict[str, str]] = {
        "flush_interval_ms": "flush_interval_ms", "cache_bytes_max": "ledger_cache_bytes_max",
        "flush_syncfs": "index_flush_syncfs", "files_open_max": "index_files_open_max"}

    flush_interval_ms: int = 10_000
    cache_bytes_max: int = limits.ledger_cache_bytes_max_default
    flush_syncfs: bool = True
    files_open_max: int = limits.index_files_open_max_default

    @property
    def flush_interval_s(self) -> float:
        """``flush_interval_ms`` in seconds."""
        return self.flush_interval_ms / 1000.0

    def validate(self) -> IndexConfig:
        """Check every key.

        Returns:
            This section, unchanged.

        Raises:
            ConfigError: A value out of range, naming the key both ways it can be written.
        """
        positive(self.key("flush_interval_ms"), self.flush_interval_ms)
        positive(self.key("cache_bytes_max"), self.cache_bytes_max)
        positive(self.key("files_open_max"), self.files_open_max)
        return self


@dataclass(frozen=True, kw_only=True)
class GcConfig(Section):
    """[gc]: garbage collection and compaction of entry logs (zbk/actors/gc.py).

    Attributes:
        wait_time_ms: How often garbage collection looks for deleted ledgers.
        minor_compaction_threshold: Minor compaction rewrites the entry logs whose live share is
            below this.
        minor_compaction_interval_s: How often minor compaction runs.
        major_compaction_threshold: Major compaction rewrites the entry logs whose live share is
            below this (at least ``minor_compaction_threshold``).
        major_compaction_interval_s: How often major compaction runs.
        compaction_rate_bytes: How fast compaction copies, per second, and so what I/O it costs.
        overreplicated_ledger_wait_time_ms: A bookie drops its copy of a closed ledger that no
            fragment names (re-replication moved it while the bookie was away) no sooner than this after
            it last saw itself named, never while the ledger is locked or marked for replication, and
            never after a cookie fix until the auditor's next full check has run (BookKeeper's
            ``gcOverreplicatedLedgerWaitTime``; zbk/actors/overrep.py); the scan runs every half of
            this, at most hourly.
    """

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
    compaction_rate_bytes: int = 64 * MIB
    overreplicated_ledger_wait_time_ms: int = 86_400_000

    def validate(self) -> GcConfig:
        """Check every key and that the minor threshold does not exceed the major one.

        Returns:
            This section, unchanged.

        Raises:
            ConfigError: A value out of range, or a minor threshold above the major one, naming the key both ways it can be written.
        """
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
    """[disk]: the disk checker and read-only mode (zbk/actors/loops.py).

    Attributes:
        usage_threshold: At this share of a disk used the bookie turns read-only (with
            ``read_only_mode_enabled``) and compaction waits.
        usage_warn_threshold: At this share of a disk used the bookie warns; below it a read-only
            bookie turns writable again.
        check_interval_ms: How often the disks' usage is read.
        read_only_mode_enabled: False: a full disk fails adds with an I/O error instead of turning
            the bookie read-only.
    """

    TABLE: ClassVar[str] = "disk"
    FLAT: ClassVar[dict[str, str]] = {
        "usage_threshold": "disk_usage_threshold", "usage_warn_threshold": "disk_usage_warn_threshold",
        "check_interval_ms": "disk_check_interval_ms", "read_only_mode_enabled": "read_only_mode_enabled"}

    usage_threshold: float = 0.95
    usage_warn_threshold: float = 0.90
    check_interval_ms: int = 10_000
    read_only_mode_enabled: bool = True

    @property
    def check_interval_s(self) -> float:
        """``check_interval_ms`` in seconds."""
        return self.check_interval_ms / 1000.0

    def validate(self) -> DiskConfig:
        """Check every key and that the warning threshold does not exceed the read-only one.

        Returns:
            This section, unchanged.

        Raises:
            ConfigError: A value out of range, or a warning threshold above the read-only one, naming the key both ways it can be written.
        """
        ratio(self.key("usage_threshold"), self.usage_threshold)
        ratio(self.key("usage_warn_threshold"), self.usage_warn_threshold)
        if self.usage_warn_threshold > self.usage_threshold:
            raise ConfigError(f"{self.key('usage_warn_threshold')} must not exceed {self.key('usage_threshold')}")
        positive(self.key("check_interval_ms"), self.check_interval_ms)
        return self


@dataclass(frozen=True, kw_only=True)
class RecoveryConfig(Section):
    """[autorecovery]: the auditor candidate and replicator workers, in a bookie that runs them
    (``enabled``) and in ``zbk autorecovery`` (AutoRecoveryConfig), which always does and so takes
    no ``enabled`` key (zbk/recovery/process.py).

    Attributes:
        enabled: Run an auditor candidate and replicator workers in the bookie process (a bookie's
            key only: ``zbk autorecovery`` always runs them and refuses it).
        lost_bookie_recovery_delay_s: The cluster's recovery delay, written only if the cluster has
            none yet: it lives in the metadata and changes at runtime (docs/autorecovery.md).
        open_ledger_rereplication_grace_period_s: How long an open ledger's writer may replace a
            lost bookie itself before a replicator fences and recovers the ledger.
        auditor_periodic_check_interval_s: How often the auditor checks every ledger's replicas.
        auditor_ledger_verification_percent: Of each replica's entries between the first and the
            last of a fragment, the share the periodic check reads back (BookKeeper's
            ``auditorLedgerVerificationPercentage``): 0 reads the two ends only, and damage between them
            is then found only by the clients' reads; 100 reads every entry.
        replicator_workers: Ledgers this process re-replicates at once.
        replication_rate_bytes: What this process's workers write to replacements, per second, all
            workers together.
    """

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
    auditor_ledger_verification_percent: float = 0.0
    replicator_workers: int = 1
    replication_rate_bytes: int = 64 * MIB

    def validate(self) -> RecoveryConfig:
        """Check every key.

        Returns:
            This section, unchanged.

        Raises:
            ConfigError: A value out of range, naming the key both ways it can be written.
        """
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
    """[curve]: ZeroMQ CURVE encryption and client authentication (zbk/wire/curve.py).

    Attributes:
        secret_key_file: This bookie's key pair (``zbk keygen``); set, the wire port requires CURVE.
        authorized_keys_dir: The public keys of the clients admitted (goes with
            ``secret_key_file``).
        server_public_key_file: For this bookie's own client connections to other CURVE bookies
            (with ``autorecovery.enabled``): their public key. Empty: this bookie's own public key
            (bookies sharing one key pair). This bookie's public key must then be in the other bookies'
            ``authorized_keys_dir``.
        server_keys_dir: As ``server_public_key_file``, one ``<host>_<port>.key`` per bookie.
    """

    TABLE: ClassVar[str] = "curve"
    FLAT: ClassVar[dict[str, str]] = {
        "secret_key_file": "curve_secret_key_file", "authorized_keys_dir": "curve_authorized_keys_dir",
        "server_public_key_file": "curve_server_public_key_file", "server_keys_dir": "curve_server_keys_dir"}

    secret_key_file: str = ""
    authorized_keys_dir: str = ""
    server_public_key_file: str = ""
    server_keys_dir: str = ""

    def validate(self) -> CurveConfig:
        """Check every key and that the CURVE keys go together.

        Returns:
            This section, unchanged.

        Raises:
            ConfigError: A value out of range, or keys that do not go together, naming the key both ways it can be written.
        """
        if bool(self.secret_key_file) != bool(self.authorized_keys_dir):
            raise ConfigError(f"{self.key('secret_key_file')} and {self.key('authorized_keys_dir')} go together")
        if (self.server_public_key_file or self.server_keys_dir) and not self.secret_key_file:
            raise ConfigError(f"{self.key('server_public_key_file')} / {self.key('server_keys_dir')} "
                              f"need {self.key('secret_key_file')}")
        return self


@dataclass(frozen=True, kw_only=True)
class HttpConfig(Section):
    """[http]: the bookie's HTTP server (/metrics and the admin API, zbk/metrics/http.py).

    Attributes:
        port: The port of ``/metrics`` and the admin API (``--http-port``).
        bind_address: The address the HTTP port binds; beyond loopback, PUT and POST need
            ``admin_token``.
        admin_token: Set: PUT and POST need ``Authorization: Bearer <token>``.
    """

    TABLE: ClassVar[str] = "http"
    FLAT: ClassVar[dict[str, str]] = {
        "port": "http_port", "bind_address": "http_bind_address", "admin_token": "admin_token"}

    port: int = 8000
    bind_address: str = "127.0.0.1"
    admin_token: str = ""

    def validate(self) -> HttpConfig:
        """Check every key.

        Returns:
            This section, unchanged.

        Raises:
            ConfigError: A value out of range, naming the key both ways it can be written.
        """
        tcp_port(self.key("port"), self.port)
        return self
