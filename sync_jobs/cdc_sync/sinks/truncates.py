"""A TRUNCATE as fenced deletes, for the sinks that remove rows one key at a time (search, cache).

The sink lists the versions it holds for the table; each row older than the truncate becomes a
delete at the version just below the truncate's, written through the sink's ordinary fenced
delete. Older-or-equal wins there (`external_gte`, the cache's compare-and-set), so the delete
removes exactly the rows still below the truncate's version, even one rewritten between the
listing and the delete by a later change, and its delete tombstone fences stale updates of the
row as any delete does. Rows of the truncating transaction itself (its version) stay: a reload
(`BEGIN; TRUNCATE; INSERT ...`) writes them.

The end of a full snapshot in a soft-delete sink (`on_delete: soft`) marks instead: the rows it
no longer holds were deleted while capture did not publish it (a re-snapshot after lost
offsets), and a soft-delete sink keeps deleted rows, marked. Each becomes a mark
(`Change.marks_deleted`) at the same version, written over the stored row; rows already marked
stay as they are (their delete's time kept). A TRUNCATE statement removes rows in every sink.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from cdc_sync.core.model import Change, Op, TableId, Truncate
from cdc_sync.core.types import RowSchema
from cdc_sync.shape.spec import SinkShape

# The key column of the deletes: a delete's doc id is its one key value, the stored id as is.
ID_COLUMN = "_id"


def marks_at_snapshot_end(shape: SinkShape, truncate: Truncate) -> bool:
    """Whether `truncate` marks the sink's older rows instead of removing them."""
    return truncate.snapshot_end and shape.soft


def truncate_deletes(table: TableId, truncate: Truncate, stored: Mapping[str, int]) -> list[Change]:
    """`stored`: doc id -> the version the sink holds. Deletes of those below the truncate."""
    below = truncate.version - 1
    return [
        Change(table, ((ID_COLUMN, doc_id),), Op.DELETE, below, None, truncate.coordinates)
        for doc_id, version in sorted(stored.items())
        if version <= below
    ]


def truncate_marks(
    table: TableId,
    truncate: Truncate,
    shape: SinkShape,
    stored: Mapping[str, int],
    marked: Collection[str],
) -> list[Change]:
    """A snapshot's end in a soft-delete sink: marks, just below its version, of the rows
    below it (`stored`: doc id -> version) that are not `marked` already. The mark's time is
    the snapshot's (the delete's own was never published)."""
    below = truncate.version - 1
    markers = RowSchema(shape.marker_columns())
    return [
        Change(
            table,
            ((ID_COLUMN, doc_id),),
            Op.UPDATE,
            below,
            shape.mark(truncate.source_ts_ms),
            truncate.coordinates,
            truncate.source_ts_ms,
            schema=markers,
            marks_deleted=True,
        )
        for doc_id, version in sorted(stored.items())
        if version <= below and doc_id not in marked
    ]
