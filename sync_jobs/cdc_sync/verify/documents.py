"""Document indices against Postgres: the same documents rendered from the tables' rows now.

Each document table is read once (every column, decoded as the job decodes it, encoded as the
job's state keeps it), indexed in memory by the columns relations join on, and the job's own
renderer (`documents.render`) builds every root's document from it: a difference is a
difference in rows, never in rendering. Memory: the document tables' rows, once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg

from cdc_sync.core.model import TableId, document_id
from cdc_sync.documents.render import render
from cdc_sync.documents.rows import Row, link_value
from cdc_sync.relations import DocumentSpec
from cdc_sync.schema import RowSchema
from cdc_sync.schema.catalog import ConverterModes, primary_key_columns, row_schema_from_catalog
from cdc_sync.schema.source_rows import read_table
from cdc_sync.shape.changes import filter_flags
from cdc_sync.sinks.documents import json_document


class PostgresRows:
    """A `RowSource` over the document tables as Postgres holds them now."""

    def __init__(self, conn: psycopg.Connection[Any], modes: ConverterModes) -> None:
        self.conn, self.modes = conn, modes
        self._rows: dict[TableId, list[Row]] = {}
        self._typed: dict[TableId, list[dict[str, Any]]] = {}
        self._schemas: dict[TableId, RowSchema] = {}
        self._indexes: dict[tuple[TableId, str], dict[str, list[Row]]] = {}

    def table(self, table: TableId) -> list[Row]:
        if table not in self._rows:
            schema = self._schemas[table] = row_schema_from_catalog(self.conn, table, self.modes)
            key = primary_key_columns(self.conn, table)
            typed = self._typed[table] = read_table(self.conn, table, schema.columns, self.modes)
            rows = []
            for row in typed:
                doc = json_document(row, schema)
                values = tuple((name, row[name]) for name in key)
                rows.append(Row(document_id(values), tuple(doc[name] for name in key), doc))
            self._rows[table] = rows
        return self._rows[table]

    def rows(self, table: TableId, ids: Sequence[str]) -> list[Row]:
        wanted = set(ids)
        return [row for row in self.table(table) if row.id in wanted]

    def joined(self, table: TableId, column: str, values: Iterable[str]) -> list[Row]:
        index = self._indexes.get((table, column))
        if index is None:
            index = defaultdict(list)
            for row in self.table(table):
                value = link_value(row.doc.get(column))
                if value is not None:
                    index[value].append(row)
            self._indexes[(table, column)] = index
        return [row for value in set(values) for row in index.get(value, [])]

    def roots(self, spec: DocumentSpec, where: str) -> list[Row]:
        """The root rows, those matching the document's filter (the job's engine, same SQL)."""
        rows = self.table(spec.table)
        if spec.filter is None or not rows:
            return rows
        schema, typed = self._schemas[spec.table], self._typed[spec.table]
        flags = filter_flags(schema, typed, [(where, spec.filter)])
        return [row for row, ok in zip(rows, flags, strict=True) if ok]


def expected_documents(
    conn: psycopg.Connection[Any], spec: DocumentSpec, modes: ConverterModes, where: str
) -> dict[str, dict[str, Any]]:
    """doc id -> the document the index should hold, for every root row now."""
    source = PostgresRows(conn, modes)
    return render(spec, source.roots(spec, where), source)
