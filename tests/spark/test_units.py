"""The data source's pure parts: options, selectors, offsets, partition planning, Arrow
schemas. No Spark session and no bookies."""

from __future__ import annotations

import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType, BinaryType, LongType, StringType, StructField, StructType

from zbk.errors import BadRequestError, ConfigError
from zbk.metadata.ledger import LedgerMetadata
from zbk.spark import offsets
from zbk.spark.options import (
    JOB_KEY,
    STATE_COMMITTED,
    STATE_KEY,
    STATE_PENDING,
    Selector,
    parse_custom_metadata,
    parse_selector,
    read_options,
    write_options,
)
from zbk.spark.plan import split
from zbk.spark.schema import arrow_schema, check_schema, default_schema, record_batch

URI = "sqlite:///tmp/zbk-spark-units/meta.db"


def md(ledger_id: int = 7, *, closed_at: int | None = None, fragments: tuple = ((0, ("a:1", "b:1", "c:1")),),
       custom: dict[str, bytes] | None = None) -> LedgerMetadata:
    m = LedgerMetadata(ledger_id=ledger_id, ensemble_size=3, write_quorum=2, ack_quorum=2, fragments=fragments,
                       custom_metadata=custom or {}).validate()
    return m.closed(closed_at, 0) if closed_at is not None else m


# -- selectors and options ----------------------------------------------------------------------
def test_selectors_parse_and_match() -> None:
    assert parse_selector("1, 2,3,2") == Selector("ids", ids=(1, 2, 3))
    assert parse_selector("ALL") == Selector("all")
    sel = parse_selector("meta:app=orders=v2")
    assert (sel.kind, sel.key, sel.value) == ("meta", "app", b"orders=v2")
    assert sel.matches(md(custom={"app": b"orders=v2"}))
    assert not sel.matches(md(custom={"app": b"orders"}))
    pending = md(custom={"app": b"orders=v2", JOB_KEY: b"j", STATE_KEY: STATE_PENDING})
    assert not sel.matches(pending) and not Selector("all").matches(pending)
    assert Selector("ids", ids=(7,)).matches(pending)  # explicit ids are explicit
    assert sel.matches(md(custom={"app": b"orders=v2", JOB_KEY: b"j", STATE_KEY: STATE_COMMITTED}))
    for bad in ["", "1,,2", "x", "-1", "meta:", "meta:=v", "meta:app", str(2**63)]:
        with pytest.raises(BadRequestError):
            parse_selector(bad)


def test_read_options() -> None:
    o = read_options({"metadata": URI, "ledgers": "all", "Password": "pw", "entries_per_partition": "5",
                      "extra_columns": "bookies, closed", "maxEntriesPerTrigger": "100", "starting_offsets": "latest"})
    assert (o.password, o.entries_per_partition, o.extra_columns, o.max_entries_per_trigger, o.starting_offsets) == \
        (b"pw", 5, ("bookies", "closed"), 100, "latest")
    d = read_options({"metadata": URI, "ledgers": "1"})
    assert (d.password, d.entries_per_partition, d.extra_columns, d.max_entries_per_trigger) == (b"", 10_000, (), None)
    with pytest.raises(ConfigError, match="required"):
        read_options({"ledgers": "1"})
    with pytest.raises(ConfigError):
        read_options({"metadata": "http://x", "ledgers": "1"})
    with pytest.raises(BadRequestError, match='"ledgers" is required'):
        read_options({"metadata": URI})
    for key, value in [("entries_per_partition", "0"), ("entries_per_partition", "ten"), ("extra_columns", "size"),
                       ("maxEntriesPerTrigger", "-1"), ("starting_offsets", "middle"), ("entriesperpartition", "5")]:
        with pytest.raises(BadRequestError):
            read_options({"metadata": URI, "ledgers": "1", key: value})


def test_write_options() -> None:
    w = write_options({"metadata": URI, "ensemble": "5", "quorums": "3,2", "digest": "HMAC", "password": "p",
                       "custom_metadata": "app=orders, env = prod"})
    assert (w.ensemble, w.write_quorum, w.ack_quorum, w.digest, w.password) == (5, 3, 2, "hmac", b"p")
    assert dict(w.custom_metadata) == {"app": b"orders", "env": b"prod"}
    tags = w.ledger_metadata("job9", 3)
    assert tags["app"] == b"orders" and tags[JOB_KEY] == b"job9" and tags[STATE_KEY] == STATE_PENDING
    assert write_options({"metadata": URI, "ensemble": "1"}).write_quorum == 1
    assert (write_options({"metadata": URI, "write_quorum": "3", "ack_quorum": "1"}).write_quorum) == 3
    for opts in [{"quorums": "2"}, {"quorums": "3,2", "ensemble": "2"}, {"quorums": "2,3"}, {"digest": "md5"},
                 {"quorums": "2,2", "ack_quorum": "1"}, {"ledgers": "1"}, {"custom_metadata": "novalue"},
                 {"custom_metadata": "zbk.spark.state=committed"}, {"custom_metadata": "a=1,a=2"}]:
        with pytest.raises(BadRequestError):
            write_options({"metadata": URI, **opts})
    assert parse_custom_metadata("") == ()


# -- offsets --------------------------------------------------------------------------------------
def test_offsets_roundtrip_and_validation() -> None:
    assert offsets.encode({10: 5, 2: -1}) == {"2": -1, "10": 5}
    assert list(offsets.encode({10: 5, 2: -1})) == ["2", "10"]  # canonical order
    assert offsets.decode({"2": -1, "10": 5}) == {2: -1, 10: 5}
    bads: list[dict[str, object]] = [{"x": 1}, {"1": -2}, {"1": "3"}, {"1": True}, {"-1": 0}]
    for bad in bads:
        with pytest.raises(BadRequestError):
            offsets.decode(bad)


def test_admit_respects_the_limit_and_never_goes_back() -> None:
    start = {1: 9, 2: 99, 3: 4}
    available = {1: 109, 2: 99, 4: 49, 3: 2}  # 3 reports less than delivered; 4 is new
    assert offsets.admit(start, available, None) == {1: 109, 2: 99, 3: 4, 4: 49}
    end = offsets.admit(start, available, 60)
    assert end == {1: 39, 2: 99, 3: 4, 4: 29}  # 30 + 30, shared between the two with backlog
    assert sum(offsets.backlog(start, end).values()) == 60
    assert offsets.admit(start, available, 1) == {1: 10, 2: 99, 3: 4, 4: -1}
    # A ledger that is gone (deleted) leaves the offsets; its delivered entries stay delivered.
    assert offsets.admit({1: 5, 8: 3}, {1: 5}, 10) == {1: 5}
    # Uneven backlogs: leftovers of the even share go to the ledgers that still have some.
    end = offsets.admit({}, {1: 2, 2: 99}, 50)
    assert end == {1: 2, 2: 46} and sum(offsets.backlog({}, end).values()) == 50


def test_ranges_are_half_open() -> None:
    assert offsets.ranges({1: 9, 2: 5}, {1: 19, 2: 5, 3: 0}) == [(1, 10, 19), (3, 0, 0)]
    assert offsets.ranges({}, {}) == []


# -- planning -------------------------------------------------------------------------------------
def test_split_cuts_at_fragments_and_size() -> None:
    frags = ((0, ("a:1", "b:1", "c:1")), (10, ("a:1", "d:1", "c:1")), (25, ("e:1", "d:1", "c:1")))
    m = md(closed_at=40, fragments=frags)
    got = [(r.first, r.last, r.bookies[0], r.bookies[1]) for r in split(m, 0, 40, 8)]
    assert got == [(0, 7, "a:1", "b:1"), (8, 9, "a:1", "b:1"), (10, 17, "a:1", "d:1"), (18, 24, "a:1", "d:1"),
                   (25, 32, "e:1", "d:1"), (33, 40, "e:1", "d:1")]
    assert all(r.closed for r in split(m, 0, 40, 8))
    assert [(r.first, r.last) for r in split(m, 12, 26, 100)] == [(12, 24), (25, 26)]
    assert split(m, 5, 4, 10) == []
    open_md = md(fragments=frags)
    assert [(r.first, r.last, r.closed) for r in split(open_md, 20, 1000, 500)] == \
        [(20, 24, False), (25, 524, False), (525, 1000, False)]


# -- schemas --------------------------------------------------------------------------------------
def test_arrow_schema_matches_what_spark_expects() -> None:
    for extra in [(), ("closed",), ("bookies", "closed")]:
        s = default_schema(extra)
        assert arrow_schema(s).equals(to_arrow_schema(s, timezone="UTC")), extra
    custom = StructType([StructField("payload", BinaryType(), False),
                         StructField("bookies", ArrayType(StringType(), containsNull=False))])
    check_schema(custom)
    assert arrow_schema(custom).equals(to_arrow_schema(custom, timezone="UTC"))
    with pytest.raises(BadRequestError, match="no column"):
        check_schema(StructType([StructField("offset", LongType())]))
    with pytest.raises(BadRequestError, match="bigint"):
        check_schema(StructType([StructField("entry_id", StringType())]))
    with pytest.raises(BadRequestError):
        check_schema(StructType([StructField("bookies", ArrayType(LongType()))]))


def test_record_batch_columns() -> None:
    s = arrow_schema(default_schema(("closed", "bookies")))
    b = record_batch(s, 7, 10, [b"a", b"bc"], True, [("x:1", "y:1"), ("x:1", "z:1")])
    assert b.schema.equals(s)
    assert b.to_pydict() == {"ledger_id": [7, 7], "entry_id": [10, 11], "payload": [b"a", b"bc"],
                             "closed": [True, True], "bookies": [["x:1", "y:1"], ["x:1", "z:1"]]}
