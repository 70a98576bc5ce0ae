"""Bookie ids and wire addresses (BookKeeper's BP-41).

The metadata knows a bookie by its id: registrations, cookies, the ensembles of ledger
metadata and repair marks all name it. An id takes one of two forms:

* ``host:port`` (the default, ``<advertised_address>:<port>``): the form every bookie had
  before stable ids. Its registration may still record another wire address; a
  registration without one (written by an older bookie), or none at all, means the id
  is the address.
* a name (``bookie-a``): a stable id that says nothing about where the bookie is. Only its
  registration does, so the bookie may come back at another address, or on another port,
  and keep its ledgers and its cookie.

zbk/metadata/resolver.py turns an id into the address to connect to; this module holds the
grammar both sides agree on and nothing that touches the metadata (the configuration
classes import it).
"""

from __future__ import annotations

from zbk import limits
from zbk.errors import ConfigError

# Bind addresses that mean "every interface": a socket bound there has no address a client
# could connect to.
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", "*"})


def split_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port`` (an IPv6 host in brackets, ``[::1]:3181``), or None
    when ``address`` is not of that form."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 1 << 16:
        return None
    if host.startswith("["):
        if not host.endswith("]") or len(host) < 3:
            return None
    elif ":" in host:
        return None  # an IPv6 host without brackets: where its port begins is a guess
    if any(c.isspace() or c == "/" for c in host) or not host.isprintable():
        return None
    return host, int(port)


def is_address(bookie_id: str) -> bool:
    """Is ``bookie_id`` of the ``host:port`` form (so that it may serve as its own address)?"""
    return split_address(bookie_id) is not None


def join_address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host put in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def check_bookie_id(bookie_id: str, *, key: str = "bookie_id") -> str:
    """``bookie_id`` if it may be a bookie's id, else ConfigError naming ``key``.

    It becomes the last part of metadata keys (``bookies/writable/<id>``, ``cookies/<id>``)
    and a CURVE key file's name (zbk/wire/curve.py), and operators type it into shell
    commands: so no ``/``, nothing unprintable, no white space, and a bounded length."""
    if not bookie_id:
        raise ConfigError(f"{key} must not be empty")
    if len(bookie_id) > limits.bookie_id_chars_max:
        raise ConfigError(f"{key} is {len(bookie_id)} characters long, at most {limits.bookie_id_chars_max} allowed")
    if "/" in bookie_id:
        raise ConfigError(f"{key} must not contain '/' (it is part of metadata keys), got {bookie_id!r}")
    if not bookie_id.isprintable() or any(c.isspace() for c in bookie_id):
        raise ConfigError(f"{key} must be printable and without white space, got {bookie_id!r}")
    if bookie_id in (".", ".."):
        raise ConfigError(f"{key} must not be {bookie_id!r}: it names a directory entry, not a bookie")
    return bookie_id


def check_host(host: str, *, key: str) -> str:
    """``host`` if it can be the host part of a wire address, else ConfigError naming ``key``."""
    if split_address(join_address(host, 1)) is None:
        raise ConfigError(f"{key} must be a host name or an IP address, got {host!r}")
    return host
