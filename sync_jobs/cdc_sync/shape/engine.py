"""SQL expressions on Arrow batches, evaluated by DuckDB: one call per table and batch.

DuckDB parses each expression on its own (`SQLExpression`: one expression, never a statement),
binds it against the batch's columns (unknown columns and type errors are binder errors) and
gives an Arrow result whose types become the fields' column types. External access is off: an
expression reads the row and nothing else.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping, Sequence
from functools import lru_cache

import duckdb
import pyarrow as pa

from cdc_sync.core.types import ColumnType, RowSchema, TypeKind
from cdc_sync.schema.arrow import arrow_schema, column_type_from_arrow, decimal_as_text


class ExpressionError(ValueError):
    """An expression that does not parse, bind or type; `path` names where it is set."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


_local = threading.local()


def _connection() -> duckdb.DuckDBPyConnection:
    # One connection per thread (a DuckDB connection is not shared across threads); one
    # thread each, so a batch's rows keep their order and the executor's cores stay the job's.
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = duckdb.connect(config={"enable_external_access": False, "threads": 1})
        _local.conn = conn
    return conn


def parse(path: str, sql: str) -> duckdb.Expression:
    """One SQL expression, or an ExpressionError naming `path` (syntax, several expressions)."""
    try:
        return duckdb.SQLExpression(sql)
    except (duckdb.Error, RuntimeError) as exc:
        raise ExpressionError(path, _first_line(exc)) from exc


def predicate(filters: Sequence[tuple[str, str]]) -> tuple[str, duckdb.Expression]:
    """Filters that must all hold, as one boolean expression (a NULL result does not match);
    its path is the first filter's."""
    combined = parse(*filters[0])
    for path, sql in filters[1:]:
        combined = combined & parse(path, sql)
    return filters[0][0], duckdb.CoalesceOperator(combined, duckdb.ConstantExpression(False))


Expressions = Mapping[str, tuple[str, "str | duckdb.Expression"]]


def evaluate(batch: pa.Table, expressions: Expressions) -> pa.Table:
    """Each expression (output name -> (path, SQL or parsed)) over every row of `batch`, in
    row order, in one engine call."""
    if not expressions:
        return pa.table({})
    selected = [_parsed(path, sql).alias(name) for name, (path, sql) in expressions.items()]
    relation = _connection().from_arrow(batch)
    try:
        result = relation.select(*selected).to_arrow_table()
    except duckdb.Error as exc:
        raise ExpressionError(_culprit(batch, expressions), _first_line(exc)) from exc
    if result.num_rows != batch.num_rows:
        raise ExpressionError(_culprit(batch, expressions), "an aggregate is not a row expression")
    return result


def result_types(
    schema: RowSchema, expressions: Mapping[str, tuple[str, str]]
) -> dict[str, ColumnType]:
    """Each expression's column type over rows of `schema` (ExpressionError if one fails)."""
    return dict(_result_types(schema, tuple(expressions.items())))


@lru_cache(maxsize=256)
def _result_types(
    schema: RowSchema, expressions: tuple[tuple[str, tuple[str, str]], ...]
) -> tuple[tuple[str, ColumnType], ...]:
    empty = arrow_schema(schema).empty_table()
    types = []
    for name, (path, sql) in expressions:
        try:
            result = evaluate(empty, {name: (path, sql)})
        except ExpressionError as exc:
            hint = _text_decimal_hint(schema, sql) if "VARCHAR" in exc.message else ""
            raise ExpressionError(exc.path, exc.message + hint) from exc
        try:
            types.append((name, column_type_from_arrow(result.schema.field(name).type)))
        except TypeError as exc:
            raise ExpressionError(path, f"{exc}: cast it (e.g. CAST(... AS VARCHAR))") from exc
    return tuple(types)


def _text_decimal_hint(schema: RowSchema, sql: str) -> str:
    """What to write instead, when the expression reads a `numeric` without a precision: the
    engine holds it as exact text (no fixed-scale decimal holds every such value), so `price >
    5` does not bind."""
    named = [
        c.name
        for c in schema.columns
        if c.type.kind is TypeKind.DECIMAL
        and decimal_as_text(c.type)
        and re.search(rf"\b{re.escape(c.name)}\b", sql)
    ]
    if not named:
        return ""
    column = named[0]
    return (
        f" ({column} is a numeric without a precision, held as exact text: compare it as "
        f"CAST({column} AS numeric(38, 10)), which Postgres reads alike, or give the column a "
        "precision)"
    )


def _parsed(path: str, sql: str | duckdb.Expression) -> duckdb.Expression:
    return parse(path, sql) if isinstance(sql, str) else sql


def _culprit(batch: pa.Table, expressions: Expressions) -> str:
    """The path of the first expression that fails on its own (errors name one field)."""
    relation = _connection().from_arrow(batch.slice(0, 0))
    for name, (path, sql) in expressions.items():
        try:
            result = relation.select(_parsed(path, sql).alias(name)).to_arrow_table()
        except duckdb.Error:
            return path
        if result.num_rows:
            return path
    return next(iter(expressions.values()))[0]


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
