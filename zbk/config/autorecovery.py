"""``AutoRecoveryConfig``: the ``zbk autorecovery`` process, and a bookie that runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from zbk import limits
from zbk.config.checks import positive, tcp_port
from zbk.config.client import ClientConfig
from zbk.config.sections import RecoveryConfig
from zbk.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class AutoRecoveryConfig:
    """The process's own keys at the top level; the auditor's and replicators' settings in
    ``[autorecovery]``, the section a bookie's config shares.

    Attributes:
        metadata_uri: Required: the cluster's metadata, as a bookie's ``metadata_uri``
            (``--metadata``).
        http_port: The port of ``/metrics`` and the admin API (0: any free port).
        http_bind_address: The address the HTTP port binds.
        advertised_address: The host others reach this process's HTTP API at. It names the process
            as auditor and as lock owner, so it must be unique; empty: ``http_bind_address``, or the
            host name when bound to ``0.0.0.0`` or ``::``.
        lease_ttl_s: The lease of this process's auditor candidacy and replication locks: how long
            after a crash they still look held.
        admin_token: Set: PUT requests need ``Authorization: Bearer <token>``.
        curve_secret_key_file: This process's key pair (``zbk keygen``), for bookies that require
            CURVE; as the ``ClientConfig`` key of the same name.
        curve_server_public_key_file: The bookies' public key (one for every bookie); as the
            ``ClientConfig`` key.
        curve_server_keys_dir: The bookies' public keys, one ``<host>_<port>.key`` each (or
            ``server.key``); as the ``ClientConfig`` key.
        autorecovery: The auditor's and replicators' settings: the ``[autorecovery]`` table a
            bookie's configuration shares.
    """

    # Keys of the shared section that only a bookie takes (zbk/config/loading.py refuses them).
    KEYS_NOT_TAKEN: ClassVar[dict[str, str]] = {
        "autorecovery.enabled": "a bookie's key; zbk autorecovery always runs the auditor and replicators"}

    metadata_uri: str = ""
    http_port: int = 8100
    http_bind_address: str = "127.0.0.1"
    advertised_address: str = ""
    lease_ttl_s: int = limits.metadata_lease_ttl_s_default
    admin_token: str = ""
    curve_secret_key_file: str = ""
    curve_server_public_key_file: str = ""
    curve_server_keys_dir: str = ""
    autorecovery: RecoveryConfig = field(default_factory=RecoveryConfig)

    def client_config(self) -> ClientConfig:
        """The client settings the auditor's checks and the replicators use.

        Returns:
            A ClientConfig with this process's CURVE keys, validated.

        Raises:
            ConfigError: The CURVE keys do not go together.
        """
        return ClientConfig(curve_secret_key_file=self.curve_secret_key_file,
                            curve_server_public_key_file=self.curve_server_public_key_file,
                            curve_server_keys_dir=self.curve_server_keys_dir).validate()

    def validate(self) -> AutoRecoveryConfig:
        """Check every key and the ``[autorecovery]`` section.

        Returns:
            This config, unchanged.

        Raises:
            ConfigError: A value out of range or a missing ``metadata_uri``.
        """
        if not self.metadata_uri:
            raise ConfigError("metadata_uri must be set")
        tcp_port("http_port", self.http_port)
        positive("lease_ttl_s", self.lease_ttl_s)
        self.autorecovery.validate()
        return self
