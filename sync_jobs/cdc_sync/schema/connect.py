"""Kafka Connect schemas (JsonConverter, schemas.enable=true) as written by Debezium -> RowSchema.

Covers the Postgres connector's defaults and documented alternatives: `decimal.handling.mode`
precise (Decimal / VariableScaleDecimal) | double | string, `time.precision.mode` adaptive |
adaptive_time_microseconds | connect | isostring, `binary.handling.mode` bytes | base64 | hex
(the latter two arrive as strings), json/jsonb, uuid, enums, arrays, money, inet/cidr, interval.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from cdc_sync.core.types import Column, ColumnType, RowSchema, SchemaConversionError, TypeKind
from cdc_sync.schema.interval import ISO_8601

DECIMAL = "org.apache.kafka.connect.data.Decimal"
VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
INTERVAL = "io.debezium.time.Interval"  # interval.handling.mode=string: ISO 8601 duration text

# Connect logical type name -> kind; the physical type decides the unit (see values.py).
LOGICAL_KINDS: dict[str, TypeKind] = {
    DECIMAL: TypeKind.DECIMAL,
    VARIABLE_SCALE_DECIMAL: TypeKind.DECIMAL,
    "io.debezium.time.Date": TypeKind.DATE,
    "org.apache.kafka.connect.data.Date": TypeKind.DATE,
    "io.debezium.time.Time": TypeKind.TIME,
    "io.debezium.time.MicroTime": TypeKind.TIME,
    "io.debezium.time.NanoTime": TypeKind.TIME,
    "org.apache.kafka.connect.data.Time": TypeKind.TIME,
    "io.debezium.time.Timestamp": TypeKind.TIMESTAMP,
    "io.debezium.time.MicroTimestamp": TypeKind.TIMESTAMP,
    "io.debezium.time.NanoTimestamp": TypeKind.TIMESTAMP,
    "org.apache.kafka.connect.data.Timestamp": TypeKind.TIMESTAMP,
    "io.debezium.time.ZonedTimestamp": TypeKind.TIMESTAMP_TZ,
    "io.debezium.data.Json": TypeKind.JSON,
    "io.debezium.data.Uuid": TypeKind.UUID,
}

# Logical types carried as their physical type on purpose (text keeps them exact).
TIME_UNITS = {
    "io.debezium.time.Time": "ms",
    "org.apache.kafka.connect.data.Time": "ms",
    "io.debezium.time.MicroTime": "us",
    "io.debezium.time.NanoTime": "ns",
    "io.debezium.time.Timestamp": "ms",
    "org.apache.kafka.connect.data.Timestamp": "ms",
    "io.debezium.time.MicroTimestamp": "us",
    "io.debezium.time.NanoTimestamp": "ns",
}

PASS_THROUGH_LOGICAL = {
    "io.debezium.time.ZonedTime",  # timetz: "HH:MM:SS[.f]Z"
    "io.debezium.time.MicroDuration",  # interval, interval.handling.mode=numeric: microseconds
    "io.debezium.time.IsoDate",
    "io.debezium.time.IsoTime",
    "io.debezium.time.IsoTimestamp",
    "io.debezium.data.Enum",
    "io.debezium.data.EnumSet",
    "io.debezium.data.Xml",
    "io.debezium.data.Bits",
    "io.debezium.data.Ltree",
}

PHYSICAL_KINDS: dict[str, TypeKind] = {
    "boolean": TypeKind.BOOLEAN,
    "int8": TypeKind.INT16,
    "int16": TypeKind.INT16,
    "int32": TypeKind.INT32,
    "int64": TypeKind.INT64,
    "float": TypeKind.FLOAT32,
    "float32": TypeKind.FLOAT32,
    "double": TypeKind.FLOAT64,
    "float64": TypeKind.FLOAT64,
    "string": TypeKind.STRING,
    "bytes": TypeKind.BYTES,
    "map": TypeKind.JSON,  # hstore.handling.mode=map: kept as a JSON object
}


# Every record carries its schemas, and a topic's records nearly all carry the same ones:
# converted once per distinct schema (by its text), the key and row schemas cost a lookup and
# each RowSchema computes its fingerprint once, not per record (~40% of decoding a record).
SCHEMA_CACHE_SIZE = 1024
_converted: dict[bytes | str, RowSchema] = {}


def _schema_text(struct_schema: Mapping[str, Any]) -> bytes | str:
    """The cache's key: the schema as JSON text (orjson: ~0.4 us, repr took ~4 us a schema and
    record); repr for what orjson refuses (a schema read by the stdlib parser's fallback, with
    an integer past 64 bits)."""
    try:
        return orjson.dumps(struct_schema)
    except orjson.JSONEncodeError:
        return repr(struct_schema)


def row_schema_from_connect(struct_schema: Mapping[str, Any]) -> RowSchema:
    """The columns of a Connect `struct` schema (an envelope's `after`, or a record key)."""
    if not isinstance(struct_schema, Mapping) or struct_schema.get("type") != "struct":
        raise SchemaConversionError("expected a Connect struct schema")
    text = _schema_text(struct_schema)
    schema = _converted.get(text)
    if schema is None:
        schema = _row_schema(struct_schema)
        if len(_converted) >= SCHEMA_CACHE_SIZE:  # schema churn: start over, stay bounded
            _converted.clear()
        _converted[text] = schema
    return schema


def _row_schema(struct_schema: Mapping[str, Any]) -> RowSchema:
    columns = []
    for index, field in enumerate(struct_schema.get("fields") or []):
        name = field.get("field") if isinstance(field, Mapping) else None
        if not isinstance(name, str):
            raise SchemaConversionError(f"fields[{index}]: missing `field` name")
        columns.append(Column(name, column_type_from_connect(field, name)))
    return RowSchema(tuple(columns))


def column_type_from_connect(spec: Mapping[str, Any], path: str) -> ColumnType:
    optional = bool(spec.get("optional", True))
    logical = spec.get("name")
    physical = spec.get("type")
    parameters = spec.get("parameters") or {}
    if logical == INTERVAL:
        # Stored as MicroDuration would be (int64 microseconds), decoded exactly from the text.
        return ColumnType(TypeKind.INT64, optional, unit=ISO_8601)
    if logical in LOGICAL_KINDS:
        kind = LOGICAL_KINDS[logical]
        if kind is TypeKind.DECIMAL:
            return _decimal_type(logical, parameters, optional, path)
        return ColumnType(kind, optional, unit=TIME_UNITS.get(logical))
    if physical == "array":
        items = spec.get("items")
        if not isinstance(items, Mapping):
            raise SchemaConversionError(f"{path}: array schema without `items`")
        return ColumnType(
            TypeKind.ARRAY, optional, element=column_type_from_connect(items, f"{path}[]")
        )
    if physical in PHYSICAL_KINDS and (logical is None or logical in PASS_THROUGH_LOGICAL):
        return ColumnType(PHYSICAL_KINDS[physical], optional)
    if physical in PHYSICAL_KINDS and isinstance(logical, str):
        # An unknown logical type over a known physical one (a newer Debezium, a custom
        # converter): the physical value is exact, so keep it rather than refuse the table.
        return ColumnType(PHYSICAL_KINDS[physical], optional)
    raise SchemaConversionError(
        f"{path}: unsupported Connect type {physical!r}"
        + (f" (logical {logical!r})" if logical else "")
    )


def _decimal_type(
    logical: str, parameters: Mapping[str, Any], optional: bool, path: str
) -> ColumnType:
    if logical == VARIABLE_SCALE_DECIMAL:
        return ColumnType(TypeKind.DECIMAL, optional)
    try:
        scale = int(parameters["scale"])
    except (KeyError, TypeError, ValueError) as exc:
        raise SchemaConversionError(f"{path}: Decimal without a `scale` parameter") from exc
    precision_text = parameters.get("connect.decimal.precision")
    precision = int(precision_text) if precision_text is not None else None
    return ColumnType(TypeKind.DECIMAL, optional, precision=precision, scale=scale)
