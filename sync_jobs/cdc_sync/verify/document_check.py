"""`mappings validate` for document specs: every level's columns, every join against the catalog.

A join's two columns must exist and hold values that encode alike (documents join on the JSON
the sinks hold: an int4 joins an int8, a text column does not join an integer); a level's
relation field must not shadow one of its columns; the root filter must evaluate on the root's
rows. Each finding names the file and the field path to change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from cdc_sync.core.model import TableId
from cdc_sync.mapping import MappingFile
from cdc_sync.relations import DocumentSpec, Level, Relation
from cdc_sync.schema import RowSchema, SchemaConversionError, TypeKind
from cdc_sync.schema.catalog import ConverterModes, row_schema_from_catalog
from cdc_sync.shape.engine import ExpressionError, result_types

_INTEGERS = {TypeKind.INT16, TypeKind.INT32, TypeKind.INT64}


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

    found: list[tuple[str, str]] = []
    for name, spec in mapping.documents.items():
        found += _spec_findings(f"documents.{name}", spec, schema_of)
    return found


def _spec_findings(
    path: str, spec: DocumentSpec, schema_of: Callable[[TableId], RowSchema | None]
) -> list[tuple[str, str]]:
    found = _level_findings(path, spec, schema_of)
    root = schema_of(spec.table)
    if spec.filter is not None and root is not None:
        try:
            result_types(root, {"filter": (f"{path}.filter", spec.filter)})
        except ExpressionError as exc:
            found.append((f"{path}.filter", exc.message))
    return found


def _level_findings(
    path: str, level: Level, schema_of: Callable[[TableId], RowSchema | None]
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
        found += _join_findings(at, level, relation, schema_of)
        found += [
            (f"{at}.order_by", f"no column {c!r} in {relation.table}")
            for c in relation.order_by
            if (child := schema_of(relation.table)) is not None and c not in child.names
        ]
        found += _level_findings(at, relation, schema_of)
    return found


def _join_findings(
    path: str,
    parent: Level,
    relation: Relation,
    schema_of: Callable[[TableId], RowSchema | None],
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
        for left_column, right_column in on:
            for table, schema, column in (
                (left, left_schema, left_column),
                (right, right_schema, right_column),
            ):
                if column not in schema.names:
                    found.append((at, f"no column {column!r} in {table}"))
            if left_column in left_schema.names and right_column in right_schema.names:
                a = left_schema.column(left_column).type.kind
                b = right_schema.column(right_column).type.kind
                if a != b and not {a, b} <= _INTEGERS:
                    found.append(
                        (
                            at,
                            f"{left}.{left_column} ({a}) and {right}.{right_column} ({b}) "
                            "do not join: their values differ in kind",
                        )
                    )
    return found
