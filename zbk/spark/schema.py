"""Columns of a zbk read and their Arrow form.

    ledger_id long, entry_id long, payload binary     always offered
    closed boolean                                     the ledger was closed when planned
    bookies array<string>                              the ensemble of the entry's fragment

The default schema is the first three plus the ``extra_columns`` option. A schema the user
gives (``.schema(...)``) may name any of these columns, in any order.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from zbk.errors import BadRequestError

COLUMNS: dict[str, DataType] = {
    "ledger_id": LongType(),
    "entry_id": LongType(),
    "payload": BinaryType(),
    "closed": BooleanType(),
    "bookies": ArrayType(StringType()),
}
BASE_COLUMNS = ("ledger_id", "entry_id", "payload")


def default_schema(extra_columns: Sequence[str] = ()) -> StructType:
    names = list(BASE_COLUMNS) + [c for c in extra_columns if c not in BASE_COLUMNS]
    return StructType([StructField(n, COLUMNS[n], True) for n in names])


def check_schema(schema: StructType) -> None:
    """BadRequestError unless every field is a known column of the right type."""
    seen = set()
    for f in schema.fields:
        want = COLUMNS.get(f.name)
        if want is None:
            raise BadRequestError(f"format zbk has no column {f.name!r} (columns: {', '.join(COLUMNS)})")
        if type(f.dataType) is not type(want) or (
                isinstance(want, ArrayType) and not isinstance(f.dataType.elementType, StringType)):  # type: ignore[attr-defined]
            raise BadRequestError(f"column {f.name!r} is {want.simpleString()}, not {f.dataType.simpleString()}")
        if f.name in seen:
            raise BadRequestError(f"column {f.name!r} is named twice")
        seen.add(f.name)


def arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark expects of batches for ``schema`` (names, types, nullability)."""
    fields = []
    for f in schema.fields:
        t: pa.DataType
        if f.name == "bookies":
            contains_null = f.dataType.containsNull  # type: ignore[attr-defined]
            t = pa.list_(pa.field("element", pa.string(), nullable=contains_null))
        else:
            t = {"ledger_id": pa.int64(), "entry_id": pa.int64(), "payload": pa.binary(),
                 "closed": pa.bool_()}[f.name]
        fields.append(pa.field(f.name, t, nullable=f.nullable))
    return pa.schema(fields)


def record_batch(schema: pa.Schema, ledger_id: int, first_entry: int, payloads: list[bytes], closed: bool,
                 bookies: Sequence[Sequence[str]] | None) -> pa.RecordBatch:
    """One batch of consecutive entries ``first_entry, first_entry+1, ...`` of a ledger.
    ``bookies`` gives each entry's fragment ensemble (needed only for the bookies column)."""
    n = len(payloads)
    columns: list[pa.Array] = []
    for name in schema.names:
        if name == "ledger_id":
            columns.append(pa.array([ledger_id] * n, pa.int64()))
        elif name == "entry_id":
            columns.append(pa.array(range(first_entry, first_entry + n), pa.int64()))
        elif name == "payload":
            columns.append(pa.array(payloads, pa.binary()))
        elif name == "closed":
            columns.append(pa.array([closed] * n, pa.bool_()))
        elif name == "bookies":
            assert bookies is not None and len(bookies) == n
            columns.append(pa.array([list(b) for b in bookies], schema.field("bookies").type))
    return pa.RecordBatch.from_arrays(columns, schema=schema)
