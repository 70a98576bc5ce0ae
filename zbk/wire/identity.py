"""Which bookie answers on a connection: the ``X-Bookie-Id`` property of the ZMTP handshake.

A client knows a bookie by its id and reaches it at an address (zbk/metadata/resolver.py).
An address can be taken by another bookie: a name-id bookie killed -9 leaves a registration
that lives until its lease expires, and a different bookie started on the same port in the
meantime would answer in its place; a misconfigured process can listen at another bookie's
address for good. Its answers (ENOLEDGER / ENOENTRY for ledgers it never held) are explicit
negatives a recoverer would close a ledger short on.

So a bookie's ROUTER announces its id in the handshake's metadata (ZeroMQ's ZMQ_METADATA,
an application property of ZMTP 3: sent once per connection, nothing per message), and
libzmq attaches the properties of a connection to every message received on it, where
``zmq.Frame.get`` reads them. A client compares each answer's property with the id it
asked for (about 0.2 us an answer). A peer without the property (an older bookie) is
taken at its word, as before.
"""

from __future__ import annotations

import zmq

# ZeroMQ application metadata must be named "X-..."; a name is at most 255 bytes.
PROPERTY = "X-Bookie-Id"


def metadata_option(bookie_id: str) -> bytes:
    """The ZMQ_METADATA value a bookie's ROUTER sets before it binds. libzmq splits it at
    the first ``:``, so an id of the host:port form keeps its own colon."""
    return f"{PROPERTY}:{bookie_id}".encode()


def announce(sock: zmq.Socket[object], bookie_id: str) -> None:
    """Make every connection ``sock`` accepts from now on carry ``bookie_id``."""
    sock.setsockopt(zmq.METADATA, metadata_option(bookie_id))


def peer_id(frame: zmq.Frame) -> str | None:
    """The bookie id announced on the connection ``frame`` came in on; None when the peer
    announced none (an older bookie). ``frame`` must come from a ``copy=False`` receive."""
    try:
        return str(frame.get(PROPERTY))
    except zmq.ZMQError:  # EINVAL: no such property on this connection
        return None


def wrong_bookie(expected: str, actual: str, address: str | None) -> str:
    """The message for an answer from bookie ``actual`` on the connection to ``expected``."""
    where = f" at {address}" if address else ""
    return f"bookie {expected}: the bookie answering{where} is {actual}, not {expected}; its answers are refused"
