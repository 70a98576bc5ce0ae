"""Wire protocol: CBOR header frames plus raw payload frames over ZeroMQ."""

from zbk.wire.status import Status

__all__ = ["Status"]
