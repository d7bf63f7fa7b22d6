"""Every document a document index should hold, as Postgres computes it now (verify's oracle).

Postgres runs the spec's query (`document_sql`): it joins, nests, orders, filters and builds the
JSON. Only the leaf values are converted here, from Postgres's text of each column to the JSON
the sinks hold for it, by the project's Postgres-row decoding (psycopg's loader for the type,
`schema.source_rows.from_postgres` with the connector's modes, `schema.to_json_value`), as flat
verify reads rows. Streamed from a server-side cursor: memory holds one chunk of documents.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import abc, pq
from psycopg.abc import Loader
from psycopg.adapt import Transformer

from cdc_sync.core.model import TableId, document_id
from cdc_sync.core.types import ColumnType
from cdc_sync.relations import DocumentSpec, Kind, Level
from cdc_sync.schema import to_json_value
from cdc_sync.schema.catalog import (
    CatalogColumn,
    ConverterModes,
    catalog_columns,
    column_type_from_catalog,
    primary_key_columns,
)
from cdc_sync.schema.source_rows import (
    array_as_text,
    from_postgres,
    read_as_text,
    register_value_loaders,
)
from cdc_sync.verify.document_sql import TableShape, document_query

CHUNK = 500  # documents fetched from the cursor at a time


@dataclass(frozen=True)
class _Leaf:
    """How one column's text (`document_sql.leaf_text`) becomes the column's value."""

    type: ColumnType
    loader: Loader

    def decoded(self, text: str | None, modes: ConverterModes) -> Any:
        """The value as the decoder gives Debezium's (doc ids are built from these)."""
        if text is None:
            return None
        return from_postgres(self.type, self.loader.load(text.encode()), modes)

    def value(self, text: str | None, modes: ConverterModes) -> Any:
        """The value as the sinks hold it."""
        decoded = self.decoded(text, modes)
        return None if decoded is None else to_json_value(self.type, decoded)


class DocumentOracle:
    """One document spec's expected documents, computed by the database of `conn` (which has
    verify's loaders registered: `compare.register_loaders`)."""

    def __init__(
        self, conn: psycopg.Connection[Any], spec: DocumentSpec, modes: ConverterModes
    ) -> None:
        register_value_loaders(conn)
        self.conn, self.spec, self.modes = conn, spec, modes
        self.tables = {table: _shape(conn, table) for table in spec.tables()}
        transformer = Transformer.from_context(conn)
        self.leaves = {
            table: {
                c.name: _Leaf(
                    column_type_from_catalog(c, modes, f"{table}.{c.name}"),
                    _loader(conn, transformer, c),
                )
                for c in shape.columns
            }
            for table, shape in self.tables.items()
        }

    def documents(self, chunk: int = CHUNK) -> Iterator[tuple[str, dict[str, Any]]]:
        """(doc id, document) of every root the filter keeps, in no particular order."""
        for row in self._rows(True, chunk):
            yield self._id(row[:-1]), self._decode(self.spec, row[-1])

    def ids(self, chunk: int = CHUNK) -> Iterator[str]:
        """The doc ids of every root the filter keeps (no documents built)."""
        for row in self._rows(False, chunk):
            yield self._id(row)

    def _rows(self, documents: bool, chunk: int) -> Iterator[tuple[Any, ...]]:
        query = document_query(self.spec, self.tables, documents)
        # A transaction of its own (a savepoint inside the caller's): the cursor lives in it.
        with self.conn.transaction(), self.conn.cursor(name="cdc_sync_documents") as cursor:
            cursor.itersize = chunk
            cursor.execute(query)
            yield from cursor

    def _id(self, texts: tuple[Any, ...]) -> str:
        key, leaves = self.tables[self.spec.table].key, self.leaves[self.spec.table]
        pairs = zip(key, texts, strict=True)
        return document_id(
            tuple((name, leaves[name].decoded(text, self.modes)) for name, text in pairs)
        )

    def _decode(self, level: Level, document: Mapping[str, Any]) -> dict[str, Any]:
        """The document with each column's text as the JSON the sinks hold (relations: their
        rows' documents, decoded in turn)."""
        leaves = self.leaves[level.table]
        columns = {level.rename.get(name, name): name for name in leaves}
        relations = {relation.name: relation for relation in level.relations}
        decoded: dict[str, Any] = {}
        for name, value in document.items():
            relation = relations.get(name)
            if relation is None:
                decoded[name] = leaves[columns[name]].value(value, self.modes)
            elif relation.kind is Kind.ONE:
                decoded[name] = None if value is None else self._decode(relation, value)
            else:
                decoded[name] = [self._decode(relation, item) for item in value]
        return decoded


def _shape(conn: psycopg.Connection[Any], table: TableId) -> TableShape:
    return TableShape(tuple(catalog_columns(conn, table)), tuple(primary_key_columns(conn, table)))


def _loader(
    conn: psycopg.Connection[Any], transformer: abc.Transformer, column: CatalogColumn
) -> Loader:
    """psycopg's text loader for what `document_sql.leaf_text` selects: the column's own type,
    or text (text[] for arrays) where verify reads the type as text (`source_rows`)."""
    types = conn.adapters.types
    text = types.get("text")
    assert text is not None
    if column.category == "A":
        element = None if array_as_text(column) else types.get(column.element or "")
        oid = (element or text).array_oid
    else:
        found = None if read_as_text(column) else types.get(column.type_name)
        oid = (found or text).oid  # an enum or an extension's type: its text
    return transformer.get_loader(oid, pq.Format.TEXT)
