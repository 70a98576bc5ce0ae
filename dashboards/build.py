"""The Grafana dashboards of this directory, as code: ``python dashboards/build.py`` writes
the ``*.json`` files next to it; ``--check`` exits 1 if any of them differs from what this
script builds (tests/ops/test_dashboards.py runs it).

Every dashboard has a ``datasource`` template variable (type datasource, Prometheus) that
every panel and every query uses, so that importing one asks only for the Prometheus to
read. Job names are those of prometheus/prometheus.yml (``zbk-bookie``,
``zbk-autorecovery``) and match the alert rules (prometheus/alerts.yml).

Metrics (names fixed in the API contract): bookies export zbk_bookie_*, zbk_journal_*,
zbk_entrylog_*, zbk_gc_*; ``zbk autorecovery`` exports zbk_auditor_*, zbk_replicator_*;
any process that embeds the client exports zbk_client_*. Every process also exports the
others' metric names at their zero values (the metric modules import one another), so
bookie panels select ``job="zbk-bookie"`` and auditor panels count only the elected leader.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 39
DS: dict[str, str] = {"type": "prometheus", "uid": "${datasource}"}
BOOKIE = 'job="zbk-bookie", instance=~"$instance"'
RATE = "$__rate_interval"
GRID_WIDTH = 24


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass
class Panel:
    title: str
    description: str
    queries: list[Query]
    kind: str = "timeseries"  # or "stat"
    unit: str = "short"
    width: int = 12
    height: int = 8
    thresholds: list[tuple[float | None, str]] = field(default_factory=lambda: [(None, "green")])
    extra_defaults: dict[str, Any] = field(default_factory=dict)

    def render(self, panel_id: int, x: int, y: int) -> dict[str, Any]:
        targets = [{"datasource": DS, "editorMode": "code", "expr": q.expr, "legendFormat": q.legend or "__auto",
                    "range": True, "refId": chr(ord("A") + i)} for i, q in enumerate(self.queries)]
        defaults: dict[str, Any] = {
            "unit": self.unit,
            "color": {"mode": "thresholds" if self.kind == "stat" else "palette-classic"},
            "thresholds": {"mode": "absolute",
                           "steps": [{"color": color, "value": value} for value, color in self.thresholds]},
            **self.extra_defaults,
        }
        if self.kind == "timeseries":
            defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                                  "spanNulls": False, "axisSoftMin": 0}
            options: dict[str, Any] = {
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []},
                "tooltip": {"mode": "multi", "sort": "desc"}}
        else:
            options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                       "colorMode": "value", "graphMode": "area", "justifyMode": "auto", "orientation": "auto",
                       "textMode": "auto"}
        return {"id": panel_id, "type": self.kind, "title": self.title, "description": self.description,
                "datasource": DS, "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
                "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options, "targets": targets}


def stat(title: str, description: str, expr: str, *, unit: str = "short",
         thresholds: list[tuple[float | None, str]] | None = None) -> Panel:
    return Panel(title, description, [Query(expr)], kind="stat", unit=unit, width=4, height=4,
                 thresholds=thresholds or [(None, "green")])


def quantiles(metric: str, selector: str, by: str = "", qs: tuple[float, ...] = (0.5, 0.99, 0.999)) -> list[Query]:
    """histogram_quantile for each of ``qs`` over ``metric``_bucket, optionally per ``by``."""
    group = f"{by}, le" if by else "le"
    legend_prefix = f"{{{{{by}}}}} " if by else ""
    return [Query(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{selector}}}[{RATE}])))",
                  f"{legend_prefix}p{q * 100:g}") for q in qs]


def layout(panels: list[Panel]) -> list[dict[str, Any]]:
    """Left to right, top to bottom, on Grafana's 24-column grid."""
    out, x, y, row_height = [], 0, 0, 0
    for i, p in enumerate(panels, start=1):
        if x + p.width > GRID_WIDTH:
            x, y, row_height = 0, y + row_height, 0
        out.append(p.render(i, x, y))
        x, row_height = x + p.width, max(row_height, p.height)
    return out


def datasource_variable() -> dict[str, Any]:
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "includeAll": False, "multi": False, "options": [], "refresh": 1,
            "regex": "", "skipUrlSync": False}


def query_variable(name: str, label: str, metric_selector: str, label_name: str) -> dict[str, Any]:
    """A multi-value variable over ``label_name`` of ``metric_selector``, "All" by default."""
    definition = f"label_values({metric_selector}, {label_name})"
    return {"name": name, "label": label, "type": "query", "datasource": DS, "definition": definition,
            "query": {"query": definition, "refId": "PrometheusVariableQueryEditor-VariableQuery", "qryType": 1},
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "hide": 0, "includeAll": True,
            "multi": True, "options": [], "refresh": 2, "regex": "", "skipUrlSync": False, "sort": 1}


def dashboard(uid: str, title: str, description: str, panels: list[Panel],
              variables: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [{"asDropdown": True, "icon": "external link", "includeVars": False, "keepTime": True,
                   "tags": ["zbk"], "targetBlank": False, "title": "zbk dashboards", "type": "dashboards"}],
        "panels": layout(panels),
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["zbk"],
        "templating": {"list": [datasource_variable(), *variables]},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


BOOKIE_INSTANCE = query_variable("instance", "Bookie", 'zbk_bookie_writable{job="zbk-bookie"}', "instance")
LEADER_ONLY = "and on (job, instance) (zbk_auditor_is_leader == 1)"


def bookie_overview() -> dict[str, Any]:
    panels = [
        stat("Bookies up", "Bookies Prometheus can scrape (job zbk-bookie).", f"sum(up{{{BOOKIE}}})"),
        stat("Writable", "Bookies that accept new entries.", f"sum(zbk_bookie_writable{{{BOOKIE}}})"),
        stat("Read-only", "Bookies that serve reads only (disk full or set by an operator).",
             f"sum(1 - zbk_bookie_writable{{{BOOKIE}}})", thresholds=[(None, "green"), (1, "orange")]),
        stat("Ledger replicas", "Ledgers held, summed over the bookies (a ledger counts once per bookie holding it).",
             f"sum(zbk_bookie_ledgers{{{BOOKIE}}})"),
        stat("Limbo ledgers", "Ledgers in limbo after an unclean shutdown (BP-46), awaiting repair.",
             f"sum(zbk_bookie_limbo_ledgers{{{BOOKIE}}})", thresholds=[(None, "green"), (1, "orange")]),
        stat("Fullest disk", "Usage of the fullest ledger or journal disk of any bookie; read-only at 95%.",
             f"max(zbk_bookie_disk_usage_ratio{{{BOOKIE}}})", unit="percentunit",
             thresholds=[(None, "green"), (0.9, "orange"), (0.95, "red")]),
        Panel("Requests by operation", "Requests answered per second, by operation (one add request may carry "
              "many entries).",
              [Query(f"sum by (op) (rate(zbk_bookie_requests_total{{{BOOKIE}}}[{RATE}]))", "{{op}}")], unit="reqps"),
        Panel("Responses other than EOK", "Answers with an error or negative status, per second. ENOENTRY and "
              "EFENCED are part of normal ledger recovery; EIO, EREADONLY, ETOOMANYREQUESTS are not.",
              [Query(f'sum by (op, status) (rate(zbk_bookie_requests_total{{{BOOKIE}, status!="EOK"}}[{RATE}]))',
                     "{{op}} {{status}}")], unit="reqps"),
        Panel("Add request latency", "Receiving an add request to replying, after the journal fsync "
              "(successful adds).", quantiles("zbk_bookie_add_entry_seconds", f'{BOOKIE}, status="EOK"'), unit="s"),
        Panel("Read request latency", "Receiving a read request to replying (successful reads).",
              quantiles("zbk_bookie_read_entry_seconds", f'{BOOKIE}, status="EOK"'), unit="s"),
        Panel("Entries added per bookie", "Entries acknowledged per second, by bookie.",
              [Query(f"sum by (instance) (rate(zbk_bookie_entries_added_total{{{BOOKIE}}}[{RATE}]))",
                     "{{instance}}")], unit="ops"),
        Panel("Add latency p99 per bookie", "99th percentile add request latency, by bookie: one slow bookie "
              "slows the writers whose ensembles include it.",
              quantiles("zbk_bookie_add_entry_seconds", f'{BOOKIE}, status="EOK"', by="instance", qs=(0.99,)),
              unit="s"),
        Panel("Writable (1) or read-only (0)", "Each bookie's state.",
              [Query(f"zbk_bookie_writable{{{BOOKIE}}}", "{{instance}}")],
              extra_defaults={"min": 0, "max": 1}),
        Panel("Disk usage", "Fullest ledger or journal disk, by bookie. Warning at 90%, read-only at 95%.",
              [Query(f"zbk_bookie_disk_usage_ratio{{{BOOKIE}}}", "{{instance}}")], unit="percentunit",
              thresholds=[(None, "green"), (0.9, "orange"), (0.95, "red")],
              extra_defaults={"min": 0, "max": 1}),
        Panel("Ledgers per bookie", "Ledgers each bookie holds, and those in limbo.",
              [Query(f"zbk_bookie_ledgers{{{BOOKIE}}}", "{{instance}}"),
               Query(f"zbk_bookie_limbo_ledgers{{{BOOKIE}}}", "{{instance}} limbo")], width=24),
    ]
    return dashboard("zbk-bookie-overview", "zbk / Bookie overview",
                     "Bookies: availability, requests, latency, space.", panels, [BOOKIE_INSTANCE])


def journal_storage() -> dict[str, Any]:
    panels = [
        Panel("Journal fsync latency", "One group commit: write + fsync of everything queued. Every add waits "
              "for one; the ZbkJournalFsyncLatencyHigh alert fires when p99 stays over 100 ms.",
              quantiles("zbk_journal_fsync_seconds", BOOKIE), unit="s"),
        Panel("Journal fsync p99 per bookie", "99th percentile group commit time, by bookie.",
              quantiles("zbk_journal_fsync_seconds", BOOKIE, by="instance", qs=(0.99,)), unit="s"),
        Panel("Journal fsyncs", "Group commits per second, by bookie.",
              [Query(f"sum by (instance) (rate(zbk_journal_fsync_seconds_count{{{BOOKIE}}}[{RATE}]))",
                     "{{instance}}")], unit="ops"),
        Panel("Entries per group commit", "How many entries one fsync makes durable: the mean, and the 99th "
              "percentile. Grows with load (journal_max_group_wait_ms, journal_buffered_writes_threshold_bytes).",
              [Query(f"sum by (instance) (rate(zbk_journal_group_commit_entries_sum{{{BOOKIE}}}[{RATE}])) / "
                     f"sum by (instance) (rate(zbk_journal_group_commit_entries_count{{{BOOKIE}}}[{RATE}]))",
                     "{{instance}} mean"),
               *quantiles("zbk_journal_group_commit_entries", BOOKIE, by="instance", qs=(0.99,))]),
        Panel("Journal queue depth", "Batches waiting for the next journal commit, per journal directory; a "
              "queue that keeps growing means the disk cannot keep up.",
              [Query(f"zbk_journal_queue_depth{{{BOOKIE}}}", "{{instance}} journal {{journal}}")]),
        Panel("Entry log writes", "Bytes appended to entry logs per second (entries, and compaction copies).",
              [Query(f"sum by (instance) (rate(zbk_entrylog_bytes_written_total{{{BOOKIE}}}[{RATE}]))",
                     "{{instance}}")], unit="Bps"),
        Panel("Checkpoints per minute", "Checkpoints: entry logs and index flushed, journal mark persisted "
              "(every flush_interval_ms).",
              [Query(f"60 * sum by (instance) (rate(zbk_bookie_checkpoints_total{{{BOOKIE}}}[{RATE}]))",
                     "{{instance}}")]),
        Panel("Disk usage", "Fullest ledger or journal disk, by bookie. Warning at 90%, read-only at 95%.",
              [Query(f"zbk_bookie_disk_usage_ratio{{{BOOKIE}}}", "{{instance}}")], unit="percentunit",
              thresholds=[(None, "green"), (0.9, "orange"), (0.95, "red")], extra_defaults={"min": 0, "max": 1}),
        Panel("Space reclaimed by garbage collection", "Bytes of entry logs deleted per second (deleted "
              "ledgers' data, and the old copies of compacted logs).",
              [Query(f"sum by (instance) (rate(zbk_gc_reclaimed_bytes_total{{{BOOKIE}}}[{RATE}]))",
                     "{{instance}}")], unit="Bps"),
        Panel("Compactions", "Entry logs compacted, by kind: minor (logs under minor_compaction_threshold "
              "live) and major (under major_compaction_threshold).",
              [Query(f"sum by (instance, kind) (increase(zbk_gc_compactions_total{{{BOOKIE}}}[{RATE}]))",
                     "{{instance}} {{kind}}")]),
    ]
    return dashboard("zbk-journal-storage", "zbk / Journal and storage",
                     "Bookie internals: journal group commit and fsync, entry logs, checkpoints, garbage collection.",
                     panels, [BOOKIE_INSTANCE])


def autorecovery() -> dict[str, Any]:
    panels = [
        stat("Auditors elected", "Auto-recovery processes leading the auditor election: 1 is right, 0 means "
             "lost bookies go unnoticed (ZbkNoAuditor).", "sum(zbk_auditor_is_leader)",
             thresholds=[(None, "red"), (1, "green"), (2, "red")]),
        stat("Auto-recovery processes up", "zbk autorecovery processes Prometheus can scrape.",
             'sum(up{job="zbk-autorecovery"})', thresholds=[(None, "red"), (1, "orange"), (2, "green")]),
        stat("Under-replicated ledgers", "Ledgers marked under-replicated, as the elected auditor counts them.",
             f"max(zbk_auditor_under_replicated_ledgers {LEADER_ONLY})",
             thresholds=[(None, "green"), (1, "orange")]),
        stat("Lost bookies", "Bookies that ledgers name but that are registered neither writable nor read-only "
             "(pending their lost_bookie_recovery_delay, or audited).",
             f"max(zbk_auditor_lost_bookies {LEADER_ONLY})", thresholds=[(None, "green"), (1, "red")]),
        stat("Bookies up", "Bookies Prometheus can scrape.", 'sum(up{job="zbk-bookie"})'),
        stat("Limbo ledgers", "Ledgers in limbo on all bookies (BP-46), repaired by the replicator.",
             'sum(zbk_bookie_limbo_ledgers{job="zbk-bookie"})', thresholds=[(None, "green"), (1, "orange")]),
        Panel("Auditor leadership", "1 for the process that leads the auditor election.",
              [Query("zbk_auditor_is_leader", "{{instance}}")], extra_defaults={"min": 0, "max": 1}),
        Panel("Under-replicated ledgers and lost bookies", "As the elected auditor counts them.",
              [Query(f"max(zbk_auditor_under_replicated_ledgers {LEADER_ONLY})", "under-replicated ledgers"),
               Query(f"max(zbk_auditor_lost_bookies {LEADER_ONLY})", "lost bookies")]),
        Panel("Entries copied", "Entries re-replicated to replacement bookies per second, by process.",
              [Query(f"sum by (instance) (rate(zbk_replicator_entries_copied_total[{RATE}]))", "{{instance}}")],
              unit="ops"),
        Panel("Ledgers repaired", "Under-replicated ledgers made whole, and limbo ledgers repaired, per interval.",
              [Query(f"sum by (instance) (increase(zbk_replicator_ledgers_replicated_total[{RATE}]))",
                     "{{instance}} re-replicated"),
               Query(f"sum by (instance) (increase(zbk_replicator_limbo_ledgers_repaired_total[{RATE}]))",
                     "{{instance}} limbo repaired")]),
        Panel("Periodic check", "What the auditor's last periodic check found (replica lists, read probes of "
              "each fragment's first and last entries, placement), and in-place repairs pending (limbo ledgers "
              "after BP-46 phase one, damaged replicas).",
              [Query(f"max(zbk_auditor_check_damaged_replicas {LEADER_ONLY})", "damaged replicas"),
               Query(f"max(zbk_auditor_check_placement_violations {LEADER_ONLY})", "placement violations"),
               Query(f"max(zbk_auditor_repair_marks {LEADER_ONLY})", "repairs pending")]),
        Panel("Ledgers checked", "Ledgers the last periodic check examined, and seconds since a check finished "
              "(0 until the first one).",
              [Query(f"max(zbk_auditor_check_ledgers {LEADER_ONLY})", "ledgers checked"),
               Query(f"max(time() - zbk_auditor_last_check_timestamp_seconds > 0 < 1e9 {LEADER_ONLY}) or "
                     f"max(zbk_auditor_last_check_timestamp_seconds {LEADER_ONLY})", "seconds since last check")]),
        Panel("Bookies up and writable", "Bookies scraped, and those accepting writes: re-replication needs a "
              "writable bookie outside each fragment's ensemble.",
              [Query('sum(up{job="zbk-bookie"})', "up"), Query('sum(zbk_bookie_writable{job="zbk-bookie"})',
                                                                "writable")], width=24),
    ]
    return dashboard("zbk-autorecovery", "zbk / Auto-recovery",
                     "The auditor (lost bookies, under-replicated ledgers) and the replicator workers.", panels, [])


def client() -> dict[str, Any]:
    sel = 'job=~"$job"'
    panels = [
        Panel("Add latency", "append() to the entry being confirmed (ack quorum reached, in entry order).",
              quantiles("zbk_client_add_entry_seconds", sel), unit="s"),
        Panel("Mean add latency", "Mean append() latency, by process.",
              [Query(f"sum by (job, instance) (rate(zbk_client_add_entry_seconds_sum{{{sel}}}[{RATE}])) / "
                     f"sum by (job, instance) (rate(zbk_client_add_entry_seconds_count{{{sel}}}[{RATE}]))",
                     "{{job}} {{instance}}")], unit="s"),
        Panel("Entries appended", "Entries confirmed per second, by process.",
              [Query(f"sum by (job, instance) (rate(zbk_client_add_entry_seconds_count{{{sel}}}[{RATE}]))",
                     "{{job}} {{instance}}")], unit="ops"),
        Panel("Ensemble changes", "Writers replacing a failed or slow bookie in their ensemble, per interval.",
              [Query(f"sum by (job, instance) (increase(zbk_client_ensemble_changes_total{{{sel}}}[{RATE}]))",
                     "{{job}} {{instance}}")]),
        Panel("Ledger recoveries", "Ledgers fenced and recovered (open with recovery), per interval.",
              [Query(f"sum by (job, instance) (increase(zbk_client_ledger_recoveries_total{{{sel}}}[{RATE}]))",
                     "{{job}} {{instance}}")]),
        Panel("Add latency p99 per process", "99th percentile append() latency, by process.",
              quantiles("zbk_client_add_entry_seconds", sel, by="instance", qs=(0.99,)), unit="s"),
    ]
    job = query_variable("job", "Job", "zbk_client_add_entry_seconds_count", "job")
    return dashboard("zbk-client", "zbk / Client",
                     "Processes that embed the zbk client: applications (job zbk-client in prometheus.yml) and "
                     "auto-recovery's replicator.", panels, [job])


DASHBOARDS = {
    "bookie-overview.json": bookie_overview,
    "journal-storage.json": journal_storage,
    "autorecovery.json": autorecovery,
    "client.json": client,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 if a file is out of date")
    args = ap.parse_args(argv)
    here = Path(__file__).resolve().parent
    stale = []
    for name, build in DASHBOARDS.items():
        path, text = here / name, render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date (run python dashboards/build.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
