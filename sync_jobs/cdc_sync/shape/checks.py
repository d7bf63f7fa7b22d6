"""Checks of a table's shapes against its columns: `mappings validate` and job start.

Each problem is (file: field path, message): an expression that does not bind or type
(unknown column, type error, an aggregate), a masked / hashed / dropped / listed field the sink
does not have, a masked or hashed key column. The hash secrets are checked at start
(`missing_secrets`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.types import RowSchema, TypeKind
from cdc_sync.shape.changes import Projection, sink_schema
from cdc_sync.shape.engine import ExpressionError, result_types
from cdc_sync.shape.spec import SinkShape

Problem = tuple[str, str]  # ("<file>: <field path>", message)


def shape_problems(
    projection: Projection,
    shapes: Mapping[str, SinkShape],
    schema: RowSchema,
    key: Sequence[str] = (),
) -> list[Problem]:
    """`key`: the table's primary-key columns; the warehouse merges by them, so its shape must
    keep them (search and cache key by the document id and may leave them out)."""
    problems: list[Problem] = []
    for shape in shapes.values():
        try:
            for path, sql in shape.filters:
                found = result_types(schema, {"filter": (path, sql)})["filter"]
                if found.kind is not TypeKind.BOOLEAN:
                    problems.append((path, f"a filter is a boolean expression, this is {found}"))
            result_types(schema, shape.computed)
        except ExpressionError as exc:
            problems.append((exc.path, exc.message))
            continue
        problems += _unknown_fields(projection, shape, schema)
        keys = [projection.rename.get(k, k) for k in key]
        problems += _shaped_keys(shape, keys)
        if shape.sink == "delta":
            for name in keys:
                if not shape.keeps(name):
                    problems.append((shape.path, f"key column {name!r} must stay (MERGE key)"))
    return problems


def _shaped_keys(shape: SinkShape, keys: Sequence[str]) -> list[Problem]:
    """A masked or hashed key column: refused. Every sink addresses a row by its raw key (the
    search `_id`, the cache key, the Delta MERGE key; verify, repair and erase too), so the
    shape would change the field and not the id: the raw key would stay in the sink."""
    problems = []
    for name in keys:
        if name in shape.mask:
            problems.append(
                (
                    f"{shape.path}.mask",
                    f"key column {name!r} cannot be masked: ids would collide (every row the "
                    "same id) and the sink keys rows by the raw key anyway; mask a non-key "
                    "column, or key the table by a surrogate key",
                )
            )
        if shape.hashed(name):
            problems.append(
                (
                    f"{shape.path}.hash.fields",
                    f"key column {name!r} cannot be hashed: the sink keys rows by the raw key "
                    "(search _id, cache key, Delta MERGE key), so it would stay there; key the "
                    "table by a surrogate key and hash the natural key as a plain column",
                )
            )
    return problems


def _unknown_fields(projection: Projection, shape: SinkShape, schema: RowSchema) -> list[Problem]:
    unshaped = SinkShape(shape.sink, shape.path, computed=shape.computed)
    fields = set(sink_schema(projection, unshaped, schema).names)
    named = {
        "mask": list(shape.mask),
        "hash.fields": list(shape.hash.fields) if shape.hash else [],
        "drop": list(shape.drop),
        "columns": list(shape.columns or ()),
    }
    problems = []
    for key, names in named.items():
        for name in names:
            if name not in fields:
                problems.append(
                    (
                        f"{shape.path}.{key}",
                        f"no field {name!r} (fields: {', '.join(sorted(fields))})",
                    )
                )
    return problems


def missing_secrets(shapes: Mapping[str, SinkShape]) -> list[ConfigError]:
    """Hash secrets whose environment variable is unset (each error names the field)."""
    errors = []
    for shape in shapes.values():
        if shape.hash is not None:
            try:
                shape.hash.secret()
            except ConfigError as exc:
                errors.append(exc)
    return errors
