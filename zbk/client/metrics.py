"""Client metrics (API.md): exported by whatever process embeds the client."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from zbk.limits import LATENCY_BUCKETS

ADD_ENTRY_SECONDS = Histogram("zbk_client_add_entry_seconds", "Time from append() to the entry being confirmed",
                              buckets=LATENCY_BUCKETS)
ENSEMBLE_CHANGES = Counter("zbk_client_ensemble_changes_total", "Ensemble changes made by writers of this process")
RECOVERIES = Counter("zbk_client_ledger_recoveries_total", "Ledgers fenced and recovered by this process")
