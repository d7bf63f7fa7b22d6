"""Keeping document indices current from the log: the driver's step after each batch's writes.

Per batch, in one state transaction: each TRUNCATE of a document table and each of the batch's
changes to them (full rows, filled) are merged into the state, and the roots they touch
(`fanout`) are marked pending. Then each document's pending roots are rendered from the state in
chunks of `chunk` roots (`render`: one lookup per relation and chunk) and written to the search
server in bulks of up to `BULK_CHUNK` documents, `bulks_in_flight` of them at once while the
next are rendered, all at the documents' version: the highest change version
applied so far, so a later render (from a newer state) always overwrites an earlier one and
never the reverse (`external_gte`). The source database serves none of it.

An index is built anew, in a new concrete index behind its alias, when its spec or mapping
changed (every root rendered from the state, then the alias moved), and when a new state starts
beside an index it did not write (a new checkpoint replaying the topics): readers keep the old
index while the replay fills the new one, and the alias moves at the first batch that ends the
backlog. A state that does not belong to its checkpoint is refused (`documents.checkpoint`).

Memory: a chunk's roots with their nested rows, the bulks in flight (`BULK_CHUNK` documents
each), the batch's changed rows and the ids of the roots they reach (the pending roots
themselves wait in the state, not in memory).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cdc_sync.core.collector import collecting_less
from cdc_sync.core.logs import CONSOLE
from cdc_sync.core.model import Change, Coordinates, Op, TableId, Truncate
from cdc_sync.documents.builds import (
    Build,
    building_key,
    caught_up,
    fingerprint,
    fingerprint_key,
    planned,
    renders_during_snapshot,
    snapshot_goes_on,
    snapshot_rows_only,
    snapshot_version,
)
from cdc_sync.documents.checkpoint import state_fits_checkpoint
from cdc_sync.documents.comparisons import TableTypes, schema_types
from cdc_sync.documents.fanout import affected_roots
from cdc_sync.documents.render import render
from cdc_sync.documents.rows import Row
from cdc_sync.documents.state import Changed, DocumentState, Entry
from cdc_sync.documents.target import document_route
from cdc_sync.mapping import MappingFile, TableRoute
from cdc_sync.relations import DocumentSpec
from cdc_sync.schema import RowSchema, from_json_value
from cdc_sync.shape.changes import filter_flags
from cdc_sync.sinks.base import WriteResult
from cdc_sync.sinks.documents import json_document
from cdc_sync.sinks.search.actions import BulkAction
from cdc_sync.sinks.search.client import BULK_CHUNK
from cdc_sync.source.checkpoint import query_id

log = logging.getLogger(__name__)
console = logging.getLogger(CONSOLE)

STATE_FILE = "state.sqlite"  # in the document consumer's checkpoint (job.consumers)
# The key of a table's full, filled changes among a write's deferred changes
# (job.write.table_writes).
DOCUMENTS_DEFERRED = "documents"
CHUNK = 1000  # roots rendered at once (memory); their writes are gathered into larger bulks
# Bulks written while the next are rendered: the server indexes one while the driver renders
# (and serializes) the next, and a server with cores to spare indexes two at once.
BULKS_IN_FLIGHT = 2


class DocumentWriter(Protocol):
    """Where documents go: the search sink (`SearchSink`)."""

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None: ...

    def holds(self, alias: str) -> bool: ...

    def index_exists(self, index: str) -> bool: ...

    def next_generation(self, route: TableRoute) -> str: ...

    def promote(self, alias: str, index: str) -> None: ...

    def write_documents(self, alias: str, actions: Sequence[BulkAction]) -> WriteResult: ...


@dataclass
class DocumentResult:
    """What one batch did to the document indices."""

    rendered: int = 0  # documents written (indexed or deleted)
    writes: dict[str, WriteResult] = field(default_factory=dict)  # per document

    def refused(self) -> dict[str, WriteResult]:
        """The documents whose writes the search server refused some of."""
        return {name: result for name, result in self.writes.items() if result.failures}


class StateMisfit(RuntimeError):
    """The documents' state does not belong to the checkpoint beside it (the reason says why)."""


class DocumentSync:
    def __init__(
        self,
        mapping: MappingFile,
        state_path: Path,
        search: DocumentWriter,
        chunk: int = CHUNK,
        full_batch: int | None = None,
        *,
        names: Collection[str] | None = None,
        checkpoint: Path | None = None,
        bulks_in_flight: int = BULKS_IN_FLIGHT,
    ) -> None:
        """`full_batch`: records a batch holds at most (the source's maxOffsetsPerTrigger): a
        full batch of snapshot rows has more behind it, so its roots wait for the batch that
        ends the backlog and render once (an initial build renders a root once, not once per
        table and batch that reaches it); a build behind the alias ends at the first batch that
        is not full. `names`: the documents this instance keeps (default: every one), each
        instance with its own state file. `checkpoint`: the streaming query's checkpoint the
        state belongs to (`ensure_targets` refuses a state that does not). `bulks_in_flight`:
        bulk requests sent and not yet answered at most (at least 1)."""
        if bulks_in_flight < 1:
            raise ValueError(f"bulks_in_flight must be at least 1, got {bulks_in_flight}")
        self.full_batch = full_batch
        self.mapping = mapping
        self.specs = _chosen(mapping, names)
        self.state = DocumentState(state_path, self.specs.values())
        self.search = search
        self.chunk = chunk
        self.checkpoint = checkpoint
        self.tables = frozenset(t for spec in self.specs.values() for t in spec.tables())
        self.bulks_in_flight = bulks_in_flight
        # The bulks' threads only call the search server; the state stays on the caller's.
        self._bulks = ThreadPoolExecutor(bulks_in_flight, thread_name_prefix="document-bulk")

    @classmethod
    def beside_checkpoint(
        cls,
        mapping: MappingFile,
        checkpoint: Path,
        search: DocumentWriter,
        full_batch: int | None = None,
        names: Collection[str] | None = None,
        bulks_in_flight: int = BULKS_IN_FLIGHT,
    ) -> DocumentSync:
        """The state in `<checkpoint>/state.sqlite`, refused at start unless it belongs to that
        checkpoint."""
        return cls(
            mapping,
            checkpoint / STATE_FILE,
            search,
            full_batch=full_batch,
            names=names,
            checkpoint=checkpoint,
            bulks_in_flight=bulks_in_flight,
        )

    def ensure_targets(
        self,
        schemas: Mapping[TableId, RowSchema],
        types: Mapping[TableId, TableTypes] | None = None,
    ) -> None:
        """Each document index, before the stream starts, made, built anew or its build
        resumed as `builds.planned` decides (`schemas`: the document tables', from the
        catalog: the index mapping's field types, the filter's column types). A state that does
        not belong to the checkpoint is refused first (`StateMisfit`). Rows join and sort by
        the columns' Postgres `types` (`comparisons.catalog_types`; without them, as their
        kinds in `schemas` suggest)."""
        if self.checkpoint is not None:
            reason = state_fits_checkpoint(self.checkpoint, self.state.path)
            if reason is not None:
                raise StateMisfit(
                    f"documents {', '.join(self.specs)}: {reason}; the job does not render "
                    "documents from it: start them on a new checkpoint, which rebuilds them "
                    "from the topics behind their alias"
                )
        self.state.use_types({**schema_types(schemas), **(types or {})})
        for name, spec in self.specs.items():
            route = document_route(spec, schemas, self.mapping.policies_for(spec.table))
            written = fingerprint(spec, route)
            building = self.state.meta(building_key(name))
            build = planned(
                written,
                self.state.meta(fingerprint_key(name)),
                building,
                building is not None and self.search.index_exists(building),
                self.search.holds(spec.index),
                self.state.count(spec.table) > 0,
            )
            if build is Build.IN_PLACE:
                self.search.ensure_target(route, None)
            elif build is not Build.RESUME:
                promote = build is Build.BUILD_NOW
                self._build(name, spec, route, schemas.get(spec.table), promote)
            with self.state.transaction():
                self.state.set_meta(fingerprint_key(name), written)

    def _build(
        self,
        name: str,
        spec: DocumentSpec,
        route: TableRoute,
        root: RowSchema | None,
        promote: bool,
    ) -> None:
        """Every root rendered from the state into a new concrete index (the filter evaluated
        anew over every root row: the spec's may have changed), which the alias points at
        now (`promote`), or once the state has caught up: readers see the old documents until
        the new index is whole."""
        index = self.search.next_generation(route)
        with self.state.transaction():
            self.state.set_meta(building_key(name), index)
        total = self.state.count(spec.table)
        started, done = time.monotonic(), 0
        version = self.state.version()
        self.state.forget_written(name)  # the new index holds nothing yet

        def rendered() -> Iterator[list[BulkAction]]:
            nonlocal done
            for chunk in self.state.present_ids(spec.table, self.chunk):
                if spec.filter is not None:
                    self._filter_state(name, spec, root, self.state.rows(spec.table, chunk))
                yield [a for a in self._actions(name, spec, chunk, version) if a.op == "index"]
                done += len(chunk)
                console.info(
                    "documents %s: built %d/%d roots into %s (%.0f/s)",
                    name,
                    done,
                    total,
                    index,
                    done / max(time.monotonic() - started, 1e-6),
                )

        written, _ = self._write(name, index, rendered())
        if written.failures:
            first = written.failures[0]
            raise RuntimeError(
                f"building {index}: the search server refused {len(written.failures)} "
                f"document(s) ({first.error_class}: {first.message})"
            )
        self.state.rendered(name)  # everything pending is in the new index now
        if promote:
            self._promote(name, spec, index)

    def _promote(self, name: str, spec: DocumentSpec, index: str) -> None:
        self.search.promote(spec.index, index)
        with self.state.transaction():
            self.state.clear_meta(building_key(name))

    def apply(
        self,
        truncates: Sequence[Truncate],
        changes: Mapping[TableId, Sequence[Change]],
        records: int = 0,
        batch_id: int | None = None,
    ) -> DocumentResult:
        """The batch's TRUNCATEs (applied first: the batch's changes are newer; a snapshot's
        end as its table's `on_snapshot_end` says) and its changes (per document table: one per
        key, full rows, filled) into the state, with `batch_id` (the streaming query's); then
        every pending root rendered and written, unless the batch is a full one of snapshot rows
        that ends no table's snapshot (`records`: the batch's; see `full_batch`) or one of a full
        snapshot's rows that goes on behind it (`snapshot_goes_on`): then only the roots that
        snapshot read, of documents whose other tables it has read whole. A build behind the
        alias ends at the first batch that ends the backlog."""
        # The batch's rows and the rendered documents live until the step ends: collected less
        # often meanwhile (core.collector).
        with collecting_less():
            return self._apply(truncates, changes, records, batch_id)

    def _apply(
        self,
        truncates: Sequence[Truncate],
        changes: Mapping[TableId, Sequence[Change]],
        records: int,
        batch_id: int | None,
    ) -> DocumentResult:
        truncates = [
            t
            for t in truncates
            if t.table in self.tables and self.mapping.policies_for(t.table).applies(t)
        ]
        changes = {t: list(found) for t, found in changes.items() if t in self.tables and found}
        if truncates or changes or batch_id is not None:
            self._merge(truncates, changes, batch_id)
        full = self.full_batch is not None and records >= self.full_batch
        snapshot_rows = snapshot_rows_only(truncates, changes)
        if (full and snapshot_rows) or snapshot_goes_on(truncates, changes):
            # A snapshot going on: only the roots it read that render whole already.
            snapshot = snapshot_version(changes)
            result = DocumentResult() if snapshot is None else self._render_pending(snapshot)
        else:
            result = self._render_pending()
            if caught_up(full, snapshot_rows):
                for name, spec in self.specs.items():
                    building = self.state.meta(building_key(name))
                    if building is not None:
                        self._promote(name, spec, building)
        if truncates or any(c.row is None for found in changes.values() for c in found):
            self.state.forget_freed()  # erasure: no old copy of a deleted row stays in the WAL
        return result

    def close(self) -> None:
        self._bulks.shutdown(wait=True)
        self.state.close()

    def _merge(
        self,
        truncates: Sequence[Truncate],
        changes: Mapping[TableId, Sequence[Change]],
        batch_id: int | None,
    ) -> None:
        versions = [c.version for found in changes.values() for c in found]
        versions += [t.version for t in truncates]
        with self.state.transaction():
            if batch_id is not None:
                checkpoint = self.checkpoint
                self.state.record_batch(batch_id, query_id(checkpoint) if checkpoint else None)
            changed: dict[TableId, Changed] = {}
            for truncate in truncates:
                changed.setdefault(truncate.table, Changed()).add(
                    self.state.truncate(truncate.table, truncate.version)
                )
            for table, found in sorted(changes.items()):
                merged = self.state.merge(table, [_entry(c) for c in found])
                changed.setdefault(table, Changed()).add(merged)
                for end in (c for c in found if c.ends_snapshot):
                    self.state.record_snapshot_end(table, end.version)
            for name, spec in self.specs.items():
                if spec.filter is not None and spec.table in changes:
                    self._filter_changes(name, spec, changes[spec.table])
                self.state.add_pending(name, affected_roots(spec, changed, self.state))
            self.state.raise_version(max(versions, default=0))

    def _filter_changes(self, name: str, spec: DocumentSpec, changes: Sequence[Change]) -> None:
        """Which of the batch's root rows match the document's filter."""
        live = [c for c in changes if c.row is not None]
        schema = next((c.schema for c in reversed(live) if c.schema is not None), None)
        if schema is not None and live:
            rows = [c.row for c in live if c.row is not None]
            self._match(name, spec, schema, [c.doc_id for c in live], rows)

    def _filter_state(
        self, name: str, spec: DocumentSpec, schema: RowSchema | None, rows: Sequence[Row]
    ) -> None:
        """Which of these root rows, as the state keeps them (JSON), match the filter."""
        if schema is None:
            raise ValueError(
                f"{self.mapping.document_filter_path(name)}: no schema of {spec.table} to "
                "evaluate the filter over its rows with"
            )
        typed = [
            {c.name: from_json_value(c.type, row.doc.get(c.name)) for c in schema.columns}
            for row in rows
        ]
        self._match(name, spec, schema, [row.id for row in rows], typed)

    def _match(
        self,
        name: str,
        spec: DocumentSpec,
        schema: RowSchema,
        ids: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> None:
        """The filter (SQL over each full root row, decoded values) decides which match."""
        assert spec.filter is not None
        filters = [(self.mapping.document_filter_path(name), spec.filter)]
        flags = filter_flags(schema, rows, filters)
        self.state.set_matching(
            name,
            [ident for ident, ok in zip(ids, flags, strict=True) if ok],
            [ident for ident, ok in zip(ids, flags, strict=True) if not ok],
        )

    def _render_pending(self, snapshot: int | None = None) -> DocumentResult:
        """Every document's pending roots rendered and written; with `snapshot` (the version
        of a full snapshot going on), only the roots that snapshot read, of documents whose
        every other table it has read whole (`renders_during_snapshot`): the others stay
        pending."""
        result = DocumentResult()
        version = self.state.version()
        ends = self.state.snapshot_ends(self.tables) if snapshot is not None else {}
        for name, spec in self.specs.items():
            if snapshot is not None and not renders_during_snapshot(spec, ends, snapshot):
                continue
            # Into the index being built behind the alias, if there is one.
            target = self.state.meta(building_key(name)) or spec.index
            pages = (
                self.state.pending(name, self.chunk)
                if snapshot is None
                else self.state.pending_read_at(name, spec.table, snapshot, self.chunk)
            )
            chunks = (self._actions(name, spec, chunk, version) for chunk in pages)
            written, sent = self._write(name, target, chunks)
            result.writes[name] = result.writes.get(name, WriteResult()).merge(written)
            result.rendered += sent
            if snapshot is None:
                self.state.rendered(name)
            else:
                self.state.rendered_read_at(name, spec.table, snapshot)
        return result

    def _write(
        self, name: str, target: str, chunks: Iterable[Sequence[BulkAction]]
    ) -> tuple[WriteResult, int]:
        """The rendered chunks' actions, written in bulks as large as the search sink's
        (`BULK_CHUNK`), `bulks_in_flight` at once while the next chunks render, leaving out
        documents the index already holds as rendered: what was written, and how many actions
        were sent. Each root is in one chunk of a step, so bulks in flight together never hold
        the same document. No bulk is left writing when this returns or raises. (Writes of
        1,000 documents a bulk, the render chunk, left the local search server re-indexing for a
        minute and more afterwards, while bulks of 2,000 or more did not:
        benchmarks/probe_document_pattern.py.)"""
        result, sent, gathered = WriteResult(), 0, list[tuple[BulkAction, bytes | None]]()
        in_flight: deque[tuple[Future[WriteResult], list[tuple[BulkAction, bytes | None]]]]
        in_flight = deque()

        def settle_oldest() -> None:
            nonlocal result
            future, bulk = in_flight.popleft()
            result = result.merge(self._record(name, bulk, future.result()))

        def send(bulk: list[tuple[BulkAction, bytes | None]]) -> None:
            nonlocal sent
            while len(in_flight) >= self.bulks_in_flight:
                settle_oldest()
            actions = [action for action, _ in bulk]
            future = self._bulks.submit(self.search.write_documents, target, actions)
            in_flight.append((future, bulk))
            sent += len(bulk)

        try:
            for actions in chunks:
                gathered += self._changed(name, actions)
                if len(gathered) >= BULK_CHUNK:
                    send(gathered)
                    gathered = []
            if gathered:
                send(gathered)
            while in_flight:
                settle_oldest()
        finally:
            wait([future for future, _ in in_flight])  # after an error: none still writing
        return result, sent

    def _changed(
        self, name: str, actions: Sequence[BulkAction]
    ) -> list[tuple[BulkAction, bytes | None]]:
        """The actions with their documents' digests, without the documents the index holds
        already as rendered now (a root re-rendered by a change that does not show in it)."""
        digests = {a.doc_id: _digest(a.document) for a in actions if a.document is not None}
        held = self.state.written(name, list(digests))
        return [
            (action, digests.get(action.doc_id))
            for action in actions
            if action.document is None or held.get(action.doc_id) != digests[action.doc_id]
        ]

    def _record(
        self,
        name: str,
        gathered: Sequence[tuple[BulkAction, bytes | None]],
        written: WriteResult,
    ) -> WriteResult:
        """The state records what the index holds after one bulk. A write fenced by a newer
        document (one repair wrote, say) leaves its digest unknown: rendered again."""
        refused = {failure.change.doc_id for failure in written.failures}
        kept = {
            action.doc_id: digest
            for action, digest in gathered
            if digest is not None and action.doc_id not in refused and not written.fenced
        }
        self.state.record_written(
            name, kept, [a.doc_id for a, _ in gathered if a.doc_id not in kept]
        )
        return written

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


def _digest(document: Mapping[str, Any] | None) -> bytes:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _chosen(mapping: MappingFile, names: Collection[str] | None) -> dict[str, DocumentSpec]:
    if names is None:
        return dict(mapping.documents)
    unknown = sorted(set(names) - set(mapping.documents))
    if unknown:
        known = ", ".join(sorted(mapping.documents)) or "none"
        raise ValueError(f"{mapping.path}: no document {', '.join(unknown)} (documents: {known})")
    return {name: mapping.documents[name] for name in names}


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
