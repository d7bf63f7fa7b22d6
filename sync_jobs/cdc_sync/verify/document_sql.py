"""The SQL that makes Postgres compute a document index's every document (verify's oracle).

One query per document spec, generated from the spec alone (identifiers quoted by psycopg):

    SELECT <the root's key, as text>, <document> FROM root AS d0 WHERE (<filter>)

where each level's document is `jsonb_build_object` of its projected, renamed columns (each as
its Postgres text, decoded in Python as verify decodes every Postgres value) `||` its relations:
a `kind: one` relation a scalar subquery (the first row in the relation's order, or null), a
`kind: many` relation `coalesce(jsonb_agg(... ORDER BY ...), '[]')` (through its join table
when it has one), correlated on the relation's join pairs with Postgres's own `=`, to any depth.
Arrays are ordered by the relation's `order_by`, then the child's primary key, nulls last, with
strings `COLLATE "C"` (code points: the order the job's arrays have, `documents.order`). Which
rows join, how they nest, when a relation is null or [] and which roots the filter keeps are
all Postgres's; nothing here shares the job's render, fan-out or join code.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from psycopg import sql

from cdc_sync.core.model import TableId
from cdc_sync.relations import DocumentSpec, Kind, Level, Relation
from cdc_sync.schema.catalog import CatalogColumn
from cdc_sync.schema.source_rows import array_as_text

# jsonb_build_object takes at most 100 arguments: 50 key/value pairs per call, joined by ||.
_PAIRS_PER_CALL = 50
# Types whose values sort by their text: strings under COLLATE "C" (code points); an enum by
# its label's text, as the job sorts it (Postgres would use its declaration order).
_COLLATED = {"text", "varchar", "bpchar", "name"}


@dataclass(frozen=True)
class TableShape:
    """What the query needs of a table: its columns (catalog order) and primary key."""

    columns: tuple[CatalogColumn, ...]
    key: tuple[str, ...]

    def column(self, name: str) -> CatalogColumn:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)

    def projected(self, level: Level) -> list[CatalogColumn]:
        """The level's columns: `columns` in their order, else every column."""
        if level.columns is None:
            return list(self.columns)
        present = {c.name for c in self.columns}
        return [self.column(name) for name in level.columns if name in present]


def document_query(
    spec: DocumentSpec, tables: Mapping[TableId, TableShape], documents: bool = True
) -> sql.Composed:
    """The root's key columns as text, then (`documents`) each root's document as jsonb, for
    every root row the filter keeps."""
    builder = _Builder(tables)
    root = builder.alias()
    selected = [leaf_text(root, tables[spec.table].column(name)) for name in tables[spec.table].key]
    if documents:
        selected.append(builder.document(spec, root))
    query = sql.SQL("SELECT {} FROM {} AS {}").format(
        sql.SQL(", ").join(selected), _table(spec.table), root
    )
    if spec.filter is not None:
        # The mapping's SQL, as written: Postgres evaluates it over the root row.
        query = sql.SQL("{} WHERE ({})").format(query, sql.SQL(spec.filter))
    return query


def leaf_text(alias: sql.Identifier, column: CatalogColumn) -> sql.Composable:
    """A column's value as the text Postgres outputs for it (a `char(n)` padded, a boolean `t`:
    not its cast to text), in the type verify loads it as (`documents._loader`): text[] for
    arrays psycopg cannot load element by element, hstore as JSON, else its own type's."""
    value: sql.Composable = sql.SQL("{}.{}").format(alias, sql.Identifier(column.name))
    if column.category == "A" and array_as_text(column):
        value = sql.SQL("{}::text[]").format(value)
    elif column.type_name == "hstore":
        value = sql.SQL("hstore_to_json({})").format(value)
    # concat() writes its argument with the type's output function (a cast may differ), but
    # writes a null as '': the CASE keeps it null.
    return sql.SQL("CASE WHEN {0} IS NULL THEN NULL ELSE concat({0}) END").format(value)


class _Builder:
    def __init__(self, tables: Mapping[TableId, TableShape]) -> None:
        self.tables = tables
        self._aliases = itertools.count()

    def alias(self) -> sql.Identifier:
        return sql.Identifier(f"d{next(self._aliases)}")

    def document(self, level: Level, alias: sql.Identifier) -> sql.Composable:
        """The level's row as jsonb: projected columns (renamed), then each relation."""
        fields: list[tuple[str, sql.Composable]] = [
            (level.rename.get(c.name, c.name), leaf_text(alias, c))
            for c in self.tables[level.table].projected(level)
        ]
        fields += [(r.name, self.relation(r, level.table, alias)) for r in level.relations]
        calls = [
            sql.SQL("jsonb_build_object({})").format(
                sql.SQL(", ").join(
                    sql.SQL("{}, {}").format(sql.Literal(name), value) for name, value in part
                )
            )
            for part in _chunks(fields, _PAIRS_PER_CALL)
        ]
        return sql.SQL(" || ").join(calls) if calls else sql.SQL("'{}'::jsonb")

    def relation(
        self, relation: Relation, parent: TableId, parent_alias: sql.Identifier
    ) -> sql.Composable:
        """A relation's value for one parent row: a correlated subquery."""
        child = self.alias()
        source = sql.SQL("{} AS {}").format(_table(relation.table), child)
        if relation.through is None:
            where = _equal(parent_alias, child, relation.on)
        else:
            join = self.alias()
            source = sql.SQL("{} AS {} JOIN {} ON {}").format(
                _table(relation.through.table), join, source, _equal(join, child, relation.on)
            )
            where = _equal(parent_alias, join, relation.through.on)
        body, order = self.document(relation, child), self.order(relation, child)
        if relation.kind is Kind.ONE:
            return sql.SQL("(SELECT {} FROM {} WHERE {} ORDER BY {} LIMIT 1)").format(
                body, source, where, order
            )
        return sql.SQL(
            "(SELECT coalesce(jsonb_agg({} ORDER BY {}), '[]'::jsonb) FROM {} WHERE {})"
        ).format(body, order, source, where)

    def order(self, relation: Relation, alias: sql.Identifier) -> sql.Composable:
        """`order_by`, then the child's primary key: ascending, nulls last (the default)."""
        table = self.tables[relation.table]
        names = [*relation.order_by, *table.key]
        return sql.SQL(", ").join(_sorted_by(alias, table.column(name)) for name in names)


def _sorted_by(alias: sql.Identifier, column: CatalogColumn) -> sql.Composable:
    value = sql.SQL("{}.{}").format(alias, sql.Identifier(column.name))
    if column.type_name == "citext":  # as citext compares: lower-cased, then by code point
        return sql.SQL('lower({}::text) COLLATE "C"').format(value)
    if column.type_name in _COLLATED or column.category == "E":
        return sql.SQL('{}::text COLLATE "C"').format(value)
    return value


def _equal(
    parent: sql.Identifier, child: sql.Identifier, on: Sequence[tuple[str, str]]
) -> sql.Composable:
    """`parent.a = child.b AND ...`: Postgres's `=` for the two columns' types."""
    return sql.SQL(" AND ").join(
        sql.SQL("{}.{} = {}.{}").format(parent, sql.Identifier(p), child, sql.Identifier(c))
        for p, c in on
    )


def _table(table: TableId) -> sql.Identifier:
    return sql.Identifier(table.schema, table.table)


def _chunks(
    items: Sequence[tuple[str, sql.Composable]], size: int
) -> list[Sequence[tuple[str, sql.Composable]]]:
    return [items[start : start + size] for start in range(0, len(items), size)]
