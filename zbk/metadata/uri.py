"""Metadata URIs and ``open_store``.

* ``sqlite:///abs/path/meta.db[?scope=name]`` — the embedded store (an absolute path; its
  directory must exist; the file is created on first use).
* ``etcd://host:port[,host:port...]/scope[?options]`` — an etcd cluster; the port defaults
  to 2379, the scope to ``zbk``; IPv6 hosts in brackets (``[::1]:2379``). Options (the
  arguments of ``etcd3.client`` of the same names):

  - ``user`` and ``password`` (or ``password_file``, a file holding it, so the secret is
    not in the URI): etcd authentication; the store gets a token and renews it.
  - ``ca_cert``: a PEM file of the CA that signed the members' certificates; TLS on.
  - ``cert_cert`` and ``cert_key``: this client's certificate and key (mutual TLS).

  Values are percent-decoded (``password=a%26b`` is ``a&b``).
* ``memory://name`` — a store in this process's memory (zbk/metadata/memory.py), for tests
  and simulations: every store opened on one name shares its keys while one of them is
  open. The name follows the rules of a scope. Options: ``clock`` (a zbk.clock.Clock that
  leases expire by).

A scope is one path segment of letters, digits, ``_``, ``.`` and ``-``. Anything else is
a ConfigError whose message says what is wrong and what a good URI looks like.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from zbk.errors import ConfigError
from zbk.metadata.store import MetadataStore

DEFAULT_SCOPE = "zbk"
ETCD_DEFAULT_PORT = 2379
_SCOPE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_ENDPOINT = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.-]+))(?::(?P<port>\d{1,5}))?$")
_SQLITE_EXAMPLE = "sqlite:///var/zbk/meta.db"
_ETCD_EXAMPLE = "etcd://127.0.0.1:2379,127.0.0.2:2379/zbk"
_MEMORY_EXAMPLE = "memory://my-test"


@dataclass(frozen=True)
class SqliteUri:
    path: str
    scope: str = DEFAULT_SCOPE


@dataclass(frozen=True)
class EtcdUri:
    endpoints: tuple[str, ...]  # "host:port", IPv6 as "[addr]:port"
    scope: str = DEFAULT_SCOPE
    user: str = ""
    password: str = field(default="", repr=False)
    ca_cert: str = ""
    cert_key: str = ""
    cert_cert: str = ""


@dataclass(frozen=True)
class MemoryUri:
    name: str


ETCD_OPTIONS = ("user", "password", "password_file", "ca_cert", "cert_key", "cert_cert")


def parse_uri(uri: str) -> SqliteUri | EtcdUri | MemoryUri:
    """Parse a metadata URI; ConfigError if it is malformed."""
    if not isinstance(uri, str) or "://" not in uri:
        raise ConfigError(f"metadata URI {uri!r}: expected {_SQLITE_EXAMPLE} or {_ETCD_EXAMPLE}")
    scheme = uri.split("://", 1)[0].lower()
    if scheme == "sqlite":
        return _parse_sqlite(uri)
    if scheme == "etcd":
        return _parse_etcd(uri)
    if scheme == "memory":
        return _parse_memory(uri)
    raise ConfigError(f"metadata URI {uri!r}: unknown scheme {scheme!r} (use sqlite://, etcd:// or memory://)")


def _parse_memory(uri: str) -> MemoryUri:
    name = uri.split("://", 1)[1]
    if not _SCOPE.match(name):
        raise ConfigError(f"metadata URI {uri!r}: a memory URI is memory:// and a name of 1-128 letters, "
                          f"digits, '_', '.' or '-', e.g. {_MEMORY_EXAMPLE}")
    return MemoryUri(name)


def _parse_sqlite(uri: str) -> SqliteUri:
    parts = urlsplit(uri)
    if parts.netloc:
        raise ConfigError(f"metadata URI {uri!r}: a sqlite URI has no host; use three slashes and an "
                          f"absolute path, e.g. {_SQLITE_EXAMPLE}")
    path = parts.path
    if not path.startswith("/") or path.endswith("/") or len(path) < 2:
        raise ConfigError(f"metadata URI {uri!r}: needs an absolute file path, e.g. {_SQLITE_EXAMPLE}")
    scope = _scope_from_query(uri, parts.query)
    return SqliteUri(path=os.path.normpath(path), scope=scope)


def _scope_from_query(uri: str, query: str) -> str:
    try:
        params = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConfigError(f"metadata URI {uri!r}: malformed query {query!r}") from None
    unknown = set(params) - {"scope"}
    if unknown:
        raise ConfigError(f"metadata URI {uri!r}: unknown parameter(s) {', '.join(sorted(unknown))} (only scope=)")
    values = params.get("scope", [DEFAULT_SCOPE])
    if len(values) != 1:
        raise ConfigError(f"metadata URI {uri!r}: scope given more than once")
    return _check_scope(uri, values[0])


def _check_scope(uri: str, scope: str) -> str:
    if not _SCOPE.match(scope):
        raise ConfigError(f"metadata URI {uri!r}: scope {scope!r} must be 1-128 letters, digits, '_', '.' or '-'")
    return scope


def _parse_etcd(uri: str) -> EtcdUri:
    rest = uri.split("://", 1)[1]
    if "#" in rest:
        raise ConfigError(f"metadata URI {redact(uri)!r}: an etcd URI has no fragment, e.g. {_ETCD_EXAMPLE}")
    rest, _, query = rest.partition("?")
    hosts, _, path = rest.partition("/")
    if not hosts:
        raise ConfigError(f"metadata URI {redact(uri)!r}: no etcd endpoints, e.g. {_ETCD_EXAMPLE}")
    endpoints = tuple(_endpoint(uri, h) for h in hosts.split(","))
    scope = _check_scope(uri, path.rstrip("/")) if path.rstrip("/") else DEFAULT_SCOPE
    return EtcdUri(endpoints=endpoints, scope=scope, **_etcd_options(uri, query))


def _etcd_options(uri: str, query: str) -> dict[str, str]:
    shown = redact(uri)
    try:
        params = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ConfigError(f"metadata URI {shown!r}: malformed query") from None
    unknown = set(params) - set(ETCD_OPTIONS)
    if unknown:
        raise ConfigError(f"metadata URI {shown!r}: an etcd URI takes no parameters but {', '.join(ETCD_OPTIONS)} "
                          f"(got {', '.join(sorted(unknown))})")
    opts: dict[str, str] = {}
    for name, values in params.items():
        if len(values) != 1 or not values[0]:
            raise ConfigError(f"metadata URI {shown!r}: {name} must be given once, not empty")
        opts[name] = values[0]
    if "password_file" in opts:
        if "password" in opts:
            raise ConfigError(f"metadata URI {shown!r}: password and password_file exclude each other")
        path = opts.pop("password_file")
        try:
            with open(path, encoding="utf-8") as f:
                opts["password"] = f.read().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"metadata URI {shown!r}: cannot read password_file {path}: {e}") from None
    if ("user" in opts) != ("password" in opts):
        raise ConfigError(f"metadata URI {shown!r}: user and password (or password_file) go together")
    if ("cert_key" in opts) != ("cert_cert" in opts):
        raise ConfigError(f"metadata URI {shown!r}: cert_key and cert_cert go together")
    for name in ("ca_cert", "cert_key", "cert_cert"):
        if name in opts and not os.path.isfile(opts[name]):
            raise ConfigError(f"metadata URI {shown!r}: {name} {opts[name]} is not a readable file")
    return opts


def redact(uri: str) -> str:
    """The URI with any password replaced by ``***`` (for logs and error messages)."""
    return re.sub(r"([?&]password=)[^&#]*", r"\1***", uri) if isinstance(uri, str) else uri


def _endpoint(uri: str, text: str) -> str:
    m = _ENDPOINT.match(text.strip())
    if not m:
        raise ConfigError(f"metadata URI {uri!r}: bad endpoint {text!r}, expected host:port")
    port = int(m["port"]) if m["port"] else ETCD_DEFAULT_PORT
    if not 1 <= port <= 65535:
        raise ConfigError(f"metadata URI {uri!r}: port {port} out of range")
    host = f"[{m['v6']}]" if m["v6"] else m["host"]
    return f"{host}:{port}"


def open_store(uri: str, **options: Any) -> MetadataStore:
    """Open the store a URI names. ``options`` go to the driver's constructor (e.g.
    ``deadline_s`` for etcd, ``changelog_kept`` for sqlite). Raises ConfigError for a bad
    URI and MetadataUnavailableError if the store cannot be reached."""
    parsed = parse_uri(uri)
    if isinstance(parsed, MemoryUri):
        from zbk.metadata.memory import MemoryMetadataStore

        return MemoryMetadataStore(parsed.name, **options)
    if isinstance(parsed, SqliteUri):
        from zbk.metadata.sqlite import SqliteStore

        return SqliteStore(parsed.path, scope=parsed.scope, uri=uri, **options)
    # Imported here so that sqlite users never load grpc and protobuf.
    from zbk.metadata.etcd import EtcdStore

    return EtcdStore(list(parsed.endpoints), scope=parsed.scope, uri=redact(uri), user=parsed.user,
                     password=parsed.password, ca_cert=parsed.ca_cert, cert_key=parsed.cert_key,
                     cert_cert=parsed.cert_cert, **options)
