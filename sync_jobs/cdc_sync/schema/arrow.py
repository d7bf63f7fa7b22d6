"""RowSchema -> Arrow schema (what Delta tables are created and evolved with)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pyarrow as pa

from cdc_sync.core.types import ColumnType, RowSchema, TypeKind

MAX_DECIMAL128_PRECISION = 38

_SIMPLE: dict[TypeKind, pa.DataType] = {
    TypeKind.BOOLEAN: pa.bool_(),
    TypeKind.INT16: pa.int16(),
    TypeKind.INT32: pa.int32(),
    TypeKind.INT64: pa.int64(),
    TypeKind.FLOAT32: pa.float32(),
    TypeKind.FLOAT64: pa.float64(),
    TypeKind.STRING: pa.string(),
    TypeKind.BYTES: pa.binary(),
    TypeKind.DATE: pa.date32(),
    TypeKind.TIME: pa.string(),  # Delta has no time type
    TypeKind.TIMESTAMP: pa.timestamp("us"),
    TypeKind.TIMESTAMP_TZ: pa.timestamp("us", tz="UTC"),
    TypeKind.JSON: pa.string(),
    TypeKind.UUID: pa.string(),
}


def arrow_type(column_type: ColumnType) -> pa.DataType:
    kind = column_type.kind
    if kind is TypeKind.ARRAY and column_type.element is not None:
        return pa.list_(arrow_type(column_type.element))
    if kind is TypeKind.DECIMAL:
        if decimal_as_text(column_type):
            return pa.string()
        return pa.decimal128(column_type.precision or MAX_DECIMAL128_PRECISION, column_type.scale)
    return _SIMPLE[kind]


def decimal_as_text(column_type: ColumnType) -> bool:
    """Variable-scale or over-wide numerics have no exact Arrow/Delta decimal: kept as text."""
    return column_type.scale is None or (column_type.precision or 0) > MAX_DECIMAL128_PRECISION


def arrow_value(column_type: ColumnType, value: Any) -> Any:
    """A converted value in the form `pa.array(..., type=arrow_type(t))` accepts."""
    if value is None:
        return None
    if column_type.kind is TypeKind.ARRAY and column_type.element is not None:
        return [arrow_value(column_type.element, item) for item in value]
    if isinstance(value, Decimal) and decimal_as_text(column_type):
        return str(value)
    return value


def arrow_schema(schema: RowSchema) -> pa.Schema:
    return pa.schema(
        [pa.field(c.name, arrow_type(c.type), nullable=c.type.optional) for c in schema.columns]
    )
