"""`zbk shell` through the real CLI against real bookies: output, --json, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.bookie import BookieProcess


def zbk(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zbk.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def three(tmp_path: Path):
    uri = f"sqlite:///{tmp_path}/meta.db"
    bks = [BookieProcess(tmp_path, uri, name=f"b{i}") for i in range(3)]
    try:
        for b in bks:
            b.start()
        yield uri, bks
    finally:
        for b in bks:
            if b.proc is not None and b.proc.poll() is None:
                b.proc.kill()
                b.proc.wait(10)


def test_shell_commands(three, tmp_path):
    uri, bks = three
    r = zbk("shell", "--metadata", uri, "--json", "listbookies")
    assert r.returncode == 0, r.stderr
    assert sorted(x["id"] for x in json.loads(r.stdout)) == sorted(b.bookie_id for b in bks)
    r = zbk("shell", "--metadata", uri, "listbookies")
    assert r.returncode == 0 and "bookie" in r.stdout and bks[0].bookie_id in r.stdout

    r = zbk("shell", "--metadata", uri, "--json", "--entries", "300", "simpletest")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["ok"] and out["entries"] == 300 and out["mismatches"] == 0

    # A ledger to look at (simpletest deletes its own).
    import zbk as client

    with client.BookKeeper(uri) as bk:
        lh = bk.create_ledger(3, 3, 3, password=b"pw")  # AQ3: every bookie has every entry at the close
        for i in range(20):
            lh.append(b"entry-%d" % i)
        lid = lh.ledger_id
        ens = lh.metadata.ensembles[0]
        lh.close()
    r = zbk("shell", "--metadata", uri, "--json", "listledgers")
    assert r.returncode == 0 and lid in json.loads(r.stdout)
    r = zbk("shell", "--metadata", uri, "--json", "ledgermetadata", str(lid))
    md = json.loads(r.stdout)
    assert md["state"] == "CLOSED" and md["last_entry_id"] == 19 and md["ensembles"]["0"] == ens
    r = zbk("shell", "--metadata", uri, "--json", "--password", "pw", "readledger", str(lid))
    assert r.returncode == 0, r.stderr
    assert [e["payload"] for e in json.loads(r.stdout)] == [f"entry-{i}" for i in range(20)]
    r = zbk("shell", "--metadata", uri, "--json", "--bookie", ens[0], "readentry", str(lid), "5")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "EOK"
    r = zbk("shell", "--metadata", uri, "--json", "--bookie", ens[0], "readentry", str(lid), "500")
    assert r.returncode == 1 and json.loads(r.stdout)["status"] == "ENOENTRY"
    r = zbk("shell", "--metadata", uri, "--json", "--bookie", ens[1], "ledgerentries", str(lid))
    assert json.loads(r.stdout)["ranges"] == [[0, 19]]
    r = zbk("shell", "--metadata", uri, "--json", "bookieinfo", ens[2])
    assert json.loads(r.stdout)["state"] == "writable"
    assert zbk("shell", "--metadata", uri, "instanceid").returncode == 0
    r = zbk("shell", "--metadata", uri, "--json", "cookie", "get", ens[0])
    assert r.returncode == 0 and json.loads(r.stdout)["bookie_id"] == ens[0]
    assert zbk("shell", "--metadata", uri, "deleteledger", str(lid)).returncode == 0
    r = zbk("shell", "--metadata", uri, "ledgermetadata", str(lid))
    assert r.returncode == 1 and "NO_SUCH_LEDGER" in r.stderr and "Traceback" not in r.stderr

    # Offline tools on a stopped bookie.
    assert bks[0].stop() == 0
    for cmd in (["lastmark"], ["readjournal"]):
        r = zbk("shell", "--data-dir", str(bks[0].data_dir), "--json", *cmd)
        assert r.returncode == 0, (cmd, r.stderr)


def test_shell_usage_errors_and_unreachable_metadata(tmp_path):
    r = zbk("shell", "--metadata", f"sqlite:///{tmp_path}/m.db", "ledgermetadata", "not-a-number")
    assert r.returncode == 2 and "expected a number" in r.stderr
    r = zbk("shell", "--metadata", f"sqlite:///{tmp_path}/m.db", "nosuchcommand")
    assert r.returncode == 2
    r = zbk("shell", "listbookies")
    assert r.returncode == 2 and "--metadata" in r.stderr
    r = zbk("shell", "--metadata", "etcd://127.0.0.1:1/zbk", "listbookies", timeout=120)
    assert r.returncode == 3, (r.returncode, r.stderr[-500:])
    assert "Traceback" not in r.stderr
    r = zbk("shell", "--metadata", "bogus://x", "listbookies")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_autorecovery_shell_commands(tmp_path):
    from zbk.metadata.uri import open_store
    from zbk.recovery.underreplication import UnderReplicationRegistry

    uri = f"sqlite:///{tmp_path}/meta.db"
    assert zbk("shell", "--metadata", uri, "lostbookierecoverydelay", "45").returncode == 0
    r = zbk("shell", "--metadata", uri, "--json", "lostbookierecoverydelay")
    assert json.loads(r.stdout) == {"lost_bookie_recovery_delay_s": 45.0}
    assert zbk("shell", "--metadata", uri, "lostbookierecoverydelay", "-3").returncode == 2
    r = zbk("shell", "--metadata", uri, "--json", "whoisauditor")
    assert r.returncode == 1 and json.loads(r.stdout) == {"auditor": None}
    store = open_store(uri)
    try:
        UnderReplicationRegistry(store, "test").mark(7, ["127.0.0.1:9"])
    finally:
        store.close()
    r = zbk("shell", "--metadata", uri, "--json", "listunderreplicated")
    marks = json.loads(r.stdout)
    assert r.returncode == 0 and marks[0]["ledger_id"] == 7 and marks[0]["missing_bookies"] == ["127.0.0.1:9"]
    r = zbk("shell", "--metadata", uri, "listunderreplicated")
    assert "127.0.0.1:9" in r.stdout and "7" in r.stdout


def test_every_metadata_command_reports_an_unreachable_store_with_exit_3():
    """Each command that needs the metadata store, against an etcd nobody listens on: one
    clear line and exit code 3, never a traceback. (Run side by side: each waits out the
    store's retry budget.)"""
    commands = [["listbookies"], ["listledgers"], ["ledgermetadata", "1"], ["deleteledger", "1"], ["instanceid"],
                ["readledger", "1"], ["simpletest", "--entries", "1"], ["listunderreplicated"], ["whoisauditor"],
                ["triggeraudit"], ["lostbookierecoverydelay"], ["lostbookierecoverydelay", "5"],
                ["recover", "127.0.0.1:5"], ["cookie", "get", "127.0.0.1:5"]]
    procs = []
    try:
        for cmd in commands:
            argv = [sys.executable, "-m", "zbk.cli.main", "shell", "--metadata", "etcd://127.0.0.1:1/zbk", *cmd]
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for cmd, p in zip(commands, procs, strict=True):
            out, err = p.communicate(timeout=180)
            assert p.returncode == 3, (cmd, p.returncode, err[-400:])
            assert "Traceback" not in err and f"zbk shell {cmd[0]}:" in err, (cmd, err[-400:])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def test_bench_reports_and_serves_client_metrics(three):
    import time
    import urllib.request

    from helpers.procs import free_port

    uri, _ = three
    port = free_port()
    argv = [sys.executable, "-m", "zbk.cli.main", "bench", "--metadata", uri, "--seconds", "4", "--window", "50",
            "--entry-size", "512", "--json", "--http-port", str(port)]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = 0.0
        deadline = time.monotonic() + 60
        while p.poll() is None and time.monotonic() < deadline and not seen:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
                    text = resp.read().decode()
                seen = sum(float(line.split()[-1]) for line in text.splitlines()
                           if line.startswith("zbk_client_add_entry_seconds_count"))
            except OSError:
                pass
            time.sleep(0.2)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    assert p.returncode == 0, err[-500:]
    assert seen > 0, "the client's add latency was served while the bench ran"
    report = json.loads(out.strip().splitlines()[-1])
    assert report["entries"] > 0 and report["entries_per_s"] > 0 and report["entry_size"] == 512
    assert 0 < report["p50_ms"] <= report["p95_ms"] <= report["p99_ms"] <= report["max_ms"]
    assert json.loads(zbk("shell", "--metadata", uri, "--json", "listledgers").stdout) == [], "the ledger is deleted"
    r = zbk("bench", "--metadata", uri, "--entries", "10", "--ensemble", "5")
    assert r.returncode != 0 and "Traceback" not in r.stderr, "E5 on 3 bookies: a clear error"
