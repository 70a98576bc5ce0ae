"""Configuration: one frozen dataclass per component, each with ``validate()``.

The bookie's keys (``BookieConfig``) are its identity at the top level and one section per
component below it, a TOML table each (zbk/config/sections.py); the flat names of API.md
keep working beside them (zbk/config/loading.py). Sources, later ones winning: defaults, a
TOML file (``--config``), ``--set key=value`` overrides, then explicit command-line flags.
"""

from zbk.config.autorecovery import AutoRecoveryConfig
from zbk.config.bookie import BookieConfig
from zbk.config.client import ClientConfig
from zbk.config.loading import (
    build,
    canonical_key,
    key_names,
    load,
    load_toml,
    parse_overrides,
    with_settings,
)
from zbk.config.sections import (
    CurveConfig,
    DiskConfig,
    EntryLogConfig,
    GcConfig,
    HttpConfig,
    IndexConfig,
    JournalConfig,
    RecoveryConfig,
    Section,
)

__all__ = [
    "AutoRecoveryConfig", "BookieConfig", "ClientConfig", "CurveConfig", "DiskConfig", "EntryLogConfig", "GcConfig",
    "HttpConfig", "IndexConfig", "JournalConfig", "RecoveryConfig", "Section", "build", "canonical_key", "key_names", "load",
    "load_toml", "parse_overrides", "with_settings",
]
