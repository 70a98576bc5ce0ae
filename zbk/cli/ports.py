"""Loopback ports for the servers zbk's own tools start: the sandbox, the tests, the benches.

Ports are picked at random *below* Linux's ephemeral range (32768-60999 by default), never
by binding port 0: a port the kernel hands out for a bind is also one it hands out as the
local end of outgoing connections, so while a server is down for a restart any client
connecting anywhere could be holding its port ("Address already in use" on restart).
"""

from __future__ import annotations

import random
import socket
import threading
from collections import deque

LOOPBACK = "127.0.0.1"
AUTO_PORT_LOW, AUTO_PORT_HIGH = 10_000, 31_000
_pick = random.Random()  # our own generator: tests that seed the module's must not repeat ports
# The ports free_port handed out last. A starter picks a server's ports, then the next
# server's, before the first has bound its own (a Python server takes a second to start): a
# port that is merely free when asked for again would be handed to both.
_HANDED_OUT_KEPT = 4096
_handed_out: deque[int] = deque(maxlen=_HANDED_OUT_KEPT)
_handing_out = threading.Lock()


def port_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a server could listen on ``port`` now. SO_REUSEADDR as servers use it: a port
    in TIME_WAIT from an earlier run is free for them, a port someone listens on is not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOOPBACK) -> int:
    """A port on ``host`` that is free now, outside the ephemeral range, and not one this
    process handed out among its last 4,096. Another process may still pick it before our
    server binds it (rare: the range holds 21,000 ports)."""
    with _handing_out:
        for _ in range(1000):
            port = _pick.randrange(AUTO_PORT_LOW, AUTO_PORT_HIGH)
            if port not in _handed_out and port_free(port, host):
                _handed_out.append(port)
                return port
    raise OSError(f"no free port in {AUTO_PORT_LOW}-{AUTO_PORT_HIGH} on {host}")
