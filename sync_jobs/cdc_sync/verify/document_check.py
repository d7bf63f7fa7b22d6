"""`mappings validate` for document specs: every level's columns, every join against the catalog.

A join's two columns must exist and be a pair Postgres compares with `=` (asked of Postgres
itself), which the job then joins as Postgres does (`documents.equality`: an int4 joins a
numeric by value, a varchar a char(n), a citext a citext in any case); a pair Postgres refuses
(an integer and a text) or one the job has no rule for (a time and a timetz) is refused. An
`order_by` column must exist and be of a type arrays sort as Postgres does (`documents.order`:
numbers, strings, booleans, uuids, dates and times, enums by label), not JSON or an array. A
level's relation field must not shadow one of its columns; the root filter must evaluate on the
root's rows in the job's engine and in Postgres (verify's query runs it). Each finding names the
file and the field path to change.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from cdc_sync.core.model import TableId
from cdc_sync.documents.comparisons import TableTypes, catalog_types
from cdc_sync.documents.equality import FLOATS, INSTANTS, NUMBERS, STRINGS, pair_rule
from cdc_sync.mapping import MappingFile
from cdc_sync.relations import DocumentSpec, Level, Relation
from cdc_sync.schema import RowSchema, SchemaConversionError
from cdc_sync.schema.catalog import ConverterModes, catalog_columns, row_schema_from_catalog
from cdc_sync.shape.engine import ExpressionError, result_types

Findings = list[tuple[str, str]]  # (field path, message)
# Types whose values arrays sort as Postgres's ORDER BY does (enums: by label, documented).
SORTABLE = NUMBERS | FLOATS | STRINGS | INSTANTS | {"money", "bool", "uuid", "time"}


def document_findings(
    mapping: MappingFile, conn: psycopg.Connection[Any], modes: ConverterModes
) -> Findings:
    """(field path, message) for every problem of every document spec."""
    catalog = _Catalog(conn, modes)
    found: Findings = []
    for name, spec in mapping.documents.items():
        found += _spec_findings(f"documents.{name}", spec, catalog)
    return found


class _Catalog:
    """What the checks ask of the database, each table read once."""

    def __init__(self, conn: psycopg.Connection[Any], modes: ConverterModes) -> None:
        self.conn, self.modes = conn, modes
        self._schemas: dict[TableId, RowSchema | None] = {}
        self._types: dict[TableId, TableTypes] = {}
        self._enums: dict[TableId, set[str]] = {}

    def schema(self, table: TableId) -> RowSchema | None:
        if table not in self._schemas:
            try:
                self._schemas[table] = row_schema_from_catalog(self.conn, table, self.modes)
            except SchemaConversionError:
                self._schemas[table] = None  # reported with the table's route
        return self._schemas[table]

    def types(self, table: TableId) -> TableTypes:
        if table not in self._types:
            self._types[table] = catalog_types(self.conn, [table])[table]
            columns = catalog_columns(self.conn, table)
            self._enums[table] = {c.name for c in columns if c.category == "E"}
        return self._types[table]

    def join_problem(self, left: TableId, right: TableId, on: tuple[str, str]) -> str | None:
        """Why the two columns do not join, or None: Postgres is asked whether `=` compares
        them (planned on the empty product of the tables, never run), the job whether it has
        a rule for the pair."""
        left_type, right_type = self.types(left).of(on[0]), self.types(right).of(on[1])
        named = f"{left}.{on[0]} ({left_type}) and {right}.{on[1]} ({right_type})"
        query = sql.SQL("SELECT a.{} = b.{} FROM {} AS a, {} AS b LIMIT 0").format(
            sql.Identifier(on[0]), sql.Identifier(on[1]), _table(left), _table(right)
        )
        try:
            with self.conn.transaction():
                self.conn.execute(query)
        except psycopg.errors.UndefinedFunction:
            return f"{named} do not join: Postgres has no = for them"
        if pair_rule(left_type, right_type) is None:
            return f"{named}: Postgres compares them, but cdc-sync does not join them"
        return None

    def order_problem(self, table: TableId, column: str) -> str | None:
        pg_type = self.types(table).of(column)
        if pg_type in SORTABLE or column in self._enums[table]:
            return None
        return (
            f"{table}.{column} ({pg_type}): arrays sort by numbers, strings, booleans, uuids, "
            "dates and times, not by this type"
        )

    def filter_problem(self, table: TableId, condition: str) -> str | None:
        """Why Postgres cannot evaluate the filter (verify's query runs it), or None."""
        query = sql.SQL("SELECT 1 FROM {} WHERE ({}) LIMIT 0").format(
            _table(table),
            sql.SQL(condition),  # the mapping's SQL, as written
        )
        try:
            with self.conn.transaction():
                self.conn.execute(query)
        except psycopg.Error as exc:
            return f"Postgres cannot evaluate it (verify does): {exc.diag.message_primary}"
        return None


def _spec_findings(path: str, spec: DocumentSpec, catalog: _Catalog) -> Findings:
    found = _level_findings(path, spec, catalog)
    root = catalog.schema(spec.table)
    if spec.filter is not None and root is not None:
        try:
            result_types(root, {"filter": (f"{path}.filter", spec.filter)})
        except ExpressionError as exc:
            found.append((f"{path}.filter", exc.message))
            return found
        problem = catalog.filter_problem(spec.table, spec.filter)
        if problem is not None:
            found.append((f"{path}.filter", problem))
    return found


def _level_findings(path: str, level: Level, catalog: _Catalog) -> Findings:
    schema = catalog.schema(level.table)
    if schema is None:
        return [(path, f"table {level.table} does not exist or does not convert")]
    names = set(schema.names)
    found = [
        (f"{path}.{key}", f"no column {column!r} in {level.table}")
        for key, columns in (("columns", level.columns or ()), ("rename", tuple(level.rename)))
        for column in columns
        if column not in names
    ]
    projected = {level.rename.get(c, c) for c in (level.columns or schema.names)}
    for relation in level.relations:
        at = f"{path}.relations.{relation.name}"
        if relation.name in projected:
            found.append((at, f"the field {relation.name!r} is also a column of {level.table}"))
        found += _join_findings(at, level, relation, catalog)
        found += _order_findings(f"{at}.order_by", relation, catalog)
        found += _level_findings(at, relation, catalog)
    return found


def _order_findings(path: str, relation: Relation, catalog: _Catalog) -> Findings:
    child = catalog.schema(relation.table)
    if child is None:
        return []
    found: Findings = []
    for column in relation.order_by:
        problem = (
            f"no column {column!r} in {relation.table}"
            if column not in child.names
            else catalog.order_problem(relation.table, column)
        )
        if problem is not None:
            found.append((path, problem))
    return found


def _join_findings(path: str, parent: Level, relation: Relation, catalog: _Catalog) -> Findings:
    hops = [(f"{path}.join", relation.through.table if relation.through else parent.table)]
    pairs = [relation.on]
    if relation.through is not None:
        hops.insert(0, (f"{path}.through.join", parent.table))
        pairs.insert(0, relation.through.on)
    targets = [relation.through.table, relation.table] if relation.through else [relation.table]
    found: Findings = []
    for (at, left), right, on in zip(hops, targets, pairs, strict=True):
        left_schema, right_schema = catalog.schema(left), catalog.schema(right)
        if left_schema is None or right_schema is None:
            continue
        for pair in on:
            sides = ((left, left_schema, pair[0]), (right, right_schema, pair[1]))
            missing = [
                (at, f"no column {column!r} in {table}")
                for table, schema, column in sides
                if column not in schema.names
            ]
            found += missing
            problem = None if missing else catalog.join_problem(left, right, pair)
            if problem is not None:
                found.append((at, problem))
    return found


def _table(table: TableId) -> sql.Identifier:
    return sql.Identifier(table.schema, table.table)
