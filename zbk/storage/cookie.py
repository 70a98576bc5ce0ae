"""The bookie's cookie: its identity, written into every journal, ledger and index directory.

A cookie ties the directories to one bookie incarnation (BP-46 "A note on cookies"): a
directory that should hold a cookie and does not, or holds another bookie's, means its
data is missing or foreign, and the bookie must not boot as if nothing happened.

Encoding (format version 1): :meth:`Cookie.to_bytes` is a CBOR map with text keys, the
same bytes the metadata store keeps at ``<scope>/cookies/<bookie id>``::

    fv   int        format version (1); a reader refuses versions it does not know
    bid  text       bookie id (host:port)
    iid  text       cluster instance id
    jd   [text]     journal directories, in configuration order
    ld   [text]     ledger directories
    xd   [text]     index directories
    inc  text       incarnation: a uuid4 made when the bookie first formatted its disks

Local file ``<dir>/COOKIE`` (replaced atomically)::

    0   8s   magic b"ZBKCOOKI"
    8   u32  crc32c of the CBOR bytes
    12  ...  the CBOR bytes above
"""

from __future__ import annotations

import dataclasses
import os
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cbor2
from crc32c import crc32c

from zbk.errors import CorruptDataError
from zbk.storage.disk import REAL_DISK, Disk

FORMAT_VERSION = 1
COOKIE_FILE = "COOKIE"
COOKIE_MAGIC = b"ZBKCOOKI"
_FILE_HEADER = struct.Struct("<8sI")
_COMPARED = ("bookie_id", "instance_id", "journal_dirs", "ledger_dirs", "index_dirs", "incarnation")


@dataclass(frozen=True, kw_only=True)
class Cookie:
    bookie_id: str
    instance_id: str
    journal_dirs: tuple[str, ...]
    ledger_dirs: tuple[str, ...]
    index_dirs: tuple[str, ...]
    incarnation: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)

    def to_bytes(self) -> bytes:
        return cbor2.dumps({
            "fv": FORMAT_VERSION, "bid": self.bookie_id, "iid": self.instance_id,
            "jd": list(self.journal_dirs), "ld": list(self.ledger_dirs), "xd": list(self.index_dirs),
            "inc": self.incarnation,
        })

    @classmethod
    def from_bytes(cls, data: bytes, *, path: str = "") -> Cookie:
        """Decode :meth:`to_bytes`; CorruptDataError when malformed or of an unknown version."""
        try:
            doc: Any = cbor2.loads(data)
        except (cbor2.CBORDecodeError, ValueError) as e:
            raise CorruptDataError(f"cookie is not valid CBOR: {e}", path=path, offset=0) from None
        if not isinstance(doc, dict) or doc.get("fv") != FORMAT_VERSION:
            version = doc.get("fv") if isinstance(doc, dict) else None
            raise CorruptDataError(f"cookie format version {version!r} is not {FORMAT_VERSION}",
                                   path=path, offset=0)
        try:
            cookie = cls(bookie_id=_text(doc["bid"]), instance_id=_text(doc["iid"]),
                         journal_dirs=_texts(doc["jd"]), ledger_dirs=_texts(doc["ld"]),
                         index_dirs=_texts(doc["xd"]), incarnation=_text(doc["inc"]))
        except (KeyError, TypeError) as e:
            raise CorruptDataError(f"cookie field is missing or mistyped: {e}", path=path, offset=0) from None
        return cookie

    def differences(self, other: Cookie) -> list[str]:
        """One line per field that differs, as ``field: mine != other``."""
        return [f"{name}: {getattr(self, name)!r} != {getattr(other, name)!r}"
                for name in _COMPARED if getattr(self, name) != getattr(other, name)]


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected text, got {value!r}")
    return value


def _texts(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list of text, got {value!r}")
    return tuple(_text(v) for v in value)


def cookie_path(directory: str) -> str:
    return os.path.join(directory, COOKIE_FILE)


def write_cookie(directory: str, cookie: Cookie, disk: Disk = REAL_DISK) -> None:
    """Write the cookie into ``directory`` atomically and durably."""
    body = cookie.to_bytes()
    os.makedirs(directory, exist_ok=True)
    disk.write_file_atomic(cookie_path(directory), _FILE_HEADER.pack(COOKIE_MAGIC, crc32c(body)) + body)


def write_cookies(dirs: Sequence[str], cookie: Cookie, disk: Disk = REAL_DISK) -> None:
    for d in dirs:
        write_cookie(d, cookie, disk)


def read_cookie(directory: str) -> Cookie | None:
    """The cookie in ``directory``; ``None`` when it has none; CorruptDataError when damaged."""
    path = cookie_path(directory)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if len(data) < _FILE_HEADER.size:
        raise CorruptDataError("cookie file is too short", path=path, offset=0)
    magic, crc = _FILE_HEADER.unpack_from(data, 0)
    body = data[_FILE_HEADER.size:]
    if magic != COOKIE_MAGIC or crc32c(body) != crc:
        raise CorruptDataError("cookie file fails its checks", path=path, offset=0)
    return Cookie.from_bytes(body, path=path)


def verify_cookies(dirs: Sequence[str], expected: Cookie) -> list[str]:
    """Reasons why ``dirs`` do not all hold ``expected`` (empty when they all do).

    A directory without a cookie is a mismatch: BP-46 reads it as a disk whose data is gone.
    """
    reasons = []
    for d in dirs:
        try:
            found = read_cookie(d)
        except CorruptDataError as e:
            reasons.append(f"{d}: cookie unreadable: {e}")
            continue
        if found is None:
            reasons.append(f"{d}: cookie missing")
            continue
        reasons.extend(f"{d}: {line}" for line in found.differences(expected))
    return reasons
