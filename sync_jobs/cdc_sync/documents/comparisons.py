"""How a document's rows compare: each join pair by Postgres's `=`, each array by its `ORDER BY`.

Both need the columns' Postgres types, not only the JSON their values arrive in (a `char(6)`, a
`citext` and a `text` all arrive as strings, a `numeric` as a string or a number by the
connector's decimal mode): the job reads them from the catalog once, at start
(`catalog_types`); without it (tests, probes) a type is inferred from the column's kind
(`schema_types`). The rules themselves: `equality` (joins) and `order` (arrays).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from cdc_sync.core.model import TableId
from cdc_sync.core.types import RowSchema, TypeKind
from cdc_sync.documents.equality import Rule, link_text, pair_rule
from cdc_sync.documents.order import sort_value
from cdc_sync.documents.rows import Row
from cdc_sync.relations import DocumentSpec
from cdc_sync.schema.catalog import catalog_columns, primary_key_columns


@dataclass(frozen=True)
class TableTypes:
    """A table's columns' Postgres types (pg_type names of the base types) and its key."""

    columns: Mapping[str, str] = field(default_factory=dict)
    key: tuple[str, ...] = ()  # primary-key columns in key order; () when unknown

    def of(self, column: str) -> str:
        return self.columns.get(column, "")  # "": unknown, compared by its JSON


def catalog_types(
    conn: psycopg.Connection[Any], tables: Iterable[TableId]
) -> dict[TableId, TableTypes]:
    """Each table's column types and key as the catalog has them now."""
    return {
        table: TableTypes(
            {c.name: c.type_name for c in catalog_columns(conn, table)},
            tuple(primary_key_columns(conn, table)),
        )
        for table in tables
    }


# What a column's kind says of its Postgres type when the catalog is not at hand.
_KIND_TYPES = {
    TypeKind.BOOLEAN: "bool",
    TypeKind.INT16: "int2",
    TypeKind.INT32: "int4",
    TypeKind.INT64: "int8",
    TypeKind.FLOAT32: "float4",
    TypeKind.FLOAT64: "float8",
    TypeKind.STRING: "text",
    TypeKind.DECIMAL: "numeric",
    TypeKind.DATE: "date",
    TypeKind.TIMESTAMP: "timestamp",
    TypeKind.TIMESTAMP_TZ: "timestamptz",
    TypeKind.UUID: "uuid",
}


def schema_types(schemas: Mapping[TableId, RowSchema]) -> dict[TableId, TableTypes]:
    """Column types inferred from their kinds (no catalog): exact for numbers and times; every
    string is `text` (a `char(n)` or `citext` then compares exactly)."""
    return {
        table: TableTypes({c.name: _KIND_TYPES.get(c.type.kind, "") for c in schema.columns})
        for table, schema in schemas.items()
    }


@dataclass(frozen=True)
class Side:
    """One column of a join pair, with the rule of its pair: its values as they join."""

    table: TableId
    column: str
    rule: Rule
    type: str

    @property
    def key(self) -> str:
        """Where the state indexes these join values (one column may join under two rules)."""
        return f"{self.rule}:{self.column}"

    def value(self, row: Row) -> str | None:
        return link_text(self.rule, self.type, row.doc.get(self.column))


@dataclass(frozen=True)
class Pair:
    parent: Side
    child: Side


class Comparisons:
    """The document specs' join pairs and array orders, resolved against the column types."""

    def __init__(
        self, specs: Iterable[DocumentSpec], types: Mapping[TableId, TableTypes] | None = None
    ) -> None:
        self.specs = tuple(specs)
        self.types = dict(types or {})
        self._pairs: dict[
            tuple[TableId, TableId, tuple[tuple[str, str], ...]], tuple[Pair, ...]
        ] = {}

    def pairs(
        self, parent: TableId, child: TableId, on: Sequence[tuple[str, str]]
    ) -> tuple[Pair, ...]:
        """The pairs `on` joins `parent` to `child` by ({parent column: child column})."""
        cached = self._pairs.get((parent, child, tuple(on)))
        if cached is not None:
            return cached
        found = []
        for parent_column, child_column in on:
            left, right = self._type(parent, parent_column), self._type(child, child_column)
            rule = pair_rule(left, right) or Rule.SAME  # refused by `mappings validate`
            found.append(
                Pair(
                    Side(parent, parent_column, rule, left), Side(child, child_column, rule, right)
                )
            )
        self._pairs[(parent, child, tuple(on))] = tuple(found)
        return tuple(found)

    def sides(self) -> dict[TableId, list[Side]]:
        """Per table, every join column and rule the specs use (what the state indexes)."""
        found: dict[TableId, set[Side]] = {}
        for spec in self.specs:
            for _, via, parent in spec.walk():
                if via is None or parent is None:
                    continue
                hops = [(parent.table, via.table, via.on)]
                if via.through is not None:
                    through = via.through
                    hops = [
                        (parent.table, through.table, through.on),
                        (through.table, via.table, via.on),
                    ]
                for left, right, on in hops:
                    for pair in self.pairs(left, right, on):
                        found.setdefault(left, set()).add(pair.parent)
                        found.setdefault(right, set()).add(pair.child)
        return {table: sorted(sides, key=lambda s: s.key) for table, sides in found.items()}

    def order(self, table: TableId, columns: Sequence[str]) -> Callable[[Row], tuple[Any, ...]]:
        """The sort key of `table`'s rows in an array: `columns`, then the primary key (its
        values as the row holds them when the key's columns are unknown), then the doc id."""
        types = self.types.get(table, TableTypes())

        def key(row: Row) -> tuple[Any, ...]:
            ordered = tuple(sort_value(types.of(c), row.doc.get(c)) for c in columns)
            if types.key:
                primary = tuple(sort_value(types.of(c), row.doc.get(c)) for c in types.key)
            else:
                primary = tuple(sort_value("", value) for value in row.key)
            return (ordered, primary, row.id)

        return key

    def _type(self, table: TableId, column: str) -> str:
        return self.types.get(table, TableTypes()).of(column)
