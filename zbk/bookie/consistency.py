"""The offline consistency check of a stopped bookie's storage (`zbk shell localconsistencycheck`).

Every entry the index holds must be readable where its slot points:

1. the index file's header and every slot pass their checks (zbk/storage/index.py);
2. the slot's location lies inside an existing entry log's records, and the record there
   passes its crc32c and names the same ledger and entry (zbk/storage/entrylogformat.py);
3. the blob in the record is a well-formed entry of that ledger and entry id, and its
   digest is right where checking it needs no password: crc32 and crc32c digests are
   checked; an hmac digest is keyed from the ledger password, which bookies never hold,
   so hmac entries are counted as unchecked; ``dummy`` entries carry no digest.

Nothing is written: entry logs are opened read-only and never sealed (the bookie seals a
log without a footer at its next boot); a log without a footer is read up to its size.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from zbk.client.digest import Crc32cDigest, Crc32Digest, Digest
from zbk.errors import CorruptDataError, DigestMismatchError
from zbk.storage import index
from zbk.storage.entrylogformat import (
    HEADER_BYTES,
    RECORD_HEADER_BYTES,
    _header_ok,
    _read_record,
    list_logs,
    read_footer,
    split_location,
)
from zbk.wire.entry import DigestType, check_structure, parse_entry

# Entry logs held open at once while checking (least recently used closed first).
_LOGS_OPEN_MAX = 64
_DIGESTS: dict[int, Digest] = {DigestType.CRC32: Crc32Digest(), DigestType.CRC32C: Crc32cDigest()}


@dataclass(frozen=True)
class BadEntry:
    """One entry (or, with ``entry_id`` None, a whole index file) that fails the check."""

    ledger_id: int
    entry_id: int | None
    problem: str
    path: str = ""
    offset: int = -1


@dataclass
class ConsistencyReport:
    ledgers: int = 0
    entries: int = 0  # entries the index holds (slots that pass their check or point at bad records)
    digests_checked: int = 0  # crc32 and crc32c entries whose digest was verified
    digests_unchecked: int = 0  # hmac entries: their digest needs the ledger password
    no_digest: int = 0  # dummy entries: structure and ids only
    bad: list[BadEntry] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.bad


class _LogReader:
    """Read-only access to the entry logs of the ledger directories."""

    def __init__(self, ledger_dirs: Iterable[str]) -> None:
        self.paths: dict[int, str] = {}
        for d in ledger_dirs:
            if os.path.isdir(d):
                self.paths.update(list_logs(d))
        self._open: OrderedDict[int, tuple[int, int, str]] = OrderedDict()  # log id -> (fd, end, header problem)

    def read(self, location: int, ledger_id: int, entry_id: int) -> bytes:
        log_id, offset = split_location(location)
        path = self.paths.get(log_id)
        if path is None:
            raise CorruptDataError(f"points into entry log {log_id}, which does not exist", path="", offset=offset)
        fd, end, header_problem = self._fd(log_id, path)
        if header_problem:
            raise CorruptDataError(header_problem, path=path, offset=0)
        if offset < HEADER_BYTES or offset + RECORD_HEADER_BYTES > end:
            raise CorruptDataError(f"points outside the log's records (they end at {end})", path=path, offset=offset)
        return _read_record(fd, path, offset, end, ledger_id, entry_id)

    def _fd(self, log_id: int, path: str) -> tuple[int, int, str]:
        got = self._open.get(log_id)
        if got is not None:
            self._open.move_to_end(log_id)
            return got
        fd = os.open(path, os.O_RDONLY)
        head = os.pread(fd, HEADER_BYTES, 0)
        problem = "" if _header_ok(head, log_id) else f"the header of entry log {log_id} fails its checks"
        footer = read_footer(fd, log_id)
        end = footer.data_end if footer is not None else os.fstat(fd).st_size
        self._open[log_id] = (fd, end, problem)
        if len(self._open) > _LOGS_OPEN_MAX:
            os.close(self._open.popitem(last=False)[1][0])
        return fd, end, problem

    def close(self) -> None:
        for fd, _, _ in self._open.values():
            os.close(fd)
        self._open.clear()


def _index_files(index_dirs: Iterable[str]) -> dict[int, str]:
    found: dict[int, str] = {}
    for d in index_dirs:
        if os.path.isdir(d):
            for lid, path in index.list_index_files(d).items():
                found.setdefault(lid, path)
    return found


def _slots(ledger_id: int, path: str, report: ConsistencyReport) -> Iterator[tuple[int, int]]:
    """(entry id, location) of every slot in the ledger's index file that passes its check;
    the others, and a damaged header or page, go to ``report.bad``."""
    with open(path, "rb") as f:
        fd = f.fileno()
        try:
            index.decode_header(os.pread(fd, index.HEADER_BYTES, 0), ledger_id, path)
        except CorruptDataError as e:
            report.bad.append(BadEntry(ledger_id, None, f"index header: {e}", path, 0))
            return
        for page_no in range(index.page_count(os.fstat(fd).st_size)):
            try:
                page = index.read_page(fd, page_no, path)
            except CorruptDataError as e:
                report.bad.append(BadEntry(ledger_id, None, str(e), e.path, e.offset))
                continue
            base = page_no * index.PAGE_ENTRIES
            for i in range(index.PAGE_ENTRIES):
                if not (page[2 * i] or page[2 * i + 1]):
                    continue
                try:
                    location = index.slot_location(page, base + i, path)
                except CorruptDataError as e:
                    report.bad.append(BadEntry(ledger_id, base + i, str(e), e.path, e.offset))
                    continue
                if location is not None:
                    yield base + i, location


def _check_blob(blob: bytes, ledger_id: int, entry_id: int, report: ConsistencyReport) -> str:
    """Why the stored blob is not a valid entry ``ledger_id:entry_id`` ("" when it is)."""
    checked = check_structure(blob)
    if isinstance(checked, str):
        return f"the stored entry is malformed: {checked}"
    dtype, lid, eid = checked[0], checked[1], checked[2]
    if (lid, eid) != (ledger_id, entry_id):
        return f"the stored entry is {lid}:{eid}"
    if dtype == DigestType.HMAC_SHA256:
        report.digests_unchecked += 1
        return ""
    if dtype == DigestType.DUMMY:
        report.no_digest += 1
        return ""
    digest = _DIGESTS[dtype]  # check_structure let only known digest types through
    try:
        parse_entry(blob, digest, ledger_id=ledger_id, entry_id=entry_id)
    except DigestMismatchError as e:
        return f"the entry's {digest.kind} digest: {e}"
    report.digests_checked += 1
    return ""


def check(ledger_dirs: Iterable[str], index_dirs: Iterable[str],
          progress: Callable[[int, int], None] | None = None) -> ConsistencyReport:
    """Check every entry the index holds (the module docstring says how); ``progress(done,
    total)`` after each ledger."""
    report = ConsistencyReport()
    logs = _LogReader(ledger_dirs)
    files = _index_files(index_dirs)
    try:
        for n, (lid, path) in enumerate(sorted(files.items()), 1):
            report.ledgers += 1
            for eid, location in _slots(lid, path, report):
                report.entries += 1
                try:
                    blob = logs.read(location, lid, eid)
                except CorruptDataError as e:
                    report.bad.append(BadEntry(lid, eid, str(e), e.path, e.offset))
                    continue
                except OSError as e:  # a disk that fails the read: this entry is unreadable
                    report.bad.append(BadEntry(lid, eid, f"reading it failed: {e}", "", split_location(location)[1]))
                    continue
                problem = _check_blob(blob, lid, eid, report)
                if problem:
                    log_id, offset = split_location(location)
                    report.bad.append(BadEntry(lid, eid, problem, logs.paths[log_id], offset))
            if progress is not None:
                progress(n, len(files))
    finally:
        logs.close()
    return report
