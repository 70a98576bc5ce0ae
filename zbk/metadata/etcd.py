"""The etcd metadata store, on the gRPC stubs and protobuf messages of python-etcd3.

URI: ``etcd://host:port[,host:port...]/scope[?user=..&password=..&ca_cert=..]`` (see
zbk/metadata/uri.py for every option). Keys live under ``/<scope>/``.

Security (the arguments python-etcd3's ``etcd3.client`` takes, with the same names):

* ``ca_cert`` turns TLS on and verifies the members against that CA; ``cert_cert`` and
  ``cert_key`` add this client's certificate (etcd ``--client-cert-auth``).
* ``user`` and ``password``: the store authenticates (Auth.Authenticate) and sends the
  token as ``token`` metadata on every call and stream. A token etcd no longer accepts
  (expired: ``--auth-token-ttl``, or a restart) is renewed once and the call retried; a
  wrong user or password is a MetadataError naming the user, never retried.

Why the raw stubs and not etcd3's client methods: we need a per-call timeout on every
RPC, one place that maps gRPC failures to the zbk error tree, our own endpoint failover,
and our own watch loop. (python-etcd3 0.12's watcher drops every watch silently when its
stream breaks, e.g. when etcd restarts, and its Lock does not work with current tenacity.)

Semantics:

* Every call retries on "unreachable" gRPC codes (UNAVAILABLE, DEADLINE_EXCEEDED, ...),
  moving to the next listed endpoint each time with a growing pause, until ``deadline_s``
  has passed; then it raises MetadataUnavailableError.
* A retried write may have been applied by the attempt that timed out. Retrying is still
  safe: a create or CAS that finds its own earlier write reports a conflict
  (KeyExistsError / MetadataVersionError), which callers treat as "reread and decide";
  no update is ever silently lost or applied twice.
* CAS compares the key's mod_revision in a transaction; create compares create_revision
  == 0; delete-if-version compares mod_revision.
* A watch is a thread owning one gRPC watch stream (created with ``hasleader`` metadata,
  so that a member cut off from its leader cancels the stream instead of going quiet).
  When the stream fails it re-watches from ``last_revision + 1`` on the next endpoint,
  skipping any event at or below the last revision delivered, so every event is delivered
  exactly once across reconnects. A store-wide liveness check probes the watch channel
  every ``watch_check_interval_s`` and tears it down if the probe fails. If history has
  been compacted past the resume point the watch stops and reports WatchCompactedError.
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
import random  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any, TypeVar  # noqa: E402

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

from zbk import limits  # noqa: E402
from zbk.errors import (  # noqa: E402
    ConfigError,
    KeyExistsError,
    LeaseExpiredError,
    MetadataError,
    MetadataUnavailableError,
    MetadataVersionError,
    WatchCompactedError,
)
from zbk.metadata.sqlite import ErrorCallback, prefix_end  # noqa: E402
from zbk.metadata.store import KeyValue, WatchCallback, WatchEvent  # noqa: E402

log = logging.getLogger(__name__)

T = TypeVar("T")

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


class EtcdStore:
    """A :class:`~zbk.metadata.store.MetadataStore` on an etcd v3 cluster."""

    def __init__(self, endpoints: list[str], *, scope: str = "zbk", uri: str | None = None,
                 deadline_s: float = deadline_s_default, rpc_timeout_s: float = rpc_timeout_s_default,
                 user: str = "", password: str = "", ca_cert: str = "", cert_key: str = "",
                 cert_cert: str = "") -> None:
        assert endpoints and deadline_s > 0 and rpc_timeout_s > 0
        if bool(user) != bool(password):
            raise ConfigError("etcd: user and password go together")
        self.endpoints = list(endpoints)
        self.scope = scope
        self.uri = uri or f"etcd://{','.join(endpoints)}/{scope}"
        self._prefix = f"/{scope}/".encode()
        self._deadline_s = deadline_s
        self._rpc_timeout_s = rpc_timeout_s
        # Start at a random member so that many clients spread over the cluster.
        first = random.randrange(len(self.endpoints))
        self._auth = _TokenAuth(user, password) if user else None
        security: dict[str, Any] = dict(credentials=_channel_credentials(ca_cert, cert_key, cert_cert),
                                        auth=self._auth, auth_timeout_s=rpc_timeout_s)
        self._kv_conn = _Connection(self.endpoints, first, **security)
        self._watch_conn = _Connection(self.endpoints, first, **security)
        self._lock = threading.Lock()
        self._watches: list[EtcdWatch] = []
        self._watchdog: threading.Thread | None = None
        self._stop = threading.Event()
        try:
            self.revision()  # fail fast (MetadataUnavailableError) on an unreachable cluster
        except BaseException:
            self.close()
            raise

    @property
    def current_endpoint(self) -> str:
        """The endpoint that key-value calls go to now (tests kill it)."""
        return self._kv_conn.endpoint

    # -- calls with failover --------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[_Stubs, float], T], conn: _Connection | None = None, *,
              deadline_s: float | None = None) -> T:
        """Run ``fn(stubs, timeout)``, failing over and retrying while etcd is unreachable,
        for ``deadline_s`` (None: the store's ``deadline_s``) in all."""
        conn = conn or self._kv_conn
        deadline_s = self._deadline_s if deadline_s is None else deadline_s
        deadline = time.monotonic() + deadline_s
        pause = retry_pause_s_min
        renewed = False
        while True:
            stubs = conn.current()
            timeout = min(self._rpc_timeout_s, max(retry_pause_s_min, deadline - time.monotonic()))
            token = self._auth.current if self._auth is not None else None
            try:
                return fn(stubs, timeout)
            except grpc.RpcError as e:
                if self._auth is not None and not renewed and _token_rejected(e):
                    renewed = True  # expired or unknown token: authenticate again, once
                    self._auth.invalidate(token)
                    continue
                if _code(e) not in _RETRYABLE:
                    raise _translate(e, what) from None
                reason = f"{_code(e).name}: {_details(e)}"
            except ValueError as e:
                # A failover closed the channel under this call. grpc words it "Cannot invoke
                # RPC on closed channel!" for unary calls and "Cannot invoke RPC: Channel
                # closed!" for streams (watches): both are a retry on the next endpoint.
                if not _closed_channel(e):
                    raise
                reason = str(e)
            conn.fail(stubs.generation)
            if time.monotonic() + pause > deadline:
                raise MetadataUnavailableError(
                    f"etcd {','.join(self.endpoints)}: {what} failed for {deadline_s:.1f} s ({reason})")
            time.sleep(pause * random.uniform(0.5, 1.0))
            pause = min(pause * 2, retry_pause_s_max)

    def _k(self, key: str) -> bytes:
        return self._prefix + key.encode()

    def _kv(self, kv: Any) -> KeyValue:
        return KeyValue(key=kv.key[len(self._prefix):].decode(), value=kv.value, version=kv.mod_revision,
                        create_revision=kv.create_revision, lease=kv.lease or None)

    def _txn(self, what: str, compare: Any, success: Any, failure: Any = None) -> Any:
        request = etcdrpc.TxnRequest(compare=[compare], success=[success], failure=[failure] if failure else [])
        return self._call(what, lambda s, t: s.kv.Txn(request, timeout=t))

    # -- the protocol -----------------------------------------------------------------------
    def get(self, key: str) -> KeyValue | None:
        request = etcdrpc.RangeRequest(key=self._k(key))
        response = self._call(f"get {key}", lambda s, t: s.kv.Range(request, timeout=t))
        return self._kv(response.kvs[0]) if response.kvs else None

    def put(self, key: str, value: bytes, *, lease: int | None = None) -> int:
        request = etcdrpc.PutRequest(key=self._k(key), value=value, lease=lease or 0)
        response = self._call(f"put {key}", lambda s, t: s.kv.Put(request, timeout=t))
        return int(response.header.revision)

    def create(self, key: str, value: bytes, *, lease: int | None = None) -> int:
        k = self._k(key)
        absent = etcdrpc.Compare(key=k, target=etcdrpc.Compare.CREATE, result=etcdrpc.Compare.EQUAL,
                                 create_revision=0)
        response = self._txn(f"create {key}", absent, _put_op(k, value, lease))
        if not response.succeeded:
            raise KeyExistsError(f"key {key!r} already exists")
        return int(response.header.revision)

    def cas(self, key: str, value: bytes, version: int, *, lease: int | None = None) -> int:
        k = self._k(key)
        response = self._txn(f"cas {key}", _same_version(k, version), _put_op(k, value, lease), _get_op(k))
        if not response.succeeded:
            raise MetadataVersionError(_conflict(key, version, response))
        return int(response.header.revision)

    def delete(self, key: str, *, version: int | None = None) -> bool:
        k = self._k(key)
        delete = etcdrpc.DeleteRangeRequest(key=k)
        if version is None:
            response = self._call(f"delete {key}", lambda s, t: s.kv.DeleteRange(delete, timeout=t))
            return bool(response.deleted)
        response = self._txn(f"delete {key}", _same_version(k, version),
                             etcdrpc.RequestOp(request_delete_range=delete), _get_op(k))
        if not response.succeeded:
            raise MetadataVersionError(_conflict(key, version, response))
        return True

    def list(self, prefix: str, *, start_after: str | None = None,
             limit: int = limits.metadata_list_page_keys) -> list[KeyValue]:
        assert limit >= 1, limit
        lo = self._k(prefix)
        end = prefix_end(lo)
        if start_after is not None:
            lo = max(lo, self._k(start_after) + b"\0")  # the least key after start_after
        request = etcdrpc.RangeRequest(key=lo, range_end=end, limit=limit,
                                       sort_order=etcdrpc.RangeRequest.ASCEND,
                                       sort_target=etcdrpc.RangeRequest.KEY)
        response = self._call(f"list {prefix}", lambda s, t: s.kv.Range(request, timeout=t))
        return [self._kv(kv) for kv in response.kvs]

    def revision(self) -> int:
        return self._revision(self._kv_conn, self._rpc_timeout_s)

    def _revision(self, conn: _Connection, timeout: float) -> int:
        request = etcdrpc.RangeRequest(key=self._prefix, count_only=True)
        response = self._call("revision", lambda s, t: s.kv.Range(request, timeout=min(t, timeout)), conn)
        return int(response.header.revision)

    def grant_lease(self, ttl_s: int) -> int:
        assert ttl_s >= 1, ttl_s
        request = etcdrpc.LeaseGrantRequest(TTL=ttl_s)
        response = self._call("grant lease", lambda s, t: s.lease.LeaseGrant(request, timeout=t))
        if response.error:
            raise MetadataError(f"etcd: grant lease: {response.error}")
        return int(response.ID)

    def keepalive(self, lease: int, *, timeout_s: float | None = None) -> None:
        # With a budget, one attempt gets at most half of it: a member that hangs (a
        # follower that cannot reach the leader) leaves time to ask another.
        attempt_s = self._rpc_timeout_s if timeout_s is None else max(0.5, timeout_s / 2)
        ttl = self._call(f"keepalive {lease}", lambda s, t: _keepalive_once(s, lease, min(t, attempt_s)),
                         deadline_s=timeout_s)
        if ttl <= 0:
            raise LeaseExpiredError(f"lease {lease} has expired or was revoked")

    def revoke_lease(self, lease: int) -> None:
        request = etcdrpc.LeaseRevokeRequest(ID=lease)
        try:
            self._call(f"revoke lease {lease}", lambda s, t: s.lease.LeaseRevoke(request, timeout=t))
        except LeaseExpiredError:
            pass  # absent leases are ignored

    def compact(self, revision: int) -> None:
        """Drop etcd's history before ``revision``: watches may start at ``revision`` or later."""
        request = etcdrpc.CompactionRequest(revision=revision, physical=True)
        self._call(f"compact {revision}", lambda s, t: s.kv.Compact(request, timeout=t))

    def close(self) -> None:
        with self._lock:
            self._stop.set()
            watches, self._watches = self._watches, []
        for w in watches:
            w.cancel()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join()
        self._kv_conn.close()
        self._watch_conn.close()

    def __enter__(self) -> EtcdStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- watches --------------------------------------------------------------------------
    def watch(self, prefix: str, callback: WatchCallback, *, start_revision: int | None = None,
              on_error: ErrorCallback | None = None) -> EtcdWatch:
        """See the protocol. ``on_error`` (driver extension) hears why a watch stopped on its
        own (WatchCompactedError while resuming); without it the reason is logged."""
        assert start_revision is None or start_revision >= 1, start_revision
        start = self.revision() + 1 if start_revision is None else start_revision
        w = EtcdWatch(self, self._k(prefix), callback, start, on_error)
        w.start()  # raises WatchCompactedError / MetadataUnavailableError from the first stream
        with self._lock:
            if self._stop.is_set():
                w.cancel()
                raise MetadataError("etcd metadata store is closed")
            self._watches.append(w)
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watchdog_loop, daemon=True,
                                                  name=f"zbk-etcd-watchdog:{self.scope}")
                self._watchdog.start()
        return w

    def _unregister(self, w: EtcdWatch) -> None:
        with self._lock:
            if w in self._watches:
                self._watches.remove(w)

    def _watchdog_loop(self) -> None:
        """Probe the channel the watch streams use; a failed probe fails the channel over,
        which breaks every stream on it, and each stream then re-watches elsewhere."""
        while not self._stop.wait(watch_check_interval_s):
            try:
                stubs = self._watch_conn.current()
            except MetadataError:
                return
            request = etcdrpc.RangeRequest(key=self._prefix, count_only=True)
            try:
                stubs.kv.Range(request, timeout=watch_check_timeout_s)
            except grpc.RpcError as e:
                if _code(e) in _RETRYABLE and not self._stop.is_set():
                    log.warning("etcd: watch channel to %s failed its liveness probe (%s)",
                                self._watch_conn.endpoint, _details(e))
                    self._watch_conn.fail(stubs.generation)
            except ValueError:
                pass  # the channel was just replaced


class _StreamBroken(Exception):
    """The current watch stream ended; re-watch."""


class _WatchCancelled(MetadataError):
    """cancel() interrupted the opening of a stream."""


class EtcdWatch:
    """One watch: a thread consuming one gRPC watch stream at a time."""

    def __init__(self, store: EtcdStore, prefix: bytes, callback: WatchCallback, start: int,
                 on_error: ErrorCallback | None) -> None:
        self._store = store
        self._prefix = prefix
        self._end = prefix_end(prefix)
        self._callback = callback
        self._on_error = on_error
        self._last = start - 1  # revision of the last event delivered
        self._cancelled = threading.Event()
        self._call_lock = threading.Lock()
        self._call: Any = None  # the current stream, cancelled by cancel()
        self._stream_done: threading.Event = threading.Event()
        self._generation = -1  # of the channel the current stream runs on
        self._thread: threading.Thread | None = None

    @property
    def last_revision(self) -> int:
        return self._last

    def start(self) -> None:
        """Open the first stream in the caller's thread (so that errors reach the caller),
        then hand it to the watch thread."""
        store = self._store
        responses = store._call("watch", self._open, store._watch_conn)
        self._thread = threading.Thread(target=self._run, args=(responses,), daemon=True,
                                        name=f"zbk-etcd-watch:{self._prefix.decode(errors='replace')}")
        self._thread.start()

    def _open(self, stubs: _Stubs, timeout: float) -> Iterator[Any]:
        """Create a stream from last_revision + 1 and wait for etcd to confirm it."""
        self._check_not_compacted(stubs, timeout)
        create = etcdrpc.WatchCreateRequest(key=self._prefix, range_end=self._end, start_revision=self._last + 1)
        done = threading.Event()
        call = stubs.watch.Watch(_requests(etcdrpc.WatchRequest(create_request=create), done),
                                 metadata=_REQUIRE_LEADER)
        with self._call_lock:
            self._call, self._stream_done, self._generation = call, done, stubs.generation
        timer = threading.Timer(timeout, call.cancel)  # no answer in time: treat as unreachable
        timer.start()
        try:
            if self._cancelled.is_set():
                call.cancel()
            first = next(call)
            if first.compact_revision:
                raise WatchCompactedError(f"watch on {self._prefix.decode()!r}: revision {self._last + 1} is "
                                          f"compacted (history starts at {first.compact_revision})")
            if not first.created or first.canceled:
                raise _stream_error(f"watch not created: {first.cancel_reason or 'no reason given'}")
            return call
        except BaseException as e:
            call.cancel()
            done.set()  # releases the request iterator's thread
            if self._cancelled.is_set():
                raise _WatchCancelled() from None
            if isinstance(e, StopIteration):
                raise _stream_error("watch stream closed before it was created") from None
            raise
        finally:
            timer.cancel()

    def _check_not_compacted(self, stubs: _Stubs, timeout: float) -> None:
        """etcd confirms a watch below its compaction point first and cancels it only in a
        later message; a read at the start revision tells us at once."""
        probe = etcdrpc.RangeRequest(key=self._prefix, revision=self._last + 1, count_only=True)
        try:
            stubs.kv.Range(probe, timeout=timeout)
        except grpc.RpcError as e:
            if _code(e) != grpc.StatusCode.OUT_OF_RANGE:
                raise
            if "compacted" in _details(e):
                raise WatchCompactedError(f"watch on {self._prefix.decode()!r}: revision {self._last + 1} "
                                          "is compacted") from None
            # "future revision": nothing to miss yet

    def _run(self, responses: Iterator[Any] | None) -> None:
        while responses is not None:
            try:
                self._consume(responses)
            except (grpc.RpcError, _StreamBroken) as e:
                if not self._cancelled.is_set():
                    reason = _details(e) if isinstance(e, grpc.RpcError) else str(e)
                    log.info("etcd watch on %s: stream broke (%s); re-watching from %d",
                             self._prefix.decode(), reason, self._last + 1)
                    self._store._watch_conn.fail(self._generation)
            finally:
                self._stream_done.set()
            responses = None if self._cancelled.is_set() else self._reopen()

    def _reopen(self) -> Iterator[Any] | None:
        """A new stream from last_revision + 1, or None if the watch is over."""
        store = self._store
        while not self._cancelled.is_set():
            try:
                return store._call("re-watch", self._open, store._watch_conn)
            except _WatchCancelled:
                return None
            except MetadataUnavailableError as e:
                # A watch outlives any outage: the callers rely on it to survive restarts.
                log.warning("etcd watch on %s: %s; still trying", self._prefix.decode(), e)
            except MetadataError as e:  # compacted, or the store was closed
                if not self._cancelled.is_set() and not store._stop.is_set():
                    self._stop_with(e)
                return None
        return None

    def _consume(self, responses: Iterator[Any]) -> None:
        for response in responses:
            if response.compact_revision:
                raise _StreamBroken(f"compacted at {response.compact_revision}")
            if response.canceled:
                raise _StreamBroken(f"cancelled by etcd: {response.cancel_reason}")
            floor = self._last  # events of one revision arrive in one response
            for ev in response.events:
                if self._cancelled.is_set():
                    return
                if ev.kv.mod_revision <= floor:
                    continue  # already delivered before a reconnect
                self._deliver(ev)
        raise _StreamBroken("stream ended")

    def _deliver(self, ev: Any) -> None:
        is_put = ev.type == kv_pb2.Event.PUT
        event = WatchEvent(kind="put" if is_put else "delete",
                           key=ev.kv.key[len(self._store._prefix):].decode(),
                           value=ev.kv.value if is_put else None, revision=ev.kv.mod_revision)
        self._last = event.revision
        try:
            self._callback(event)
        except Exception:
            log.exception("watch callback failed on %s", event)

    def _stop_with(self, err: Exception) -> None:
        self._cancelled.set()
        self._store._unregister(self)
        if self._on_error is None:
            log.error("etcd watch on %s stopped: %s", self._prefix.decode(), err)
            return
        try:
            self._on_error(err)
        except Exception:
            log.exception("watch error callback failed")

    def cancel(self) -> None:
        self._cancelled.set()
        self._store._unregister(self)
        with self._call_lock:
            call, done = self._call, self._stream_done
        if call is not None:
            call.cancel()
        done.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()


def _requests(create: Any, done: threading.Event) -> Iterator[Any]:
    """The request side of a watch stream: the create request, then silence until the
    stream is finished (ending the iterator would half-close the stream)."""
    yield create
    done.wait()


def _keepalive_once(stubs: _Stubs, lease: int, timeout: float) -> int:
    """One keep-alive round trip on a short-lived stream; the lease's remaining TTL (0: gone)."""
    stream = stubs.lease.LeaseKeepAlive(iter([etcdrpc.LeaseKeepAliveRequest(ID=lease)]), timeout=timeout)
    try:
        for response in stream:
            return int(response.TTL)
        raise _stream_error("keepalive stream closed without an answer")
    finally:
        stream.cancel()


def _put_op(key: bytes, value: bytes, lease: int | None) -> Any:
    return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=value, lease=lease or 0))


def _get_op(key: bytes) -> Any:
    return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=key))


def _same_version(key: bytes, version: int) -> Any:
    # mod_revision of an absent key is 0; versions are >= 1, so "absent" never matches.
    return etcdrpc.Compare(key=key, target=etcdrpc.Compare.MOD, result=etcdrpc.Compare.EQUAL,
                           mod_revision=version if version >= 1 else -1)


def _conflict(key: str, version: int, response: Any) -> str:
    kvs = response.responses[0].response_range.kvs if response.responses else []
    found = f"at version {kvs[0].mod_revision}" if kvs else "absent"
    return f"key {key!r}: expected version {version}, found {found}"


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
