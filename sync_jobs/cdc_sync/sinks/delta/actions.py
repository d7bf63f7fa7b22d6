"""Pure conversion: compacted changes -> one Arrow merge source per Delta table (no I/O).

The merge source holds the routed row columns, the key columns (from the change key, so deletes
have them too), the metadata columns written to the table (`_cdc_version`, `_cdc_source_ts`,
`_cdc_op`) and control columns used only by the MERGE:
- `_cdc_deleted`: the change is a delete;
- `_cdc_mark`: the change is a soft delete's mark (`Change.marks_deleted`): it updates the row
  the table holds and inserts nothing, and is remembered as a delete (its tombstone fences
  when the table holds no row: a row the table never held is not marked);
- `_cdc_keep__<column>`: keep the stored value (unchanged TOAST, or the column did not exist in
  the change's schema), so the MERGE writes `t.<column>` instead of `s.<column>`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from cdc_sync.core.model import Change, Op, Truncate
from cdc_sync.mapping import TableRoute
from cdc_sync.schema import ColumnType, arrow_value
from cdc_sync.schema.arrow import arrow_schema
from cdc_sync.shape.spec import SinkShape

VERSION = "_cdc_version"
SOURCE_TS = "_cdc_source_ts"
OP = "_cdc_op"
DELETED = "_cdc_deleted"
MARK = "_cdc_mark"
KEEP_PREFIX = "_cdc_keep__"

METADATA_FIELDS = (
    pa.field(VERSION, pa.int64(), nullable=False),
    pa.field(SOURCE_TS, pa.timestamp("us", tz="UTC")),
    pa.field(OP, pa.string()),
)


def truncate_predicate(version: int) -> str:
    """A TRUNCATE at `version`: the rows it removes, those written by an older change. Rows of
    its own transaction (a reload after it) and of later ones stay."""
    return f"{VERSION} < {int(version)}"


def marks_predicate(version: int, marker: str) -> str:
    """A snapshot's end at `version` in a soft-delete table: the rows it marks, those older
    than it not marked already (`marker`, a boolean column: null in rows written before)."""
    return f"{truncate_predicate(version)} AND NOT coalesce({marker}, false)"


def snapshot_end_marks(shape: SinkShape, truncate: Truncate) -> dict[str, Any]:
    """What a snapshot's end writes into the rows it marks: the markers (at the snapshot's
    time) and the version just below it, as a streamed mark would (`sinks.truncates`)."""
    return {
        **shape.mark(truncate.source_ts_ms),
        VERSION: truncate.version - 1,
        SOURCE_TS: _timestamp(truncate.source_ts_ms),
        OP: Op.UPDATE.value,
    }


def keep_flag(column: str) -> str:
    return f"{KEEP_PREFIX}{column}"


@dataclass(frozen=True)
class DeltaActions:
    key_columns: tuple[str, ...]
    data_columns: tuple[str, ...]  # row columns present in the source, key columns included
    kept_columns: tuple[str, ...]  # columns with a keep flag in the source
    source: pa.Table
    changes: tuple[Change, ...]

    @property
    def deleted_ids(self) -> list[tuple[str, int]]:
        """The deletes and the soft deletes' marks, as (doc id, version): their tombstones.
        A tombstone without a version leaves none: there is no version to fence by."""
        return [
            (c.doc_id, c.version)
            for c in self.changes
            if (c.is_delete or c.marks_deleted) and not c.is_unversioned
        ]


def routed_key_columns(route: TableRoute, change: Change) -> tuple[str, ...]:
    return tuple(route.rename.get(name, name) for name, _ in change.key)


def batch_row_schema(changes: Sequence[Change]) -> pa.Schema:
    """The newest schema in the batch, extended by columns only older schemas have."""
    fields: dict[str, pa.Field] = {}
    for change in sorted(changes, key=lambda c: c.version, reverse=True):
        if change.schema is None:
            continue
        for arrow_field in arrow_schema(change.schema):
            fields.setdefault(arrow_field.name, arrow_field.with_nullable(True))
    return pa.schema(list(fields.values()))


def batch_column_types(changes: Sequence[Change]) -> dict[str, ColumnType]:
    types: dict[str, ColumnType] = {}
    for change in sorted(changes, key=lambda c: c.version, reverse=True):
        for column in change.schema.columns if change.schema is not None else ():
            types.setdefault(column.name, column.type)
    return types


def to_actions(route: TableRoute, changes: Sequence[Change]) -> DeltaActions | None:
    if not changes:
        return None
    key_columns = routed_key_columns(route, changes[0])
    row_schema = batch_row_schema(changes)
    column_types = batch_column_types(changes)
    data_columns = tuple(dict.fromkeys([*key_columns, *row_schema.names]))
    kept = sorted(
        {
            column
            for change in changes
            if not change.is_delete
            for column in _kept_columns(change, row_schema.names)
        }
    )
    columns: dict[str, list[object]] = {name: [] for name in data_columns}
    meta: dict[str, list[object]] = {VERSION: [], SOURCE_TS: [], OP: [], DELETED: [], MARK: []}
    flags: dict[str, list[bool]] = {keep_flag(c): [] for c in kept}
    for change in changes:
        key_values = dict(zip(key_columns, (v for _, v in change.key), strict=True))
        row = change.row or {}
        for name in data_columns:
            columns[name].append(key_values[name] if name in key_values else row.get(name))
        meta[VERSION].append(change.version)
        meta[SOURCE_TS].append(_timestamp(change.source_ts_ms))
        meta[OP].append(change.op.value)
        meta[DELETED].append(change.is_delete)
        meta[MARK].append(change.marks_deleted)
        change_kept = set(_kept_columns(change, row_schema.names))
        for column in kept:
            flags[keep_flag(column)].append(column in change_kept)
    arrays: dict[str, pa.Array] = {}
    for name in data_columns:
        arrow_type = row_schema.field(name).type if name in row_schema.names else None
        values = columns[name]
        if name in column_types:  # e.g. variable-scale decimals are stored as exact text
            values = [arrow_value(column_types[name], v) for v in values]
        arrays[name] = pa.array(values, type=arrow_type)
    for meta_field in METADATA_FIELDS:
        arrays[meta_field.name] = pa.array(meta[meta_field.name], type=meta_field.type)
    arrays[DELETED] = pa.array(meta[DELETED], type=pa.bool_())
    arrays[MARK] = pa.array(meta[MARK], type=pa.bool_())
    for name, flag_values in flags.items():
        arrays[name] = pa.array(flag_values, type=pa.bool_())
    return DeltaActions(
        key_columns=key_columns,
        data_columns=data_columns,
        kept_columns=tuple(kept),
        source=pa.table(arrays),
        changes=tuple(changes),
    )


def _kept_columns(change: Change, batch_columns: Sequence[str]) -> set[str]:
    if change.is_delete or change.row is None:
        return set()
    known = {c.name for c in change.schema.columns} if change.schema is not None else set()
    missing_from_schema = {c for c in batch_columns if known and c not in known}
    return set(change.unavailable_columns) | missing_from_schema


def _timestamp(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)
