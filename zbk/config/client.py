"""``ClientConfig``: every client's settings, also those of the auditor's and replicators'
own connections. ``zbk.BookKeeper(uri, add_timeout_ms=...)`` takes any of them as a keyword."""

from __future__ import annotations

from dataclasses import dataclass

from zbk import limits
from zbk.config.checks import positive
from zbk.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """A client's settings: given to ``zbk.BookKeeper`` or ``zbk.AsyncBookKeeper`` as
    ``config=ClientConfig(...)``, or field by field as keywords (a keyword wins over the
    field of ``config``). ``validate()`` raises ``ConfigError`` for a value out of range."""

    add_timeout_ms: int = limits.client_add_timeout_ms_default
    """A bookie that has not acknowledged an add within this is treated as failed: the
    writer replaces it with an ensemble change."""
    read_timeout_ms: int = limits.client_read_timeout_ms_default
    """A bookie that has not answered a read within this is treated as failed for that
    read."""
    speculative_read_ms: int = limits.client_speculative_read_ms_default
    """A read asks the next replica of the entry's write set when the one asked has not
    answered within this (BookKeeper's ``speculativeReadTimeout``)."""
    pending_adds_max: int = limits.client_pending_adds_max
    """Appends in flight per writer; one more raises ``ZbkError`` rather than let a writer's
    memory grow without bound."""
    add_request_entries_max: int = limits.client_add_request_entries_default
    """The entries of one add request, 1 to 4096: with more appends in flight than this, a
    writer keeps several requests in flight per bookie, and the bookie stores one while the
    client builds the next (docs/contributors.md, "Write path")."""
    ensemble_change_attempts_max: int = limits.client_ensemble_change_attempts_max
    """Ensemble changes in a row without an add confirmed before the pending adds fail."""
    heartbeat_timeout_ms: int = limits.client_heartbeat_timeout_ms_default
    """A bookie connection that answers no heartbeat for this long is closed and its
    writers change ensembles; only a stopped process or a cut network goes this long
    silent. 0: no heartbeats."""
    explicit_lac_interval_ms: int = limits.client_explicit_lac_interval_ms_default
    """An idle writer sends its last add confirmed to the bookies (``WRITE_LAC``) after this
    long, so that a tailing reader sees its last entry before the next add or the close
    (BookKeeper's ``explicitLacInterval``; docs/contributors.md, "Explicit LAC"). 0: off;
    otherwise at least 10."""
    min_racks_per_write_quorum: int = limits.client_min_racks_per_write_quorum_default
    """Each write set spans at least min(this, WQ) racks, 1 to 64 (BookKeeper's
    ``minNumRacksPerWriteQuorum``; docs/contributors.md, "Placement")."""
    enforce_min_racks_per_write_quorum: bool = False
    """Enforced: bookies without a rack are not used, and when no placement reaches
    ``min_racks_per_write_quorum``, ``create_ledger`` and ensemble changes fail with
    ``NotEnoughBookiesError`` instead of placing a ledger short of it. Not enforced: as many
    racks per write set as the bookies allow."""
    isolation_groups: tuple[str, ...] = ()
    """Non-empty: only bookies whose ``isolation_group`` is one of these hold this client's
    ledgers."""
    curve_server_keys_dir: str = ""
    """The bookies' public keys, one ``<host>_<port>.key`` each, or ``server.key`` for all
    (CURVE)."""
    curve_server_public_key_file: str = ""
    """One public key for every bookie (CURVE)."""
    curve_secret_key_file: str = ""
    """This client's key pair (``zbk keygen``); set, connections use CURVE and need the
    bookies' public keys (``curve_server_public_key_file`` or ``curve_server_keys_dir``)."""

    def validate(self) -> ClientConfig:
        positive("add_timeout_ms", self.add_timeout_ms)
        positive("read_timeout_ms", self.read_timeout_ms)
        positive("speculative_read_ms", self.speculative_read_ms)
        positive("pending_adds_max", self.pending_adds_max)
        if not 1 <= self.add_request_entries_max <= limits.entries_per_add_request_max:
            raise ConfigError(f"add_request_entries_max must be in [1, {limits.entries_per_add_request_max}]")
        positive("ensemble_change_attempts_max", self.ensemble_change_attempts_max)
        if not 0 <= self.heartbeat_timeout_ms <= limits.client_heartbeat_timeout_ms_max:
            raise ConfigError(f"heartbeat_timeout_ms must be in [0, {limits.client_heartbeat_timeout_ms_max}]")
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
