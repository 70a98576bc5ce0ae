"""The codec over a real DEALER/ROUTER pair (inproc): frames survive ZeroMQ, zero-copy."""

from __future__ import annotations

import zmq

from zbk.client.digest import make_digest, master_key
from zbk.wire.codec import decode_request, decode_response, encode
from zbk.wire.entry import build_entry, parse_entry, peek_entry_header
from zbk.wire.messages import AddRequest, AddResponse
from zbk.wire.ops import AddFlag
from zbk.wire.status import Status


def test_add_over_dealer_router() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    try:
        for s in (router, dealer):
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.RCVTIMEO, 5000)
        router.bind("inproc://wire-test")
        dealer.connect("inproc://wire-test")
        digest = make_digest("crc32c", b"pw")
        blobs = tuple(build_entry(3, e, e - 1, b"p%d" % e, digest) for e in range(4))
        request = AddRequest(
            rid=1, ledger_id=3, master_key=master_key(b"pw"), flags=AddFlag(0), entries=blobs
        )
        dealer.send_multipart(encode(request))

        identity, *frames = router.recv_multipart(copy=False)
        received = decode_request([f.buffer for f in frames])  # zero-copy views, as a bookie reads
        assert received == request and isinstance(received, AddRequest)
        assert all(isinstance(b, memoryview) for b in received.entries)
        ids = [peek_entry_header(b)[1] for b in received.entries]
        reply = AddResponse(
            rid=1, status=Status.EOK, ledger_id=3, first_entry_id=ids[0], last_entry_id=ids[-1]
        )
        router.send_multipart([identity, *encode(reply)])

        assert decode_response(dealer.recv_multipart()) == reply
        payloads = [bytes(parse_entry(b, digest).payload) for b in received.entries]
        assert payloads == [b"p0", b"p1", b"p2", b"p3"]
    finally:
        dealer.close()
        router.close()
        ctx.term()
