"""Row schemas from the Postgres catalog, as Debezium would encode the columns.

Used where records carry no Connect schema (`schemas.enable=false`) and by `cdc-sync mappings
validate`. The connector's `decimal.handling.mode`, `binary.handling.mode`,
`time.precision.mode` and `interval.handling.mode` decide the encodings, as in Debezium.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from cdc_sync.core.model import TableId
from cdc_sync.core.types import (
    Column,
    ColumnType,
    KnownSchema,
    RowSchema,
    SchemaConversionError,
    TypeKind,
)
from cdc_sync.schema.interval import ISO_8601

_SIMPLE: dict[str, TypeKind] = {
    "int2": TypeKind.INT16,
    "int4": TypeKind.INT32,
    "int8": TypeKind.INT64,
    "float4": TypeKind.FLOAT32,
    "float8": TypeKind.FLOAT64,
    "bool": TypeKind.BOOLEAN,
    "text": TypeKind.STRING,
    "varchar": TypeKind.STRING,
    "bpchar": TypeKind.STRING,
    "name": TypeKind.STRING,
    "citext": TypeKind.STRING,
    "xml": TypeKind.STRING,
    "inet": TypeKind.STRING,
    "cidr": TypeKind.STRING,
    "macaddr": TypeKind.STRING,
    "macaddr8": TypeKind.STRING,
    "timetz": TypeKind.STRING,  # io.debezium.time.ZonedTime
    "json": TypeKind.JSON,
    "jsonb": TypeKind.JSON,
    "uuid": TypeKind.UUID,
    "date": TypeKind.DATE,
    "timestamptz": TypeKind.TIMESTAMP_TZ,
}


@dataclass(frozen=True)
class ConverterModes:
    """The connector settings that change how Debezium encodes values."""

    decimal: str = "precise"  # precise | double | string
    binary: str = "bytes"  # bytes | base64 | base64-url-safe | hex
    time_precision: str = "adaptive"  # adaptive | adaptive_time_microseconds | connect
    interval: str = "numeric"  # numeric | string

    @classmethod
    def from_connector(cls, config: Mapping[str, str]) -> ConverterModes:
        return cls(
            decimal=config.get("decimal.handling.mode", "precise"),
            binary=config.get("binary.handling.mode", "bytes"),
            time_precision=config.get("time.precision.mode", "adaptive"),
            interval=config.get("interval.handling.mode", "numeric"),
        )


@dataclass(frozen=True)
class CatalogColumn:
    name: str
    type_name: str  # pg_type.typname of the base type (domains resolved)
    category: str  # pg_type.typcategory: "A" array, "E" enum, ...
    element: str | None  # element typname for arrays
    element_category: str | None
    typmod: int
    not_null: bool
    # A stored generated column (`GENERATED ALWAYS AS (...) STORED`): pgoutput publishes it
    # only from Postgres 18 on, with `publish_generated_columns` (job.write.generated).
    generated: bool = False


_COLUMNS_SQL = """
SELECT a.attname,
       bt.typname, bt.typcategory,
       et.typname, et.typcategory,
       a.atttypmod, a.attnotnull, a.attgenerated = 's'
FROM pg_attribute a
JOIN pg_type t ON t.oid = a.atttypid
JOIN pg_type bt ON bt.oid = CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.oid END
LEFT JOIN pg_type et ON et.oid = bt.typelem AND bt.typcategory = 'A'
WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum
"""


def quoted(table: TableId) -> str:
    """`"schema"."table"`, every quote doubled: the table's name as SQL text (for `::regclass`,
    or to show in a statement to run)."""
    return sql.Identifier(table.schema, table.table).as_string()


def catalog_columns(conn: psycopg.Connection[Any], table: TableId) -> list[CatalogColumn]:
    rows = conn.execute(_COLUMNS_SQL, (quoted(table),)).fetchall()
    return [CatalogColumn(*row) for row in rows]


def row_schema_from_catalog(
    conn: psycopg.Connection[Any], table: TableId, modes: ConverterModes = ConverterModes()
) -> RowSchema:
    return RowSchema(
        tuple(
            Column(c.name, column_type_from_catalog(c, modes, f"{table}.{c.name}"))
            for c in catalog_columns(conn, table)
        )
    )


def column_type_from_catalog(column: CatalogColumn, modes: ConverterModes, path: str) -> ColumnType:
    optional = not column.not_null
    if column.category == "A" and column.element is not None:
        element = CatalogColumn(
            column.name, column.element, column.element_category or "", None, None, -1, False
        )
        return ColumnType(
            TypeKind.ARRAY, optional, element=column_type_from_catalog(element, modes, path)
        )
    name = column.type_name
    if column.category == "E":
        return ColumnType(TypeKind.STRING, optional)  # io.debezium.data.Enum
    if name in ("numeric", "money"):
        return _decimal(column, modes, optional)
    if name == "bytea":
        kind = TypeKind.BYTES if modes.binary == "bytes" else TypeKind.STRING
        return ColumnType(kind, optional)
    if name == "interval":
        # numeric: MicroDuration; string: io.debezium.time.Interval, read into the same int64.
        return ColumnType(
            TypeKind.INT64, optional, unit=ISO_8601 if modes.interval == "string" else None
        )
    if name in ("time", "timestamp"):
        return _temporal(name, column.typmod, modes, optional)
    if name in _SIMPLE:
        return ColumnType(_SIMPLE[name], optional)
    raise SchemaConversionError(f"{path}: Postgres type {name!r} has no supported conversion")


def _decimal(column: CatalogColumn, modes: ConverterModes, optional: bool) -> ColumnType:
    if modes.decimal == "double":
        return ColumnType(TypeKind.FLOAT64, optional)
    if modes.decimal == "string":
        return ColumnType(TypeKind.STRING, optional)
    if column.type_name == "money":
        return ColumnType(TypeKind.DECIMAL, optional, scale=2)  # money.fraction.digits
    if column.typmod < 0:
        return ColumnType(TypeKind.DECIMAL, optional)  # VariableScaleDecimal
    precision = ((column.typmod - 4) >> 16) & 0xFFFF
    scale = (column.typmod - 4) & 0xFFFF
    return ColumnType(TypeKind.DECIMAL, optional, precision=precision, scale=scale)


def _temporal(name: str, typmod: int, modes: ConverterModes, optional: bool) -> ColumnType:
    precision = 6 if typmod < 0 else typmod
    kind = TypeKind.TIME if name == "time" else TypeKind.TIMESTAMP
    if modes.time_precision == "connect":
        return ColumnType(kind, optional, unit="ms")
    if kind is TypeKind.TIME and modes.time_precision == "adaptive_time_microseconds":
        return ColumnType(kind, optional, unit="us")
    # adaptive: milliseconds up to precision 3, microseconds up to 6
    return ColumnType(kind, optional, unit="ms" if precision <= 3 else "us")


def primary_key_columns(conn: psycopg.Connection[Any], table: TableId) -> list[str]:
    rows = conn.execute(
        """
        SELECT a.attname FROM pg_index i
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE i.indrelid = %s::regclass AND i.indisprimary
        ORDER BY array_position(i.indkey::int2[], a.attnum)
        """,
        (quoted(table),),
    ).fetchall()
    return [row[0] for row in rows]


def known_schemas(
    conn: psycopg.Connection[Any], tables: Iterable[TableId], modes: ConverterModes
) -> dict[TableId, KnownSchema]:
    """Key and row schemas per table, read once (records without schemas are parsed by them).

    The trade-off: a column added later is not seen until the job restarts and reads the
    catalog again; until then its values are left out of every sink.
    """
    schemas: dict[TableId, KnownSchema] = {}
    for table in tables:
        row = row_schema_from_catalog(conn, table, modes)
        key_names = primary_key_columns(conn, table)
        if not key_names:
            raise SchemaConversionError(f"{table}: no primary key to key its records by")
        key = RowSchema(tuple(row.column(name) for name in key_names))
        schemas[table] = KnownSchema(key=key, row=row)
    return schemas
