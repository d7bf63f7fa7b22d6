"""`mappings validate` for document specs: every level's columns, every join against the catalog.

A join's two columns must exist and be a pair Postgres compares with `=` (asked of Postgres
itself), which the job then joins as Postgres does (`documents.equality`: an int4 joins a
numeric by value, a varchar a char(n), a citext a citext in any case); a pair Postgres refuses
(an integer and a text) or one the job has no rule for (a time and a timetz) is refused; a
level's relation field must not shadow one of its columns; the root filter must evaluate on
the root's rows. Each finding names the file and the field path to change.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import psycopg
from psycopg import sql

from cdc_sync.core.model import TableId
from cdc_sync.documents.comparisons import catalog_types
from cdc_sync.documents.equality import pair_rule
from cdc_sync.mapping import MappingFile
from cdc_sync.relations import DocumentSpec, Level, Relation
from cdc_sync.schema import RowSchema, SchemaConversionError
from cdc_sync.schema.catalog import ConverterModes, row_schema_from_catalog
from cdc_sync.shape.engine import ExpressionError, result_types


def document_findings(
    mapping: MappingFile, conn: psycopg.Connection[Any], modes: ConverterModes
) -> list[tuple[str, str]]:
    """(field path, message) for every problem of every document spec."""
    schemas: dict[TableId, RowSchema | None] = {}

    def schema_of(table: TableId) -> RowSchema | None:
        if table not in schemas:
            try:
                schemas[table] = row_schema_from_catalog(conn, table, modes)
            except SchemaConversionError:
                schemas[table] = None  # reported with the table's route
        return schemas[table]

    compared = partial(_compared, conn)
    found: list[tuple[str, str]] = []
    for name, spec in mapping.documents.items():
        found += _spec_findings(f"documents.{name}", spec, schema_of, compared)
    return found


Compared = Callable[[TableId, TableId, tuple[str, str]], str | None]
SchemaOf = Callable[[TableId], RowSchema | None]


def _spec_findings(
    path: str, spec: DocumentSpec, schema_of: SchemaOf, compared: Compared
) -> list[tuple[str, str]]:
    found = _level_findings(path, spec, schema_of, compared)
    root = schema_of(spec.table)
    if spec.filter is not None and root is not None:
        try:
            result_types(root, {"filter": (f"{path}.filter", spec.filter)})
        except ExpressionError as exc:
            found.append((f"{path}.filter", exc.message))
    return found


def _level_findings(
    path: str, level: Level, schema_of: SchemaOf, compared: Compared
) -> list[tuple[str, str]]:
    schema = schema_of(level.table)
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
        found += _join_findings(at, level, relation, schema_of, compared)
        found += [
            (f"{at}.order_by", f"no column {c!r} in {relation.table}")
            for c in relation.order_by
            if (child := schema_of(relation.table)) is not None and c not in child.names
        ]
        found += _level_findings(at, relation, schema_of, compared)
    return found


def _join_findings(
    path: str, parent: Level, relation: Relation, schema_of: SchemaOf, compared: Compared
) -> list[tuple[str, str]]:
    hops = [(f"{path}.join", relation.through.table if relation.through else parent.table)]
    pairs = [relation.on]
    if relation.through is not None:
        hops.insert(0, (f"{path}.through.join", parent.table))
        pairs.insert(0, relation.through.on)
    targets = [relation.through.table, relation.table] if relation.through else [relation.table]
    found = []
    for (at, left), right, on in zip(hops, targets, pairs, strict=True):
        left_schema, right_schema = schema_of(left), schema_of(right)
        if left_schema is None or right_schema is None:
            continue
        for pair in on:
            missing = [
                (at, f"no column {column!r} in {table}")
                for table, schema, column in (
                    (left, left_schema, pair[0]),
                    (right, right_schema, pair[1]),
                )
                if column not in schema.names
            ]
            found += missing
            problem = None if missing else compared(left, right, pair)
            if problem is not None:
                found.append((at, problem))
    return found


def _compared(
    conn: psycopg.Connection[Any], left: TableId, right: TableId, on: tuple[str, str]
) -> str | None:
    """Why the two columns do not join, or None: Postgres is asked whether `=` compares them
    (planned on the empty product of the tables, never run), the job whether it has a rule."""
    types = catalog_types(conn, sorted({left, right}))
    left_type, right_type = types[left].of(on[0]), types[right].of(on[1])
    named = f"{left}.{on[0]} ({left_type}) and {right}.{on[1]} ({right_type})"
    query = sql.SQL("SELECT a.{} = b.{} FROM {} AS a, {} AS b LIMIT 0").format(
        sql.Identifier(on[0]),
        sql.Identifier(on[1]),
        sql.Identifier(left.schema, left.table),
        sql.Identifier(right.schema, right.table),
    )
    try:
        with conn.transaction():
            conn.execute(query)
    except psycopg.errors.UndefinedFunction:
        return f"{named} do not join: Postgres has no = for them"
    if pair_rule(left_type, right_type) is None:
        return f"{named}: Postgres compares them, but cdc-sync does not join them"
    return None
