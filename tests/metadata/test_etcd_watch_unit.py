"""The etcd watch loop's bookkeeping, fed real protobuf responses without a server:
duplicates after a re-watch are dropped, several keys of one revision all arrive, and a
stream that ends or is cancelled by etcd is reported as broken (so it is re-watched)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from zbk.metadata.etcd import EtcdWatch, etcdrpc, kv_pb2
from zbk.metadata.etcdwatch import _StreamBroken
from zbk.metadata.store import WatchEvent


def _event(key: str, revision: int, *, delete: bool = False) -> Any:
    kv = kv_pb2.KeyValue(key=f"/s/{key}".encode(), value=b"" if delete else b"v", mod_revision=revision)
    return kv_pb2.Event(type=kv_pb2.Event.DELETE if delete else kv_pb2.Event.PUT, kv=kv)


def _response(*events: Any, **fields: Any) -> Any:
    return etcdrpc.WatchResponse(events=list(events), **fields)


def _watch(start: int) -> tuple[EtcdWatch, list[WatchEvent]]:
    got: list[WatchEvent] = []
    store = SimpleNamespace(_prefix=b"/s/")
    return EtcdWatch(store, b"/s/w/", got.append, start, None), got  # type: ignore[arg-type]


def test_duplicates_are_dropped_and_same_revision_events_kept() -> None:
    w, got = _watch(start=5)
    stream = [
        _response(_event("w/a", 5), _event("w/b", 6)),
        _response(),  # a progress notification: no events
        _response(_event("w/b", 6), _event("w/c", 7)),  # 6 again, as after a re-watch from an old point
        _response(_event("w/d", 8), _event("w/e", 8, delete=True)),  # one transaction, two keys
    ]
    with pytest.raises(_StreamBroken, match="ended"):
        w._consume(iter(stream))
    assert [(e.kind, e.key, e.revision) for e in got] == [
        ("put", "w/a", 5), ("put", "w/b", 6), ("put", "w/c", 7), ("put", "w/d", 8), ("delete", "w/e", 8)]
    assert got[-1].value is None and got[0].value == b"v"
    assert w.last_revision == 8


@pytest.mark.parametrize("response,why", [
    (_response(canceled=True, cancel_reason="etcdserver: no leader"), "no leader"),
    (_response(compact_revision=40), "compacted"),
])
def test_cancel_or_compaction_from_etcd_breaks_the_stream(response: Any, why: str) -> None:
    w, got = _watch(start=1)
    with pytest.raises(_StreamBroken, match=why):
        w._consume(iter([_response(_event("w/a", 3)), response, _response(_event("w/b", 4))]))
    assert [e.key for e in got] == ["w/a"]


def test_closed_channel_errors_of_unary_and_stream_calls_are_both_retried() -> None:
    """A failover closes the channel under calls in flight. grpc words the error differently
    for unary calls and for streams (a watch); both must count as "retry elsewhere", or a
    watch thread dies with the stream's wording (found by the chaos run)."""
    import grpc

    from zbk.metadata.etcdconn import _closed_channel

    ch = grpc.insecure_channel("127.0.0.1:1")
    ch.close()
    errors = []
    for call in (lambda: etcdrpc.KVStub(ch).Range(etcdrpc.RangeRequest(key=b"k"), timeout=1),
                 lambda: etcdrpc.WatchStub(ch).Watch(iter([]))):
        with pytest.raises(ValueError) as err:
            call()
        errors.append(err.value)
    assert all(_closed_channel(e) for e in errors), [str(e) for e in errors]
    assert not _closed_channel(ValueError("some other value error"))
