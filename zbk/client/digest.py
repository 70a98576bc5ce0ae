"""Entry digests and the ledger master key, both derived from the ledger password.

Digest kinds (the ``digest`` of a ledger, API.md):

* ``crc32``  zlib CRC-32, 4 bytes: catches corruption, not forgery.
* ``crc32c`` CRC-32C (Castagnoli, the crc32c C extension), 4 bytes: the same, faster.
* ``hmac``   HMAC-SHA256 under a key derived from the password, the full 32 bytes (BookKeeper
  truncates nothing either: its 20 bytes are a whole SHA-1). Catches forgery by anyone
  without the password, bookies included.
* ``dummy``  no digest bytes: the entry's structure and ids are still checked.

Keys: two different salted SHA-256 derivations of the password. The **master key** goes to
bookies (they compare it on adds and fencing, so only holders of the password write); the
**MAC key** never leaves the client. They must differ: a bookie that knows the master key
must not be able to forge an hmac entry. The salts carry a version so that a future
derivation (e.g. a KDF with a per-ledger salt) can coexist.
"""

from __future__ import annotations

import hashlib
import hmac
import zlib
from abc import ABC, abstractmethod
from typing import ClassVar

import crc32c as _crc32c

from zbk.errors import BadRequestError
from zbk.wire.entry import DIGEST_BYTES, DigestType
from zbk.wire.messages import MASTER_KEY_BYTES, Blob

MASTER_KEY_SALT = b"zbk/ledger-master-key/v1\x00"
MAC_KEY_SALT = b"zbk/entry-mac-key/v1\x00"
DIGEST_KINDS = ("crc32", "crc32c", "hmac", "dummy")


def master_key(password: bytes) -> bytes:
    """The 32-byte key bookies check on adds and fencing; the password never leaves the client."""
    key = hashlib.sha256(MASTER_KEY_SALT + password).digest()
    assert len(key) == MASTER_KEY_BYTES
    return key


def mac_key(password: bytes) -> bytes:
    """The HMAC key of ``hmac`` digests: derived apart from the master key (see module doc)."""
    return hashlib.sha256(MAC_KEY_SALT + password).digest()


class Digest(ABC):
    """Computes an entry's digest over its header bytes and payload (``zbk.wire.entry``)."""

    kind: ClassVar[str]
    type: ClassVar[DigestType]
    size: ClassVar[int]
    __slots__ = ()

    @abstractmethod
    def compute(self, header: Blob, payload: Blob) -> bytes:
        """The digest of ``header`` followed by ``payload`` (``size`` bytes)."""

    def __repr__(self) -> str:  # never shows key material
        return f"<Digest {self.kind}>"


class DummyDigest(Digest):
    kind = "dummy"
    type = DigestType.DUMMY
    size = 0
    __slots__ = ()

    def compute(self, header: Blob, payload: Blob) -> bytes:
        return b""


class Crc32Digest(Digest):
    kind = "crc32"
    type = DigestType.CRC32
    size = 4
    __slots__ = ()

    def compute(self, header: Blob, payload: Blob) -> bytes:
        return zlib.crc32(payload, zlib.crc32(header)).to_bytes(4, "big")


class Crc32cDigest(Digest):
    kind = "crc32c"
    type = DigestType.CRC32C
    size = 4
    __slots__ = ()

    def compute(self, header: Blob, payload: Blob) -> bytes:
        return _crc32c.crc32c(payload, _crc32c.crc32c(header)).to_bytes(4, "big")


class HmacDigest(Digest):
    kind = "hmac"
    type = DigestType.HMAC_SHA256
    size = 32
    __slots__ = ("_keyed",)

    def __init__(self, password: bytes) -> None:
        # Keyed once; copy() per entry skips re-deriving the inner and outer pads.
        self._keyed = hmac.new(mac_key(password), digestmod=hashlib.sha256)

    def compute(self, header: Blob, payload: Blob) -> bytes:
        h = self._keyed.copy()
        h.update(header)
        h.update(payload)
        return h.digest()


_STATELESS: dict[str, Digest] = {"crc32": Crc32Digest(), "crc32c": Crc32cDigest(), "dummy": DummyDigest()}


def make_digest(kind: str, password: bytes) -> Digest:
    """The digest of a ledger created with ``digest=kind`` and ``password``."""
    if kind == "hmac":
        return HmacDigest(password)
    digest = _STATELESS.get(kind)
    if digest is None:
        raise BadRequestError(f"digest must be one of {', '.join(DIGEST_KINDS)}, got {kind!r}")
    return digest


for _d in (*_STATELESS.values(), HmacDigest(b"")):
    assert _d.size == DIGEST_BYTES[_d.type], _d
del _d
