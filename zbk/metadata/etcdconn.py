"""The etcd store's connection: gRPC channels with endpoint failover, TLS, auth tokens,
and the mapping of gRPC failures to the zbk error tree (zbk/metadata/etcd.py has the
store and its semantics).

This module is the one that loads grpc and python-etcd3's generated code: the store and
the watch take ``grpc``, ``etcdrpc`` and ``kv_pb2`` from here, so that the environment
below is set before gRPC or protobuf is first imported, whichever module comes first.
"""

from __future__ import annotations

import os

# python-etcd3's generated code predates protobuf 4: it loads only with the pure-python
# protobuf runtime, which must be chosen before google.protobuf is first imported.
os.environ.setdefault("PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION", "python")
# zbk forks only to exec (bookies, etcd members, test children). gRPC's fork handlers, on by
# default, pause and reset its threads and file descriptors around every fork() in the
# process and are unsafe while other threads are inside gRPC; they are meant for children
# that go on using gRPC without exec. Off unless the application asks for them.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import logging  # noqa: E402
import threading  # noqa: E402
import warnings  # noqa: E402
from typing import Any  # noqa: E402

import grpc  # noqa: E402

with warnings.catch_warnings():
    # The old generated code calls protobuf APIs that now warn on every descriptor.
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        from etcd3 import etcdrpc
        from etcd3.etcdrpc import kv_pb2
    except TypeError as _e:  # "Descriptors cannot be created directly"
        raise ImportError(
            "python-etcd3 needs the pure-Python protobuf runtime, but protobuf was loaded with "
            "another one before zbk.metadata.etcd: set PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python "
            "in the environment (or import zbk.metadata.etcd before anything that uses protobuf)"
        ) from _e

from zbk.errors import (  # noqa: E402
    ConfigError,
    LeaseExpiredError,
    MetadataError,
    WatchCompactedError,
)

__all__ = ["etcdrpc", "grpc", "kv_pb2"]

# Named as the module this code was split from: log configuration and output stay as they were.
log = logging.getLogger("zbk.metadata.etcd")

deadline_s_default = 10.0  # a call keeps retrying across endpoints for this long
rpc_timeout_s_default = 5.0  # one RPC attempt
retry_pause_s_min = 0.05
retry_pause_s_max = 1.0
watch_check_interval_s = 3.0  # liveness probe of the watch channel
watch_check_timeout_s = 2.0
grpc_message_bytes_max = 64 * 1024 * 1024  # a full list page of large ledger metadata

_RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,  # unreachable, or "no leader" / "leader changed"
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.CANCELLED,  # our channel was closed under the call by a failover
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # "too many requests"
    grpc.StatusCode.UNKNOWN,  # transport errors surface as UNKNOWN in some grpc versions
}
_CHANNEL_OPTIONS = [
    # Find a dead peer behind a silent connection (etcd permits pings every >= 5 s while a
    # stream is open; pings without a stream get the connection closed, so not those).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.max_receive_message_length", grpc_message_bytes_max),
    ("grpc.max_send_message_length", grpc_message_bytes_max),
]
_REQUIRE_LEADER = (("hasleader", "true"),)


class _TokenAuth:
    """etcd user/password authentication: one token, fetched on demand, shared by channels."""

    def __init__(self, user: str, password: str) -> None:
        self.user = user
        self._password = password
        self._lock = threading.Lock()
        self._token: str | None = None

    def token(self, channel: grpc.Channel, timeout: float) -> str:
        with self._lock:
            if self._token is None:
                request = etcdrpc.AuthenticateRequest(name=self.user, password=self._password)
                try:
                    self._token = str(etcdrpc.AuthStub(channel).Authenticate(request, timeout=timeout).token)
                except grpc.RpcError as e:
                    if _code(e) in _RETRYABLE:
                        raise
                    raise MetadataError(f"etcd: authentication as user {self.user!r} failed: {_details(e)} "
                                        "(check the user and password of the metadata URI)") from None
            return self._token

    def invalidate(self, token: str | None = None) -> None:
        """Forget the token (if it is still ``token``): the next call authenticates again."""
        with self._lock:
            if token is None or token == self._token:
                self._token = None

    @property
    def current(self) -> str | None:
        return self._token


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, base: grpc.ClientCallDetails, metadata: list[tuple[str, str]]) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class _TokenInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,  # type: ignore[misc]
                        grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds the auth token to the metadata of every call made through a channel."""

    def __init__(self, auth: _TokenAuth, raw: grpc.Channel, timeout_s: float) -> None:
        self._auth, self._raw, self._timeout_s = auth, raw, timeout_s

    def _details(self, details: grpc.ClientCallDetails) -> _CallDetails:
        token = self._auth.token(self._raw, details.timeout or self._timeout_s)
        return _CallDetails(details, [*(details.metadata or ()), ("token", token)])

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(self._details(details), requests)


def _channel_credentials(ca_cert: str, cert_key: str, cert_cert: str) -> grpc.ChannelCredentials | None:
    if not (ca_cert or cert_cert):
        return None

    def read(path: str) -> bytes | None:
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise ConfigError(f"etcd TLS: cannot read {path}: {e}") from None

    return grpc.ssl_channel_credentials(root_certificates=read(ca_cert), private_key=read(cert_key),
                                        certificate_chain=read(cert_cert))


class _Stubs:
    def __init__(self, channel: grpc.Channel, generation: int) -> None:
        self.generation = generation
        self.kv = etcdrpc.KVStub(channel)
        self.lease = etcdrpc.LeaseStub(channel)
        self.watch = etcdrpc.WatchStub(channel)


class _Connection:
    """One gRPC channel to one of the endpoints; ``fail`` moves to the next endpoint.

    ``generation`` counts channels, so that many threads seeing one broken channel cause
    one failover, not one each."""

    def __init__(self, endpoints: list[str], first: int, *, credentials: grpc.ChannelCredentials | None = None,
                 auth: _TokenAuth | None = None, auth_timeout_s: float = rpc_timeout_s_default) -> None:
        assert endpoints
        self._endpoints = endpoints
        self._index = first % len(endpoints)
        self._lock = threading.Lock()
        self._generation = 0
        self._credentials = credentials
        self._auth = auth
        self._auth_timeout_s = auth_timeout_s
        self._channel, self._stubs = self._open(0)
        self._closed = False

    def _open(self, generation: int) -> tuple[grpc.Channel, _Stubs]:
        target = self._endpoints[self._index]
        if self._credentials is not None:
            raw = grpc.secure_channel(target, self._credentials, options=_CHANNEL_OPTIONS)
        else:
            raw = grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
        channel = raw
        if self._auth is not None:
            channel = grpc.intercept_channel(raw, _TokenInterceptor(self._auth, raw, self._auth_timeout_s))
        return raw, _Stubs(channel, generation)

    @property
    def endpoint(self) -> str:
        return self._endpoints[self._index]

    def current(self) -> _Stubs:
        with self._lock:
            if self._closed:
                raise MetadataError("etcd metadata store is closed")
            return self._stubs

    def fail(self, generation: int) -> None:
        with self._lock:
            if self._closed or generation != self._generation:
                return
            old = self._channel
            self._index = (self._index + 1) % len(self._endpoints)
            self._generation += 1
            self._channel, self._stubs = self._open(self._generation)
        old.close()
        log.info("etcd: switched to endpoint %s", self.endpoint)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._channel.close()


def _closed_channel(e: ValueError) -> bool:
    msg = str(e).lower()
    return "closed channel" in msg or "channel closed" in msg



class _GrpcLikeError(grpc.RpcError):
    """A broken stream that grpc reported as a normal end: retry it like UNAVAILABLE."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._message


def _stream_error(message: str) -> grpc.RpcError:
    return _GrpcLikeError(message)


def _code(e: grpc.RpcError) -> grpc.StatusCode:
    code = getattr(e, "code", None)
    return code() if callable(code) else grpc.StatusCode.UNKNOWN


def _details(e: grpc.RpcError) -> str:
    details = getattr(e, "details", None)
    return str(details() if callable(details) else e)


def _token_rejected(e: grpc.RpcError) -> bool:
    return _code(e) == grpc.StatusCode.UNAUTHENTICATED or (
        _code(e) == grpc.StatusCode.INVALID_ARGUMENT and "invalid auth token" in _details(e))


def _translate(e: grpc.RpcError, what: str) -> Exception:
    code, details = _code(e), _details(e)
    if code == grpc.StatusCode.NOT_FOUND and "lease" in details:
        return LeaseExpiredError(f"etcd: {what}: {details}")
    if code == grpc.StatusCode.OUT_OF_RANGE and "compacted" in details:
        return WatchCompactedError(f"etcd: {what}: {details}")
    return MetadataError(f"etcd: {what}: {code.name}: {details}")
