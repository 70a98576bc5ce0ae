"""The shipped monitoring: Grafana dashboards (dashboards/), Prometheus alert rules and their
promtool unit tests, and the Prometheus configuration (prometheus/).

Static checks: promtool accepts the rules and the configuration and passes the rule unit
tests; every alert has a firing and a quiet unit test case; the dashboards are what
dashboards/build.py builds, importable (schema 39, one ``datasource`` variable used by
every panel and query) and cover every metric of the API contract.

Live check: a real `zbk sandbox` (three bookies and auto-recovery, as real processes), a
workload that embeds the client and serves its metrics like an application would, and a
real Prometheus running the shipped prometheus.yml (only the sandbox's actual ports and a
1 s scrape/evaluation interval substituted) with the shipped alerts.yml. Then every PromQL
expression of every dashboard panel and every alert rule is evaluated through Prometheus'
HTTP API (/api/v1/query) and must return data — see :func:`check_alert` and
:func:`check_panel_expr` for what "data" means for each. Every process is stopped by PID,
also when the test fails; everything listens on 127.0.0.1.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.procs import free_port, start_process, stop_pid, stop_process, tail
from helpers.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
PROMETHEUS_DIR = ROOT / "prometheus"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

# The metric names of the API contract (API.md "Metrics"): each must be on some dashboard.
API_METRICS = [
    "zbk_bookie_add_entry_seconds", "zbk_bookie_read_entry_seconds", "zbk_bookie_requests_total",
    "zbk_journal_fsync_seconds", "zbk_journal_group_commit_entries", "zbk_journal_queue_depth",
    "zbk_entrylog_bytes_written_total", "zbk_bookie_ledgers", "zbk_bookie_limbo_ledgers", "zbk_bookie_writable",
    "zbk_bookie_disk_usage_ratio", "zbk_gc_reclaimed_bytes_total", "zbk_gc_compactions_total",
    "zbk_auditor_is_leader", "zbk_auditor_under_replicated_ledgers", "zbk_auditor_lost_bookies",
    "zbk_replicator_entries_copied_total", "zbk_replicator_ledgers_replicated_total",
    "zbk_replicator_limbo_ledgers_repaired_total", "zbk_client_add_entry_seconds", "zbk_client_ensemble_changes_total",
]
# The default `zbk sandbox` targets the shipped prometheus.yml scrapes (zbk/cli/sandboxlayout.py:
# base port 3181; bookie HTTP at base + 1000 + i, auto-recovery HTTP at base + 2000).
SHIPPED_BOOKIE_TARGETS = ["127.0.0.1:4181", "127.0.0.1:4182", "127.0.0.1:4183"]
SHIPPED_AUTORECOVERY_TARGET = "127.0.0.1:5181"

# Grafana's built-in interval variables, as Grafana computes them for a Prometheus data
# source whose scrape interval is Prometheus' default 15 s (the shipped prometheus.yml):
# $__interval = the step for the time range and panel width, at least the scrape interval;
# $__rate_interval = max($__interval + scrape interval, 4 * scrape interval) = 1m for any
# range up to several hours. $__range: the dashboards' default range is one hour, but this
# cluster is minutes old; 5m covers all of its samples.
GRAFANA_BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "5m", "__range_s": "300",
                    "__interval_ms": "15000"}

# A healthy sandbox must not trip these (the look-alike bookie gauges that every client
# process exports at zero, for example, must not look like a read-only bookie). The two
# others depend on this machine (its disk usage, its fsync latency under the shared load).
QUIET_WHEN_HEALTHY = {"ZbkBookieDown", "ZbkBookieReadOnly", "ZbkUnderReplicatedLedgersTooLong", "ZbkLimboLedgers",
                      "ZbkNoAuditor"}

pytestmark = pytest.mark.timeout(300)


# -- a small PromQL lexer: enough to find vector selectors and a top-level comparison -------
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<duration>\d+(?:ms|[smhdwy])(?:\d+(?:ms|[smhdwy]))*\b)
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=(){},@])
""", re.VERBOSE)
_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
                 "topk", "quantile", "limitk", "limit_ratio"}
_LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"} | _AGGREGATIONS | _LABEL_LIST_KEYWORDS
_COMPARISONS = {"==", "!=", ">=", "<=", ">", "<"}


@dataclass(frozen=True)
class Token:
    kind: str
    text: str
    start: int
    end: int


def tokenize(expr: str) -> list[Token]:
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise ValueError(f"cannot tokenize {expr!r} at {pos}: {expr[pos:pos + 20]!r}")
        if m.lastgroup != "ws":
            out.append(Token(str(m.lastgroup), m.group(), m.start(), m.end()))
        pos = m.end()
    return out


def _closing(tokens: list[Token], i: int, open_: str, close: str) -> int:
    """Index of the token that closes the bracket at ``tokens[i]``."""
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j].text == open_:
            depth += 1
        elif tokens[j].text == close:
            depth -= 1
            if depth == 0:
                return j
    raise ValueError(f"unbalanced {open_}")


def vector_selectors(expr: str) -> list[str]:
    """The vector selectors of ``expr`` (``name`` or ``name{matchers}``), in order."""
    tokens, out, i = tokenize(expr), [], 0
    while i < len(tokens):
        t = tokens[i]
        nxt = tokens[i + 1].text if i + 1 < len(tokens) else ""
        if t.text == "{":  # a selector without a name
            j = _closing(tokens, i, "{", "}")
            out.append(expr[t.start:tokens[j].end])
            i = j + 1
        elif t.kind == "ident" and t.text in _LABEL_LIST_KEYWORDS and nxt == "(":
            i = _closing(tokens, i + 1, "(", ")") + 1  # a list of label names, not metrics
        elif t.kind == "ident" and t.text not in _KEYWORDS and nxt != "(":
            if nxt == "{":
                j = _closing(tokens, i + 1, "{", "}")
                out.append(expr[t.start:tokens[j].end])
                i = j + 1
            else:
                out.append(t.text)
                i += 1
        else:
            i += 1
    return out


def split_comparison(expr: str) -> tuple[str, str, str] | None:
    """``(lhs, op, rhs)`` if ``expr`` is a comparison at its top level (outside every
    bracket), else None. A ``bool`` modifier stays with the operator."""
    tokens, depth, found = tokenize(expr), 0, []
    for i, t in enumerate(tokens):
        if t.text in "({[":
            depth += 1
        elif t.text in ")}]":
            depth -= 1
        elif depth == 0 and t.kind == "op" and t.text in _COMPARISONS:
            found.append(i)
    if len(found) != 1:
        return None
    i = found[0]
    rhs_start = i + 1
    op = tokens[i].text
    if rhs_start < len(tokens) and tokens[rhs_start].text == "bool":
        op, rhs_start = f"{op} bool", rhs_start + 1
    return expr[:tokens[i].start].strip(), op, expr[tokens[rhs_start].start:].strip()


def test_promql_helpers() -> None:
    q = ('histogram_quantile(0.99, sum by (job, instance, le) (rate(zbk_journal_fsync_seconds_bucket'
         '{job="zbk-bookie", le!="0.1"}[5m]))) > 0.1')
    assert vector_selectors(q) == ['zbk_journal_fsync_seconds_bucket{job="zbk-bookie", le!="0.1"}']
    assert split_comparison(q) == (q[:q.rindex(" > ")], ">", "0.1")
    q = "max(zbk_auditor_under_replicated_ledgers and on (job, instance) (zbk_auditor_is_leader == 1)) > 0"
    assert vector_selectors(q) == ["zbk_auditor_under_replicated_ledgers", "zbk_auditor_is_leader"]
    assert split_comparison(q) == (q[:-4], ">", "0")
    q = "(sum(zbk_auditor_is_leader) or vector(0)) < 1"
    assert vector_selectors(q) == ["zbk_auditor_is_leader"]
    assert split_comparison(q) == ("(sum(zbk_auditor_is_leader) or vector(0))", "<", "1")
    assert split_comparison('up{job!="x"} == bool 0') == ('up{job!="x"}', "== bool", "0")
    assert split_comparison("sum(rate(x[1m])) by (le)") is None
    assert split_comparison("a > 1 and b < 2") is None  # two comparisons: not "quantity vs threshold"
    assert vector_selectors("sum(x) without (le) / on (i) group_left (j) y offset 5m") == ["x", "y"]
    assert vector_selectors('{__name__="up"} - 1') == ['{__name__="up"}']


# -- static checks ----------------------------------------------------------------------------
def run(argv: list[str], timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)


def alert_names_in_rules() -> list[str]:
    return re.findall(r"^\s*- alert:\s*(\w+)\s*$", (PROMETHEUS_DIR / "alerts.yml").read_text(), re.M)


def test_promtool_accepts_the_rules_and_their_unit_tests_pass() -> None:
    names = alert_names_in_rules()
    assert len(names) == len(set(names)) == 7, names
    r = run([PROMTOOL, "check", "rules", "prometheus/alerts.yml"])
    assert r.returncode == 0 and f"SUCCESS: {len(names)} rules found" in r.stdout, r.stdout + r.stderr
    r = run([PROMTOOL, "test", "rules", "prometheus/alerts_test.yml"])
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


def test_every_alert_has_a_firing_and_a_quiet_unit_test_case() -> None:
    text = (PROMETHEUS_DIR / "alerts_test.yml").read_text()
    cases = re.findall(r"alertname:\s*(\w+)\s*\n\s*exp_alerts:[ \t]*(\[\])?", text)
    assert text.count("alertname:") == len(cases), "keep `exp_alerts` right after `alertname` (see the file's header)"
    firing = {name for name, empty in cases if not empty}
    quiet = {name for name, empty in cases if empty}
    names = set(alert_names_in_rules())
    assert names - firing == set(), "alerts without a firing test case"
    assert names - quiet == set(), "alerts without a not-firing test case"
    assert (firing | quiet) <= names, "test cases for alerts that do not exist"


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_alert_runbooks_point_to_sections_of_the_operations_guide() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    anchors = {github_anchor(h) for h in re.findall(r"^#+\s+(.+)$", doc, re.M)}
    runbooks = re.findall(r'^\s*runbook:\s*"docs/operations\.md#([\w-]+)"\s*$',
                          (PROMETHEUS_DIR / "alerts.yml").read_text(), re.M)
    assert len(runbooks) == len(alert_names_in_rules()), "one runbook annotation per alert"
    assert [r for r in runbooks if r not in anchors] == []
    assert github_anchor("Configuration (`--set` keys, `AutoRecoveryConfig`)") == \
        "configuration---set-keys-autorecoveryconfig"


def test_promtool_accepts_the_shipped_prometheus_config() -> None:
    r = run([PROMTOOL, "check", "config", "prometheus/prometheus.yml"])
    assert r.returncode == 0 and "SUCCESS: 1 rule files found" in r.stdout, r.stdout + r.stderr


def test_dashboards_are_what_build_py_builds() -> None:
    r = run([sys.executable, "dashboards/build.py", "--check"])
    assert r.returncode == 0, r.stderr


def load_dashboards() -> dict[str, dict[str, Any]]:
    found = {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}
    assert set(found) == {"bookie-overview.json", "journal-storage.json", "autorecovery.json", "client.json"}
    return found


def panel_targets(dash: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


def query_variables(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in dash["templating"]["list"] if v["type"] == "query"]


def test_dashboards_are_importable_and_use_the_datasource_variable() -> None:
    uids, used = set(), ""
    for name, dash in load_dashboards().items():
        assert dash["schemaVersion"] == 39 and dash["id"] is None and dash["title"], name
        assert dash["uid"] not in uids, f"{name}: duplicate uid"
        uids.add(dash["uid"])
        variables = dash["templating"]["list"]
        ds = [v for v in variables if v["name"] == "datasource"]
        assert ds and ds[0]["type"] == "datasource" and ds[0]["query"] == "prometheus", name
        want = {"type": "prometheus", "uid": "${datasource}"}
        for v in query_variables(dash):
            assert v["datasource"] == want, f"{name}: variable {v['name']}"
        panel_ids = [p["id"] for p in dash["panels"]]
        assert len(panel_ids) == len(set(panel_ids)), f"{name}: duplicate panel ids"
        cells: set[tuple[int, int]] = set()
        for panel in dash["panels"]:
            where = f"{name}: panel {panel['title']!r}"
            assert panel["datasource"] == want, where
            assert panel["targets"], where
            ref_ids = [t["refId"] for t in panel["targets"]]
            assert len(ref_ids) == len(set(ref_ids)), where
            g = panel["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, where
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not mine & cells, f"{where} overlaps another panel"
            cells |= mine
            for target in panel["targets"]:
                assert target["datasource"] == want and target["expr"].strip(), where
                used += target["expr"] + "\n"
    missing = [m for m in API_METRICS if not re.search(rf"\b{m}(_bucket|_sum|_count)?\b", used)]
    assert missing == [], "API metrics on no dashboard"


# -- Grafana's variable interpolation -------------------------------------------------------
def regex_escape_for_promql(value: str) -> str:
    """Grafana's prometheusSpecialRegexEscape: a value of a multi-value variable inside a
    PromQL string used as a regex (backslashes doubled for the string literal)."""
    value = value.replace("\\", "\\\\\\\\")
    return re.sub(r"[$^*+?.()|\\\[\]{}]", lambda m: "\\\\" + m.group(), value)


def interpolate(expr: str, values: dict[str, list[str]]) -> str:
    """Substitute the dashboard's variables as Grafana does with "All" selected (a
    multi-value variable becomes ``(v1|v2|...)`` of escaped values), and the built-ins."""
    subst = {**GRAFANA_BUILTINS}
    for name, vals in values.items():
        escaped = [regex_escape_for_promql(v) for v in vals]
        subst[name] = escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"
    for name in sorted(subst, key=len, reverse=True):  # $__range_s before $__range
        expr = expr.replace("${" + name + "}", subst[name]).replace("$" + name, subst[name])
    assert "$" not in expr, f"unsubstituted variable in {expr!r}"
    return expr


# -- the live cluster -----------------------------------------------------------------------
# An application embedding the client, serving its metrics the way docs/operations.md
# describes: writes ledgers, leaves one open to be recovered (as after a writer crash),
# reads back, deletes the churn (so that garbage collection and compaction have work).
WORKLOAD = r'''
import signal, sys, threading
import zbk
from zbk.metrics.http import AdminHttpServer

uri, port, progress = sys.argv[1], int(sys.argv[2]), sys.argv[3]
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
http = AdminHttpServer("127.0.0.1", port)
http.start()
PW, rounds = b"ops", 0
with zbk.BookKeeper(uri) as bk:
    while not stop.is_set():
        kept = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PW)
        churn = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=PW)
        futures = []
        for i in range(300):
            futures.append(churn.append_async(b"c" * 4096))
            if i % 10 == 0:
                futures.append(kept.append_async(b"k" * 4096))
        for f in futures:
            f.result(60)
        churn.close()
        rh = bk.open_ledger(kept.ledger_id, password=PW)  # `kept` is still open: fence and recover
        assert rh.is_closed and sum(1 for _ in rh.read(0, rh.last_add_confirmed)) == 30
        bk.delete_ledger(churn.ledger_id)
        rounds += 1
        with open(progress, "w") as f:
            f.write(str(rounds))
        stop.wait(1.0)
http.stop()
'''
# Small entry logs and frequent garbage collection, so that deleting the churn ledgers
# leads to compactions (zbk_gc_compactions_total exists only once one happened).
SANDBOX_SETTINGS = ["gc_wait_time_ms=1000", "minor_compaction_interval_s=1", "entry_log_size_limit_mb=1"]


def pids_naming(path: Path) -> list[int]:
    """Live processes whose command line names ``path`` (the sandbox's children name its
    data dir or its metadata file)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().decode(errors="replace")
        except OSError:
            continue
        if str(path) in cmdline:
            found.append(int(entry))
    return found


class Processes:
    """Everything the live test starts, stopped by PID in reverse order, always."""

    def __init__(self, cluster_dir: Path) -> None:
        self.cluster_dir = cluster_dir
        self.procs: list[tuple[subprocess.Popen[bytes], float]] = []

    def start(self, argv: list[str], log: Path, *, stop_timeout_s: float = 10.0) -> subprocess.Popen[bytes]:
        proc = start_process(argv, log)
        self.procs.append((proc, stop_timeout_s))
        return proc

    def stop_all(self) -> None:
        for proc, timeout_s in reversed(self.procs):
            stop_process(proc, timeout_s=timeout_s)
        for pid in pids_naming(self.cluster_dir):  # children of a sandbox that had to be killed
            stop_pid(pid)


@dataclass
class Cluster:
    base_port: int
    metadata: str
    prometheus: str  # http://127.0.0.1:<port>
    logs: list[Path]

    def diagnostics(self) -> str:
        return "\n".join(f"--- {p}:\n{tail(p, 15)}" for p in self.logs)


def sandbox_events(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text(errors="replace").splitlines() if line.startswith("{")]


def prometheus_config(shipped: str, base_port: int) -> str:
    """The shipped prometheus.yml with the sandbox's actual ports and 1 s intervals."""
    ports = {old: f"127.0.0.1:{base_port + 1000 + i}" for i, old in enumerate(SHIPPED_BOOKIE_TARGETS)}
    ports[SHIPPED_AUTORECOVERY_TARGET] = f"127.0.0.1:{base_port + 2000}"
    for old in ports:
        assert shipped.count(f'"{old}"') == 1, f"the shipped prometheus.yml no longer scrapes {old}"
    config = re.sub(r'"(127\.0\.0\.1:\d+)"', lambda m: f'"{ports.get(m.group(1), m.group(1))}"', shipped)
    for key in ("scrape_interval", "evaluation_interval"):
        config, n = re.subn(rf"^(\s*{key}:\s*)\S+\s*$", r"\g<1>1s", config, flags=re.M)
        assert n == 1, f"{key} in the shipped prometheus.yml"
    return config


def http_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def prom_query(base: str, expr: str) -> dict[str, Any]:
    """/api/v1/query at the current time; the data object (raises on an API error)."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    try:
        body = http_json(url)
    except urllib.error.HTTPError as e:  # 400: a PromQL error; the body says which
        raise AssertionError(f"{expr!r}: {e.read().decode(errors='replace')}") from None
    assert body["status"] == "success", body
    return dict(body["data"])


def finite_values(data: dict[str, Any]) -> list[float]:
    if data["resultType"] == "scalar":
        samples = [data["result"][1]]
    else:
        assert data["resultType"] == "vector", data["resultType"]
        samples = [item["value"][1] for item in data["result"]]
    return [v for v in map(float, samples) if math.isfinite(v)]


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Cluster]:
    for binary in (PROMETHEUS, PROMTOOL):
        assert os.access(binary, os.X_OK), f"{binary} missing: scripts/setup.sh installs the prometheus package"
    cluster_dir = tmp_path / "cluster"
    procs = Processes(cluster_dir)
    sandbox_log, workload_log, prom_log = tmp_path / "sandbox.log", tmp_path / "workload.log", tmp_path / "prom.log"
    try:
        settings = [arg for kv in SANDBOX_SETTINGS for arg in ("--set", kv)]
        sandbox = procs.start([sys.executable, "-m", "zbk.cli.main", "sandbox", "--data-dir", str(cluster_dir),
                               "--base-port", "0", "--json", "--no-status", *settings], sandbox_log,
                              stop_timeout_s=70.0)

        def event(kind: str) -> dict[str, Any]:
            assert sandbox.poll() is None, f"sandbox exited:\n{tail(sandbox_log)}"
            return next((e for e in sandbox_events(sandbox_log) if e["event"] == kind), {})

        cluster_event = wait_until(lambda: event("cluster"), timeout_s=30, interval_s=0.1, message="sandbox up")
        wait_until(lambda: event("ready"), timeout_s=60, interval_s=0.2, message="sandbox ready")
        base, uri = int(cluster_event["base_port"]), str(cluster_event["metadata"])

        client_port = free_port()
        procs.start([sys.executable, "-c", WORKLOAD, uri, str(client_port), str(tmp_path / "rounds")], workload_log)

        prom_dir = tmp_path / "prometheus"
        (prom_dir / "clients").mkdir(parents=True)
        shipped = (PROMETHEUS_DIR / "prometheus.yml").read_text()
        (prom_dir / "prometheus.yml").write_text(prometheus_config(shipped, base))
        shutil.copy(PROMETHEUS_DIR / "alerts.yml", prom_dir / "alerts.yml")
        (prom_dir / "clients" / "workload.json").write_text(
            json.dumps([{"targets": [f"127.0.0.1:{client_port}"], "labels": {"app": "workload"}}]))
        prom_port = free_port()
        prom = procs.start([PROMETHEUS, f"--config.file={prom_dir / 'prometheus.yml'}",
                            f"--storage.tsdb.path={prom_dir / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                           prom_log)
        prom_url = f"http://127.0.0.1:{prom_port}"

        def prom_ready() -> bool:
            assert prom.poll() is None, f"prometheus exited:\n{tail(prom_log)}"
            return ready(f"{prom_url}/-/ready")

        wait_until(prom_ready, timeout_s=30, interval_s=0.2, message="prometheus ready")
        yield Cluster(base, uri, prom_url, [sandbox_log, workload_log, prom_log,
                                            *sorted((cluster_dir / "logs").glob("*.log"))])
    finally:
        procs.stop_all()
    assert pids_naming(cluster_dir) == [], "a process of the sandbox outlived the test"


def targets_up(cluster: Cluster) -> dict[str, int]:
    active = http_json(f"{cluster.prometheus}/api/v1/targets?state=active")["data"]["activeTargets"]
    up: dict[str, int] = {}
    for t in active:
        if t["health"] == "up":
            up[t["labels"]["job"]] = up.get(t["labels"]["job"], 0) + 1
    return up


def variable_values(cluster: Cluster, var: dict[str, Any]) -> list[str]:
    """A query variable's values, fetched as Grafana does for label_values(selector, label)."""
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
    assert m, f"variable {var['name']}: only label_values(selector, label) is interpolated here"
    selector, label = m.groups()
    url = f"{cluster.prometheus}/api/v1/label/{label}/values?{urllib.parse.urlencode({'match[]': selector})}"
    return sorted(http_json(url)["data"])


def check_panel_expr(cluster: Cluster, expr: str) -> list[str]:
    """A panel query returns data: at least one series with a finite value (a quantile over
    a window without observations would be NaN: the panel would draw nothing); and so does
    each vector selector in it on its own (an `or vector(0)` must not hide a metric that
    does not exist)."""
    problems = []
    if not finite_values(prom_query(cluster.prometheus, expr)):
        problems.append(f"no finite value: {expr}")
    for sel in vector_selectors(expr):
        if not prom_query(cluster.prometheus, sel)["result"]:
            problems.append(f"selector {sel} has no series (in {expr})")
    return problems


def check_alert(cluster: Cluster, rule: dict[str, Any]) -> list[str]:
    """An alert is a condition: `<watched quantity> <comparison> <threshold>`, false on a
    healthy cluster, so evaluating it must return nothing and proves nothing about the
    metrics. What must hold: the whole expression evaluates without error (Prometheus
    reports the rule healthy); the watched quantity — the expression without its top-level
    comparison — returns a finite value for some series; and every vector selector in it
    returns series (so that no `or vector(0)` stands in for a metric nobody exports)."""
    name, expr = rule["name"], rule["query"]
    problems = []
    if rule["health"] != "ok":
        problems.append(f"{name}: health {rule['health']} {rule.get('lastError', '')}")
    prom_query(cluster.prometheus, expr)  # valid PromQL; its result may be empty
    split = split_comparison(expr)
    if split is None:
        return [*problems, f"{name}: not `quantity <comparison> threshold`: {expr}"]
    lhs, _op, rhs = split
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?", rhs):
        problems.append(f"{name}: the threshold {rhs!r} is not a number")
    if not finite_values(prom_query(cluster.prometheus, lhs)):
        problems.append(f"{name}: the watched quantity returns no finite value: {lhs}")
    for sel in vector_selectors(lhs):
        if not prom_query(cluster.prometheus, sel)["result"]:
            problems.append(f"{name}: selector {sel} has no series")
    if name in QUIET_WHEN_HEALTHY and rule["state"] != "inactive":
        problems.append(f"{name}: {rule['state']} on a healthy sandbox")
    return problems


def alerting_rules(cluster: Cluster) -> list[dict[str, Any]]:
    groups = http_json(f"{cluster.prometheus}/api/v1/rules?type=alert")["data"]["groups"]
    return [r for g in groups for r in g["rules"]]


def evaluate_everything(cluster: Cluster) -> tuple[list[str], int]:
    """Problems with any dashboard query or alert rule; and how many expressions were checked."""
    problems, checked = [], 0
    for name, dash in load_dashboards().items():
        values = {}
        for var in query_variables(dash):
            values[var["name"]] = variable_values(cluster, var)
            if not values[var["name"]]:
                problems.append(f"{name}: variable {var['name']} has no values")
        if any(not v for v in values.values()):
            continue
        for panel, target in panel_targets(dash):
            checked += 1
            expr = interpolate(target["expr"], values)
            problems += [f"{name} / {panel['title']} / {target['refId']}: {p}" for p in check_panel_expr(cluster, expr)]
    rules = alerting_rules(cluster)
    if sorted(r["name"] for r in rules) != sorted(alert_names_in_rules()):
        problems.append(f"Prometheus loaded alerts {sorted(r['name'] for r in rules)}")
    for rule in rules:
        checked += 1
        problems += check_alert(cluster, rule)
    return problems, checked


def test_every_dashboard_query_and_alert_expression_returns_data(live: Cluster) -> None:
    wanted = {"zbk-bookie": 3, "zbk-autorecovery": 1, "zbk-client": 1}
    wait_until(lambda: targets_up(live) == wanted, timeout_s=60, interval_s=0.5,
               message=f"Prometheus scraping {wanted} (up)")
    # Data arrives over time (rates need two scrapes, compaction follows a few workload
    # rounds, rules need an evaluation); every expression must pass in the same round.
    deadline = time.monotonic() + 150
    while True:
        problems, checked = evaluate_everything(live)
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert checked >= 60, checked
    assert problems == [], "\n".join(problems) + "\n" + live.diagnostics()

