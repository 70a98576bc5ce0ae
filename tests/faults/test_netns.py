"""The network-namespace harness and its nftables faults, checked with real sockets: a probe
in each host (faults.probe) connects over TCP and sends UDP datagrams to the others."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest
from helpers.procs import start_process, stop_process, tail

from faults.conftest import NetworkFactory
from faults.netns import IP, NetnsError, Network, list_netns
from faults.probe import Probe

TCP_PORT = 7000
OTHER_PORT = 7002
UDP_PORT = 7001
SINK_PORT = 7003
FAIL_S = 0.5  # connect timeout where a connect must fail: the SYN is dropped, nothing answers
REPO = Path(__file__).resolve().parents[2]


def start_probes(net: Network, tmp_path: Path) -> dict[str, Probe]:
    probes = {}
    for name in net.hosts:
        p = Probe(net, name, tmp_path / f"probe-{name}.log")
        p.must("listen_tcp", port=TCP_PORT)
        p.must("bind_udp", port=UDP_PORT)
        probes[name] = p
    return probes


def pairs(*groups: Iterable[str]) -> set[tuple[str, str]]:
    """Every ordered pair of distinct hosts within each group."""
    return {(a, b) for g in groups for a, b in itertools.permutations(list(g), 2)}


def reachability(probes: dict[str, Probe], expected: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Which (src, dst) pairs deliver a UDP datagram now: every host sends one to every other.
    Waits (up to 10 s) for the ``expected`` ones, then a little longer for any others."""
    tag = uuid.uuid4().hex[:8]
    for s, ps in probes.items():
        for d, pd in probes.items():
            if s != d:
                ps.must("send_udp", addr=pd.addr, port=UDP_PORT, data=f"{tag}/{s}")
    got: set[tuple[str, str]] = set()

    def collect() -> None:
        for d, pd in probes.items():
            for src_addr, data in pd.must("received_udp")["datagrams"]:
                t, s = data.split("/")
                if t == tag:
                    assert src_addr == probes[s].addr, f"datagram from {s} came from {src_addr}"
                    got.add((s, d))

    deadline = time.monotonic() + 10
    while True:
        collect()
        if expected <= got or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    time.sleep(0.3)
    collect()
    return got


def connects(src: Probe, dst: Probe, port: int = TCP_PORT, timeout: float = 5.0) -> bool:
    return bool(src.must("connect", addr=dst.addr, port=port, timeout=timeout)["connected"])


def assert_gone(prefix: str, pids: Iterable[int]) -> None:
    left = [n for n in list_netns() if n.startswith(prefix + "-")]
    assert not left, f"namespaces left behind: {left}"
    links = subprocess.run([IP, "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert prefix not in links
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_hosts_talk_over_their_loopback_range_addresses(network: NetworkFactory, tmp_path: Path) -> None:
    net = network(["a", "b"])
    assert [h.addr for h in net.hosts.values()] == ["127.77.0.1", "127.77.0.2"]
    assert sorted(net.namespaces()) == sorted([net.bridge_netns, *(h.netns for h in net.hosts.values())])
    for h in net.hosts.values():
        assert net.run(h.name, ["cat", "/proc/sys/net/ipv4/conf/all/route_localnet",
                                "/proc/sys/net/ipv4/conf/eth0/route_localnet"]).stdout.split() == ["1", "1"]
    # The other host's address goes out on eth0, not back into lo.
    route = net.run("a", [IP, "route", "get", "127.77.0.2"]).stdout
    assert "dev eth0" in route and "src 127.77.0.1" in route, route
    p = start_probes(net, tmp_path)
    assert p["a"].must("connect", addr="127.77.0.2", port=TCP_PORT, timeout=5.0) == {
        "ok": True, "connected": True, "local": "127.77.0.1"}
    assert p["b"].must("accepted")["peers"] == ["127.77.0.1"]
    assert connects(p["b"], p["a"])
    assert p["a"].must("accepted")["peers"] == ["127.77.0.2"]
    assert reachability(p, pairs("ab")) == pairs("ab")
    # The probes run inside the hosts under the PIDs the harness handed back.
    assert p["a"].pid in net.pids("a") and p["b"].pid in net.pids("b")


def test_isolate_cuts_both_ways_and_heal_restores(network: NetworkFactory, tmp_path: Path) -> None:
    net = network(["a", "b", "c"])
    p = start_probes(net, tmp_path)
    net.faults.isolate("a")
    assert reachability(p, pairs("bc")) == pairs("bc")
    assert not connects(p["a"], p["b"], timeout=FAIL_S)
    assert not connects(p["b"], p["a"], timeout=FAIL_S)
    assert not connects(p["c"], p["a"], timeout=FAIL_S)
    assert connects(p["b"], p["c"])
    net.faults.heal()
    assert reachability(p, pairs("abc")) == pairs("abc")
    assert connects(p["a"], p["b"]) and connects(p["b"], p["a"])


def test_one_way_loss_drops_exactly_one_direction(network: NetworkFactory, tmp_path: Path) -> None:
    net = network(["a", "b"])
    p = start_probes(net, tmp_path)
    net.faults.one_way("a", "b")
    assert reachability(p, {("b", "a")}) == {("b", "a")}
    # a -> b: a's SYN never arrives, so b holds no half-open connection.
    assert not connects(p["a"], p["b"], timeout=FAIL_S)
    assert p["b"].must("syn_recv", port=TCP_PORT)["count"] == 0
    # b -> a: b's SYN arrives (a holds it half-open) but a's SYN-ACK is lost on the way back.
    assert not connects(p["b"], p["a"], timeout=FAIL_S)
    assert p["a"].must("syn_recv", port=TCP_PORT)["count"] >= 1
    assert p["a"].must("accepted")["peers"] == [] and p["b"].must("accepted")["peers"] == []
    assert "127.77.0.1" in net.faults.rules("b") and "127.77.0.2" not in net.faults.rules("a")
    net.faults.heal()
    assert reachability(p, pairs("ab")) == pairs("ab")
    assert connects(p["a"], p["b"]) and connects(p["b"], p["a"])


def test_split_into_majority_and_minority(network: NetworkFactory, tmp_path: Path) -> None:
    net = network(["a", "b", "c", "d", "e"])
    p = start_probes(net, tmp_path)
    net.faults.split(["a", "b", "c"], ["d", "e"])
    assert reachability(p, pairs("abc", "de")) == pairs("abc", "de")
    assert not connects(p["a"], p["d"], timeout=FAIL_S)
    assert connects(p["a"], p["c"]) and connects(p["e"], p["d"])
    with pytest.raises(ValueError, match="exactly once"):
        net.faults.split(["a", "b"], ["d", "e"])  # c in no group
    net.faults.heal()
    assert reachability(p, pairs("abcde")) == pairs("abcde")


def test_bridge_joins_two_sides_through_one_host(network: NetworkFactory, tmp_path: Path) -> None:
    net = network(["a", "b", "c", "d", "e"])
    p = start_probes(net, tmp_path)
    net.faults.bridge(["a", "b"], ["d", "e"], via="c")
    want = pairs("abc", "cde")
    assert reachability(p, want) == want
    assert connects(p["a"], p["c"]) and connects(p["c"], p["e"])
    assert not connects(p["b"], p["d"], timeout=FAIL_S)
    net.faults.heal()
    assert reachability(p, pairs("abcde")) == pairs("abcde")


def test_cut_by_port_leaves_the_rest_of_the_traffic(network: NetworkFactory, tmp_path: Path) -> None:
    """The zombie shape: a client loses one server port of a host (a bookie's wire port)
    while its other port (etcd's, say) and every other client still reach it."""
    net = network(["client", "server", "other"])
    p = start_probes(net, tmp_path)
    p["server"].must("listen_tcp", port=OTHER_PORT)
    net.faults.zombie("server", ["client"], port=TCP_PORT)
    assert not connects(p["client"], p["server"], timeout=FAIL_S)
    assert connects(p["client"], p["server"], port=OTHER_PORT)
    assert connects(p["other"], p["server"])
    assert connects(p["server"], p["client"])  # the server's own connections to the client
    assert reachability(p, pairs(net.hosts)) == pairs(net.hosts)
    p["other"].must("listen_tcp", port=OTHER_PORT)
    net.faults.lose_etcd("client", ["other"], port=TCP_PORT)
    assert not connects(p["client"], p["other"], timeout=FAIL_S)
    assert connects(p["client"], p["other"], port=OTHER_PORT)
    net.faults.heal()
    assert connects(p["client"], p["server"]) and connects(p["client"], p["other"])


def test_rate_cap_with_tbf(network: NetworkFactory, tmp_path: Path) -> None:
    net = network(["a", "b"])
    p = start_probes(net, tmp_path)
    p["b"].must("listen_sink", port=SINK_PORT)
    nbytes = 1_000_000
    net.faults.cap("a", "4mbit")  # 1 MB at 4 Mbit/s: 2 s
    capped = p["a"].must("transfer", addr=p["b"].addr, port=SINK_PORT, nbytes=nbytes, timeout=30.0)
    assert capped["acked"] and capped["seconds"] >= 1.5, capped
    net.faults.heal()
    free = p["a"].must("transfer", addr=p["b"].addr, port=SINK_PORT, nbytes=nbytes, timeout=30.0)
    assert free["acked"] and free["seconds"] < capped["seconds"] / 2, (free, capped)


def test_teardown_removes_every_namespace_link_and_process(tmp_path: Path) -> None:
    with Network(["a", "b"]) as net:
        p = start_probes(net, tmp_path)
        net.faults.isolate("a")
        pids = [q.pid for q in p.values()]
        # a grandchild too: teardown kills what runs in a host, not only what it started
        sleeper = net.start("b", ["sh", "-c", "sleep 600 & wait"])
        time.sleep(0.3)
        pids += net.pids("b")
        assert len(net.namespaces()) == 3
    assert sleeper.poll() is not None
    assert_gone(net.prefix, pids)


def test_teardown_after_an_exception_inside_the_context(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with Network(["a", "b"]) as net:
            p = start_probes(net, tmp_path)
            net.faults.split(["a"], ["b"])
            raise RuntimeError("boom")
    assert_gone(net.prefix, [q.pid for q in p.values()])


CHILD = """
import faulthandler, json, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for stacks if it hangs
# SIGINT as Python sets it up when it is not ignored: a suite started as a background job of
# a non-interactive shell passes SIGINT ignored to its children, and a Network keeps an
# ignored signal ignored.
signal.signal(signal.SIGINT, signal.default_int_handler)
from faults.netns import Network
net = Network(["a", "b"]).create()
proc = net.start("a", ["sleep", "600"])
net.faults.isolate("a")
with open(sys.argv[1], "w") as f:
    json.dump({"prefix": net.prefix, "pid": proc.pid}, f)
time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_tears_everything_down(tmp_path: Path, sig: signal.Signals) -> None:
    """Ctrl-C (SIGINT) or SIGTERM to a process that holds a network: its handlers remove
    every namespace and stop every process before the process ends."""
    out = tmp_path / "child.json"
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'tests'}")
    child = start_process([sys.executable, "-c", CHILD, str(out)], tmp_path / "child.log", env=env)
    try:
        deadline = time.monotonic() + 60
        while not out.exists() or not out.read_text():
            assert child.poll() is None, tail(tmp_path / "child.log")
            assert time.monotonic() < deadline, tail(tmp_path / "child.log")
            time.sleep(0.05)
        info = json.loads(out.read_text())
        assert len([n for n in list_netns() if n.startswith(info["prefix"] + "-")]) == 3
        os.kill(child.pid, sig)
        try:
            code = child.wait(60)
        except subprocess.TimeoutExpired:
            os.kill(child.pid, signal.SIGUSR1)  # every thread's stack, into its log
            time.sleep(1)
            pytest.fail(f"still running 60 s after signal {sig.name}:\n{tail(tmp_path / 'child.log', 120)}")
    finally:
        stop_process(child, kill=True)
    assert code == -sig, f"exit {code}:\n{tail(tmp_path / 'child.log')}"
    assert_gone(info["prefix"], [info["pid"]])


UNPRIVILEGED = """
from faults.netns import Network, NetnsError
try:
    Network(["a"]).create()
except NetnsError as e:
    print(e)
    raise SystemExit(3)
"""


def test_no_namespace_is_a_clear_error_not_a_skip(tmp_path: Path) -> None:
    """Without the capabilities to make a namespace, building a network raises NetnsError
    that says what is missing (run here with every capability dropped)."""
    env = dict(os.environ, PYTHONPATH=f"{REPO}:{REPO / 'tests'}")
    before = set(list_netns())
    r = subprocess.run(["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-c", UNPRIVILEGED],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "cannot create network namespace" in r.stdout and "root" in r.stdout, r.stdout
    assert set(list_netns()) <= before


def test_a_dead_runs_namespaces_are_swept(network: NetworkFactory) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"zbkf{dead.pid}-1-x"
    subprocess.run([IP, "netns", "add", stale], check=True)
    try:
        network(["a"])
        assert stale not in list_netns()
    finally:
        if stale in list_netns():
            subprocess.run([IP, "netns", "delete", stale], check=True)


def test_bad_host_names_and_fault_arguments_are_refused(network: NetworkFactory) -> None:
    with pytest.raises(ValueError, match="unique"):
        Network(["a", "a"])
    with pytest.raises(ValueError, match="bad host name"):
        Network(["A-1"])
    net = network(["a", "b", "c"])
    with pytest.raises(ValueError, match="no host"):
        net.faults.isolate("z")
    with pytest.raises(ValueError, match="exactly once"):
        net.faults.bridge(["a"], ["b", "c"], via="c")
    assert not net.faults.drops
    with pytest.raises(NetnsError):
        net.run("a", ["false"])
