"""Auto-recovery metrics (API.md "Metrics"), exported by `zbk autorecovery`."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

AUDITOR_IS_LEADER = Gauge("zbk_auditor_is_leader", "1 while this process is the elected auditor, else 0")
AUDITOR_UNDER_REPLICATED_LEDGERS = Gauge("zbk_auditor_under_replicated_ledgers",
                                         "Ledgers marked under-replicated (as last counted by the auditor)")
AUDITOR_LOST_BOOKIES = Gauge("zbk_auditor_lost_bookies",
                             "Bookies named in ledgers that are registered neither writable nor read-only")
REPLICATOR_ENTRIES_COPIED = Counter("zbk_replicator_entries_copied_total",
                                    "Entries copied to replacement bookies by re-replication")
REPLICATOR_LEDGERS_REPLICATED = Counter("zbk_replicator_ledgers_replicated_total",
                                        "Under-replicated ledgers made whole and unmarked")
REPLICATOR_LIMBO_LEDGERS_REPAIRED = Counter("zbk_replicator_limbo_ledgers_repaired_total",
                                            "Limbo ledgers repaired (BP-46 phase two)")
