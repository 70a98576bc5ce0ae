"""``ClientConfig``: every client's settings, also those of the auditor's and replicators'
own connections. ``zbk.BookKeeper(uri, add_timeout_ms=...)`` takes any of them as a keyword."""

from __future__ import annotations

from dataclasses import dataclass

from zbk import limits
from zbk.config.checks import non_negative, positive
from zbk.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """Every setting of a client (``zbk.BookKeeper``, ``zbk.AsyncBookKeeper``), also of the
    auditor's and replicators' own connections.

    Give the fields as keywords to either client, ``zbk.BookKeeper(uri,
    add_timeout_ms=2000)``, or as ``config=ClientConfig(...)``, or both (a keyword wins).
    Frozen: ``dataclasses.replace`` makes a changed copy.

    Attributes:
        add_timeout_ms: A bookie that has not acknowledged an add within this many
            milliseconds counts as failed: the writer replaces it (an ensemble change).
        read_timeout_ms: A bookie that has not answered a read within this many
            milliseconds counts as failed for that read.
        speculative_read_ms: After this many milliseconds without an answer a read also
            asks the entry's next replica.
        pending_adds_max: Appends of one ledger that may be unconfirmed at once; one more
            raises `TooManyRequestsError` (backpressure, and a bound on memory).
        add_request_entries_max: Entries per add request to a bookie (1 to 4,096).
        add_batches_in_flight_max: Batches of a ledger's new entries that may be sent and
            unconfirmed at once; appends made meanwhile wait and go out together in the next
            batch, so a busy writer makes fewer, larger requests. 0: no limit, every
            append is sent at once.
        tail_long_polls: Bookies of the ledger's last ensemble that ``tail()`` long-polls
            at once for new entries (at most the ensemble's size); the first answer wins.
            1 polls one bookie at a time: half the poll answers, a longer tail of
            end-to-end latency.
        ensemble_change_attempts_max: Ensemble changes a writer makes without confirming
            an entry before it fails with `NotEnoughBookiesError`.
        bookie_heartbeat_timeout_ms: A bookie whose connection stays silent this many
            milliseconds counts as failed at once, without waiting for a timeout; 0: no
            heartbeats.
        explicit_lac_interval_ms: An idle writer sends its LAC to its bookies after this
            many milliseconds, so that readers see its last entry; 0 (default): off; on
            means at least 10.
        min_racks_per_write_quorum: Each write set spans at least this many racks (or WQ,
            if fewer), as far as the bookies allow.
        enforce_min_racks_per_write_quorum: Fail with `NotEnoughBookiesError` rather than
            place a ledger on fewer racks than ``min_racks_per_write_quorum``.
        isolation_groups: When not empty, only bookies of these groups hold this client's
            ledgers.
        curve_server_keys_dir: A directory of the bookies' CURVE public keys
            (``<host>_<port>.key``, or ``server.key`` for all).
        curve_server_public_key_file: One CURVE public key for every bookie.
        curve_secret_key_file: This client's CURVE key pair (``zbk keygen``); set, it turns
            CURVE on, and needs one of the two above.
    """

    add_timeout_ms: int = limits.client_add_timeout_ms_default
    read_timeout_ms: int = limits.client_read_timeout_ms_default
    speculative_read_ms: int = limits.client_speculative_read_ms_default
    pending_adds_max: int = limits.client_pending_adds_max
    add_request_entries_max: int = limits.client_add_request_entries_default
    add_batches_in_flight_max: int = limits.client_add_batches_in_flight_default
    tail_long_polls: int = limits.client_tail_long_polls_default
    ensemble_change_attempts_max: int = limits.client_ensemble_change_attempts_max
    bookie_heartbeat_timeout_ms: int = limits.client_heartbeat_timeout_ms_default  # a silent bookie fails after this; 0: never
    # An idle writer sends its LAC with WRITE_LAC after this long (0: never); see docs/contributors.md.
    explicit_lac_interval_ms: int = limits.client_explicit_lac_interval_ms_default
    # Placement (docs/contributors.md, "Placement"): each write set spans at least this many racks
    # (or WQ, if fewer); enforced, creation and ensemble changes fail with NotEnoughBookies
    # rather than place a ledger short of it. Non-empty isolation_groups: only bookies of
    # these groups hold this client's ledgers.
    min_racks_per_write_quorum: int = limits.client_min_racks_per_write_quorum_default
    enforce_min_racks_per_write_quorum: bool = False
    isolation_groups: tuple[str, ...] = ()
    curve_server_keys_dir: str = ""  # per-bookie public keys: <host>_<port>.key, or server.key
    curve_server_public_key_file: str = ""  # one public key for every bookie
    curve_secret_key_file: str = ""  # this client's key pair (zbk keygen); enables CURVE

    def validate(self) -> ClientConfig:
        """Check every field and the fields together (both clients call it).

        Returns:
            This config, unchanged.

        Raises:
            ConfigError: A value out of range, or CURVE settings that do not go together.
        """
        positive("add_timeout_ms", self.add_timeout_ms)
        positive("read_timeout_ms", self.read_timeout_ms)
        positive("speculative_read_ms", self.speculative_read_ms)
        positive("pending_adds_max", self.pending_adds_max)
        if not 1 <= self.add_request_entries_max <= limits.entries_per_add_request_max:
            raise ConfigError(f"add_request_entries_max must be in [1, {limits.entries_per_add_request_max}]")
        non_negative("add_batches_in_flight_max", self.add_batches_in_flight_max)
        if not 1 <= self.tail_long_polls <= limits.ledger_ensemble_size_max:
            raise ConfigError(f"tail_long_polls must be in [1, {limits.ledger_ensemble_size_max}], "
                              f"got {self.tail_long_polls!r}")
        positive("ensemble_change_attempts_max", self.ensemble_change_attempts_max)
        if not 0 <= self.bookie_heartbeat_timeout_ms <= limits.client_heartbeat_timeout_ms_max:
            raise ConfigError(f"bookie_heartbeat_timeout_ms must be in [0, {limits.client_heartbeat_timeout_ms_max}]")
        lac_ms, lac_ms_min = self.explicit_lac_interval_ms, limits.client_explicit_lac_interval_ms_min
        if lac_ms != 0 and lac_ms < lac_ms_min:
            raise ConfigError(f"explicit_lac_interval_ms must be 0 (off) or >= {lac_ms_min}, got {lac_ms!r}")
        if not 1 <= self.min_racks_per_write_quorum <= limits.ledger_ensemble_size_max:
            raise ConfigError(f"min_racks_per_write_quorum must be in [1, {limits.ledger_ensemble_size_max}], "
                              f"got {self.min_racks_per_write_quorum!r}")
        for group in self.isolation_groups:
            if not isinstance(group, str) or not group or "," in group:
                raise ConfigError(f"isolation_groups: a group is a non-empty name without commas, got {group!r}")
        server_key = bool(self.curve_server_public_key_file or self.curve_server_keys_dir)
        if bool(self.curve_secret_key_file) != server_key:
            raise ConfigError("CURVE: curve_secret_key_file goes with curve_server_public_key_file "
                              "or curve_server_keys_dir")
        return self
