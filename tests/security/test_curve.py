"""ZeroMQ CURVE on a bookie: authorized clients work, everyone else gets nothing.

The bookie runs in this process (``zbk.bookie.process.Bookie``, real sockets on loopback,
real actors and disks), built from a BookieConfig with the CURVE keys, which the bookie
applies to its Server socket itself. Clients: the real client (``zbk.BookKeeper`` with the
CURVE keys in its ClientConfig) and raw DEALER sockets; and once, a `zbk bookie` process.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from helpers.procs import free_port

import zbk
from zbk.bookie.process import Bookie
from zbk.client.raw import BookieConnection
from zbk.client.transport import ZmqTransport
from zbk.config import BookieConfig, ClientConfig, CurveConfig, HttpConfig
from zbk.errors import BookieUnavailableError, ConfigError, UnauthorizedError
from zbk.wire import messages as w
from zbk.wire.codec import decode_response, encode
from zbk.wire.curve import CurveClient, CurveServer, generate_keypair, load_keypair, server_key_file_name
from zbk.wire.status import Status


class Keys:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.authorized = root / "authorized"
        self.authorized.mkdir(parents=True)
        self.server_public, self.server_secret = generate_keypair(str(root / "server"), "bookie")
        self.client_public, self.client_secret = generate_keypair(str(root / "clients"), "app")
        shutil.copy(self.client_public, self.authorized)
        self.stranger_public, self.stranger_secret = generate_keypair(str(root / "clients"), "stranger")
        _, self.other_server_secret = generate_keypair(str(root / "server"), "impostor")

    def client(self, secret: str | None = None, server_key: str | None = None) -> CurveClient:
        return CurveClient(secret or self.client_secret, server_public_key_file=server_key or self.server_public)


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path / "keys")


@pytest.fixture
def curve_bookie(tmp_path: Path, keys: Keys) -> Iterator[Bookie]:
    cfg = BookieConfig(metadata_uri=f"sqlite:///{tmp_path}/meta.db", data_dir=str(tmp_path / "bookie"),
                       port=free_port(), http=HttpConfig(port=free_port()), registration_ttl_s=2,
                       curve=CurveConfig(secret_key_file=keys.server_secret, authorized_keys_dir=str(keys.authorized)))
    bk = Bookie(cfg)
    bk.start()
    try:
        yield bk
    finally:
        bk.stop()


def raw_call(bookie_id: str, msg: Any, curve: CurveClient | None, timeout_s: float = 2.0) -> Any:
    """One request over a fresh DEALER; None when no answer came within ``timeout_s``."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        if curve is not None:
            curve.apply(sock, bookie_id)
        sock.connect(f"tcp://{bookie_id}")
        sock.send_multipart(encode(msg))
        if not sock.poll(int(timeout_s * 1000)):
            return None
        return decode_response(sock.recv_multipart())
    finally:
        sock.close(0)
        ctx.term()


def add_request(lid: int, rid: int = 1) -> w.AddRequest:
    from zbk.client.digest import make_digest, master_key
    from zbk.wire.entry import build_entry

    return w.AddRequest(rid=rid, ledger_id=lid, master_key=master_key(b"pw"), flags=w.AddFlag(0),
                        entries=[build_entry(lid, 0, -1, b"hello", make_digest("crc32c", b"pw"))])


def test_authorized_client_writes_and_reads_through_the_real_client(curve_bookie: Bookie, keys: Keys) -> None:
    uri = curve_bookie.cfg.metadata_uri
    config = ClientConfig(curve_secret_key_file=keys.client_secret,
                          curve_server_public_key_file=keys.server_public).validate()
    with zbk.BookKeeper(uri, config=config) as bk:  # the client applies its CURVE keys itself
        lh = bk.create_ledger(ensemble=1, write_quorum=1, ack_quorum=1, password=b"pw", digest="crc32c")
        for i in range(20):
            lh.append(f"entry {i}".encode())
        lh.close()
        rh = bk.open_ledger(lh.ledger_id, password=b"pw")
        assert [e.payload for e in rh.read(0, 19)] == [f"entry {i}".encode() for i in range(20)]


def test_clients_without_curve_get_nothing_and_store_nothing(curve_bookie: Bookie, keys: Keys) -> None:
    bid = curve_bookie.cfg.bookie_id
    assert raw_call(bid, add_request(77), curve=None) is None
    with BookieConnection(bid, timeout_s=1.0) as c, pytest.raises(BookieUnavailableError):
        c.call(w.BookieInfoRequest(rid=c.next_rid()))
    with zbk.BookKeeper(curve_bookie.cfg.metadata_uri, config=ClientConfig(add_timeout_ms=2000)) as bk:
        with pytest.raises(Exception) as err:  # noqa: PT011 - any typed failure, never a success
            lh = bk.create_ledger(ensemble=1, write_quorum=1, ack_quorum=1, password=b"pw")
            lh.append(b"x")
        assert isinstance(err.value, zbk.errors.ZbkError), err.value
    # Nothing reached the Server: the authorized client finds no trace of ledger 77.
    answer = raw_call(bid, w.ReadRequest(rid=2, ledger_id=77, first_entry_id=0), keys.client())
    assert answer is not None and answer.status == Status.ENOLEDGER
    assert 77 not in curve_bookie.server.ledgers  # type: ignore[union-attr]


def test_unknown_client_key_is_refused_with_a_typed_error(curve_bookie: Bookie, keys: Keys) -> None:
    bid = curve_bookie.cfg.bookie_id
    stranger = keys.client(secret=keys.stranger_secret)
    assert raw_call(bid, add_request(78), stranger) is None
    transport = ZmqTransport(curve=stranger)

    async def attempt() -> None:
        try:
            await transport.request(bid, w.BookieInfoRequest(rid=transport.next_rid()), timeout_s=5.0)
        finally:
            await transport.close()

    import asyncio

    started = time.monotonic()
    with pytest.raises(UnauthorizedError, match="refused this client's CURVE key"):
        asyncio.run(attempt())
    assert time.monotonic() - started < 4.0, "a refused key must fail fast, not time out"
    assert curve_bookie.server_loop.curve is not None and curve_bookie.server_loop.curve.denied > 0
    assert 78 not in curve_bookie.server.ledgers  # type: ignore[union-attr]


def test_wrong_server_key_gets_no_answer(curve_bookie: Bookie, keys: Keys) -> None:
    impostor_public = str(Path(keys.other_server_secret).with_suffix(".key"))
    assert raw_call(curve_bookie.cfg.bookie_id, w.BookieInfoRequest(rid=3),
                    keys.client(server_key=impostor_public)) is None


def test_a_key_authorized_at_runtime_is_accepted_for_new_connections(curve_bookie: Bookie, keys: Keys) -> None:
    bid = curve_bookie.cfg.bookie_id
    stranger = keys.client(secret=keys.stranger_secret)
    assert raw_call(bid, w.BookieInfoRequest(rid=4), stranger, timeout_s=1.0) is None
    time.sleep(0.02)  # the directory's mtime must move (ns resolution, but be safe on coarse clocks)
    shutil.copy(keys.stranger_public, keys.authorized)
    answer = raw_call(bid, w.BookieInfoRequest(rid=5), stranger, timeout_s=5.0)
    assert answer is not None and answer.status == Status.EOK
    # And revoked again: new connections are refused.
    (keys.authorized / Path(keys.stranger_public).name).unlink()
    time.sleep(0.02)
    assert raw_call(bid, w.BookieInfoRequest(rid=6), stranger, timeout_s=1.0) is None


def test_key_files_and_config_errors(tmp_path: Path, keys: Keys) -> None:
    public, secret = load_keypair(keys.client_secret)
    assert len(public) == 40 and len(secret) == 40
    with pytest.raises(ConfigError, match="no secret key"):
        load_keypair(keys.client_public)
    with pytest.raises(ConfigError):
        load_keypair(str(tmp_path / "missing.key_secret"))
    with pytest.raises(ConfigError, match="not overwriting"):
        generate_keypair(str(Path(keys.client_public).parent), "app")
    with pytest.raises(ConfigError, match="not a directory"):
        CurveServer(keys.server_secret, str(tmp_path / "nope"))
    with pytest.raises(ConfigError):
        ClientConfig(curve_secret_key_file=keys.client_secret).validate()
    with pytest.raises(ConfigError):
        ClientConfig(curve_server_public_key_file=keys.server_public).validate()
    # Per-bookie server keys: <host>_<port>.key, else server.key.
    d = tmp_path / "servers"
    d.mkdir()
    shutil.copy(keys.server_public, d / "127.0.0.1_3181.key")
    per_bookie = CurveClient(keys.client_secret, server_keys_dir=str(d))
    assert per_bookie.server_key_for("127.0.0.1:3181") == load_keypair(keys.server_secret)[0]
    with pytest.raises(ConfigError, match="no public key for bookie"):
        per_bookie.server_key_for("127.0.0.1:3182")


def test_per_bookie_key_files_are_named_after_the_id_whatever_its_form(tmp_path: Path, keys: Keys) -> None:
    assert server_key_file_name("127.0.0.1:3181") == "127.0.0.1_3181.key"
    assert server_key_file_name("bookie-a") == "bookie-a.key"
    assert server_key_file_name("[::1]:3181") == "[__1]_3181.key"
    for bad in ("", "../x", "a/b"):
        with pytest.raises(ConfigError, match="cannot name a key file"):
            server_key_file_name(bad)
    d = tmp_path / "servers"
    d.mkdir()
    shutil.copy(keys.server_public, d / "bookie-a.key")
    per_bookie = CurveClient(keys.client_secret, server_keys_dir=str(d))
    assert per_bookie.server_key_for("bookie-a") == load_keypair(keys.server_secret)[0]
    with pytest.raises(ConfigError, match="no public key for bookie bookie-b"):
        per_bookie.server_key_for("bookie-b")


def test_a_curve_bookie_with_a_name_id_is_reached_with_its_own_key_file(tmp_path: Path, keys: Keys) -> None:
    """The client finds the bookie's address through its registration and its server key
    in ``curve_server_keys_dir/<id>.key``; ``server.key`` would be another bookie's key, so
    only the file named after the id can make the handshake succeed."""
    servers = tmp_path / "servers"
    servers.mkdir()
    shutil.copy(keys.server_public, servers / "bookie-curve.key")
    impostor_public = str(Path(keys.other_server_secret).with_suffix(".key"))
    shutil.copy(impostor_public, servers / "server.key")
    uri = f"sqlite:///{tmp_path}/meta.db"
    cfg = BookieConfig(metadata_uri=uri, data_dir=str(tmp_path / "bookie"), bookie_id="bookie-curve",
                       port=free_port(), http=HttpConfig(port=free_port()), registration_ttl_s=2,
                       curve=CurveConfig(secret_key_file=keys.server_secret, authorized_keys_dir=str(keys.authorized)))
    bookie = Bookie(cfg)
    bookie.start()
    try:
        config = ClientConfig(curve_secret_key_file=keys.client_secret, curve_server_keys_dir=str(servers),
                              add_timeout_ms=5000, read_timeout_ms=5000).validate()
        with zbk.BookKeeper(uri, config=config) as bk:
            lh = bk.create_ledger(ensemble=1, write_quorum=1, ack_quorum=1, password=b"pw")
            assert lh.metadata.ensembles[0] == ["bookie-curve"]
            assert [lh.append(b"%d" % i) for i in range(5)] == list(range(5))
            lh.close()
            rh = bk.open_ledger(lh.ledger_id, password=b"pw")
            assert [e.payload for e in rh.read(0, 4)] == [b"%d" % i for i in range(5)]
    finally:
        bookie.stop()


def test_keygen_command_writes_a_usable_pair(tmp_path: Path) -> None:
    from zbk.cli.main import main

    assert main(["keygen", "--dir", str(tmp_path), "--name", "b1"]) == 0
    public, secret = load_keypair(str(tmp_path / "b1.key_secret"))
    assert (tmp_path / "b1.key").exists() and (tmp_path / "b1.key_secret").stat().st_mode & 0o077 == 0
    assert main(["keygen", "--dir", str(tmp_path), "--name", "b1"]) == 2  # never overwrites


def test_a_bookie_process_with_curve_keys_serves_only_authorized_clients(tmp_path: Path, keys: Keys) -> None:
    from helpers.bookie import BookieProcess

    uri = f"sqlite:///{tmp_path}/meta.db"
    b = BookieProcess(tmp_path, uri, name="curve", settings={"curve_secret_key_file": keys.server_secret,
                                                             "curve_authorized_keys_dir": str(keys.authorized)})
    b.start(wait=False)
    try:
        deadline = time.monotonic() + 30
        answer = None
        while answer is None and time.monotonic() < deadline:
            assert b.proc is not None and b.proc.poll() is None, b.log_tail()
            answer = raw_call(b.bookie_id, w.BookieInfoRequest(rid=1), keys.client(), timeout_s=0.5)
        assert answer is not None and answer.status == Status.EOK
        assert raw_call(b.bookie_id, w.BookieInfoRequest(rid=2), curve=None, timeout_s=1.0) is None
        assert raw_call(b.bookie_id, w.BookieInfoRequest(rid=3), keys.client(keys.stranger_secret),
                        timeout_s=1.0) is None
        config = ClientConfig(curve_secret_key_file=keys.client_secret,
                              curve_server_public_key_file=keys.server_public).validate()
        with zbk.BookKeeper(uri, config=config) as bk:
            lh = bk.create_ledger(ensemble=1, write_quorum=1, ack_quorum=1, password=b"pw")
            assert [lh.append(b"%d" % i) for i in range(5)] == list(range(5))
            lh.close()
        assert b.stop() == 0
    finally:
        if b.proc is not None and b.proc.poll() is None:
            b.proc.kill()
            b.proc.wait(10)


def _shell(uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zbk.cli.main", "shell", "--metadata", uri, *args],
                          capture_output=True, text=True, timeout=120)


def test_shell_commands_reach_a_curve_bookie_with_the_keys_given_by_set(curve_bookie: Bookie, keys: Keys) -> None:
    uri, bid = curve_bookie.cfg.metadata_uri, curve_bookie.cfg.bookie_id
    with_keys = ["--set", f"curve_secret_key_file={keys.client_secret}",
                 "--set", f"curve_server_public_key_file={keys.server_public}"]
    without = _shell(uri, "--timeout", "1", "bookieinfo", bid)
    assert without.returncode == 3 and "did not answer" in without.stderr, without
    info = _shell(uri, "--json", *with_keys, "bookieinfo", bid)
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["state"] == "writable"
    test = _shell(uri, "--json", *with_keys, "--ensemble", "1", "--write-quorum", "1", "--ack-quorum", "1",
                  "--entries", "50", "simpletest")
    assert test.returncode == 0 and json.loads(test.stdout)["ok"], test.stdout + test.stderr
    # A ledger written by the real client, then read back entry by entry through the shell.
    config = ClientConfig(curve_secret_key_file=keys.client_secret,
                          curve_server_public_key_file=keys.server_public).validate()
    with zbk.BookKeeper(uri, config=config) as bk:
        lh = bk.create_ledger(ensemble=1, write_quorum=1, ack_quorum=1, password=b"pw")
        for i in range(3):
            lh.append(b"shell %d" % i)
        lh.close()
    read = _shell(uri, "--json", *with_keys, "--password", "pw", "readledger", str(lh.ledger_id))
    assert read.returncode == 0, read.stderr
    assert [r["entry_id"] for r in json.loads(read.stdout)] == [0, 1, 2]
    held = _shell(uri, "--json", *with_keys, "--bookie", bid, "ledgerentries", str(lh.ledger_id))
    assert held.returncode == 0 and json.loads(held.stdout)["ranges"] == [[0, 2]], held.stdout + held.stderr
    bad = _shell(uri, "--set", "curve_secret_key_file=/nonexistent.key_secret",
                 "--set", f"curve_server_public_key_file={keys.server_public}", "bookieinfo", bid)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "nonexistent" in bad.stderr, bad


def test_autorecovery_inside_curve_bookies_replaces_a_killed_bookie(tmp_path: Path, keys: Keys) -> None:
    """autorecovery_enabled on CURVE bookies: the in-process auditor and replicators reach
    the other bookies with the bookie's own key pair (bookies share one here, and its public
    half is authorized), so a killed bookie is replaced."""
    from helpers.bookie import BookieProcess
    from helpers.wait import wait_until

    from zbk.metadata.registry import LedgerStore
    from zbk.metadata.uri import open_store

    shutil.copy(keys.server_public, keys.authorized)  # the bookies' own connections to each other
    uri = f"sqlite:///{tmp_path}/meta.db"
    settings: dict[str, object] = {"curve_secret_key_file": keys.server_secret,
                                   "curve_authorized_keys_dir": str(keys.authorized),
                                   "autorecovery_enabled": True, "lost_bookie_recovery_delay_s": 0}
    bookies = [BookieProcess(tmp_path, uri, name=f"b{i}", settings=settings, curve=keys.client()) for i in range(4)]
    store = open_store(uri)
    config = ClientConfig(curve_secret_key_file=keys.client_secret, curve_server_public_key_file=keys.server_public,
                          add_timeout_ms=2000, read_timeout_ms=1500).validate()
    try:
        for b in bookies:
            b.start()
        with zbk.BookKeeper(uri, config=config) as bk:
            lids = []
            for n in range(3):
                lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2, password=b"pw")
                for i in range(100):
                    lh.append(b"ledger %d entry %d" % (n, i))
                lh.close()
                lids.append(lh.ledger_id)
            ledgers = LedgerStore(store)
            victim = next(b for b in bookies if any(b.bookie_id in ledgers.read(lid)[0].all_bookies() for lid in lids))
            victim.kill9()
            wait_until(lambda: all(victim.bookie_id not in ledgers.read(lid)[0].all_bookies() for lid in lids),
                       timeout_s=90, interval_s=0.3, message="the CURVE bookies' replicators to replace the dead one")
            for n, lid in enumerate(lids):
                rh = bk.open_ledger(lid, password=b"pw")
                assert [e.payload for e in rh.read(0, 99)] == [b"ledger %d entry %d" % (n, i) for i in range(100)]
            for b in bookies:
                if b is not victim:
                    assert b.stop() == 0, b.log_tail()
    finally:
        store.close()
        for b in bookies:
            if b.proc is not None and b.proc.poll() is None:
                b.proc.kill()
                b.proc.wait(10)
