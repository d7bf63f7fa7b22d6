"""What a soft-delete sink (`on_delete: soft`) must hold, checked against Postgres.

For each row Postgres holds that matches the sink's filter: the shaped row, not marked; for a
row outside the filter: nothing (`compare.compare_sink`). For a key Postgres lacks: nothing, or
the row the sink held when it was deleted, marked. So a marked row is wrong when
- Postgres holds its key (`compare_sink`: a difference when the sink should hold the row live,
  extra when its filter excludes the row);
- it does not match the sink's filter: a row outside the filter is not in the sink, so the sink
  cannot have marked it. Postgres evaluates the filter, over the values the sink holds
  (`jsonb_populate_record` with the table's row type), not the job's expression engine;
- it holds nothing but its key and the markers where the sink's rows have other fields: a stub
  of a row the sink never held (search and cache; a Delta row has every column, null where
  unknown, so there a stub is told only by the filter).

The filter check needs every column the filter reads held as Postgres stores it: not dropped,
masked, hashed or replaced by a computed field, and of a type whose sink form Postgres reads
back (not bytea, interval or bit strings). Otherwise it is skipped, and said so in the log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from cdc_sync.core.types import RowSchema, TypeKind
from cdc_sync.mapping import TableRoute
from cdc_sync.schema.catalog import CatalogColumn
from cdc_sync.shape.engine import ExpressionError, result_types
from cdc_sync.shape.spec import SinkShape

log = logging.getLogger(__name__)

# Postgres types whose sink form does not read back as the value (base64 text, microseconds).
_NOT_READ_BACK = frozenset({"bytea", "interval", "bit", "varbit"})


@dataclass(frozen=True)
class SoftDeleteSink:
    """One soft-delete sink of a table: its route and shape, and the table's schema."""

    route: TableRoute
    shape: SinkShape
    schema: RowSchema

    def misplaced(
        self,
        conn: psycopg.Connection[Any],
        catalog: Sequence[CatalogColumn],
        key: Sequence[str],
        marked: Mapping[str, Mapping[str, Any]],
    ) -> set[str]:
        """The ids of `marked` (doc id -> the row as the sink holds it: marked rows whose key
        Postgres lacks) that the sink cannot have marked: stubs, and rows outside its filter."""
        stubs = self._stubs(key, marked) if self.shape.sink != "delta" else set()
        rest = {ident: row for ident, row in marked.items() if ident not in stubs}
        return stubs | self._outside_filter(conn, catalog, rest)

    def _stubs(self, key: Sequence[str], marked: Mapping[str, Mapping[str, Any]]) -> set[str]:
        bare = {self.route.rename.get(k, k) for k in key} | set(self.shape.markers)
        if not set(self.route.sink_schema(self.shape.sink, self.schema).names) - bare:
            return set()  # the sink holds nothing but the key: every marked row is whole
        return {ident for ident, row in marked.items() if not set(row) - bare}

    def _outside_filter(
        self,
        conn: psycopg.Connection[Any],
        catalog: Sequence[CatalogColumn],
        marked: Mapping[str, Mapping[str, Any]],
    ) -> set[str]:
        filters = self.shape.filters
        if not filters or not marked:
            return set()
        held = self._held_as_stored(catalog)
        readable = RowSchema(tuple(c for c in self.schema.columns if c.name in held))
        try:
            for path, text in filters:
                result_types(readable, {"filter": (path, text)})  # binds: reads only `held`
        except ExpressionError as exc:
            log.warning(
                "%s: soft-deleted rows not checked against it: it reads a column the sink "
                "does not hold as Postgres stores it (%s)",
                exc.path,
                exc.message,
            )
            return set()
        types = {c.name: c.type.kind for c in readable.columns}
        ids = sorted(marked)
        documents = [
            {
                column: _as_postgres_reads(types[column], marked[ident][field])
                for column, field in held.items()
                if field in marked[ident]
            }
            for ident in ids
        ]
        table = self.route.table
        query = sql.SQL(
            "SELECT m.__cdc_n FROM jsonb_array_elements({documents}::jsonb)"
            " WITH ORDINALITY AS m(__cdc_doc, __cdc_n)"
            " CROSS JOIN LATERAL jsonb_populate_record(NULL::{table}, m.__cdc_doc) AS r"
            " WHERE NOT coalesce({predicate}, false)"
        ).format(
            documents=sql.Literal(json.dumps(documents, default=str)),
            table=sql.Identifier(table.schema, table.table),
            predicate=sql.SQL(" AND ").join(sql.SQL(f"({text})") for _, text in filters),
        )
        try:
            with conn.transaction(), conn.cursor() as cursor:
                cursor.execute(query)
                outside = [int(row[0]) for row in cursor]
        except psycopg.Error as exc:
            # The message may quote a value: only its class is logged.
            log.warning(
                "%s: soft-deleted rows not checked against it: Postgres cannot evaluate it "
                "over the rows the sink holds (%s)",
                filters[0][0],
                type(exc).__name__,
            )
            return set()
        return {ids[n - 1] for n in outside}

    def _held_as_stored(self, catalog: Sequence[CatalogColumn]) -> dict[str, str]:
        """Source column -> the sink's field that holds its value as Postgres stores it."""
        unreadable = {
            c.name for c in catalog if c.type_name in _NOT_READ_BACK or c.element in _NOT_READ_BACK
        }
        route, shape = self.route, self.shape
        held = {}
        for column in self.schema.columns:
            name = column.name
            if (route.columns is not None and name not in route.columns) or name in unreadable:
                continue
            field = route.rename.get(name, name)
            replaced = field in shape.computed or field in shape.mask or shape.hashed(field)
            if not replaced and shape.keeps(field):
                held[name] = field
        return held


def _as_postgres_reads(kind: TypeKind, value: Any) -> Any:
    """A held value as JSON that `jsonb_populate_record` reads as the column's value."""
    if kind is TypeKind.JSON and isinstance(value, str):  # Delta holds JSON as its text
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [_as_postgres_reads(kind, item) for item in value]
    return value
