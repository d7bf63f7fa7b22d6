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
from psycopg.abc import Buffer
from psycopg.adapt import Loader

from cdc_sync.core.model import TableId
from cdc_sync.core.types import Column, ColumnType, TypeKind
from cdc_sync.schema.catalog import CatalogColumn, ConverterModes, catalog_columns
from cdc_sync.schema.interval import iso_interval_micros

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
    register_value_loaders(conn)
    key_names = [column.name for column in key_columns]
    catalog = {c.name: c for c in catalog_columns(conn, table)}
    columns = [column for column in columns if column.name in catalog]
    selected: list[sql.Composable] = [sql.Identifier(name) for name in key_names]
    selected += [_select(column.name, catalog.get(column.name)) for column in columns]
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


# Types read as Postgres renders them (Debezium sends that text), not parsed by psycopg: JSON
# keeps its own spelling, and psycopg has no loader for enums or extension types (an array of
# them would arrive as one string).
_AS_TEXT = {"json", "jsonb", "xml", "citext"}


class TimeLoader(Loader):
    """`time` as the decoder gives it: Postgres allows 24:00:00, which `datetime.time` (and so
    psycopg's own loader) refuses; it stays text, as `schema.values` keeps it."""

    def load(self, data: Buffer) -> time | str:
        text = bytes(data).decode("ascii")
        return END_OF_DAY if text.startswith("24:") else time.fromisoformat(text)


END_OF_DAY = "24:00:00"


class IntervalLoader(Loader):
    """`interval` as the sinks' int64 microseconds, exactly (needs IntervalStyle iso_8601).

    psycopg's own loader gives a timedelta with a month as 30 days; Debezium counts 30.4375.
    """

    def load(self, data: Buffer) -> int:
        return iso_interval_micros(bytes(data).decode("ascii"))


def register_value_loaders(conn: psycopg.Connection[Any]) -> None:
    """Read `time` and `interval` values (arrays too) as the decoder gives them."""
    conn.execute("SET intervalstyle = 'iso_8601'")  # the text IntervalLoader parses
    conn.adapters.register_loader("interval", IntervalLoader)
    conn.adapters.register_loader("time", TimeLoader)


def read_as_text(column: CatalogColumn) -> bool:
    """A scalar column read as its text (JSON, XML, citext; hstore as JSON text)."""
    return column.type_name in _AS_TEXT or column.type_name == "hstore"


def array_as_text(column: CatalogColumn) -> bool:
    """Arrays psycopg cannot load element by element (it returns the whole array as one
    string) or would parse (JSON): read as text[]."""
    return column.category == "A" and (column.element in _AS_TEXT or column.element_category == "E")


def _select(name: str, column: CatalogColumn | None) -> sql.Composable:
    identifier = sql.Identifier(name)
    if column is None:
        return identifier
    if column.category == "A":
        return sql.SQL("{}::text[]").format(identifier) if array_as_text(column) else identifier
    if column.type_name in _AS_TEXT:
        return sql.SQL("{}::text").format(identifier)
    if column.type_name == "hstore":
        return sql.SQL("hstore_to_json({})::text").format(identifier)
    return identifier


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


def read_table(
    conn: psycopg.Connection[Any], table: TableId, columns: Sequence[Column], modes: ConverterModes
) -> list[dict[str, Any]]:
    """Every row of `table` now, `columns` only, as the decoder gives the values (verify reads
    this to shape the rows as the job shapes the changes)."""
    register_value_loaders(conn)
    catalog = {c.name: c for c in catalog_columns(conn, table)}
    columns = [column for column in columns if column.name in catalog]
    query = sql.SQL("SELECT {} FROM {}.{}").format(
        sql.SQL(", ").join(_select(c.name, catalog.get(c.name)) for c in columns),
        sql.Identifier(table.schema),
        sql.Identifier(table.table),
    )
    return [
        {c.name: from_postgres(c.type, value, modes) for c, value in zip(columns, row, strict=True)}
        for row in conn.execute(query).fetchall()
    ]
