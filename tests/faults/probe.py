"""A socket probe that runs inside one host and answers JSON requests, one per line.

Run as a script (stdlib only) inside a host, it reads requests on stdin and writes one
JSON answer per request on stdout. :class:`Probe` starts one in a host of a Network and
calls it. The operations:

* ``listen_tcp port``: accept on (host address, port) and echo what each connection sends;
  ``accepted`` drains the peers seen so far;
* ``connect addr port timeout``: connect, send 4 bytes, read them back: ``connected`` or
  the error;
* ``bind_udp port`` / ``send_udp addr port data`` / ``received_udp``: datagrams, with the
  sender's address, drained by the last;
* ``syn_recv port``: how many half-open connections (SYN received, our SYN-ACK never
  answered) the host holds on a local port: proof that a SYN arrived;
* ``listen_sink port`` / ``transfer addr port nbytes timeout``: time to push nbytes to a sink
  that acknowledges the whole with one byte.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

PING = b"ping"


class _Agent:
    def __init__(self, addr: str) -> None:
        self.addr = addr
        self.lock = threading.Lock()
        self.accepted: list[str] = []
        self.datagrams: list[tuple[str, str]] = []

    def _serve(self, srv: socket.socket, handle: Any) -> None:
        while True:
            conn, peer = srv.accept()
            threading.Thread(target=handle, args=(conn, peer), daemon=True).start()

    def _listen(self, port: int, handle: Any) -> None:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind((self.addr, port))
        srv.listen(64)
        threading.Thread(target=self._serve, args=(srv, handle), daemon=True).start()

    def _echo(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        with self.lock:
            self.accepted.append(peer[0])
        with conn:
            conn.settimeout(10)
            try:
                conn.sendall(conn.recv(len(PING)))
            except OSError:
                pass

    def _sink(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        with conn:
            conn.settimeout(60)
            try:
                while conn.recv(1 << 16):
                    pass
                conn.sendall(b"k")
            except OSError:
                pass

    def _recv_udp(self, s: socket.socket) -> None:
        while True:
            data, peer = s.recvfrom(2048)
            with self.lock:
                self.datagrams.append((peer[0], data.decode()))

    def op_listen_tcp(self, port: int) -> dict[str, Any]:
        self._listen(port, self._echo)
        return {}

    def op_listen_sink(self, port: int) -> dict[str, Any]:
        self._listen(port, self._sink)
        return {}

    def op_accepted(self) -> dict[str, Any]:
        with self.lock:
            peers, self.accepted = self.accepted, []
        return {"peers": peers}

    def op_connect(self, addr: str, port: int, timeout: float) -> dict[str, Any]:
        try:
            with socket.create_connection((addr, port), timeout=timeout) as s:
                s.sendall(PING)
                got = s.recv(len(PING))
                if got != PING:
                    return {"connected": False, "error": f"echo {got!r}"}
                return {"connected": True, "local": s.getsockname()[0]}
        except OSError as e:
            return {"connected": False, "error": f"{type(e).__name__}: {e}"}

    def op_bind_udp(self, port: int) -> dict[str, Any]:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((self.addr, port))
        threading.Thread(target=self._recv_udp, args=(s,), daemon=True).start()
        return {}

    def op_send_udp(self, addr: str, port: int, data: str) -> dict[str, Any]:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((self.addr, 0))
            s.sendto(data.encode(), (addr, port))
        return {}

    def op_received_udp(self) -> dict[str, Any]:
        with self.lock:
            got, self.datagrams = self.datagrams, []
        return {"datagrams": got}

    def op_syn_recv(self, port: int) -> dict[str, Any]:
        n = 0
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].split(":")[1], 16)
            if local_port == port and fields[3] == "03":  # TCP_SYN_RECV
                n += 1
        return {"count": n}

    def op_transfer(self, addr: str, port: int, nbytes: int, timeout: float) -> dict[str, Any]:
        t0 = time.monotonic()
        with socket.create_connection((addr, port), timeout=timeout) as s:
            s.sendall(b"x" * nbytes)
            s.shutdown(socket.SHUT_WR)
            acked = s.recv(1) == b"k"
        return {"acked": acked, "seconds": time.monotonic() - t0}


def main() -> None:
    agent = _Agent(sys.argv[1])
    for line in sys.stdin:
        req = json.loads(line)
        op = req.pop("op")
        try:
            resp = {"ok": True, **getattr(agent, f"op_{op}")(**req)}
        except Exception as e:  # noqa: BLE001 - handed back to the caller
            resp = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(resp) + "\n")
        sys.stdout.flush()


class Probe:
    """A probe agent running inside ``host`` of ``net`` (stopped by PID at the network's
    teardown, or by :meth:`stop`)."""

    def __init__(self, net: Any, host: str, log_path: Path) -> None:
        self.host = host
        self.addr = net.host(host).addr
        self.log_path = log_path
        self.net = net
        self.proc = net.start(host, [sys.executable, "-u", __file__, self.addr], log_path=log_path,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def call(self, op: str, *, wait_s: float = 30.0, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps({"op": op, **kw}) + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], wait_s)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            raise AssertionError(f"probe in {self.host} gave no answer to {op} {kw}:\n{_tail(self.log_path)}")
        resp: dict[str, Any] = json.loads(line)
        return resp

    def must(self, op: str, **kw: Any) -> dict[str, Any]:
        """``call``, failing the test unless the operation itself worked."""
        resp = self.call(op, **kw)
        assert resp["ok"], f"{op} {kw} in {self.host}: {resp}"
        return resp

    def stop(self) -> None:
        self.net.stop(self.proc)


def _tail(path: Path) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-20:])
    except FileNotFoundError:
        return "(no log)"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
