"""Postgres rows shaped for one sink, by the same rule as the job's changes (verify)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cdc_sync.core.model import Change, Coordinates, Op, TableId
from cdc_sync.core.types import RowSchema
from cdc_sync.shape.changes import Projection, sink_changes
from cdc_sync.shape.spec import SinkShape

_NOWHERE = Coordinates("postgres", 0, 0)


def sink_rows(
    projection: Projection,
    shape: SinkShape,
    table: TableId,
    schema: RowSchema,
    key: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
) -> dict[str, dict[str, Any]]:
    """doc id -> the row `shape`'s sink should hold, for the rows that match its filters.
    `rows`: every column, decoded (`schema.source_rows.read_table`)."""
    changes = [
        Change(table, tuple((k, row[k]) for k in key), Op.READ, 0, row, _NOWHERE, schema=schema)
        for row in rows
    ]
    shaped = sink_changes(projection, {shape.sink: shape}, schema, changes)[shape.sink]
    return {c.doc_id: dict(c.row) for c in shaped if c.row is not None}


def marked_deleted(shape: SinkShape, row: Mapping[str, Any]) -> bool:
    """A soft-deleted row (`on_delete: soft`): kept by the sink, marked."""
    return shape.soft and row.get(shape.markers[0]) is True
