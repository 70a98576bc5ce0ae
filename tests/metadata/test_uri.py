"""Metadata URIs: what parses, and the ConfigError every malformed URI gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from zbk.errors import ConfigError, CorruptMetadataError
from zbk.metadata.memory import MemoryMetadataStore
from zbk.metadata.sqlite import SqliteStore
from zbk.metadata.uri import EtcdUri, MemoryUri, SqliteUri, open_store, parse_uri


@pytest.mark.parametrize("uri,expected", [
    ("sqlite:///var/zbk/meta.db", SqliteUri("/var/zbk/meta.db", "zbk")),
    ("sqlite:///var/zbk/meta.db?scope=prod-1", SqliteUri("/var/zbk/meta.db", "prod-1")),
    ("SQLITE:///x.db", SqliteUri("/x.db", "zbk")),
    ("etcd://127.0.0.1:2379/zbk", EtcdUri(("127.0.0.1:2379",), "zbk")),
    ("etcd://h1:1,h2:2,h3/scope_a", EtcdUri(("h1:1", "h2:2", "h3:2379"), "scope_a")),
    ("etcd://localhost", EtcdUri(("localhost:2379",), "zbk")),
    ("etcd://[::1]:2380/s/", EtcdUri(("[::1]:2380",), "s")),
    ("memory://my-test.1", MemoryUri("my-test.1")),
    ("Memory://x", MemoryUri("x")),
])
def test_valid_uris(uri: str, expected: object) -> None:
    assert parse_uri(uri) == expected


@pytest.mark.parametrize("uri,why", [
    ("", "expected"),
    ("/var/zbk/meta.db", "expected"),
    ("zk://h:2181/ledgers", "unknown scheme"),
    ("sqlite://relative/meta.db", "no host"),
    ("sqlite:///", "absolute file path"),
    ("sqlite:///var/zbk/", "absolute file path"),
    ("sqlite:///m.db?scope=", "scope"),
    ("sqlite:///m.db?scope=a/b", "scope"),
    ("sqlite:///m.db?scope=a&scope=b", "more than once"),
    ("sqlite:///m.db?timeout=3", "unknown parameter"),
    ("etcd:///zbk", "no etcd endpoints"),
    ("etcd://h:99999/zbk", "out of range"),
    ("etcd://h:port/zbk", "bad endpoint"),
    ("etcd://h1:1,,h2:2/zbk", "bad endpoint"),
    ("etcd://h:1/a/b", "scope"),
    ("etcd://h:1/zbk?x=1", "no parameters"),
    ("memory://", "a memory URI"),
    ("memory://a/b", "a memory URI"),
    ("memory://a?scope=b", "a memory URI"),
])
def test_bad_uris_are_config_errors(uri: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_uri(uri)


def test_open_sqlite(tmp_path: Path) -> None:
    store = open_store(f"sqlite://{tmp_path}/m.db?scope=abc")
    try:
        assert isinstance(store, SqliteStore) and store.scope == "abc"
        assert store.uri == f"sqlite://{tmp_path}/m.db?scope=abc"
    finally:
        store.close()


def test_open_memory_shares_a_name_while_a_store_is_open() -> None:
    a = open_store("memory://uri-test")
    b = open_store("memory://uri-test")
    assert isinstance(a, MemoryMetadataStore) and a.uri == "memory://uri-test"
    a.put("k", b"v")
    kv = b.get("k")
    assert kv is not None and kv.value == b"v"
    with open_store("memory://uri-test-other") as other:
        assert other.get("k") is None
    a.close()
    b.close()
    with open_store("memory://uri-test") as again:
        assert again.get("k") is None, "the last close dropped the data"
    anonymous = MemoryMetadataStore()
    joined = open_store(anonymous.uri)
    anonymous.put("k", b"mine")
    assert joined.get("k") is not None
    joined.close()
    anonymous.close()


def test_open_sqlite_in_missing_directory_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        open_store(f"sqlite://{tmp_path}/nope/m.db")


def test_open_sqlite_on_a_non_database_is_corrupt(tmp_path: Path) -> None:
    (tmp_path / "m.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(CorruptMetadataError, match="not a zbk metadata database"):
        open_store(f"sqlite://{tmp_path}/m.db")
