"""Log-compaction semantics inside one micro-batch: the newest change per key wins.

"Newest" is the highest (commit-order) version, ties broken by Kafka offset: the changes of one
transaction share a version and keep their Kafka order. Unchanged TOAST columns of the winner are
filled from older changes of the same key in the batch, so dropping the older changes never drops
a value the sinks have not seen yet; uncertain ones (a null that may be real) are left to Postgres.

A Kafka tombstone is the compacted log's delete. It carries no version: it takes the version of the
change just before it in the log (the delete event it follows, normally), or, when the batch holds
none (the log cleaner removed it, or it sits in an earlier batch), stays UNVERSIONED: the sinks
then delete whatever they hold, and every change after it in the log still wins.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from cdc_sync.core.model import Change


def order_key(change: Change) -> tuple[int, int, int]:
    return (change.version, change.coordinates.partition, change.coordinates.offset)


def fold(older: Change, newer: Change) -> Change:
    """The state after applying `newer` on top of `older` (same table and key)."""
    if newer.is_delete or not newer.unavailable_columns or older.is_delete or older.row is None:
        return newer
    assert newer.row is not None
    # An uncertain placeholder may be a real null that replaced the older value: not filled.
    recovered = {
        column: older.row[column]
        for column in newer.unavailable_columns - newer.uncertain_columns
        if column in older.row
    }
    if not recovered:
        return newer
    return dataclasses.replace(
        newer,
        row={**newer.row, **recovered},
        unavailable_columns=newer.unavailable_columns - recovered.keys(),
    )


def version_tombstones(changes: Sequence[Change]) -> list[Change]:
    """One key's changes of a batch, with each tombstone delete versioned by the change before it
    in Kafka order (if any), sorted in fold order."""
    in_log_order = sorted(changes, key=lambda c: c.coordinates.position)
    versioned: list[Change] = []
    for change in in_log_order:
        if change.is_unversioned and versioned:
            change = dataclasses.replace(change, version=versioned[-1].version)
        versioned.append(change)
    return sorted(versioned, key=order_key)


def fold_key(changes: Sequence[Change], keep_earlier: bool = False) -> Change:
    """The state one key's changes of a batch leave. `keep_earlier` (tables with a Delta
    history): the state also carries the earlier states it passed through, the last one of
    each older version (`Change.earlier`)."""
    ordered = version_tombstones(changes)
    state = ordered[0]
    states = [state]
    for change in ordered[1:]:
        state = fold(state, change)
        states.append(state)
    if keep_earlier:
        last_per_version = {s.version: s for s in states}  # a transaction's last change wins
        earlier = tuple(s for v, s in last_per_version.items() if v != state.version)
        state = dataclasses.replace(state, earlier=earlier)
    if state.is_delete and created_in_the_same_transaction(state, ordered):
        # Keyed by primary key, a transaction that swaps two rows' keys (deferrable keys) reads
        # delete(a) create(b) delete(b) create(a): b's last change is a delete though Postgres
        # holds b. A delete after a create of the same version is settled by reading Postgres
        # (within one batch only: README, Known limits).
        state = dataclasses.replace(state, resolve_from_source=True)
    return state


def created_in_the_same_transaction(delete: Change, changes: Sequence[Change]) -> bool:
    return not delete.is_unversioned and any(
        not c.is_delete and c.version == delete.version for c in changes
    )
