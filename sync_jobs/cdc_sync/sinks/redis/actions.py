"""Pure conversion: compacted, routed changes -> arguments of the fenced apply script (no I/O)."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from cdc_sync.core.model import Change, Truncate
from cdc_sync.mapping import TableRoute
from cdc_sync.sinks.documents import json_document
from cdc_sync.sinks.truncates import marks_at_snapshot_end, truncate_deletes, truncate_marks

# LSNs are unsigned 64-bit: at most 20 decimal digits. apply.lua compares versions as strings of
# this fixed width (Lua numbers are doubles and cannot hold every LSN exactly).
VERSION_WIDTH = 20


def version_string(version: int) -> str:
    if not 0 <= version < 10**VERSION_WIDTH:
        raise ValueError(f"version {version} does not fit {VERSION_WIDTH} decimal digits")
    return f"{version:0{VERSION_WIDTH}d}"


def parsed_version(field: bytes | str | None) -> int | None:
    """The version a `version_string` field holds; None for any other field (or none): the key
    is foreign, written by something else under the route's prefix (`apply.lua` lets such a
    version fence nothing)."""
    text = field.decode("latin-1") if isinstance(field, bytes) else field
    if text is None or len(text) != VERSION_WIDTH or not text.isascii() or not text.isdigit():
        return None
    return int(text)


@dataclass(frozen=True)
class CacheAction:
    change: Change
    key: str
    tombstone_key: str
    op: Literal["upsert", "delete", "forget", "mark"]  # mark: a soft delete (apply.lua)
    version: str  # zero-padded, see VERSION_WIDTH
    row_json: str  # "" for deletes
    unavailable: tuple[str, ...]  # unchanged TOAST columns, merged from the stored row
    ttl_seconds: int  # row key expiry; 0 = none

    def script_keys(self) -> list[str]:
        return [self.key, self.tombstone_key]

    def script_args(self, tombstone_retention_seconds: int) -> list[str | int]:
        return [
            self.op,
            self.version,
            self.row_json,
            json.dumps(list(self.unavailable)),
            self.ttl_seconds,
            tombstone_retention_seconds,
        ]


def to_actions(route: TableRoute, changes: Sequence[Change]) -> list[CacheAction]:
    cache = route.cache
    if cache is None:
        return []
    ttl = cache.ttl_seconds or 0
    actions = []
    for change in changes:
        key = cache.key(change.table, change.doc_id)
        stone = cache.tombstone_key(change.table, change.doc_id)
        if change.is_unversioned:
            actions.append(CacheAction(change, key, stone, "forget", "", "", (), 0))
            continue
        version = version_string(change.version)
        if change.is_delete or change.row is None:
            actions.append(CacheAction(change, key, stone, "delete", version, "", (), 0))
            continue
        unavailable = tuple(sorted(change.unavailable_columns))
        # The script splices stored values in for these names: they must not be in the row.
        row = {k: v for k, v in change.row.items() if k not in change.unavailable_columns}
        document = json_document(row, change.schema)
        row_json = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
        op: Literal["upsert", "mark"] = "mark" if change.marks_deleted else "upsert"
        actions.append(CacheAction(change, key, stone, op, version, row_json, unavailable, ttl))
    return actions


def truncate_actions(
    route: TableRoute,
    truncate: Truncate,
    stored: Mapping[str, int],
    marked: Collection[str] = (),
) -> list[CacheAction]:
    """A TRUNCATE: a fenced delete (`apply.lua`), just below the truncate's version, of each
    cached row (`stored`: id -> version) older than it (`sinks.truncates`). Each leaves the
    tombstone a delete leaves. At a snapshot's end in a soft-delete cache: a mark of each such
    row not `marked` already."""
    shape = route.shape("cache")
    if marks_at_snapshot_end(shape, truncate):
        return to_actions(route, truncate_marks(route.table, truncate, shape, stored, marked))
    return to_actions(route, truncate_deletes(route.table, truncate, stored))
