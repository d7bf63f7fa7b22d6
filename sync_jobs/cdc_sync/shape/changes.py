"""A table's routed changes -> each sink's changes: filters, computed / masked / hashed /
dropped fields, soft deletes. Pure but for the expression engine; one engine call per table
and batch, whatever the number of sinks and expressions.

- A row that does not match a sink's filter becomes a delete at the change's own version:
  fenced like any delete, so a row that stopped matching leaves the sink and a stale change
  cannot bring it back. (A delete carries only the key, so a row that never matched gets a
  delete too: harmless, a tombstone of a row the sink never held.) The filter reads the whole
  row: the job fills unchanged TOAST values from Postgres (`job.write.unavailable`) before this.
- Soft deletes (`on_delete: soft`): the delete becomes a mark (`Change.marks_deleted`), at the
  delete's version, of the markers (deleted, commit time): a conditional write that each sink
  applies over the row it holds, keeping its stored fields, and otherwise as the plain delete
  (a row the sink never held, or that its filter excluded, is not marked). When the batch held
  the deleted row whole (`Change.deleted_row`, job.decode.fold), it decides: a row that had left the
  filter is deleted, not marked, and a matching one is marked as it was last (shaped), not as
  the sink held it. Every other write clears the markers, so a re-insert un-deletes and a stale
  update (older version) is fenced as always. A tombstone without a version (its delete event
  was in an earlier batch, or compacted away) leaves a soft-delete sink as it is: it has no
  version to write at, and the delete event before it already marked the row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from cdc_sync.core.model import Change, Op
from cdc_sync.core.types import Column, ColumnType, RowSchema
from cdc_sync.schema.arrow import arrow_schema, arrow_value, column_type_from_arrow
from cdc_sync.shape.engine import evaluate, predicate, result_types
from cdc_sync.shape.hashing import hashed
from cdc_sync.shape.spec import HASH_TYPE, MASK_TYPE, SinkShape


class Projection(Protocol):
    """The table-level routing (`mapping.TableRoute`): projection and renames."""

    @property
    def rename(self) -> Mapping[str, str]: ...

    def route(self, change: Change) -> Change: ...

    def project_schema(self, schema: RowSchema) -> RowSchema: ...


FILTER_PREFIX = "__cdc_filter__"
COMPUTED_PREFIX = "__cdc_computed__"


def sink_schema(projection: Projection, shape: SinkShape, schema: RowSchema) -> RowSchema:
    """The fields a sink holds and their types: routed columns, computed fields (typed by the
    engine), masks and hashes as text, markers; `columns`/`drop` applied."""
    if shape.plain:
        return projection.project_schema(schema)
    types = result_types(schema, shape.computed)
    columns = {c.name: c.type for c in projection.project_schema(schema).columns} | types
    for name in columns:
        if name in shape.mask:
            columns[name] = MASK_TYPE
        elif shape.hashed(name):
            columns[name] = HASH_TYPE
    fields = [Column(n, t) for n, t in columns.items() if shape.keeps(n)]
    return RowSchema((*fields, *shape.marker_columns()))


def sink_changes(
    projection: Projection,
    shapes: Mapping[str, SinkShape],
    schema: RowSchema | None,
    changes: Sequence[Change],
) -> dict[str, list[Change]]:
    """Each sink's changes (sink name -> changes in the order given). `schema`: the table's
    accepted schema (the full row the expressions read); `changes`: full rows, filled."""
    routed = [projection.route(change) for change in changes]
    if all(shape.plain for shape in shapes.values()):
        return {sink: routed for sink in shapes}
    soft = any(shape.soft for shape in shapes.values())
    # A soft delete whose deleted row the batch held is shaped from that row, as a write is.
    written = [_as_written(change, schema) if soft else change for change in changes]
    values = _evaluated(shapes, schema, written)
    secrets = {s.sink: s.hash.secret() for s in shapes.values() if s.hash is not None}
    shaped: dict[str, list[Change]] = {}
    for sink, shape in shapes.items():
        if shape.plain:
            shaped[sink] = routed
            continue
        # A mark of the key alone keeps the sink's other fields: these.
        sink_fields = (
            sink_schema(projection, shape, schema) if shape.soft and schema is not None else None
        )
        by_schema: dict[int, _Fields] = {}
        out = []
        for index, (change, routed_change) in enumerate(zip(written, routed, strict=True)):
            matches = FILTER_PREFIX + sink not in values or values[FILTER_PREFIX + sink][index]
            if routed_change.row is None and not (shape.soft and change.row is not None):
                if not shape.soft:
                    out.append(routed_change)
                elif not routed_change.is_unversioned:
                    out.append(_marked_key(projection, shape, routed_change, sink_fields))
            elif not matches:
                out.append(leave(routed_change))
            else:
                computed = {
                    name: values[f"{COMPUTED_PREFIX}{sink}__{name}"][index]
                    for name in shape.computed
                }
                whole = projection.route(change) if routed_change.row is None else routed_change
                # Changes of one schema share its object (the accepted schema): one lookup.
                fields = by_schema.get(id(change.schema))
                if fields is None:
                    fields = by_schema[id(change.schema)] = _fields(shape, whole.schema, values)
                row = _shaped(shape, fields, change, whole, computed, secrets.get(sink))
                out.append(row if routed_change.row is not None else _marked(shape, row))
        shaped[sink] = out
    return shaped


def _as_written(change: Change, schema: RowSchema | None) -> Change:
    """A delete whose deleted row the batch held whole, as the write of that row (at the
    delete's version): the filter reads it and, when it matches, the mark carries it shaped."""
    if not change.is_delete or change.deleted_row is None or change.is_unversioned:
        return change
    return dataclasses.replace(change, row=change.deleted_row, schema=schema)


def _marked(shape: SinkShape, row: Change) -> Change:
    """A shaped row (its markers cleared) as the mark of its delete."""
    assert row.row is not None
    return dataclasses.replace(
        row,
        op=Op.UPDATE,
        row={**row.row, **shape.mark(row.source_ts_ms)},
        marks_deleted=True,
        deleted_row=None,
    )


def leave(change: Change) -> Change:
    """The row leaves the sink: a delete at the change's own version (fenced)."""
    return dataclasses.replace(
        change,
        op=Op.DELETE,
        row=None,
        unavailable_columns=frozenset(),
        uncertain_columns=frozenset(),
        resolve_from_source=False,
    )


def _evaluated(
    shapes: Mapping[str, SinkShape], schema: RowSchema | None, changes: Sequence[Change]
) -> dict[str, Any]:
    """Filters and computed fields of every sink over the batch's rows: name -> value per
    change (None for deletes), plus `<name>#type` -> the result's column type."""
    expressions: dict[str, tuple[str, Any]] = {}
    for sink, shape in shapes.items():
        if shape.filters:
            expressions[FILTER_PREFIX + sink] = predicate(shape.filters)
        for name, expression in shape.computed.items():
            expressions[f"{COMPUTED_PREFIX}{sink}__{name}"] = expression
    if not expressions:
        return {}
    rows = [change.row for change in changes if change.row is not None]
    batch_schema = schema or _schema_of(changes)
    result = evaluate(row_batch(batch_schema, rows), expressions)
    values: dict[str, Any] = {}
    for name in expressions:
        column = result.column(name)
        found = iter(column.to_pylist())
        values[name] = [next(found) if c.row is not None else None for c in changes]
        values[f"{name}#type"] = column_type_from_arrow(column.type)
    return values


def filter_flags(
    schema: RowSchema, rows: Sequence[Mapping[str, Any]], filters: Sequence[tuple[str, str]]
) -> list[bool]:
    """Whether each row (decoded values) matches every (path, SQL) filter; NULL does not."""
    result = evaluate(row_batch(schema, rows), {"matches": predicate(filters)})
    return [bool(flag) for flag in result.column("matches").to_pylist()]


def row_batch(schema: RowSchema, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Rows (decoded values, source column names) as an Arrow table of `schema`."""
    target = arrow_schema(schema)
    arrays = {
        column.name: pa.array(
            [arrow_value(column.type, row.get(column.name)) for row in rows],
            type=target.field(column.name).type,
        )
        for column in schema.columns
    }
    return pa.table(arrays, schema=pa.schema([f.with_nullable(True) for f in target]))


def _schema_of(changes: Sequence[Change]) -> RowSchema:
    for change in sorted(changes, key=lambda c: c.version, reverse=True):
        if change.schema is not None:
            return change.schema
    return RowSchema(())


@dataclass(frozen=True)
class _Fields:
    """A sink's fields for rows of one routed schema: computed once per batch and schema."""

    input_types: Mapping[str, ColumnType]  # before masks and hashes (what a hash reads)
    kept: frozenset[str]
    schema: RowSchema | None


def _fields(shape: SinkShape, routed: RowSchema | None, values: Mapping[str, Any]) -> _Fields:
    types = {c.name: c.type for c in routed.columns} if routed is not None else {}
    types |= {
        name: values[f"{COMPUTED_PREFIX}{shape.sink}__{name}#type"] for name in shape.computed
    }
    shaped = dict(types)
    for name in shaped:
        if name in shape.mask:
            shaped[name] = MASK_TYPE
        elif shape.hashed(name):
            shaped[name] = HASH_TYPE
    shaped |= {column.name: column.type for column in shape.marker_columns()}
    kept = [name for name in shaped if shape.keeps(name)]
    schema = RowSchema(tuple(Column(name, shaped[name]) for name in kept))
    return _Fields(types, frozenset(kept), schema if routed is not None else None)


def _shaped(
    shape: SinkShape,
    fields: _Fields,
    change: Change,
    routed: Change,
    computed: Mapping[str, Any],
    secret: bytes | None,
) -> Change:
    """Computed fields, then masks, hashes and markers; `columns`/`drop` applied. Unavailable
    fields stay unavailable: the sink's stored value is shaped already."""
    assert routed.row is not None
    row = {**routed.row, **computed}
    unavailable = set(routed.unavailable_columns)
    if change.unavailable_columns:  # an input may be unknown: keep what the sink holds
        unavailable.update(computed)
    for name, replacement in shape.mask.items():
        if name in row and name not in unavailable:
            row[name] = None if row[name] is None else replacement
    for name in shape.hash.fields if shape.hash is not None else ():
        if name in row and name not in unavailable and secret is not None:
            row[name] = hashed(secret, fields.input_types.get(name), row[name])
    if shape.soft:
        deleted, at = shape.markers
        row[deleted], row[at] = False, None
    kept = fields.kept
    return dataclasses.replace(
        routed,
        row={name: value for name, value in row.items() if name in kept},
        unavailable_columns=frozenset(unavailable & kept),
        uncertain_columns=routed.uncertain_columns & kept,
        schema=fields.schema,
    )


def _marked_key(
    projection: Projection, shape: SinkShape, delete: Change, fields: RowSchema | None
) -> Change:
    """A soft delete whose deleted row the batch did not hold: the mark of the key, at the
    delete's version, that keeps every other stored field (the sink's row, if it holds one)."""
    deleted, at = shape.markers
    keys = {projection.rename.get(name, name): value for name, value in delete.key}
    known = {c.name: c.type for c in fields.columns} if fields is not None else {}
    key_columns = tuple(Column(name, known[name]) for name in keys if name in known)
    others = frozenset(known) - keys.keys() - {deleted, at}
    return dataclasses.replace(
        delete,
        op=Op.UPDATE,
        row={**keys, **shape.mark(delete.source_ts_ms)},
        unavailable_columns=others,
        uncertain_columns=frozenset(),
        schema=RowSchema((*key_columns, *shape.marker_columns())),
        marks_deleted=True,
    )
