"""The bookie's cookie: its identity, written into every journal, ledger and index directory.

A cookie ties the directories to one bookie incarnation (BP-46 "A note on cookies"): a
directory that should hold a cookie and does not, or holds another bookie's, means its
data is missing or foreign, and the bookie must not boot as if nothing happened.

Encoding (format version 1): :meth:`Cookie.encode` (zbk.metadata.registry) is a CBOR map with text keys, the
same bytes the metadata store keeps at ``<scope>/cookies/<bookie id>``::

    fv   int        format version (1); a reader refuses versions it does not know
    bid  text       bookie id (host:port or a name: zbk/bookieid.py)
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

import os
import struct
from collections.abc import Sequence

from crc32c import crc32c

from zbk.errors import CorruptDataError, CorruptMetadataError
from zbk.metadata.registry import Cookie
from zbk.storage.disk import REAL_DISK, Disk

COOKIE_FILE = "COOKIE"
COOKIE_MAGIC = b"ZBKCOOKI"
_FILE_HEADER = struct.Struct("<8sI")


def decode_cookie(data: bytes, *, path: str = "") -> Cookie:
    """Decode a cookie body read from ``path``; damage is a CorruptDataError naming the file."""
    try:
        return Cookie.decode(data, source=f"cookie in {path}" if path else "cookie")
    except CorruptMetadataError as e:
        raise CorruptDataError(str(e), path=path, offset=0) from None


def cookie_path(directory: str) -> str:
    return os.path.join(directory, COOKIE_FILE)


def write_cookie(directory: str, cookie: Cookie, disk: Disk = REAL_DISK) -> None:
    """Write the cookie into ``directory`` atomically and durably."""
    body = cookie.encode()
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
    return decode_cookie(body, path=path)


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
