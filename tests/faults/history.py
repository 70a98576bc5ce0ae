"""The history of a fault run and the final state it is judged against: their formats, the
recorder that writes a history, and the loaders the checker uses.

History: JSON lines
-------------------
One JSON object per line (UTF-8, ``\\n``-terminated), one line per event, in the order the
recorder wrote them. Every client operation is an ``invoke`` followed by at most one
completion: ``ok``, ``fail`` (it definitely did not take effect) or ``info`` (indeterminate:
a timeout, a lost connection, an error after the request was sent). An operation with no
completion (the workload died) is indeterminate too.

Fields of every event:

========== ============================================================================
``type``    ``invoke``, ``ok``, ``fail`` or ``info``
``op``      integer, unique in the file; pairs an invoke with its completion
``process`` the client that ran the operation (a string)
``kind``    the operation: see below; a completion repeats its invoke's kind
``time``    seconds on the recorder's monotonic clock (its origin means nothing)
``ledger``  the ledger id, or null (a ``create`` learns it on ``ok``)
========== ============================================================================

Fields by kind (absent where not listed; a payload is named by ``digest``, the sha256 hex of
its bytes, and ``len``, their count; an entry a read returned is ``[entry, digest, len]``):

================ ======================================= ==================================
kind             invoke                                  ok
================ ======================================= ==================================
``create``       --                                      ``ledger``
``append``       ``entry`` (the id the client assigned), ``entry`` (the id confirmed)
                 ``digest``, ``len``
``read``         ``first``, ``last``                     ``entries``
``tail``         ``first`` (the id expected next),       ``entries`` (what this step
                 ``view``                                yielded), ``end`` (true: the
                                                         ledger closed and the tail ended)
``read_lac``     --                                      ``last`` (the LAC)
``open``         --  (no recovery, no fencing)           ``last`` (LAC, or last entry if
                                                         ``closed``), ``closed``
``open_recover`` --  (fence, recover, close)             ``last``, ``closed`` (true)
``close``        --                                      ``last``
================ ======================================= ==================================

``fail`` and ``info`` carry ``error`` (text); those of ``read`` and ``tail`` also carry the
``entries`` returned before the error, since the reader saw them. A ``tail`` is a sequence
of steps sharing one ``view`` (one call to ``tail()``): one operation per entry it yields,
so a history cut short still holds every entry a reader was given. Other kinds may appear;
the checker only checks that they are well formed.

Classifying errors: an ``append`` that the client refused before assigning or sending it is
``fail``; any error of its future is ``info``, because the entry may have reached a bookie
and a recovery may keep it (the seeds' entry 12). A ``fail`` append claims no entry id.

Final state: JSON
-----------------
What the cluster holds after healing, one object per ledger::

    {"ledgers": {"7": {"closed": true, "last_entry": 41,
                       "entries": {"0": "<sha256 hex>", "1": "...", ...}}}}

``last_entry`` is the last entry of a closed ledger (its LAC if it is not closed);
``entries`` are those read back, ``id -> digest``. An entry that could not be read is
absent. A ledger the history names but the cluster does not have is absent.

:meth:`FinalState.save` writes the header line ``{"ledgers": {``, then one ledger a line,
then ``}}``: still one JSON object, which :meth:`FinalState.load` reads a line at a time
(any other layout of the same object is parsed whole).

Size
----
A 30-minute chaos run writes a history of several hundred megabytes, most of it appends
and tail steps. Nothing here holds a whole history: :func:`iter_history` yields the events
of files a line at a time (the checker judges them as they come), and a final state keeps
each ledger's digests packed (:class:`Digests`, 32 bytes an entry).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import compress
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

from zbk.errors import CorruptDataError

TYPES = ("invoke", "ok", "fail", "info")
COMPLETIONS = ("ok", "fail", "info")
KINDS = ("create", "append", "read", "tail", "read_lac", "open", "open_recover", "close")
_DIGEST = re.compile(r"[0-9a-f]{64}")


def digest(payload: bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


@dataclass(frozen=True, slots=True)
class Seen:
    """One entry a read returned."""

    entry: int
    digest: str
    length: int


@dataclass(frozen=True, slots=True)
class Event:
    """One line of a history. ``source`` is the index of the file it came from (op ids are
    unique per file only); it is not written."""

    type: str
    op: int
    process: str
    kind: str
    time: float
    ledger: int | None = None
    entry: int | None = None
    digest: str | None = None
    length: int | None = None
    first: int | None = None
    last: int | None = None
    closed: bool | None = None
    end: bool | None = None
    view: str | None = None
    entries: tuple[Seen, ...] | None = None
    error: str | None = None
    source: int = 0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "op": self.op, "process": self.process, "kind": self.kind,
                               "time": self.time, "ledger": self.ledger}
        for name, value in (("entry", self.entry), ("digest", self.digest), ("len", self.length),
                            ("first", self.first), ("last", self.last), ("closed", self.closed), ("end", self.end),
                            ("view", self.view), ("error", self.error)):
            if value is not None:
                out[name] = value
        if self.entries is not None:
            out["entries"] = [[s.entry, s.digest, s.length] for s in self.entries]
        return out

    @property
    def ref(self) -> str:
        """How a report names this event's operation: ``op 17``, or ``op 2:17`` for the
        third of several history files."""
        return f"op {self.op}" if self.source == 0 else f"op {self.source}:{self.op}"


# -- parsing ------------------------------------------------------------------------------------
class _Bad(Exception):
    """A field failed its check; turned into CorruptDataError with the place."""


T = TypeVar("T")


def _opt(d: Mapping[str, Any], name: str, kind: type[T]) -> T | None:
    v = d.get(name)
    if v is None:
        return None
    # bool is an int in Python: an id of true is as wrong as an id of "1".
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        raise _Bad(f"{name!r} is {v!r}, not {kind.__name__}")
    return v


def _req(d: Mapping[str, Any], name: str, kind: type[T]) -> T:
    v = _opt(d, name, kind)
    if v is None:
        raise _Bad(f"no {name!r}")
    return v


def _time(d: Mapping[str, Any]) -> float:
    v = d.get("time")
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise _Bad(f"'time' is {v!r}, not a number")
    return float(v)


def _digest(v: Any, name: str) -> str:
    if not isinstance(v, str) or not _DIGEST.fullmatch(v):
        raise _Bad(f"{name!r} is {v!r}, not a sha256 hex digest")
    return v


def _seen(v: Any) -> tuple[Seen, ...]:
    if not isinstance(v, list):
        raise _Bad(f"'entries' is {v!r}, not a list")
    out = []
    for item in v:
        if (not isinstance(item, list) or len(item) != 3 or not isinstance(item[0], int) or isinstance(item[0], bool)
                or not isinstance(item[2], int) or isinstance(item[2], bool)):
            raise _Bad(f"an entry of 'entries' is {item!r}, not [entry, digest, len]")
        out.append(Seen(item[0], _digest(item[1], "entries"), item[2]))
    return tuple(out)


def event_from_json(d: Any, source: int = 0) -> Event:
    """One parsed line, checked field by field (raises ``_Bad``)."""
    if not isinstance(d, dict):
        raise _Bad(f"a line is {type(d).__name__}, not an object")
    typ = _req(d, "type", str)
    if typ not in TYPES:
        raise _Bad(f"'type' is {typ!r}, not one of {', '.join(TYPES)}")
    dg = d.get("digest")
    entries = d.get("entries")
    return Event(
        type=typ, op=_req(d, "op", int), process=_req(d, "process", str), kind=_req(d, "kind", str), time=_time(d),
        ledger=_opt(d, "ledger", int), entry=_opt(d, "entry", int),
        digest=None if dg is None else _digest(dg, "digest"), length=_opt(d, "len", int),
        first=_opt(d, "first", int), last=_opt(d, "last", int), closed=_opt(d, "closed", bool),
        end=_opt(d, "end", bool), view=_opt(d, "view", str),
        entries=None if entries is None else _seen(entries), error=_opt(d, "error", str), source=source)


@dataclass
class History:
    """The events of one or more history files, each file's in its order."""

    events: list[Event] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # e.g. a torn last line, dropped

    @classmethod
    def load(cls, paths: Iterable[Path | str]) -> History:
        h = cls()
        for source, path in enumerate(paths):
            h.events.extend(parse_lines(Path(path).read_bytes(), source, str(path), h.notes))
        return h

    def ledgers(self) -> set[int]:
        """Every ledger the history names: those whose final state the checker needs."""
        return {ev.ledger for ev in self.events if ev.ledger is not None}

    @classmethod
    def parse(cls, *texts: str) -> History:
        """The history of in-memory files (``texts[i]`` is source ``i``)."""
        h = cls()
        for source, text in enumerate(texts):
            h.events.extend(parse_lines(text.encode(), source, f"<history {source}>", h.notes))
        return h


def iter_history(paths: Iterable[Path | str], notes: list[str] | None = None) -> Iterator[Event]:
    """The events of history files, file after file, read a line at a time (file ``i`` is
    source ``i``); the same events, notes and errors as :meth:`History.load`."""
    for source, path in enumerate(paths):
        offset = 0
        with open(path, "rb") as f:
            for line_no, line in enumerate(f, start=1):
                whole = line.endswith(b"\n")
                body = line[:-1] if whole else line
                try:
                    if body.strip():
                        yield event_from_json(json.loads(body), source)
                except (ValueError, _Bad) as e:
                    if not whole:
                        if notes is not None:
                            notes.append(f"{path}: a torn last line ({len(body)} bytes at offset {offset}) was dropped")
                        return
                    raise CorruptDataError(f"history line {line_no}: {e}", path=str(path), offset=offset) from None
                offset += len(line)


def scan_ledgers(paths: Iterable[Path | str]) -> set[int]:
    """Every ledger that history files name (:meth:`History.ledgers`, a line at a time)."""
    return {ev.ledger for ev in iter_history(paths) if ev.ledger is not None}


def parse_lines(data: bytes, source: int = 0, name: str = "", notes: list[str] | None = None) -> Iterator[Event]:
    """The events of one history file's bytes. A last line without its newline that does not
    parse is what a workload killed mid-write leaves: it is dropped (with a note). Any other
    bad line is CorruptDataError, naming the file and the line's offset."""
    offset = 0
    while offset < len(data):
        nl = data.find(b"\n", offset)
        line = data[offset:] if nl < 0 else data[offset:nl]
        try:
            if line.strip():
                yield event_from_json(json.loads(line), source)
        except (ValueError, _Bad) as e:
            if nl < 0:
                if notes is not None:
                    notes.append(f"{name}: a torn last line ({len(line)} bytes at offset {offset}) was dropped")
                return
            line_no = data.count(b"\n", 0, offset) + 1
            raise CorruptDataError(f"history line {line_no}: {e}", path=name, offset=offset) from None
        if nl < 0:
            return
        offset = nl + 1


# -- the final state ------------------------------------------------------------------------------
class Digests(Mapping[int, str]):
    """Entry id -> sha256 hex digest, packed: 32 bytes an entry for ids from 0 up to the
    highest (a ledger's entries are dense), a dict for ids outside that range."""

    __slots__ = ("_packed", "_present", "_count", "_other")

    def __init__(self, items: Mapping[int, str] | Iterable[tuple[int, str]] = ()) -> None:
        pairs = sorted(items.items() if isinstance(items, Mapping) else items)
        dense = [(e, d) for e, d in pairs if 0 <= e <= 4 * len(pairs) + 1024]
        top = dense[-1][0] + 1 if dense else 0
        self._packed = bytearray(32 * top)
        self._present = bytearray(top)
        for e, d in dense:
            self._packed[32 * e:32 * e + 32] = bytes.fromhex(d)
            self._present[e] = 1
        self._other = {e: d for e, d in pairs if not 0 <= e < top}
        self._count = len(dense) + len(self._other)

    def __getitem__(self, eid: int) -> str:
        if 0 <= eid < len(self._present) and self._present[eid]:
            return self._packed[32 * eid:32 * eid + 32].hex()
        return self._other[eid]

    def __contains__(self, eid: object) -> bool:
        if isinstance(eid, int) and 0 <= eid < len(self._present):
            return bool(self._present[eid])
        return eid in self._other

    def __iter__(self) -> Iterator[int]:
        yield from sorted([e for e in self._other if e < 0])
        yield from compress(range(len(self._present)), self._present)
        yield from sorted([e for e in self._other if e >= len(self._present)])

    def __len__(self) -> int:
        return self._count

    def __repr__(self) -> str:
        return f"Digests({len(self)} entries)"


@dataclass(frozen=True)
class FinalLedger:
    closed: bool
    last_entry: int  # the last entry if closed, else the LAC
    entries: Mapping[int, str]  # entry id -> digest of what was read back after healing


@dataclass
class FinalState:
    ledgers: dict[int, FinalLedger] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"ledgers": {str(lid): _ledger_json(fl) for lid, fl in sorted(self.ledgers.items())}}

    def save(self, path: Path | str) -> None:
        """One ledger a line (see the module's doc), written as it goes."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(_HEADER + "\n")
            items = sorted(self.ledgers.items())
            for i, (lid, fl) in enumerate(items):
                f.write(json.dumps({str(lid): _ledger_json(fl)})[1:-1] + ("," if i + 1 < len(items) else "") + "\n")
            f.write("}}\n")

    @classmethod
    def from_json(cls, d: Any) -> FinalState:
        if not isinstance(d, dict) or not isinstance(d.get("ledgers"), dict):
            raise _Bad("the final state is not an object with 'ledgers'")
        out = cls()
        for key, v in d["ledgers"].items():
            out.ledgers[_int_key(key, "ledger id")] = _ledger_from_json(key, v)
        return out

    @classmethod
    def load(cls, path: Path | str) -> FinalState:
        try:
            with open(path, "rb") as f:
                if f.readline().strip() == _HEADER.encode():
                    return cls._load_lines(f)
            return cls.from_json(json.loads(Path(path).read_bytes()))
        except (ValueError, _Bad) as e:
            raise CorruptDataError(f"final state: {e}", path=str(path)) from None

    @classmethod
    def _load_lines(cls, f: IO[bytes]) -> FinalState:
        out = cls()
        for line in f:
            text = line.strip().rstrip(b",")
            if text == b"}}":
                return out
            if text:
                ((key, v),) = json.loads(b"{" + text + b"}").items()
                lid = _int_key(key, "ledger id")
                if lid in out.ledgers:
                    raise _Bad(f"ledger {key} is listed twice")
                out.ledgers[lid] = _ledger_from_json(key, v)
        raise _Bad("the final state ends before its closing '}}'")


_HEADER = '{"ledgers": {'


def _ledger_json(fl: FinalLedger) -> dict[str, Any]:
    return {"closed": fl.closed, "last_entry": fl.last_entry,
            "entries": {str(e): d for e, d in sorted(fl.entries.items())}}


def _ledger_from_json(key: str, v: Any) -> FinalLedger:
    if not isinstance(v, dict):
        raise _Bad(f"ledger {key}: not an object")
    closed = _req(v, "closed", bool)
    last = _req(v, "last_entry", int)
    raw = v.get("entries", {})
    if not isinstance(raw, dict):
        raise _Bad(f"ledger {key}: 'entries' is not an object")
    entries = Digests((_int_key(e, "entry id"), _digest(dg, f"ledger {key} entry {e}")) for e, dg in raw.items())
    beyond = [e for e in entries if e > last]
    if closed and beyond:
        # Nothing can read past a closed ledger's end: a collector that claims so is wrong.
        raise _Bad(f"ledger {key} is closed at {last} but lists entries {beyond[:5]} beyond it")
    return FinalLedger(closed, last, entries)


def _int_key(key: str, what: str) -> int:
    try:
        return int(key)
    except ValueError:
        raise _Bad(f"{what} {key!r} is not an integer") from None


# -- the recorder ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Op:
    """An invoked operation, to complete with ok / fail / info."""

    id: int
    process: str
    kind: str
    ledger: int | None


class _EntryFuture(Protocol):  # an append's asyncio.Future or concurrent.futures.Future
    def add_done_callback(self, fn: Callable[[Any], object], /) -> None: ...
    def cancelled(self) -> bool: ...
    def exception(self) -> BaseException | None: ...
    def result(self) -> int: ...


def _error_text(err: BaseException | str) -> str:
    if isinstance(err, str):
        return err
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


class HistoryRecorder:
    """Writes a history, one line per event, flushed as it is written: a workload killed at
    any point leaves every line but possibly a torn last one, which the loader drops.

    Thread-safe: one lock orders op ids, times and lines, so the file is in time order. One
    recorder per file, and the file must not exist yet (a history is never appended to by a
    second run); or a text stream the caller owns; or None, to record nothing (a workload
    then calls the recorder whether or not a history was asked for). ``clock`` is the
    monotonic clock to stamp events with (a simulation passes its virtual one).
    """

    def __init__(self, sink: Path | str | IO[str] | None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._owned = isinstance(sink, str | Path)
        self._file: IO[str] | None = open(sink, "x", encoding="utf-8") if isinstance(sink, str | Path) else sink
        self._discard = sink is None
        self._clock = clock
        self._lock = threading.Lock()
        self._next_op = 0
        self._open: set[int] = set()
        self.dropped = 0  # completions that arrived after close(): not written

    def __enter__(self) -> HistoryRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop recording. Operations still open stay without a completion: indeterminate.
        A stream passed in is flushed, not closed."""
        with self._lock:
            if self._file is not None:
                if self._owned:
                    self._file.close()
                self._file = None

    @property
    def pending(self) -> int:
        """Operations invoked and not yet completed."""
        with self._lock:
            return len(self._open)

    def _write(self, fields: dict[str, Any]) -> bool:
        # Under self._lock. The time is taken here so that it never goes backwards in the file.
        if self._file is None:
            self.dropped += not self._discard
            return False
        fields["time"] = self._clock()
        self._file.write(json.dumps(fields, separators=(",", ":")) + "\n")
        self._file.flush()
        return True

    def invoke(self, process: str, kind: str, *, ledger: int | None = None, entry: int | None = None,
               payload: bytes | None = None, first: int | None = None, last: int | None = None,
               view: str | None = None) -> Op:
        fields: dict[str, Any] = {"type": "invoke", "op": 0, "process": process, "kind": kind, "time": 0.0,
                                  "ledger": ledger}
        for name, value in (("entry", entry), ("first", first), ("last", last), ("view", view)):
            if value is not None:
                fields[name] = value
        if payload is not None:
            fields["digest"], fields["len"] = digest(payload), len(payload)
        with self._lock:
            op = self._next_op
            self._next_op += 1
            fields["op"] = op
            if self._write(fields):
                self._open.add(op)
        return Op(op, process, kind, ledger)

    def _complete(self, op: Op, typ: str, fields: dict[str, Any]) -> None:
        ledger = fields.pop("ledger", None)  # a create learns its ledger on ok
        head = {"type": typ, "op": op.id, "process": op.process, "kind": op.kind, "time": 0.0,
                "ledger": op.ledger if ledger is None else ledger}
        head.update((k, v) for k, v in fields.items() if v is not None)
        with self._lock:
            if self._file is None:
                self.dropped += not self._discard
                return
            assert op.id in self._open, f"{op} completed twice (or never invoked here)"
            self._open.discard(op.id)
            self._write(head)

    def ok(self, op: Op, *, ledger: int | None = None, entry: int | None = None,
           entries: Iterable[tuple[int, bytes]] | None = None, last: int | None = None,
           closed: bool | None = None, end: bool | None = None) -> None:
        self._complete(op, "ok", {"ledger": ledger, "entry": entry, "entries": _entries(entries), "last": last,
                                  "closed": closed, "end": end})

    def fail(self, op: Op, error: BaseException | str, *, entries: Iterable[tuple[int, bytes]] | None = None) -> None:
        self._complete(op, "fail", {"error": _error_text(error), "entries": _entries(entries)})

    def info(self, op: Op, error: BaseException | str, *, entries: Iterable[tuple[int, bytes]] | None = None) -> None:
        self._complete(op, "info", {"error": _error_text(error), "entries": _entries(entries)})

    def watch_append(self, op: Op, fut: _EntryFuture) -> None:
        """Complete an ``append`` from its future: ok with the confirmed id, else info (an
        add whose future failed may still be in the ledger)."""
        def done(f: _EntryFuture) -> None:
            if f.cancelled():
                self.info(op, "cancelled")
            elif (err := f.exception()) is not None:
                self.info(op, err)
            else:
                self.ok(op, entry=f.result())

        fut.add_done_callback(done)


def _entries(entries: Iterable[tuple[int, bytes]] | None) -> list[list[Any]] | None:
    if entries is None:
        return None
    return [[eid, digest(p), len(p)] for eid, p in entries]
