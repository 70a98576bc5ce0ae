"""etcd authentication and TLS for the metadata store, against real etcd servers.

* A private etcd with auth enabled (users created over gRPC, ``--auth-token-ttl 1`` so
  tokens expire during the test): the store works with the right user and password,
  renews expired tokens, and gives a typed error without credentials or with wrong ones.
* A private etcd serving TLS with client certificates (a CA and certificates made with
  ``openssl`` for 127.0.0.1): the store works with ca_cert/cert_cert/cert_key and cannot
  connect without them.
* A bookie process with an authenticated etcd URI.
* URI parsing of the options, and the password kept out of messages.

Every etcd and bookie is stopped by PID at teardown.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.bookie import BookieProcess
from helpers.etcd import ETCD_BIN, EtcdCluster, EtcdMember

from zbk.errors import ConfigError, MetadataError, MetadataUnavailableError
from zbk.metadata.uri import EtcdUri, open_store, parse_uri, redact

pytestmark = pytest.mark.etcd
PASSWORD = "s3cr&t pw"
QUOTED = "s3cr%26t%20pw"


class _Member(EtcdMember):
    extra: list[str] = []
    scheme = "http"
    ca = ""

    def argv(self) -> list[str]:
        argv = super().argv()
        if self.scheme == "https":
            client = f"https://127.0.0.1:{self.client_port}"
            for flag in ("--listen-client-urls", "--advertise-client-urls"):
                argv[argv.index(flag) + 1] = client
        return [*argv, *self.extra]

    def healthy(self) -> bool:
        if self.scheme == "http":
            return super().healthy()
        try:  # a TLS member: ask over TLS with the client certificate
            store = open_store(f"etcd://{self.endpoint}/health?{self.ca}", deadline_s=0.5, rpc_timeout_s=0.5)
        except MetadataError:
            return False
        store.close()
        return True


class _Cluster(EtcdCluster):
    def __init__(self, base_dir: Path, extra: list[str], scheme: str = "http", ca: str = "") -> None:
        super().__init__(base_dir, size=1)
        self.extra, self.scheme, self.ca = extra, scheme, ca

    def _configure(self, attempt: int) -> None:
        super()._configure(attempt)
        for m in self.members:
            m.__class__ = _Member
            m.extra, m.scheme, m.ca = self.extra, self.scheme, self.ca  # type: ignore[attr-defined]


@pytest.fixture
def clusters(tmp_path: Path) -> Iterator[list[_Cluster]]:
    if not os.access(ETCD_BIN, os.X_OK):
        pytest.fail(f"etcd not found at {ETCD_BIN}: install etcd-server")
    started: list[_Cluster] = []
    try:
        yield started
    finally:
        for c in started:
            c.stop()


def _enable_auth(endpoint: str) -> None:
    """root (all rights) and reader (no role) users, then auth on: over raw gRPC stubs."""
    import grpc

    from zbk.metadata.etcd import etcdrpc  # through zbk: it selects the protobuf runtime etcd3 needs

    with grpc.insecure_channel(endpoint) as ch:
        auth = etcdrpc.AuthStub(ch)
        auth.UserAdd(etcdrpc.AuthUserAddRequest(name="root", password=PASSWORD), timeout=5)
        auth.UserGrantRole(etcdrpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=5)
        auth.UserAdd(etcdrpc.AuthUserAddRequest(name="reader", password="reader"), timeout=5)
        auth.AuthEnable(etcdrpc.AuthEnableRequest(), timeout=5)


@pytest.fixture
def auth_etcd(tmp_path: Path, clusters: list[_Cluster]) -> str:
    cluster = _Cluster(tmp_path / "etcd-auth", ["--auth-token-ttl", "1"])
    clusters.append(cluster)
    cluster.start()
    _enable_auth(cluster.endpoints[0])
    return cluster.endpoints[0]


def test_user_and_password_work_and_expired_tokens_are_renewed(auth_etcd: str) -> None:
    uri = f"etcd://{auth_etcd}/sec?user=root&password={QUOTED}"
    with open_store(uri, deadline_s=5) as store:
        assert PASSWORD not in store.uri and QUOTED not in store.uri and "***" in store.uri
        store.put("a", b"1")
        kv = store.get("a")
        assert kv is not None and kv.value == b"1"
        events: list[str] = []
        seen = threading.Event()

        def on_event(ev: object) -> None:
            events.append(getattr(ev, "key", ""))
            seen.set()

        watch = store.watch("w/", on_event)
        lease = store.grant_lease(5)
        time.sleep(2.5)  # the token expires (--auth-token-ttl 1): the next call renews it
        store.keepalive(lease)
        store.create("w/x", b"2", lease=lease)
        assert seen.wait(10) and events == ["w/x"]
        assert store.cas("a", b"3", kv.version) > kv.version
        assert [k.key for k in store.list("w/")] == ["w/x"]
        watch.cancel()


def test_missing_or_wrong_credentials_are_typed_errors(auth_etcd: str, tmp_path: Path) -> None:
    with pytest.raises(MetadataError) as err:
        open_store(f"etcd://{auth_etcd}/sec", deadline_s=3)
    assert not isinstance(err.value, MetadataUnavailableError)
    with pytest.raises(MetadataError, match="authentication as user 'root' failed") as err:
        open_store(f"etcd://{auth_etcd}/sec?user=root&password=wrong", deadline_s=3)
    assert "wrong" not in str(err.value)
    with pytest.raises(MetadataError, match="permission denied"):  # authenticated, but no role
        open_store(f"etcd://{auth_etcd}/sec?user=reader&password=reader", deadline_s=3)
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD + "\n")
    with open_store(f"etcd://{auth_etcd}/sec?user=root&password_file={pw}", deadline_s=3) as store:
        store.put("from-file", b"ok")


def test_a_bookie_runs_on_an_authenticated_etcd(auth_etcd: str, tmp_path: Path) -> None:
    from zbk.client.digest import make_digest, master_key
    from zbk.wire import messages as w
    from zbk.wire.entry import build_entry
    from zbk.wire.status import Status

    pw = tmp_path / "pw"
    pw.write_text(PASSWORD)
    bk = BookieProcess(tmp_path, f"etcd://{auth_etcd}/bk?user=root&password_file={pw}")
    try:
        bk.start()
        with bk.connect() as c:
            entry = build_entry(1, 0, -1, b"hello", make_digest("crc32c", b"pw"))
            r = c.call(w.AddRequest(rid=1, ledger_id=1, master_key=master_key(b"pw"), flags=w.AddFlag(0),
                                    entries=[entry]))
            assert r.status == Status.EOK
        with open_store(f"etcd://{auth_etcd}/bk?user=root&password={QUOTED}") as store:
            assert [kv.key for kv in store.list("bookies/writable/")] == [f"bookies/writable/{bk.bookie_id}"]
        assert PASSWORD not in bk.log.read_text()
        assert bk.stop() == 0
    finally:
        if bk.proc is not None and bk.proc.poll() is None:
            bk.proc.kill()
            bk.proc.wait(10)


# --- TLS -----------------------------------------------------------------------------------------


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _make_certs(d: Path) -> None:
    d.mkdir(parents=True)
    (d / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=zbk-test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "2", "-extfile", "san.cnf", "-out", f"{name}.pem", cwd=d)


@pytest.fixture
def tls_etcd(tmp_path: Path, clusters: list[_Cluster]) -> tuple[str, Path]:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test certificates")
    certs = tmp_path / "certs"
    _make_certs(certs)
    client_opts = f"ca_cert={certs}/ca.pem&cert_cert={certs}/client.pem&cert_key={certs}/client.key"
    cluster = _Cluster(tmp_path / "etcd-tls", ["--cert-file", str(certs / "server.pem"), "--key-file",
                                               str(certs / "server.key"), "--trusted-ca-file", str(certs / "ca.pem"),
                                               "--client-cert-auth"], scheme="https", ca=client_opts)
    clusters.append(cluster)
    cluster.start()
    return cluster.endpoints[0], certs


def test_tls_with_client_certificates(tls_etcd: tuple[str, Path]) -> None:
    endpoint, certs = tls_etcd
    opts = f"ca_cert={certs}/ca.pem&cert_cert={certs}/client.pem&cert_key={certs}/client.key"
    with open_store(f"etcd://{endpoint}/tls?{opts}", deadline_s=5) as store:
        store.put("k", b"over tls")
        kv = store.get("k")
        assert kv is not None and kv.value == b"over tls"
    with pytest.raises(MetadataUnavailableError):  # plain text to a TLS port
        open_store(f"etcd://{endpoint}/tls", deadline_s=1.5, rpc_timeout_s=0.5)
    with pytest.raises(MetadataUnavailableError):  # TLS, but no client certificate
        open_store(f"etcd://{endpoint}/tls?ca_cert={certs}/ca.pem", deadline_s=1.5, rpc_timeout_s=0.5)


# --- URI options ----------------------------------------------------------------------------------


def test_etcd_uri_options(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    pw = tmp_path / "pw"
    pw.write_text("from file\n")
    parsed = parse_uri(f"etcd://h:1,h:2/s?user=u&password={QUOTED}&ca_cert={ca}&cert_cert={ca}&cert_key={ca}")
    assert parsed == EtcdUri(("h:1", "h:2"), "s", user="u", password=PASSWORD, ca_cert=str(ca), cert_key=str(ca),
                             cert_cert=str(ca))
    assert PASSWORD not in repr(parsed)
    assert parse_uri(f"etcd://h/s?user=u&password_file={pw}") == EtcdUri(("h:2379",), "s", user="u",
                                                                          password="from file")
    assert redact("etcd://h/s?user=u&password=abc&ca_cert=/x") == "etcd://h/s?user=u&password=***&ca_cert=/x"
    for uri, why in [
        ("etcd://h/s?user=u", "go together"),
        (f"etcd://h/s?password={QUOTED}", "go together"),
        ("etcd://h/s?user=u&password=a&password_file=/p", "exclude each other"),
        ("etcd://h/s?user=u&password_file=/nonexistent/pw", "cannot read password_file"),
        (f"etcd://h/s?cert_key={ca}", "go together"),
        ("etcd://h/s?ca_cert=/nonexistent.pem", "not a readable file"),
        ("etcd://h/s?user=u&user=v&password=p", "once"),
        ("etcd://h/s?user=&password=p", "not empty"),
        ("etcd://h/s?token=t", "no parameters but"),
    ]:
        with pytest.raises(ConfigError, match=why) as err:
            parse_uri(uri)
        assert "password=a" not in str(err.value) and QUOTED not in str(err.value)
