"""Pure conversion: compacted, routed changes -> versioned bulk actions (no I/O).

Every action carries `version_type=external_gte` with the change's LSN as version, so the index
keeps the newest version of each document (older ones answer 409) and a re-run batch rewrites the
same version (harmless). Deletes are versioned too: the index keeps a delete tombstone for
`index.gc_deletes`, which fences a stale update arriving after the delete.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from cdc_sync.core.model import Change, Truncate
from cdc_sync.mapping import TableRoute
from cdc_sync.sinks.documents import json_document
from cdc_sync.sinks.truncates import marks_at_snapshot_end, truncate_deletes, truncate_marks

VERSION_TYPE = "external_gte"
INDEX_GENERATION = "v1"


def concrete_index(alias: str) -> str:
    """The index behind the alias; a reindex to a new generation swaps the alias."""
    return f"{alias}_{INDEX_GENERATION}"


@dataclass(frozen=True)
class BulkAction:
    change: Change
    op: Literal["index", "delete"]
    doc_id: str
    version: int
    document: Mapping[str, Any] | None  # JSON-safe `_source`; None for deletes
    unavailable_fields: frozenset[str] = frozenset()  # filled from the stored doc before indexing
    # A soft delete (`Change.marks_deleted`): indexed over the stored document, or sent as the
    # versioned delete when the index holds none (`SearchWriter`).
    mark: bool = False

    def header(self, index: str) -> dict[str, Any]:
        return {
            self.op: {
                "_index": index,
                "_id": self.doc_id,
                "version": self.version,
                "version_type": VERSION_TYPE,
            }
        }

    def with_stored_fields(self, stored_source: Mapping[str, Any]) -> BulkAction:
        """Unchanged TOAST fields take the stored value; the change's own fields win."""
        filled = {f: stored_source[f] for f in self.unavailable_fields if f in stored_source}
        return replace(
            self, document={**(self.document or {}), **filled}, unavailable_fields=frozenset()
        )

    def over_stored(self, stored_source: Mapping[str, Any] | None) -> BulkAction:
        """A mark as it is written: over the stored document (every stored field the mark does
        not carry stays), or, when the index holds none, as the delete at its version (a row
        the index never held is not marked; the delete's tombstone still fences)."""
        if stored_source is None:
            return replace(
                self, op="delete", document=None, unavailable_fields=frozenset(), mark=False
            )
        document = {**stored_source, **(self.document or {})}
        return replace(self, document=document, unavailable_fields=frozenset(), mark=False)


@dataclass(frozen=True)
class SearchActions:
    alias: str  # writes go through the alias, so a reindex behind it needs no job change
    actions: tuple[BulkAction, ...]


def to_actions(route: TableRoute, changes: Sequence[Change]) -> SearchActions | None:
    if route.search is None or not changes:
        return None
    return SearchActions(route.search.index, tuple(_action(change) for change in changes))


def truncate_actions(
    route: TableRoute,
    truncate: Truncate,
    stored: Mapping[str, int],
    marked: Collection[str] = (),
) -> SearchActions | None:
    """A TRUNCATE: a versioned delete, just below the truncate's version, of each stored
    document (`stored`: id -> `_version`) older than it; at a snapshot's end in a soft-delete
    index, a mark of each such document not `marked` already (`sinks.truncates`)."""
    shape = route.shape("search")
    if marks_at_snapshot_end(shape, truncate):
        return to_actions(route, truncate_marks(route.table, truncate, shape, stored, marked))
    return to_actions(route, truncate_deletes(route.table, truncate, stored))


def _action(change: Change) -> BulkAction:
    if change.is_delete or change.row is None:
        return BulkAction(change, "delete", change.doc_id, change.version, None)
    return BulkAction(
        change,
        "index",
        change.doc_id,
        change.version,
        json_document(change.row, change.schema),
        frozenset(change.unavailable_columns),
        mark=change.marks_deleted,
    )


def bulk_operations(index: str, actions: Sequence[BulkAction]) -> list[dict[str, Any]]:
    """The `_bulk` body: a header line per action, plus the document for index actions."""
    lines: list[dict[str, Any]] = []
    for action in actions:
        lines.append(action.header(index))
        if action.op == "index":
            lines.append(dict(action.document or {}))
    return lines
