"""Delete rows a sink holds that Postgres does not, fenced so a concurrent re-insert wins.

Order matters: read the version the sink stores for the row, then confirm the key is absent in
Postgres, then delete in that sink at the stored version. A re-insert committed after the check
carries a higher version than anything stored before it, so the sink fences the delete if the
re-insert got there first, and fences the (older) stale row out if it comes after.

A cache key whose version field is not the pipeline's (written by something else under the
route's prefix: `sinks.redis.readback.Foreign`) orders nothing, so no fenced delete can remove
it: it is deleted only if it still holds the field read, so a pipeline write since wins.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from cdc_sync.core.model import Change, Coordinates, Op
from cdc_sync.core.retry import DEFAULT_POLICY, RetryPolicy, retried
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.connector import converter_modes
from cdc_sync.mapping import MappingFile, SearchRoute, TableRoute
from cdc_sync.sinks.base import Sink
from cdc_sync.sinks.delta import DeltaSink
from cdc_sync.sinks.delta import is_transient as delta_transient
from cdc_sync.sinks.delta import readback as delta_readback
from cdc_sync.sinks.delta.actions import VERSION
from cdc_sync.sinks.redis import RedisSink
from cdc_sync.sinks.redis import readback as cache_readback
from cdc_sync.sinks.redis.client import is_transient as cache_transient
from cdc_sync.sinks.redis.readback import Foreign
from cdc_sync.sinks.search import SearchSink
from cdc_sync.sinks.search import readback as search_readback
from cdc_sync.sinks.search.backends import is_transient as search_transient
from cdc_sync.verify.documents import DocumentOracle

# What the sinks' logs name as the deletes' coordinates: they come from no Kafka record.
REPAIR_COORDINATES = Coordinates("cdc-sync-repair", 0, 0)
# Search and cache address a row by its document id alone: a one-part key whose value is the
# id gives that id back (`document_id`).
ID_COLUMN = "_id"

Key = tuple[tuple[str, Any], ...]
T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """A read that may pass when tried again: a sink busy (a snapshot's bulk writes keep the
    local search server from answering for a while), restarting or briefly unreachable."""
    return search_transient(exc) or cache_transient(exc) or delta_transient(exc)


def read_retried(action: Callable[[], T], what: str, policy: RetryPolicy = DEFAULT_POLICY) -> T:
    return retried(action, is_transient, what, policy)


@dataclass
class ExtraRows:
    deleted: int = 0
    fenced: int = 0  # the sink holds a newer version now: a concurrent change won
    back: int = 0  # in Postgres again: the stream brings it
    gone: int = 0  # no longer in the sink
    foreign: int = 0  # deleted: their version was not the pipeline's (written by something else)
    failures: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [f"{self.deleted} deleted at their stored version"]
        parts += [
            f"{n} {what}"
            for n, what in (
                (self.foreign, "deleted as foreign (their version is not the pipeline's)"),
                (self.fenced, "kept (newer in the sink)"),
                (self.back, "kept (back in Postgres)"),
                (self.gone, "already gone"),
                (len(self.failures), "failed"),
            )
            if n
        ]
        return ", ".join(parts)


class RepairSinks:
    """The sinks repair writes to, by verify's sink names (search, cache, delta)."""

    def __init__(
        self, mapping: MappingFile, connections: Connections, retry: RetryPolicy = DEFAULT_POLICY
    ) -> None:
        self.mapping = mapping
        self.connections = connections
        self.retry = retry
        self._sinks: dict[str, Sink] = {}

    def sink(self, name: str) -> Sink:
        if name not in self._sinks:
            self._sinks[name] = self._build(name)
        return self._sinks[name]

    def _build(self, name: str) -> Sink:
        retention = self.mapping.tombstone_retention_seconds
        connections = self.connections
        if name == "search":
            return SearchSink(
                connections.search_client,
                connections.require("search_url"),
                retention,
                retry=self.retry,
            )
        if name == "cache":
            return RedisSink(connections.require("redis_url"), retention, self.retry)
        if name == "delta":
            return DeltaSink(Path(connections.require("warehouse")), retention, retry=self.retry)
        raise ValueError(f"unknown sink {name!r}")

    def stored(
        self, name: str, route: TableRoute, key_columns: Sequence[str], ids: Sequence[str]
    ) -> dict[str, tuple[int, Key]]:
        """doc id -> (stored version, key) for those of `ids` the sink holds as the pipeline
        wrote them."""
        held = self.held(name, route, key_columns, ids)
        return {i: v for i, v in held.items() if not isinstance(v, Foreign)}

    def held(
        self, name: str, route: TableRoute, key_columns: Sequence[str], ids: Sequence[str]
    ) -> dict[str, tuple[int, Key] | Foreign]:
        """doc id -> (stored version, key), or `Foreign` (a cache key the pipeline did not
        write), for those of `ids` the sink holds."""
        sink = self.sink(name)
        if isinstance(sink, SearchSink) and route.search is not None:
            found = search_readback.versions(sink.backend, route.search.index, ids)
            return {i: (v, ((ID_COLUMN, i),)) for i, v in found.items()}
        if isinstance(sink, RedisSink) and route.cache is not None:
            held = cache_readback.versions(sink.client, route.cache, route.table, ids)
            return {
                i: v if isinstance(v, Foreign) else (v, ((ID_COLUMN, i),)) for i, v in held.items()
            }
        if isinstance(sink, DeltaSink) and route.delta is not None:
            # Delta matches rows on the key columns: the key comes from the stored row.
            routed = {c: route.rename.get(c, c) for c in key_columns}
            rows = delta_readback.rows_by_id(sink.warehouse, route.delta, list(routed.values()))
            return {
                i: (int(rows[i][VERSION]), tuple((c, rows[i][routed[c]]) for c in key_columns))
                for i in ids
                if i in rows
            }
        return {}

    def close(self) -> None:
        for sink in self._sinks.values():
            sink.close()


def delete_extra_rows(
    sinks: RepairSinks,
    name: str,
    route: TableRoute,
    key_columns: Sequence[str],
    ids: Sequence[str],
    source_ids: Callable[[], Collection[str]],
    versions: Mapping[str, int] | None = None,
) -> ExtraRows:
    """Delete `ids` from sink `name` at their stored versions, unless Postgres has them again
    (`source_ids` reads its ids now, after the versions were read). `versions`: doc id -> the
    version to delete at instead (erase: above every version the pipeline can still deliver);
    a sink holding a newer one keeps its row."""
    what = f"repair {name} {route.table}"
    held = read_retried(lambda: sinks.held(name, route, key_columns, ids), what, sinks.retry)
    present = set(source_ids())
    outcome = ExtraRows(gone=len(ids) - len(held), back=len(present & held.keys()))
    extra = {i: v for i, v in sorted(held.items()) if i not in present}
    foreign = {i: v for i, v in extra.items() if isinstance(v, Foreign)}
    ours = {i: v for i, v in extra.items() if not isinstance(v, Foreign)}
    at = versions or {}
    changes = [
        Change(route.table, key, Op.DELETE, at.get(doc_id, version), None, REPAIR_COORDINATES)
        for doc_id, (version, key) in ours.items()
    ]
    sink = sinks.sink(name)
    if foreign and isinstance(sink, RedisSink):
        outcome.foreign = len(sink.drop_foreign(route, foreign))
        outcome.fenced = len(foreign) - outcome.foreign  # the pipeline wrote the key since
    if not changes:
        return outcome
    sink.ensure_target(route, None)
    result = sink.apply(route, changes)
    outcome.failures = [f"{f.change.doc_id}: {f.error_class}" for f in result.failures]
    # Counted from what the sink holds afterwards: a writer may count a fenced delete of a row
    # it cannot tell from an absent one as applied (Delta's MERGE reports rows, not outcomes).
    failed = {f.change.doc_id for f in result.failures}
    attempted = [c.doc_id for c in changes if c.doc_id not in failed]
    kept = read_retried(lambda: sinks.held(name, route, key_columns, attempted), what, sinks.retry)
    outcome.fenced += len(kept)
    outcome.deleted = len(attempted) - len(kept)
    return outcome


def delete_extra_documents(
    sinks: RepairSinks,
    mapping: MappingFile,
    name: str,
    conn: psycopg.Connection[Any],
    ids: Sequence[str],
) -> ExtraRows:
    """Delete documents of `name` whose root Postgres no longer has (or whose root no longer
    matches the filter) at their stored versions, unless it should hold them again."""
    spec = mapping.documents[name]
    route = document_route(mapping, name)
    roots = DocumentOracle(conn, spec, converter_modes(mapping.connector))
    return delete_extra_rows(sinks, "search", route, [ID_COLUMN], ids, lambda: set(roots.ids()))


def document_route(mapping: MappingFile, name: str) -> TableRoute:
    """Document index `name` as a search route keyed by the document id (its root's id)."""
    spec = mapping.documents[name]
    return TableRoute(
        spec.table, None, {}, SearchRoute(spec.index), None, None, mapping.policies_for(spec.table)
    )
