"""Auto-recovery metrics (API.md "Metrics"), exported by `zbk autorecovery`."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

AUTORECOVERY_ENABLED = Gauge("zbk_autorecovery_enabled",
                             "1 while the cluster's auto-recovery switch is on, 0 while an operator has it off")
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
REPLICATOR_REPAIRS = Counter("zbk_replicator_in_place_repairs_total",
                             "In-place repairs of a living bookie's copy of a ledger, by cause (limbo|unclean|check)",
                             ["why"])
AUDITOR_REPAIR_MARKS = Gauge("zbk_auditor_repair_marks",
                             "In-place repair marks pending (limbo ledgers and damaged replicas)")
AUDITOR_CHECK_DAMAGED_REPLICAS = Gauge("zbk_auditor_check_damaged_replicas",
                                       "Replicas the last periodic check found missing or damaged entries on")
AUDITOR_CHECK_PLACEMENT_VIOLATIONS = Gauge("zbk_auditor_check_placement_violations",
                                           "Fragments whose ensemble breaks the placement policy (last check)")
AUDITOR_CHECK_LEDGERS = Gauge("zbk_auditor_check_ledgers", "Ledgers examined by the last periodic check")
AUDITOR_CHECK_SECONDS = Histogram("zbk_auditor_check_seconds", "Duration of a periodic check of all ledgers",
                                  buckets=(0.1, 0.5, 1, 5, 15, 60, 300, 1800, 7200))
AUDITOR_LAST_CHECK = Gauge("zbk_auditor_last_check_timestamp_seconds",
                           "When the last periodic check finished (unix time; 0: never)")
