"""Watches on the etcd store: one thread per watch, owning one gRPC watch stream at a time,
re-watching from ``last_revision + 1`` when it breaks (zbk/metadata/etcd.py, "Semantics").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from zbk.errors import (
    MetadataError,
    MetadataUnavailableError,
    WatchCompactedError,
)

# grpc and etcd3's code through etcdconn, which prepares their environment first.
from zbk.metadata.etcdconn import (
    _REQUIRE_LEADER,
    _code,
    _Connection,
    _details,
    _stream_error,
    _Stubs,
    etcdrpc,
    grpc,
    kv_pb2,
)
from zbk.metadata.sqlite import ErrorCallback, prefix_end
from zbk.metadata.store import WatchCallback, WatchEvent

# Named as the module this code was split from: log configuration and output stay as they were.
log = logging.getLogger("zbk.metadata.etcd")


class _WatchedStore(Protocol):
    """What a watch uses of its EtcdStore."""

    _prefix: bytes
    _watch_conn: _Connection
    _stop: threading.Event

    def _call(self, what: str, fn: Callable[[_Stubs, float], Any], conn: _Connection | None = None, *,
              deadline_s: float | None = None) -> Any: ...

    def _unregister(self, w: EtcdWatch) -> None: ...


class _StreamBroken(Exception):
    """The current watch stream ended; re-watch."""


class _WatchCancelled(MetadataError):
    """cancel() interrupted the opening of a stream."""


class EtcdWatch:
    """One watch: a thread consuming one gRPC watch stream at a time."""

    def __init__(self, store: _WatchedStore, prefix: bytes, callback: WatchCallback, start: int,
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


