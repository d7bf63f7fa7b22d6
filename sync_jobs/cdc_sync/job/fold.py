"""Log-compaction semantics inside one micro-batch: the newest change per key wins.

"Newest" is the highest version (LSN), ties broken by Kafka offset (a replayed duplicate has the
same version). Unchanged TOAST columns of the winner are filled from older changes of the same key
in the batch, so dropping the older changes never drops a value the sinks have not seen yet.
"""

from __future__ import annotations

import dataclasses

from cdc_sync.core.model import Change


def order_key(change: Change) -> tuple[int, int, int]:
    return (change.version, change.coordinates.partition, change.coordinates.offset)


def fold(older: Change, newer: Change) -> Change:
    """The state after applying `newer` on top of `older` (same table and key)."""
    if newer.is_delete or not newer.unavailable_columns or older.is_delete or older.row is None:
        return newer
    assert newer.row is not None
    recovered = {
        column: older.row[column] for column in newer.unavailable_columns if column in older.row
    }
    if not recovered:
        return newer
    return dataclasses.replace(
        newer,
        row={**newer.row, **recovered},
        unavailable_columns=newer.unavailable_columns - recovered.keys(),
    )
