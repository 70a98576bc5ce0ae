"""The HTTP admin API against real processes: every endpoint of docs/operations.md's table on
a bookie (and the cluster-wide ones on an auto-recovery process), with its bad-input
answers: 400 with a JSON error, 404 for a path nobody serves, 405 for a wrong method, 401
for a state change without the admin token, 403 for a wrong ledger password, 503 for an
unreachable metadata store; never a 500."""

from __future__ import annotations

import base64
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.bookie import BookieProcess, wait_registered
from helpers.procs import free_port, start_process, stop_process, tail
from helpers.wait import wait_until

import zbk
from zbk.metadata import layout
from zbk.metadata.uri import open_store
from zbk.recovery.underreplication import UnderReplicationRegistry

TOKEN = "t0ken-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
PW = b"pw"


def call(port: int, method: str, path: str, body: Any = None, *, auth: bool = True,
         timeout_s: float = 30.0) -> tuple[int, Any, dict[str, str]]:
    """(status, JSON body, headers) of one request; the admin token unless ``auth`` is False."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, data=data,
                                 headers=AUTH if auth else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            raw, status, headers = resp.read(), resp.status, dict(resp.headers)
    except urllib.error.HTTPError as e:
        raw, status, headers = e.read(), e.code, dict(e.headers)
    doc = json.loads(raw) if raw else None
    assert status != 500, f"{method} {path}: 500 {doc}"
    if status >= 400:
        assert isinstance(doc, dict) and isinstance(doc.get("error"), str), (method, path, status, raw[:200])
    return status, doc, headers


def get(port: int, path: str) -> Any:
    status, doc, _ = call(port, "GET", path)
    assert status == 200, (path, status, doc)
    return doc


def code(port: int, method: str, path: str, body: Any = None, **kw: Any) -> int:
    return call(port, method, path, body, **kw)[0]


class AutoRecovery:
    """One `zbk autorecovery` process, stopped by PID."""

    def __init__(self, root: Path, uri: str, **settings: object) -> None:
        self.http_port = free_port()
        self.log = root / f"ar-{self.http_port}.log"
        argv = [sys.executable, "-m", "zbk.cli.main", "autorecovery", "--metadata", uri,
                "--http-port", str(self.http_port), "--set", f"admin_token={TOKEN}"]
        for k, v in settings.items():
            argv += ["--set", f"{k}={v}"]
        self.proc = start_process(argv, self.log, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        wait_until(self._up, timeout_s=20, message=f"autorecovery HTTP\n{tail(self.log)}")

    def _up(self) -> bool:
        assert self.proc.poll() is None, tail(self.log)
        try:
            return code(self.http_port, "GET", "/heartbeat") == 200
        except OSError:
            return False

    def stop(self) -> None:
        stop_process(self.proc, timeout_s=20)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[list[BookieProcess], str]]:
    uri = f"sqlite:///{tmp_path}/meta.db"
    settings = {"admin_token": TOKEN}
    bks = [BookieProcess(tmp_path, uri, name=f"b{i}", settings=settings) for i in range(2)]
    try:
        for b in bks:
            b.start(wait=False)
        for b in bks:
            b.wait_ready()
        wait_registered(uri, [b.bookie_id for b in bks])
        yield bks, uri
    finally:
        for b in bks:
            if b.proc is not None:
                stop_process(b.proc, kill=True)


def _write_ledgers(uri: str) -> tuple[int, int, list[bytes]]:
    """A closed ledger of text and binary entries, and an empty open one."""
    payloads = [f"entry {i}".encode() for i in range(5)] + [bytes(range(256))]
    with zbk.BookKeeper(uri) as bk:
        lh = bk.create_ledger(2, 2, 2, password=PW)
        for p in payloads:
            lh.append(p)
        lh.close()
        other = bk.create_ledger(2, 2, 2, password=PW)
        return lh.ledger_id, other.ledger_id, payloads


def test_bookie_endpoints(cluster: tuple[list[BookieProcess], str]) -> None:
    bks, uri = cluster
    p = bks[0].http_port
    # -- is_ready, info, list_bookies
    assert get(p, "/api/v1/bookie/is_ready") == {"ready": True}
    assert get(p, "/api/v1/bookie/info")["state"] == "writable"
    ids = sorted(b.bookie_id for b in bks)
    assert sorted(get(p, "/api/v1/bookie/list_bookies")) == ids
    assert get(p, "/api/v1/bookie/list_bookies?type=rw") == dict.fromkeys(ids)
    assert get(p, "/api/v1/bookie/list_bookies?type=ro") == {}
    names = get(p, "/api/v1/bookie/list_bookies?type=rw&print_hostnames=true")
    assert sorted(names) == ids and all(isinstance(n, str) and n for n in names.values())
    assert code(p, "GET", "/api/v1/bookie/list_bookies?type=all") == 400
    assert code(p, "GET", "/api/v1/bookie/list_bookies?print_hostnames=maybe") == 400
    assert code(p, "GET", "/api/v1/bookie/list_bookies?typo=rw") == 400
    # -- GC: details, forced run, suspend and resume
    details = get(p, "/api/v1/bookie/gc_details")
    assert isinstance(details, list) and set(details[0]) == {
        "forceCompacting", "majorCompacting", "minorCompacting", "lastMajorCompactionTime",
        "lastMinorCompactionTime", "majorCompactionCounter", "minorCompactionCounter"}
    assert get(p, "/api/v1/bookie/gc") == {"is_in_force_gc": False}
    both_off = {"isMajorGcSuspended": False, "isMinorGcSuspended": False}
    assert get(p, "/api/v1/bookie/gc/suspend_compaction") == both_off
    status, doc, _ = call(p, "PUT", "/api/v1/bookie/gc/suspend_compaction", {"suspendMajor": "true"})
    assert (status, doc) == (200, {"isMajorGcSuspended": True, "isMinorGcSuspended": False})
    status, doc, _ = call(p, "PUT", "/api/v1/bookie/gc/suspend_compaction", {"suspendMinor": True})
    assert doc == {"isMajorGcSuspended": True, "isMinorGcSuspended": True}
    assert code(p, "POST", "/api/v1/bookie/gc", {"major": True}) == 200
    wait_until(lambda: get(p, "/api/v1/bookie/gc_details")[0]["forceCompacting"] is False, message="the forced run")
    after = get(p, "/api/v1/bookie/gc_details")[0]
    assert after["majorCompactionCounter"] == after["minorCompactionCounter"] == 0, "suspended: no compaction ran"
    status, doc, _ = call(p, "PUT", "/api/v1/bookie/gc/resume_compaction", {"resumeMajor": True, "resumeMinor": True})
    assert (status, doc) == (200, both_off)
    assert code(p, "POST", "/api/v1/bookie/gc", {"major": True}) == 200
    wait_until(lambda: get(p, "/api/v1/bookie/gc_details")[0]["majorCompactionCounter"] == 1,
               message="a major compaction pass once resumed")
    assert get(p, "/api/v1/bookie/gc_details")[0]["lastMajorCompactionTime"] > 1_600_000_000_000
    for bad in ({}, {"suspendMajor": "yes"}, {"resumeMajor": True}, {"suspendMajor": True, "x": 1}):
        assert code(p, "PUT", "/api/v1/bookie/gc/suspend_compaction", bad) == 400, bad
    assert code(p, "PUT", "/api/v1/bookie/gc/resume_compaction", {"suspendMajor": True}) == 400
    assert code(p, "POST", "/api/v1/bookie/gc", {"major": "yes"}) == 400
    # -- the last log mark, the files on disk
    mark = get(p, "/api/v1/bookie/last_log_mark")
    assert list(mark) == [str(bks[0].data_dir / "journal")]
    assert set(mark[str(bks[0].data_dir / "journal")]) == {"log_id", "offset"}
    files = get(p, "/api/v1/bookie/list_disk_file")
    assert set(files) == {"journal files", "entrylog files", "index files"}
    assert files["journal files"] and all(f["kind"] in ("journal", "journal-free") for f in files["journal files"])
    assert all(os.path.isfile(f["path"]) or f["kind"] == "index" for f in files["entrylog files"])
    assert set(get(p, "/api/v1/bookie/list_disk_file?file_type=index")) == {"index files"}
    assert code(p, "GET", "/api/v1/bookie/list_disk_file?file_type=txt") == 400
    # -- the effective configuration, secrets masked
    conf = get(p, "/api/v1/config/server_config")
    assert conf["bookie_id"] == bks[0].bookie_id and conf["metadata_uri"] == uri
    assert conf["http"]["admin_token"] == "********" and TOKEN not in json.dumps(conf)
    assert conf["gc"]["wait_time_ms"] == 3_600_000 and conf["registration_ttl_s"] == 2  # --set applied
    # -- errors of the server itself
    status, doc, _ = call(p, "GET", "/api/v1/bookie/nothing")
    assert status == 404
    status, doc, headers = call(p, "DELETE", "/api/v1/bookie/info")
    assert status == 405 and headers["Allow"] == "GET"
    assert code(p, "POST", "/api/v1/bookie/is_ready") == 405
    assert code(p, "PUT", "/api/v1/config/server_config", {}) == 405
    assert code(p, "GET", "/api/v1/bookie/info?verbose=1") == 400
    assert code(p, "PUT", "/api/v1/bookie/state", {"state": "sleepy"}) == 400


def test_every_state_change_needs_the_admin_token(cluster: tuple[list[BookieProcess], str]) -> None:
    bks, uri = cluster
    p = bks[0].http_port
    changes = [("PUT", "/api/v1/bookie/state", {"state": "readonly"}), ("POST", "/api/v1/bookie/gc", {}),
               ("PUT", "/api/v1/bookie/gc/suspend_compaction", {"suspendMajor": True}),
               ("PUT", "/api/v1/bookie/gc/resume_compaction", {"resumeMajor": True}),
               ("PUT", "/api/v1/autorecovery/status", {"enabled": False}),
               ("PUT", "/api/v1/autorecovery/trigger_audit", None),
               ("PUT", "/api/v1/autorecovery/lost_bookie_recovery_delay", {"lost_bookie_recovery_delay_s": 5})]
    served = {(m, path) for m, path in _routes_of(p)}
    mutating = {(m, path) for m, path in served if m != "GET"}
    assert mutating == {(m, path) for m, path, _ in changes}, "every state-changing route is in this test"
    for method, path, body in changes:
        assert code(p, method, path, body, auth=False) == 401, path
    store = open_store(uri)
    try:
        assert store.get(layout.AUTORECOVERY_DISABLED) is None and store.get(layout.AUDITOR_TRIGGER) is None
    finally:
        store.close()
    assert get(p, "/api/v1/bookie/state") == {"state": "writable"}
    assert get(p, "/api/v1/bookie/gc/suspend_compaction") == {"isMajorGcSuspended": False,
                                                             "isMinorGcSuspended": False}


def _routes_of(port: int) -> list[tuple[str, str]]:
    """The routes a server has, found by asking: each path of the docs' table with each method
    (405 and 404 say which it lacks)."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    paths = sorted({line.split("`")[1].split(" ")[-1].split("?")[0] for line in doc.splitlines()
                    if line.startswith(("| `GET", "| `PUT", "| `POST"))} - {"/metrics"})  # /metrics: not JSON
    found = []
    for path in paths:
        for method in ("GET", "PUT", "POST"):
            status = code(port, method, path, {}, auth=False) if method != "GET" else code(port, "GET", path)
            if status not in (404, 405):
                found.append((method, path))
    return found


def test_ledger_and_autorecovery_endpoints_on_a_bookie_and_an_autorecovery_process(
        cluster: tuple[list[BookieProcess], str], tmp_path: Path) -> None:
    bks, uri = cluster
    closed, empty, payloads = _write_ledgers(uri)
    ar = AutoRecovery(tmp_path, uri)
    try:
        wait_until(lambda: get(ar.http_port, "/api/v1/autorecovery/who_is_auditor")["auditor"], message="an auditor")
        for p in (bks[1].http_port, ar.http_port):
            _ledger_routes(p, closed, empty, payloads)
            _autorecovery_routes(p, uri, ar)
        # An auto-recovery process serves the cluster-wide routes only.
        assert code(ar.http_port, "GET", "/api/v1/bookie/info") == 404
        assert code(ar.http_port, "GET", "/api/v1/bookie/is_ready") == 404
        assert code(ar.http_port, "GET", "/api/v1/config/server_config") == 404
    finally:
        ar.stop()


def _ledger_routes(p: int, closed: int, empty: int, payloads: list[bytes]) -> None:
    assert get(p, "/api/v1/ledger/list") == {str(closed): None, str(empty): None}
    with_md = get(p, "/api/v1/ledger/list?print_metadata=true")
    assert with_md[str(closed)]["state"] == "CLOSED" and with_md[str(empty)]["state"] == "OPEN"
    assert "password" not in json.dumps(with_md)
    assert get(p, "/api/v1/ledger/list?page=1") == {str(closed): None, str(empty): None}
    assert get(p, "/api/v1/ledger/list?page=2") == {}
    for bad in ("page=0", "page=x", "print_metadata=1", "page=1&page=2", "ledger_id=1"):
        assert code(p, "GET", f"/api/v1/ledger/list?{bad}") == 400, bad
    md = get(p, f"/api/v1/ledger/metadata?ledger_id={closed}")
    assert list(md) == [str(closed)] and md[str(closed)]["last_entry_id"] == len(payloads) - 1
    assert code(p, "GET", "/api/v1/ledger/metadata?ledger_id=999999") == 404
    for bad in ("", "?ledger_id=", "?ledger_id=abc", "?ledger_id=-1", "?ledgerid=1"):
        assert code(p, "GET", f"/api/v1/ledger/metadata{bad}") == 400, bad
    read = f"/api/v1/ledger/read?ledger_id={closed}&password=pw"
    assert get(p, read + "&start_entry_id=0&end_entry_id=4") == {str(i): f"entry {i}" for i in range(5)}
    exact = get(p, read + "&encoding=base64")
    assert {int(k): base64.b64decode(v) for k, v in exact.items()} == dict(enumerate(payloads))
    assert get(p, read + "&start_entry_id=5&encoding=hex") == {"5": payloads[5].hex()}
    assert get(p, read + "&start_entry_id=3&end_entry_id=100") == {"3": "entry 3", "4": "entry 4",
                                                                   "5": payloads[5].decode(errors="replace")}
    assert get(p, f"/api/v1/ledger/read?ledger_id={empty}&password=pw") == {}
    status, doc, _ = call(p, "GET", f"/api/v1/ledger/read?ledger_id={closed}&password=wrong")
    assert status == 403 and doc["code"] == "UNAUTHORIZED"
    assert code(p, "GET", f"/api/v1/ledger/read?ledger_id={closed}") == 403  # no password is a wrong one
    assert code(p, "GET", "/api/v1/ledger/read?ledger_id=999999&password=pw") == 404
    for bad in ("", f"?ledger_id={closed}&start_entry_id=4&end_entry_id=2",
                f"?ledger_id={closed}&start_entry_id=0&end_entry_id=5000", f"?ledger_id={closed}&encoding=utf16",
                f"?ledger_id={closed}&start_entry_id=-3", f"?ledger_id={closed}&end_entry_id=x"):
        assert code(p, "GET", f"/api/v1/ledger/read{bad}") == 400, bad
    assert code(p, "PUT", read, {}) == 405


def _autorecovery_routes(p: int, uri: str, ar: AutoRecovery) -> None:
    base = "/api/v1/autorecovery"
    assert get(p, f"{base}/status") == {"enabled": True}
    status, doc, _ = call(p, "PUT", f"{base}/status", {"enabled": False})
    assert status == 200 and doc["enabled"] is False and doc["disabled_by"]
    assert get(p, f"{base}/status")["enabled"] is False
    assert call(p, "PUT", f"{base}/status?enabled=true")[1] == {"enabled": True}  # BookKeeper's form
    for bad_path, bad_body in ((f"{base}/status", None), (f"{base}/status", {"enabled": "perhaps"}),
                               (f"{base}/status?enabled=false", {"enabled": True}), (f"{base}/status?on=1", None)):
        assert code(p, "PUT", bad_path, bad_body) == 400, (bad_path, bad_body)
    assert code(p, "POST", f"{base}/status", {"enabled": True}) == 405
    assert get(p, f"{base}/who_is_auditor") == {"auditor": ar_id(ar)}
    store = open_store(uri)
    try:
        registry = UnderReplicationRegistry(store, "test")
        registry.mark(12345, ["127.0.0.1:1"])
        registry.mark(12346, ["127.0.0.1:2"])
        listed = get(p, f"{base}/list_under_replicated_ledger")
        assert [m["ledger_id"] for m in listed["ledgers"]] == [12345, 12346] and listed["repairs"] == []
        only = get(p, f"{base}/list_under_replicated_ledger?missingreplica=127.0.0.1:2")
        assert [m["ledger_id"] for m in only["ledgers"]] == [12346]
        but = get(p, f"{base}/list_under_replicated_ledger?excludingmissingreplica=127.0.0.1:2")
        assert [m["ledger_id"] for m in but["ledgers"]] == [12345]
        assert code(p, "GET", f"{base}/list_under_replicated_ledger?missingreplica=") == 400
        for lid in (12345, 12346):
            store.delete(layout.underreplicated_key(lid))
        before = store.get(layout.AUDITOR_TRIGGER)
        status, doc, _ = call(p, "PUT", f"{base}/trigger_audit")
        assert status == 200 and doc == {"triggered": True, "auditor": ar_id(ar), "enabled": True}
        after = store.get(layout.AUDITOR_TRIGGER)
        assert after is not None and (before is None or after.version > before.version)
        assert code(p, "GET", f"{base}/trigger_audit") == 405
    finally:
        store.close()
    assert call(p, "PUT", f"{base}/lost_bookie_recovery_delay", {"delay_seconds": 7})[1] == {
        "lost_bookie_recovery_delay_s": 7.0}
    assert get(p, f"{base}/lost_bookie_recovery_delay") == {"lost_bookie_recovery_delay_s": 7.0}
    assert code(p, "PUT", f"{base}/lost_bookie_recovery_delay", {"lost_bookie_recovery_delay_s": -1}) == 400
    assert call(p, "PUT", f"{base}/lost_bookie_recovery_delay", {"lost_bookie_recovery_delay_s": 0})[0] == 200


def ar_id(ar: AutoRecovery) -> str:
    return f"127.0.0.1:{ar.http_port}"


def test_unreachable_metadata_is_a_503(tmp_path: Path, etcd_cluster_factory: Any) -> None:
    """A bookie on etcd answers the metadata routes 503 once etcd is gone (after the store's
    own deadline), and its own routes still 200."""
    etcd = etcd_cluster_factory(size=1)
    uri = etcd.uri("zbk")
    b = BookieProcess(tmp_path, uri, name="b0", settings={"admin_token": TOKEN})
    try:
        b.start()
        wait_registered(uri, [b.bookie_id])
        p = b.http_port
        assert get(p, "/api/v1/ledger/list") == {}
        etcd.members[0].kill()
        for path in ("/api/v1/ledger/list", "/api/v1/autorecovery/status", "/api/v1/bookie/list_bookies"):
            status, doc, _ = call(p, "GET", path, timeout_s=60)
            assert status == 503 and doc["code"] == "METADATA_UNAVAILABLE", (path, status, doc)
        assert get(p, "/api/v1/bookie/info")["id"] == b.bookie_id
        assert get(p, "/api/v1/bookie/is_ready") == {"ready": True}
    finally:
        if b.proc is not None:
            stop_process(b.proc, kill=True)
