"""RowSchema -> Arrow schema (what Delta tables are created and evolved with)."""

from __future__ import annotations

import math
import struct
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
        return format(value, "f")  # plain notation, as Postgres prints it (str gives 1E-7)
    return value


def python_value(arrow: pa.DataType, value: Any) -> Any:
    """A value read back from Arrow (`to_pylist`) as the decoder gave it: a float32 comes back
    as the double nearest to it (0.1 -> 0.10000000149011612), turned back into the shortest
    decimal that is the same float32, as Postgres prints `real`."""
    if value is None:
        return None
    if pa.types.is_list(arrow):
        return [python_value(arrow.value_type, item) for item in value]
    if pa.types.is_float32(arrow) and math.isfinite(value):
        return shortest_float32(value)
    return value


def shortest_float32(value: float) -> float:
    """The shortest decimal that is the same float32 (what Postgres prints for `real`)."""
    for digits in range(1, 10):  # 9 significant digits always identify a float32
        shortest = float(f"{value:.{digits}g}")
        if _as_float32(shortest) == value:
            return shortest
    return value


def _as_float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def arrow_schema(schema: RowSchema) -> pa.Schema:
    return pa.schema(
        [pa.field(c.name, arrow_type(c.type), nullable=c.type.optional) for c in schema.columns]
    )


def column_type_from_arrow(arrow: pa.DataType) -> ColumnType:
    """The column type of an Arrow result (a computed field's SQL expression): the inverse of
    `arrow_type` where one exists. TypeError for types no sink stores (intervals, structs)."""
    if pa.types.is_boolean(arrow):
        return ColumnType(TypeKind.BOOLEAN)
    if pa.types.is_int8(arrow) or pa.types.is_int16(arrow) or pa.types.is_uint8(arrow):
        return ColumnType(TypeKind.INT16)
    if pa.types.is_int32(arrow) or pa.types.is_uint16(arrow):
        return ColumnType(TypeKind.INT32)
    if pa.types.is_int64(arrow) or pa.types.is_uint32(arrow):
        return ColumnType(TypeKind.INT64)
    if pa.types.is_uint64(arrow):
        return ColumnType(TypeKind.DECIMAL, precision=20, scale=0)
    if pa.types.is_float16(arrow) or pa.types.is_float32(arrow):
        return ColumnType(TypeKind.FLOAT32)
    if pa.types.is_float64(arrow):
        return ColumnType(TypeKind.FLOAT64)
    if pa.types.is_decimal(arrow):
        return ColumnType(TypeKind.DECIMAL, precision=arrow.precision, scale=arrow.scale)
    if pa.types.is_string(arrow) or pa.types.is_large_string(arrow) or _is_string_view(arrow):
        return ColumnType(TypeKind.STRING)
    if pa.types.is_binary(arrow) or pa.types.is_large_binary(arrow):
        return ColumnType(TypeKind.BYTES)
    if pa.types.is_date(arrow):
        return ColumnType(TypeKind.DATE)
    if pa.types.is_timestamp(arrow):
        return ColumnType(TypeKind.TIMESTAMP_TZ if arrow.tz else TypeKind.TIMESTAMP)
    if pa.types.is_list(arrow) or pa.types.is_large_list(arrow):
        return ColumnType(TypeKind.ARRAY, element=column_type_from_arrow(arrow.value_type))
    raise TypeError(f"the result type {arrow} has no column type")


def _is_string_view(arrow: pa.DataType) -> bool:
    return str(arrow) == "string_view"
