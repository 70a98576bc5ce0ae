"""Network faults between the hosts of a :class:`faults.netns.Network`, made with nftables.

Every fault is a set of one-way drops. A drop ``src -> dst`` is a rule in ``dst``'s own
namespace, in the input hook of the table ``inet zbkfault``: the packet crosses the bridge
and vanishes on arrival. Dropping on arrival rather than on departure keeps the sender
unaware, as a real network would: a drop in the output hook makes the sender's own send()
fail with EPERM.

No rule looks at connection-tracking state, so an established TCP connection is cut as
surely as a new one (its segments stop arriving), and a one-way drop on an open connection
lets requests arrive while the replies are lost.

Faults add up until :meth:`NetFaults.heal`, which removes every rule and every rate cap.
Each fault method returns the drops it asked for, and :meth:`NetFaults.lift` takes back one
fault's drops alone: a drop that two faults asked for (two isolated hosts cut from each
other) stays until both are lifted, so overlapping faults of a chaos run end one by one.
Each change rewrites the input chain of each host it touches in one nft transaction.

This kernel has no netem qdisc, so nothing here delays or randomly loses packets; rate
caps use tbf (:meth:`NetFaults.cap`), which shapes a host's egress on its ``eth0``.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from faults.netns import FAULT_TABLE, HOST_IF, IP, NFT, TC, Host, run

if TYPE_CHECKING:
    from faults.netns import Network

ETCD_CLIENT_PORT = 2379


@dataclass(frozen=True, order=True)
class Drop:
    """Packets from host ``src`` to host ``dst`` vanish (only TCP to ``dport`` or from
    ``sport``, when given)."""

    src: str
    dst: str
    dport: int | None = None
    sport: int | None = None

    def rule(self, hosts: dict[str, Host]) -> str:
        r = f"ip saddr {hosts[self.src].addr} ip daddr {hosts[self.dst].addr}"
        if self.dport is not None:
            r += f" tcp dport {self.dport}"
        if self.sport is not None:
            r += f" tcp sport {self.sport}"
        return r + " counter drop"


class NetFaults:
    def __init__(self, net: Network) -> None:
        self.net = net
        self._drops: Counter[Drop] = Counter()  # each drop, with how many faults asked for it
        self._caps: set[str] = set()

    def install(self, host: Host) -> None:
        """The empty table and chain of one host (the network calls this as it builds it)."""
        self._nft(host, f"add table inet {FAULT_TABLE}\n"
                        f"add chain inet {FAULT_TABLE} input {{ type filter hook input priority filter; policy accept; }}\n")

    @property
    def drops(self) -> frozenset[Drop]:
        return frozenset(self._drops)

    def lift(self, drops: Iterable[Drop]) -> None:
        """Take back the drops of one fault (what one of the fault methods returned)."""
        touched = set()
        for d in set(drops):
            if self._drops[d] > 0:
                self._drops[d] -= 1
                if self._drops[d] == 0:
                    del self._drops[d]
                    touched.add(d.dst)
        self._apply(touched)

    # --- the faults ----------------------------------------------------------------------

    def one_way(self, src: str, dst: str) -> list[Drop]:
        """Packets from ``src`` to ``dst`` are lost; ``dst`` to ``src`` still arrive."""
        return self._add([Drop(src, dst)])

    def cut(self, a: str, b: str, *, port: int | None = None) -> list[Drop]:
        """Cut ``a`` and ``b`` both ways; with ``port``, only TCP to that port of ``b`` (and
        its replies), so that their other traffic flows on."""
        if port is None:
            return self._add([Drop(a, b), Drop(b, a)])
        return self._add([Drop(a, b, dport=port), Drop(b, a, sport=port)])

    def isolate(self, host: str) -> list[Drop]:
        """``host`` can reach no other host, nor any reach it."""
        self.net.host(host)
        return self._add(d for other in self.net.hosts if other != host
                         for d in (Drop(host, other), Drop(other, host)))

    def split(self, *groups: Iterable[str]) -> list[Drop]:
        """Partition the hosts: every host in exactly one group (a majority and a minority,
        say); hosts talk within their group only."""
        gs = [list(g) for g in groups]
        self._check_cover(gs)
        if len(gs) < 2:
            raise ValueError("a split needs at least two groups")
        return self._add(d for g1, g2 in itertools.combinations(gs, 2) for a in g1 for b in g2
                         for d in (Drop(a, b), Drop(b, a)))

    def bridge(self, side_a: Iterable[str], side_b: Iterable[str], via: str) -> list[Drop]:
        """Two sides that reach each other only through ``via``, which reaches both."""
        a, b = list(side_a), list(side_b)
        self._check_cover([a, b, [via]])
        return self._add(d for x in a for y in b for d in (Drop(x, y), Drop(y, x)))

    def zombie(self, bookie: str, clients: Iterable[str], port: int) -> list[Drop]:
        """Clients cannot reach the bookie's wire ``port`` (nor it them on it); the bookie
        still talks to etcd, so it keeps its registration."""
        return self._add(d for c in clients for d in (Drop(c, bookie, dport=port), Drop(bookie, c, sport=port)))

    def lose_etcd(self, host: str, etcd_hosts: Iterable[str], port: int = ETCD_CLIENT_PORT) -> list[Drop]:
        """``host`` cannot reach etcd's client ``port`` on any of ``etcd_hosts`` (its lease
        runs out) while everything else it does still flows."""
        return self._add(d for e in etcd_hosts for d in (Drop(host, e, dport=port), Drop(e, host, sport=port)))

    def cap(self, host: str, rate: str, *, burst: str = "32kb", latency: str = "100ms") -> None:
        """Cap ``host``'s outgoing bandwidth with tbf (``rate`` as tc takes it: "4mbit")."""
        h = self.net.host(host)
        run([IP, "netns", "exec", h.netns, TC, "qdisc", "replace", "dev", HOST_IF, "root", "tbf",
             "rate", rate, "burst", burst, "latency", latency])
        self._caps.add(host)

    def heal(self) -> None:
        """Remove every drop and every rate cap."""
        touched = {d.dst for d in self._drops}
        self._drops.clear()
        self._apply(touched)
        for host in sorted(self._caps):
            run([IP, "netns", "exec", self.net.host(host).netns, TC, "qdisc", "del", "dev", HOST_IF, "root"])
        self._caps.clear()

    def rules(self, host: str) -> str:
        """The host's fault table as nft lists it (with counters)."""
        return run([IP, "netns", "exec", self.net.host(host).netns, NFT, "list", "table", "inet", FAULT_TABLE])

    # --- machinery -----------------------------------------------------------------------

    def _check_cover(self, groups: Sequence[Sequence[str]]) -> None:
        names = [n for g in groups for n in g]
        for n in names:
            self.net.host(n)
        if any(not g for g in groups):
            raise ValueError(f"empty group in {groups}")
        if len(set(names)) != len(names) or set(names) != set(self.net.hosts):
            raise ValueError(f"groups {groups} must hold every host ({sorted(self.net.hosts)}) exactly once")

    def _add(self, drops: Iterable[Drop]) -> list[Drop]:
        asked = sorted(set(drops))
        for d in asked:
            self.net.host(d.src), self.net.host(d.dst)
            if d.src == d.dst:
                raise ValueError(f"a host cannot be cut from itself: {d}")
        new = [d for d in asked if d not in self._drops]
        self._drops.update(asked)
        self._apply({d.dst for d in new})
        return asked

    def _apply(self, hosts: Iterable[str]) -> None:
        for name in sorted(set(hosts)):
            rules = sorted(d for d in self._drops if d.dst == name)
            script = f"flush chain inet {FAULT_TABLE} input\n"
            script += "".join(f"add rule inet {FAULT_TABLE} input {d.rule(self.net.hosts)}\n" for d in rules)
            self._nft(self.net.host(name), script)

    def _nft(self, host: Host, script: str) -> None:
        run([IP, "netns", "exec", host.netns, NFT, "-f", "-"], stdin=script)
