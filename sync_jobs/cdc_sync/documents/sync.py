"""Keeping document indices current from the log: the driver's step after each batch's writes.

Per batch, in one state transaction: each TRUNCATE of a document table and each of the batch's
changes to them (full rows, filled) are merged into the state, and the roots they touch
(`fanout`) are marked pending. Then each document's pending roots are rendered from the state in
chunks of `chunk` roots (`render`: one lookup per relation and chunk) and written to the search
server with one bulk request per chunk, all at the documents' version: the highest change version
applied so far, so a later render (from a newer state) always overwrites an earlier one and
never the reverse (`external_gte`). The source database serves none of it.

Memory: a chunk's roots with their nested rows, plus the batch's changed rows and the ids of the
roots they reach (the pending roots themselves wait in the state, not in memory).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cdc_sync.core.logs import CONSOLE
from cdc_sync.core.model import Change, Coordinates, Op, TableId, Truncate
from cdc_sync.documents.comparisons import TableTypes, schema_types
from cdc_sync.documents.fanout import affected_roots
from cdc_sync.documents.render import render
from cdc_sync.documents.state import Changed, DocumentState, Entry
from cdc_sync.documents.target import document_route
from cdc_sync.mapping import MappingFile, TableRoute
from cdc_sync.relations import DocumentSpec
from cdc_sync.schema import RowSchema
from cdc_sync.shape.changes import filter_flags
from cdc_sync.sinks.base import WriteResult
from cdc_sync.sinks.documents import json_document
from cdc_sync.sinks.search.actions import BulkAction

log = logging.getLogger(__name__)
console = logging.getLogger(CONSOLE)

STATE_FILE = "documents/state.sqlite"
# The key of a table's full, filled changes among a write's deferred changes (job.table_writes).
DOCUMENTS_DEFERRED = "documents"
CHUNK = 1000  # roots rendered and written per bulk request


class DocumentWriter(Protocol):
    """Where documents go: the search sink (`SearchSink`)."""

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None: ...

    def holds(self, alias: str) -> bool: ...

    def next_generation(self, route: TableRoute) -> str: ...

    def promote(self, alias: str, index: str) -> None: ...

    def highest_version(self, alias: str) -> int:
        """The highest document version behind `alias` (0 when empty or absent)."""
        ...

    def write_documents(self, alias: str, actions: Sequence[BulkAction]) -> WriteResult: ...


@dataclass
class DocumentResult:
    """What one batch did to the document indices."""

    rendered: int = 0  # documents written (indexed or deleted)
    writes: dict[str, WriteResult] = field(default_factory=dict)  # per document

    def refused(self) -> dict[str, WriteResult]:
        """The documents whose writes the search server refused some of."""
        return {name: result for name, result in self.writes.items() if result.failures}


class DocumentSync:
    def __init__(
        self,
        mapping: MappingFile,
        state_path: Path,
        search: DocumentWriter,
        chunk: int = CHUNK,
        full_batch: int | None = None,
    ) -> None:
        """`full_batch`: records a batch holds at most (the source's maxOffsetsPerTrigger): a
        full batch of snapshot rows has more behind it, so its roots wait for the batch that
        ends the backlog and render once (an initial build renders a root once, not once per
        table and batch that reaches it)."""
        self.full_batch = full_batch
        self.mapping = mapping
        self.specs = dict(mapping.documents)
        self.state = DocumentState(state_path, self.specs.values())
        self.search = search
        self.chunk = chunk
        self.tables = frozenset(t for spec in self.specs.values() for t in spec.tables())

    @classmethod
    def beside_checkpoint(
        cls,
        mapping: MappingFile,
        checkpoint: Path,
        search: DocumentWriter,
        full_batch: int | None = None,
    ) -> DocumentSync:
        return cls(mapping, checkpoint / STATE_FILE, search, full_batch=full_batch)

    def ensure_targets(
        self,
        schemas: Mapping[TableId, RowSchema],
        types: Mapping[TableId, TableTypes] | None = None,
    ) -> None:
        """Each document index, before the stream starts: created (its mapping typed from
        `schemas`); built from the state when the state already holds its rows; rebuilt into a
        new concrete index behind the alias when its spec changed since the state last wrote
        it. A build renders every root from the state, then points the alias at it. Rows join
        and sort by the columns' Postgres `types` (`comparisons.catalog_types`; without them,
        as their kinds in `schemas` suggest)."""
        self.state.use_types({**schema_types(schemas), **(types or {})})
        for name, spec in self.specs.items():
            route = document_route(spec, schemas, self.mapping.policies_for(spec.table))
            fingerprint = _fingerprint(spec, route)
            key = f"fingerprint:{name}"
            held = self.search.holds(spec.index)
            if self.state.meta(key) is None and held:
                # A new state (a new checkpoint replaying the topics) beside an index written
                # before: its documents carry versions this state has not reached yet, and every
                # render must overwrite them (a delete of a root included), so start above.
                with self.state.transaction():
                    self.state.raise_version(self.search.highest_version(spec.index))
            stale = self.state.meta(key) not in (None, fingerprint)
            if self.state.count(spec.table) and (stale or not held):
                self._build(name, spec, route)
            else:
                self.search.ensure_target(route, None)
            with self.state.transaction():
                self.state.set_meta(key, fingerprint)

    def _build(self, name: str, spec: DocumentSpec, route: TableRoute) -> None:
        """Every root rendered from the state into a new concrete index, then the alias moved
        to it: readers see the old documents until the new index is whole."""
        index = self.search.next_generation(route)
        total = self.state.count(spec.table)
        started, done = time.monotonic(), 0
        version = self.state.version()
        for chunk in self.state.present_ids(spec.table, self.chunk):
            actions = self._actions(name, spec, chunk, version)
            written = self.search.write_documents(index, [a for a in actions if a.op == "index"])
            if written.failures:
                first = written.failures[0]
                raise RuntimeError(
                    f"building {index}: the search server refused {len(written.failures)} "
                    f"document(s) ({first.error_class}: {first.message})"
                )
            done += len(chunk)
            console.info(
                "documents %s: built %d/%d roots into %s (%.0f/s)",
                name,
                done,
                total,
                index,
                done / max(time.monotonic() - started, 1e-6),
            )
        self.search.promote(spec.index, index)
        self.state.rendered(name)  # everything pending is in the new index now

    def apply(
        self,
        truncates: Sequence[Truncate],
        changes: Mapping[TableId, Sequence[Change]],
        records: int = 0,
    ) -> DocumentResult:
        """The batch's TRUNCATEs (applied first: the batch's changes are newer) and its changes
        (per document table: one per key, full rows, filled) into the state; then every pending
        root rendered and written, unless the batch is a full one of snapshot rows that ends no
        table's snapshot (`records`: the batch's; see `full_batch`)."""
        truncates = [t for t in truncates if t.table in self.tables]
        changes = {t: list(found) for t, found in changes.items() if t in self.tables and found}
        if truncates or changes:
            self._merge(truncates, changes)
        if self._snapshot_continues(truncates, changes, records):
            return DocumentResult()
        return self._render_pending()

    def _snapshot_continues(
        self,
        truncates: Sequence[Truncate],
        changes: Mapping[TableId, Sequence[Change]],
        records: int,
    ) -> bool:
        if self.full_batch is None or records < self.full_batch or truncates or not changes:
            return False
        found = [c for batch in changes.values() for c in batch]
        return all(c.op is Op.READ and not c.ends_snapshot for c in found)

    def close(self) -> None:
        self.state.close()

    def _merge(
        self, truncates: Sequence[Truncate], changes: Mapping[TableId, Sequence[Change]]
    ) -> None:
        versions = [c.version for found in changes.values() for c in found]
        versions += [t.version for t in truncates]
        with self.state.transaction():
            changed: dict[TableId, Changed] = {}
            for truncate in truncates:
                changed.setdefault(truncate.table, Changed()).add(
                    self.state.truncate(truncate.table, truncate.version)
                )
            for table, found in sorted(changes.items()):
                merged = self.state.merge(table, [_entry(c) for c in found])
                changed.setdefault(table, Changed()).add(merged)
            for name, spec in self.specs.items():
                if spec.filter is not None and spec.table in changes:
                    self._filter_roots(name, spec, changes[spec.table])
                self.state.add_pending(name, affected_roots(spec, changed, self.state))
            self.state.raise_version(max(versions, default=0))

    def _filter_roots(self, name: str, spec: DocumentSpec, changes: Sequence[Change]) -> None:
        """Which of the batch's root rows match the document's filter (SQL over the full row)."""
        live = [c for c in changes if c.row is not None]
        schema = next((c.schema for c in reversed(live) if c.schema is not None), None)
        if schema is None or not live or spec.filter is None:
            return
        filters = [(self.mapping.document_filter_path(name), spec.filter)]
        flags = filter_flags(schema, [c.row for c in live if c.row is not None], filters)
        ids = [c.doc_id for c in live]
        self.state.set_matching(
            name,
            [ident for ident, ok in zip(ids, flags, strict=True) if ok],
            [ident for ident, ok in zip(ids, flags, strict=True) if not ok],
        )

    def _render_pending(self) -> DocumentResult:
        result = DocumentResult()
        version = self.state.version()
        for name, spec in self.specs.items():
            for chunk in self.state.pending(name, self.chunk):
                actions = self._actions(name, spec, chunk, version)
                written = self.search.write_documents(spec.index, actions)
                result.writes[name] = result.writes.get(name, WriteResult()).merge(written)
                result.rendered += len(actions)
            self.state.rendered(name)
        return result

    def _actions(
        self, name: str, spec: DocumentSpec, ids: Sequence[str], version: int
    ) -> list[BulkAction]:
        rows = self.state.rows(spec.table, ids)
        if spec.filter is not None:
            kept = self.state.matching(name, [row.id for row in rows])
            rows = [row for row in rows if row.id in kept]
        documents = render(spec, rows, self.state)
        where = Coordinates(f"documents:{name}", 0, 0)
        return [
            document_action(spec.table, where, ident, version, documents.get(ident))
            for ident in ids
        ]


def _fingerprint(spec: DocumentSpec, route: TableRoute) -> str:
    """What a document index's contents depend on: its spec and its index mapping."""
    mapping = route.search.mapping if route.search is not None else {}
    text = json.dumps([repr(spec), mapping], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def document_action(
    table: TableId,
    where: Coordinates,
    ident: str,
    version: int,
    document: Mapping[str, Any] | None,
) -> BulkAction:
    if document is None:
        change = Change(table, (("_id", ident),), Op.DELETE, version, None, where)
        return BulkAction(change, "delete", ident, version, None)
    change = Change(table, (("_id", ident),), Op.CREATE, version, document, where)
    return BulkAction(change, "index", ident, version, document)


def _entry(change: Change) -> Entry:
    """A change as the state keeps it: its row as the flat search index would hold it."""
    key = json_document(dict(change.key), change.schema)
    doc = None if change.row is None else json_document(change.row, change.schema)
    return Entry(
        id=change.doc_id,
        key=tuple(key[name] for name, _ in change.key),
        version=change.version,
        doc=doc,
        unavailable=change.unavailable_columns,
        unversioned=change.is_unversioned,
    )
