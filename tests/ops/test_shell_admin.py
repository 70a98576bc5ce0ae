"""The shell's cluster-metadata commands against real bookies and real stores:
listledgers --bookie/--meta, ledgermetadata --dump/--restore, initnewcluster and
nukeexistingcluster on sqlite and on etcd."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from helpers.bookie import wait_registered
from helpers.shell import refused, shell, shell_json

import zbk
from zbk.metadata.uri import open_store


def _snapshot(uri: str) -> list[tuple[str, bytes]]:
    """Every key and value of the cluster."""
    from zbk.metadata.store import iter_prefix

    store = open_store(uri)
    try:
        return [(kv.key, kv.value) for kv in iter_prefix(store, "")]
    finally:
        store.close()


def test_listledgers_by_bookie_and_by_custom_metadata(bookies):
    uri = bookies.metadata_uri
    bks = [bookies(f"b{i}").start() for i in range(3)]
    with zbk.BookKeeper(uri) as bk:
        everywhere = bk.create_ledger(3, 3, 2, custom_metadata={"app": b"orders", "tier": b"gold"})
        everywhere.append(b"x")
        pair = bk.create_ledger(2, 2, 2, custom_metadata={"app": b"orders"})
        pair.append(b"y")
        other = bk.create_ledger(3, 2, 2, custom_metadata={"app": b"billing"})
        ids = {h.ledger_id: set(h.metadata.ensembles[0]) for h in (everywhere, pair, other)}
        for h in (everywhere, pair, other):
            h.close()
    outside = next(b.bookie_id for b in bks if b.bookie_id not in ids[pair.ledger_id])

    assert shell_json("listledgers", "--metadata", uri) == sorted(ids)
    for b in bks:
        want = sorted(lid for lid, ens in ids.items() if b.bookie_id in ens)
        assert shell_json("listledgers", "--bookie", b.bookie_id, "--metadata", uri) == want
    assert pair.ledger_id not in shell_json("--bookie", outside, "listledgers", "--metadata", uri)
    assert shell_json("listledgers", "--metadata", uri, "--bookie", "127.0.0.1:1") == []
    assert shell_json("listledgers", "--metadata", uri, "--meta", "app=orders") == \
        sorted([everywhere.ledger_id, pair.ledger_id])
    assert shell_json("listledgers", "--metadata", uri, "--meta", "app=orders", "--meta", "tier=gold") == \
        [everywhere.ledger_id]
    assert shell_json("listledgers", "--metadata", uri, "--meta", "app=") == []
    assert shell_json("listledgers", "--metadata", uri, "--meta", "app=orders", "--bookie", outside) == \
        [everywhere.ledger_id]
    r = shell("listledgers", "--metadata", uri, "--meta", "app=billing")
    assert r.returncode == 0 and r.stdout.strip() == str(other.ledger_id)
    r = shell("listledgers", "--metadata", uri, "--meta", "app=nothing")
    assert r.returncode == 0 and r.stdout.strip() == "(no ledgers)"

    # A ledger whose metadata does not decode: listed on stderr, exit code 1 (it might have matched).
    store = open_store(uri)
    try:
        from zbk.metadata.layout import ledger_key

        store.put(ledger_key(other.ledger_id + 1000), b"\xff garbage")
    finally:
        store.close()
    r = shell("listledgers", "--metadata", uri, "--meta", "app=orders", "--json")
    assert r.returncode == 1 and json.loads(r.stdout) == sorted([everywhere.ledger_id, pair.ledger_id])
    assert f"ledger {other.ledger_id + 1000}:" in r.stderr and "Traceback" not in r.stderr


def test_ledgermetadata_dump_and_restore(bookies, tmp_path: Path):
    uri = bookies.metadata_uri
    for i in range(3):
        bookies(f"b{i}").start()
    with zbk.BookKeeper(uri) as bk:
        lh = bk.create_ledger(3, 2, 2, password=b"pw", custom_metadata={"app": b"\x00\x01binary"})
        for i in range(5):
            lh.append(b"e%d" % i)
        lh.close()
        lid = lh.ledger_id
        second = bk.create_ledger(3, 2, 2, password=b"other")
        second.close()
    before = shell_json("ledgermetadata", str(lid), "--metadata", uri)
    dump = tmp_path / "md.json"

    done = shell_json("ledgermetadata", str(lid), "--metadata", uri, "--dump", str(dump))
    assert done == {"ledger_id": lid, "dumped_to": str(dump), "version": before["version"]}
    assert stat.S_IMODE(os.stat(dump).st_mode) == 0o600, "the dump holds the password"
    doc = json.loads(dump.read_text())
    assert doc["ledger_id"] == lid and doc["metadata"]["password_hex"] == b"pw".hex()
    assert doc["metadata"]["custom_metadata_hex"] == {"app": b"\x00\x01binary".hex()}

    # Unchanged since the dump: restoring an edited dump is a compare-and-set that succeeds.
    doc["metadata"]["custom_metadata_hex"]["note"] = b"restored".hex()
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(doc))
    got = shell_json("ledgermetadata", str(lid), "--metadata", uri, "--restore", str(edited))
    assert got["created"] is False and got["version"] > before["version"]
    after = shell_json("ledgermetadata", str(lid), "--metadata", uri)
    assert after["custom_metadata"]["note"] == "restored" and after["ensembles"] == before["ensembles"]
    assert after["state"] == "CLOSED" and after["last_entry_id"] == 4

    # The ledger changed since the first dump: its version no longer matches, nothing written.
    r = shell("ledgermetadata", str(lid), "--metadata", uri, "--restore", str(dump))
    refused(r, 1, "METADATA_VERSION", "changed since the dump")
    assert shell_json("ledgermetadata", str(lid), "--metadata", uri) == after
    # ...unless told to overwrite whatever is there.
    got = shell_json("ledgermetadata", str(lid), "--metadata", uri, "--restore", str(dump), "--any-version")
    assert "note" not in shell_json("ledgermetadata", str(lid), "--metadata", uri)["custom_metadata"]

    # A dump of another ledger: refused unless told; then an existing ledger needs --any-version.
    other = second.ledger_id
    refused(shell("ledgermetadata", str(other), "--metadata", uri, "--restore", str(dump)), 1,
            "OPERATION_REFUSED", f"holds ledger {lid}, not {other}", "--allow-other-ledger")
    refused(shell("ledgermetadata", str(other), "--metadata", uri, "--restore", str(dump), "--allow-other-ledger"),
            1, "OPERATION_REFUSED", "--any-version")
    got = shell_json("ledgermetadata", str(other), "--metadata", uri, "--restore", str(dump), "--allow-other-ledger",
                     "--any-version")
    assert shell_json("ledgermetadata", str(other), "--metadata", uri)["last_entry_id"] == 4

    # A deleted ledger is created again from its dump, with its password: the client reads it.
    assert shell("deleteledger", str(lid), "--metadata", uri).returncode == 0
    got = shell_json("ledgermetadata", str(lid), "--metadata", uri, "--restore", str(dump))
    assert got["created"] is True
    read = shell_json("readledger", str(lid), "--metadata", uri, "--password", "pw")
    assert [e["payload"] for e in read] == [f"e{i}" for i in range(5)]

    # Bad input: typed errors, exit code 2, no traceback.
    (tmp_path / "not.json").write_text("{nope")
    refused(shell("ledgermetadata", str(lid), "--metadata", uri, "--restore", str(tmp_path / "not.json")), 2,
            "BAD_REQUEST", "is not JSON")
    (tmp_path / "other.json").write_text('{"something": 1}')
    refused(shell("ledgermetadata", str(lid), "--metadata", uri, "--restore", str(tmp_path / "other.json")), 2,
            "BAD_REQUEST", "not a ledger metadata dump")
    doc["metadata"]["write_quorum"] = 9
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    refused(shell("ledgermetadata", str(lid), "--metadata", uri, "--restore", str(tmp_path / "bad.json")), 2,
            "BAD_REQUEST", "E >= WQ >= AQ")
    refused(shell("ledgermetadata", str(lid), "--metadata", uri, "--restore", str(tmp_path / "absent.json")), 2,
            "cannot read")
    refused(shell("ledgermetadata", str(lid), "--metadata", uri, "--any-version"), 2, "go with --restore")
    refused(shell("ledgermetadata", "999999", "--metadata", uri, "--dump", str(tmp_path / "x.json")), 1,
            "NO_SUCH_LEDGER")
    assert not (tmp_path / "x.json").exists()


@pytest.fixture(params=["sqlite", "etcd"])
def cluster_uri(request: pytest.FixtureRequest, tmp_path: Path, unique_scope: str) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/cluster.db?scope={unique_scope}"
    return str(request.getfixturevalue("etcd_uri"))


def test_initnewcluster_and_nukeexistingcluster(cluster_uri: str, bookies):
    uri = cluster_uri
    made = shell_json("initnewcluster", "--metadata", uri)
    assert made["initialized"] is True and len(made["instance_id"]) == 32
    assert shell_json("instanceid", "--metadata", uri) == {"instance_id": made["instance_id"]}
    refused(shell("initnewcluster", "--metadata", uri), 1, "OPERATION_REFUSED", "already holds a cluster")

    b = bookies("b0", metadata_uri=uri).start()
    wait_registered(uri, [b.bookie_id])  # answering on its socket comes before its registration
    with zbk.BookKeeper(uri) as bk:
        lh = bk.create_ledger(1, 1, 1)
        lh.append(b"x")
        lh.close()
    before = _snapshot(uri)
    assert any(k.startswith("ledgers/") for k, _ in before)

    # Without --force (or the instance id) nothing changes.
    refused(shell("nukeexistingcluster", "--metadata", uri), 1, "OPERATION_REFUSED", "without --force")
    refused(shell("nukeexistingcluster", "--metadata", uri, "--instanceid", "0" * 32), 1, "nothing deleted")
    # While a bookie is registered, not even --force.
    refused(shell("nukeexistingcluster", "--metadata", uri, "--force"), 1, "bookies are still registered",
            b.bookie_id)
    refused(shell("nukeexistingcluster", "--metadata", uri, "--instanceid", made["instance_id"]), 1,
            "bookies are still registered")
    assert _snapshot(uri) == before

    assert b.stop() == 0
    nuked = shell_json("nukeexistingcluster", "--metadata", uri, "--instanceid", made["instance_id"])
    assert nuked["keys_deleted"] >= len([k for k, _ in before if not k.startswith("bookies/")])
    assert _snapshot(uri) == []
    # An empty scope: a new cluster may be made again, with a new id; nuke --force works too.
    again = shell_json("initnewcluster", "--metadata", uri)
    assert again["instance_id"] != made["instance_id"]
    assert shell_json("nukeexistingcluster", "--force", "--metadata", uri)["keys_deleted"] == 2
    assert _snapshot(uri) == []
