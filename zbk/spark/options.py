"""Options of the ``zbk`` Spark data source, parsed into small frozen (picklable) values.

Spark hands options over as a case-insensitive map of strings (keys arrive lower-cased).
Every option is checked here, on the driver, before any job runs: a typo or a bad value is
a ``BadRequestError`` / ``ConfigError`` naming the option, never a silent default.

Read options (batch and streaming):

    metadata               metadata URI (required)
    ledgers                "1,2,3" | "all" | "meta:KEY=VALUE" (required)
    password               ledger password, UTF-8 (default empty)
    entries_per_partition  at most this many entries per Spark partition (default 10000)
    extra_columns          "closed", "bookies" or "closed,bookies" (default none)
    maxEntriesPerTrigger   streaming: at most this many entries per micro-batch
    starting_offsets       streaming: "earliest" (default) or "latest"

Write options:

    metadata, password
    ensemble               ensemble size E (default 3)
    quorums                "WQ,AQ" (default "2,2"); or write_quorum / ack_quorum
    digest                 crc32 | crc32c (default) | hmac | dummy
    custom_metadata        "key=value,key2=value2" stored on every ledger written
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from zbk import limits
from zbk.errors import BadRequestError, ConfigError
from zbk.metadata.ledger import DIGEST_TYPES, LedgerMetadata
from zbk.metadata.uri import parse_uri

# Custom metadata keys the writer uses for its commit protocol (docs/spark.md "Writing").
JOB_KEY = "zbk.spark.job"
STATE_KEY = "zbk.spark.state"
PARTITION_KEY = "zbk.spark.partition"
STATE_PENDING = b"pending"
STATE_COMMITTED = b"committed"
RESERVED_PREFIX = "zbk.spark."

EXTRA_COLUMNS = ("closed", "bookies")

_READ_KEYS = {"metadata", "ledgers", "password", "entries_per_partition", "extra_columns",
              "maxentriespertrigger", "max_entries_per_trigger", "starting_offsets"}
_WRITE_KEYS = {"metadata", "password", "ensemble", "quorums", "write_quorum", "ack_quorum", "digest",
               "custom_metadata"}


@dataclass(frozen=True)
class Selector:
    """Which ledgers a read covers: explicit ids, every ledger, or a custom metadata match."""

    kind: Literal["ids", "all", "meta"]
    ids: tuple[int, ...] = ()
    key: str = ""
    value: bytes = b""

    def matches(self, md: LedgerMetadata) -> bool:
        """Whether a listed ledger belongs to this selector. Ledgers of a Spark write that has
        not committed (docs/spark.md) never match "all" or "meta:"."""
        if self.kind == "ids":
            return md.ledger_id in self.ids
        if md.custom_metadata.get(STATE_KEY) == STATE_PENDING:
            return False
        if self.kind == "all":
            return True
        return md.custom_metadata.get(self.key) == self.value

    def __str__(self) -> str:
        if self.kind == "ids":
            return ",".join(map(str, self.ids))
        if self.kind == "all":
            return "all"
        return f"meta:{self.key}={self.value.decode(errors='replace')}"


@dataclass(frozen=True)
class ReadOptions:
    metadata: str
    selector: Selector
    password: bytes = b""
    entries_per_partition: int = limits.spark_entries_per_partition_default
    extra_columns: tuple[str, ...] = ()
    max_entries_per_trigger: int | None = None
    starting_offsets: Literal["earliest", "latest"] = "earliest"


@dataclass(frozen=True)
class WriteOptions:
    metadata: str
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    digest: str = "crc32c"
    password: bytes = b""
    custom_metadata: tuple[tuple[str, bytes], ...] = ()

    def ledger_metadata(self, job_id: str, partition: int | None) -> dict[str, bytes]:
        """The custom metadata of a ledger this job writes, still marked pending."""
        md = dict(self.custom_metadata)
        md[JOB_KEY] = job_id.encode()
        md[STATE_KEY] = STATE_PENDING
        if partition is not None:
            md[PARTITION_KEY] = str(partition).encode()
        return md


def parse_selector(text: str) -> Selector:
    """``"1,2,3"`` | ``"all"`` | ``"meta:KEY=VALUE"``; BadRequestError otherwise."""
    raw = text.strip()
    if not raw:
        raise BadRequestError('option "ledgers" is empty: give "1,2,3", "all" or "meta:KEY=VALUE"')
    if raw.lower() == "all":
        return Selector("all")
    if raw.lower().startswith("meta:"):
        key, sep, value = raw[5:].partition("=")
        if not sep or not key.strip():
            raise BadRequestError(f'option "ledgers"={text!r}: a metadata selector is "meta:KEY=VALUE"')
        return Selector("meta", key=key.strip(), value=value.encode())
    ids: list[int] = []
    for part in raw.split(","):
        part = part.strip()
        if not part.isascii() or not part.isdigit():
            raise BadRequestError(f'option "ledgers"={text!r}: {part!r} is not a ledger id '
                                  '(give "1,2,3", "all" or "meta:KEY=VALUE")')
        lid = int(part)
        if lid > limits.ledger_id_max:
            raise BadRequestError(f'option "ledgers"={text!r}: ledger id {lid} is out of range')
        if lid not in ids:
            ids.append(lid)
    return Selector("ids", ids=tuple(ids))


def read_options(options: Mapping[str, str]) -> ReadOptions:
    opts = _lower(options)
    _unknown(opts, _READ_KEYS, "read")
    extra = tuple(c.strip().lower() for c in opts.get("extra_columns", "").split(",") if c.strip())
    for c in extra:
        if c not in EXTRA_COLUMNS:
            raise BadRequestError(f'option "extra_columns": unknown column {c!r} (known: {", ".join(EXTRA_COLUMNS)})')
    if "maxentriespertrigger" in opts and "max_entries_per_trigger" in opts:
        raise BadRequestError('give "maxEntriesPerTrigger" or "max_entries_per_trigger", not both')
    max_trigger = opts.get("maxentriespertrigger", opts.get("max_entries_per_trigger"))
    starting = opts.get("starting_offsets", "earliest").strip().lower()
    if starting not in ("earliest", "latest"):
        raise BadRequestError(f'option "starting_offsets"={starting!r}: use "earliest" or "latest"')
    if "ledgers" not in opts:
        raise BadRequestError('option "ledgers" is required: "1,2,3", "all" or "meta:KEY=VALUE"')
    return ReadOptions(
        metadata=_metadata(opts),
        selector=parse_selector(opts["ledgers"]),
        password=opts.get("password", "").encode(),
        entries_per_partition=_int(opts, "entries_per_partition", limits.spark_entries_per_partition_default, low=1),
        extra_columns=tuple(dict.fromkeys(extra)),
        max_entries_per_trigger=None if max_trigger is None else _parse_int("maxEntriesPerTrigger", max_trigger, 1),
        starting_offsets="latest" if starting == "latest" else "earliest",
    )


def write_options(options: Mapping[str, str]) -> WriteOptions:
    opts = _lower(options)
    _unknown(opts, _WRITE_KEYS, "write")
    ensemble = _int(opts, "ensemble", 3, low=1, high=limits.ledger_ensemble_size_max)
    if "quorums" in opts:
        if "write_quorum" in opts or "ack_quorum" in opts:
            raise BadRequestError('give "quorums" or "write_quorum"/"ack_quorum", not both')
        parts = [p.strip() for p in opts["quorums"].split(",")]
        if len(parts) != 2:
            raise BadRequestError(f'option "quorums"={opts["quorums"]!r}: expected "WQ,AQ", e.g. "2,2"')
        wq, aq = (_parse_int("quorums", p, 1) for p in parts)
    else:
        wq = _int(opts, "write_quorum", min(2, ensemble), low=1)
        aq = _int(opts, "ack_quorum", min(2, wq), low=1)
    if not ensemble >= wq >= aq:
        raise BadRequestError(f"need ensemble >= write quorum >= ack quorum, got E={ensemble} WQ={wq} AQ={aq}")
    digest = opts.get("digest", "crc32c").strip().lower()
    if digest not in DIGEST_TYPES:
        raise BadRequestError(f'option "digest"={digest!r}: use one of {", ".join(DIGEST_TYPES)}')
    return WriteOptions(metadata=_metadata(opts), ensemble=ensemble, write_quorum=wq, ack_quorum=aq, digest=digest,
                        password=opts.get("password", "").encode(),
                        custom_metadata=parse_custom_metadata(opts.get("custom_metadata", "")))


def parse_custom_metadata(text: str) -> tuple[tuple[str, bytes], ...]:
    """``"app=orders,env=prod"`` -> ((app, b"orders"), (env, b"prod")); keys unique, and none
    in the ``zbk.spark.`` namespace the writer keeps for itself."""
    out: dict[str, bytes] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise BadRequestError(f'option "custom_metadata": {item!r} is not KEY=VALUE')
        if key.startswith(RESERVED_PREFIX):
            raise BadRequestError(f'option "custom_metadata": keys starting with {RESERVED_PREFIX!r} are reserved')
        if key in out:
            raise BadRequestError(f'option "custom_metadata": key {key!r} given twice')
        out[key] = value.strip().encode()
    return tuple(out.items())


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _unknown(opts: dict[str, str], known: set[str], what: str) -> None:
    unknown = sorted(set(opts) - known)
    if unknown:
        raise BadRequestError(f"unknown {what} option(s) {', '.join(unknown)} for format zbk "
                              f"(known: {', '.join(sorted(known))})")


def _metadata(opts: dict[str, str]) -> str:
    uri = opts.get("metadata", "").strip()
    if not uri:
        raise ConfigError('option "metadata" is required: a metadata URI such as sqlite:///var/zbk/meta.db')
    parse_uri(uri)  # ConfigError naming what is wrong
    return uri


def _int(opts: dict[str, str], key: str, default: int, *, low: int, high: int | None = None) -> int:
    if key not in opts:
        return default
    return _parse_int(key, opts[key], low, high)


def _parse_int(key: str, text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise BadRequestError(f'option "{key}"={text!r} is not an integer') from None
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in {low}..{high}"
        raise BadRequestError(f'option "{key}"={value} must be {bound}')
    return value
