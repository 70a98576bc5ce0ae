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

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from zbk import limits
from zbk.errors import (
    ConfigError,
    KeyExistsError,
    LeaseExpiredError,
    MetadataError,
    MetadataUnavailableError,
    MetadataVersionError,
)

# grpc and etcd3's code through etcdconn, which prepares their environment first.
from zbk.metadata.etcdconn import (
    _RETRYABLE,
    _channel_credentials,
    _closed_channel,
    _code,
    _Connection,
    _details,
    _stream_error,
    _Stubs,
    _token_rejected,
    _TokenAuth,
    _translate,
    deadline_s_default,
    etcdrpc,
    grpc,
    kv_pb2,
    retry_pause_s_max,
    retry_pause_s_min,
    rpc_timeout_s_default,
    watch_check_interval_s,
    watch_check_timeout_s,
)
from zbk.metadata.etcdwatch import EtcdWatch
from zbk.metadata.sqlite import ErrorCallback, prefix_end
from zbk.metadata.store import KeyValue, WatchCallback

# etcdrpc and kv_pb2 stay importable from here (for tests building raw requests).
__all__ = ["EtcdStore", "EtcdWatch", "etcdrpc", "kv_pb2"]

log = logging.getLogger(__name__)

T = TypeVar("T")


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


