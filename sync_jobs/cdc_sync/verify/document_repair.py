"""`cdc-sync repair` of a document index: documents rewritten from Postgres's own join, fenced.

Missing and different documents are computed by Postgres (`verify.documents`) and written to
the index directly at a fence version F; extra documents (a root Postgres no longer has, or that
no longer matches the filter) are deleted at the version the index stores (`extra_rows`).

F comes from Postgres just before the documents are read: repair commits a Debezium `log`
signal (the signal table is captured, so its transaction is streamed) and reads the WAL insert
position inside that transaction, before its commit record. A change's version is the commit
end of the transaction streamed before its own: every change committed before the read is
below F, every transaction committing after the signal is at or above the signal's commit end,
above F. The job writes a document at the highest version it has applied, so a render from a
state that holds nothing committed after F cannot replace the repaired document (older
content), and a render from one that holds a later change replaces it (newer content). The
documents are read after the signal committed, so they hold everything below F. A document the
index already holds above F (rendered from a newer state) is kept: the write is fenced.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg

from cdc_sync.core.lsn import format_lsn, parse_lsn
from cdc_sync.core.model import Coordinates
from cdc_sync.debezium.connector import converter_modes
from cdc_sync.debezium.signals import request_log
from cdc_sync.documents.sync import document_action
from cdc_sync.mapping import MappingFile
from cdc_sync.sinks.search import SearchSink
from cdc_sync.sinks.search.actions import BulkAction
from cdc_sync.verify.documents import DocumentOracle

CHUNK = 500  # documents per bulk request
# What the index's logs name as the writes' coordinates: they come from no Kafka record.
REPAIR_SOURCE = "cdc-sync-repair"


@dataclass
class Rewritten:
    fence: int = 0
    written: int = 0
    kept: int = 0  # the index holds the document above the fence: a newer render won
    gone: int = 0  # no longer a root in Postgres: an extra document now, if the index has it
    failures: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [f"{self.written} rewritten at version {format_lsn(self.fence)}"]
        parts += [
            f"{n} {what}"
            for n, what in (
                (self.kept, "kept (newer in the index)"),
                (self.gone, "no longer in Postgres"),
                (len(self.failures), "failed"),
            )
            if n
        ]
        first = f" (first: {self.failures[0]})" if self.failures else ""
        return ", ".join(parts) + first


def fence_version(conn: psycopg.Connection[Any], config: Mapping[str, str]) -> int:
    """The version repaired documents are written at (see the module's docstring): the WAL
    insert position read inside a transaction that commits a Debezium `log` signal."""
    with conn.transaction():
        request_log(conn, config, "cdc-sync repair: documents rewritten at this position")
        found = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert found is not None
    return parse_lsn(str(found[0]))


def rewrite_documents(
    search: SearchSink,
    mapping: MappingFile,
    name: str,
    conn: psycopg.Connection[Any],
    config: Mapping[str, str],
    ids: Sequence[str],
) -> Rewritten:
    """Write the documents `ids` as Postgres computes them now, at the fence version."""
    spec = mapping.documents[name]
    if not search.holds(spec.index):  # a write would create an index without its mapping
        return Rewritten(failures=[f"{spec.index}: no such index (the job builds it at start)"])
    outcome = Rewritten(fence=fence_version(conn, config))
    oracle = DocumentOracle(conn, spec, converter_modes(mapping.connector))
    wanted = set(ids)
    where = Coordinates(REPAIR_SOURCE, 0, 0)
    for chunk in _chunks(
        document_action(spec.table, where, ident, outcome.fence, document)
        for ident, document in oracle.documents()
        if ident in wanted
    ):
        result = search.write_documents(spec.index, chunk)
        outcome.written += result.applied
        outcome.kept += result.fenced
        outcome.failures += [f"{f.change.doc_id}: {f.error_class}" for f in result.failures]
        wanted -= {action.doc_id for action in chunk}
    outcome.gone = len(wanted)
    return outcome


def _chunks(actions: Iterable[BulkAction]) -> Iterator[list[BulkAction]]:
    chunk: list[BulkAction] = []
    for action in actions:
        chunk.append(action)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
