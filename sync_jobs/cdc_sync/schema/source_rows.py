"""Column values read from Postgres by primary key, in the form the decoder gives Debezium's.

The job reads these when a change carries unchanged-TOAST placeholders that neither the batch
nor a sink can fill (a primary-key move, a rebuild from a compacted topic, an expired cache
entry, a new sink): Postgres is the source of truth, read-only. Only variable-length types can
be TOASTed, so the conversions cover text-like, binary, JSON-like, numeric and array columns
(and the element types arrays hold); the connector's modes decide the encodings as in Debezium.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from cdc_sync.core.model import TableId
from cdc_sync.core.types import Column, ColumnType, TypeKind
from cdc_sync.schema.catalog import ConverterModes, catalog_columns

KeyValues = tuple[Any, ...]


def read_columns(
    conn: psycopg.Connection[Any],
    table: TableId,
    key_columns: Sequence[Column],
    keys: Sequence[KeyValues],
    columns: Sequence[Column],
    modes: ConverterModes,
) -> dict[KeyValues, dict[str, Any]]:
    """key values -> {column: value} for the keys that exist now (absent keys were deleted).
    Keys are given, and returned, as the decoder converts them. Only the `columns` the table
    has now are read (and returned): one dropped or renamed since the change was written is
    not an error, it has no value to read any more."""
    if not keys:
        return {}
    key_names = [column.name for column in key_columns]
    pg_types = {c.name: c.type_name for c in catalog_columns(conn, table)}
    columns = [column for column in columns if column.name in pg_types]
    selected: list[sql.Composable] = [sql.Identifier(name) for name in key_names]
    selected += [_select(column.name, pg_types.get(column.name, "")) for column in columns]
    key_tuple = sql.SQL("({})").format(sql.SQL(", ").join(map(sql.Identifier, key_names)))
    one_key = sql.SQL("({})").format(sql.SQL(", ").join([sql.Placeholder()] * len(key_names)))
    query = sql.SQL("SELECT {} FROM {}.{} WHERE {} IN ({})").format(
        sql.SQL(", ").join(selected),
        sql.Identifier(table.schema),
        sql.Identifier(table.table),
        key_tuple,
        sql.SQL(", ").join([one_key] * len(keys)),
    )
    params = [value for key in keys for value in key]
    found: dict[KeyValues, dict[str, Any]] = {}
    for row in conn.execute(query, params).fetchall():
        key = tuple(
            from_postgres(column.type, value, modes)
            for column, value in zip(key_columns, row[: len(key_names)], strict=True)
        )
        values = row[len(key_names) :]
        found[key] = {
            column.name: from_postgres(column.type, value, modes)
            for column, value in zip(columns, values, strict=True)
        }
    return found


def _select(name: str, pg_type: str) -> sql.Composable:
    # JSON-like values are read as Postgres renders them (Debezium sends that text), not parsed.
    if pg_type in ("json", "jsonb", "xml"):
        return sql.SQL("{}::text").format(sql.Identifier(name))
    if pg_type == "hstore":
        return sql.SQL("hstore_to_json({})::text").format(sql.Identifier(name))
    return sql.Identifier(name)


def from_postgres(column_type: ColumnType, value: Any, modes: ConverterModes) -> Any:
    """A psycopg value as `schema.values.convert_value` gives the same value from Debezium."""
    if value is None:
        return None
    kind = column_type.kind
    if kind is TypeKind.ARRAY and column_type.element is not None:
        return [from_postgres(column_type.element, item, modes) for item in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return _binary(column_type, bytes(value), modes)
    if isinstance(value, Decimal):
        return _decimal(column_type, value)
    if kind is TypeKind.TIMESTAMP_TZ and isinstance(value, datetime):
        return value.astimezone(UTC)
    if kind is TypeKind.TIME and isinstance(value, time):
        return value.isoformat()
    if kind in (TypeKind.STRING, TypeKind.UUID, TypeKind.JSON) and not isinstance(value, str):
        return _text(value)
    return value


def _binary(column_type: ColumnType, value: bytes, modes: ConverterModes) -> bytes | str:
    if column_type.kind is TypeKind.BYTES:
        return value
    if modes.binary == "hex":
        return value.hex()
    if modes.binary == "base64-url-safe":
        return base64.urlsafe_b64encode(value).decode("ascii")
    return base64.b64encode(value).decode("ascii")


def _decimal(column_type: ColumnType, value: Decimal) -> Decimal | float | str:
    if column_type.kind is TypeKind.FLOAT64:  # decimal.handling.mode=double
        return float(value)
    if column_type.kind is TypeKind.STRING:  # decimal.handling.mode=string: plain notation
        return format(value, "f")
    return value


def _text(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    return str(value)
