"""A TRUNCATE as fenced deletes, for the sinks that remove rows one key at a time (search, cache).

The sink lists the versions it holds for the table; each row older than the truncate becomes a
delete at the version just below the truncate's, written through the sink's ordinary fenced
delete. Older-or-equal wins there (`external_gte`, the cache's compare-and-set), so the delete
removes exactly the rows still below the truncate's version, even one rewritten between the
listing and the delete by a later change, and its delete tombstone fences stale updates of the
row as any delete does. Rows of the truncating transaction itself (its version) stay: a reload
(`BEGIN; TRUNCATE; INSERT ...`) writes them.
"""

from __future__ import annotations

from collections.abc import Mapping

from cdc_sync.core.model import Change, Op, TableId, Truncate

# The key column of the deletes: a delete's doc id is its one key value, the stored id as is.
ID_COLUMN = "_id"


def truncate_deletes(table: TableId, truncate: Truncate, stored: Mapping[str, int]) -> list[Change]:
    """`stored`: doc id -> the version the sink holds. Deletes of those below the truncate."""
    below = truncate.version - 1
    return [
        Change(table, ((ID_COLUMN, doc_id),), Op.DELETE, below, None, truncate.coordinates)
        for doc_id, version in sorted(stored.items())
        if version <= below
    ]
