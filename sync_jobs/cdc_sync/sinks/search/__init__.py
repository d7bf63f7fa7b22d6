"""Search sink (Elasticsearch / OpenSearch): one index per routed table behind its alias.

Fenced by `version_type=external_gte` with the LSN as version; deletes are versioned and kept as
tombstones for `index.gc_deletes` (= the mapping's tombstone retention). Refresh is left to the
index's refresh policy (users choose it); `refresh(alias)` is there for tests and tools.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cdc_sync.core.model import Change, Truncate
from cdc_sync.core.retry import DEFAULT_POLICY, RetryPolicy, retried
from cdc_sync.mapping import TableRoute
from cdc_sync.schema import RowSchema
from cdc_sync.sinks.base import WriteResult
from cdc_sync.sinks.search.actions import BulkAction, SearchActions, to_actions, truncate_actions
from cdc_sync.sinks.search.backends import (
    CLIENT_KINDS,
    SearchBackend,
    is_transient,
    open_backend,
)
from cdc_sync.sinks.search.client import SearchWriter
from cdc_sync.sinks.search.readback import stored_marks, stored_versions
from cdc_sync.sinks.search.target import ensure_index, next_generation, promote
from cdc_sync.sinks.search.watermarks import SearchWatermarks
from cdc_sync.sinks.truncates import marks_at_snapshot_end

__all__ = ["CLIENT_KINDS", "SearchSink"]


class SearchSink:
    name = "search"

    def __init__(
        self,
        client_kind: str,
        url: str,
        tombstone_retention_seconds: int,
        *,
        compat_headers: bool | None = None,
        retry: RetryPolicy = DEFAULT_POLICY,
        name: str = "search",
    ) -> None:
        """`compat_headers`: see `open_backend`. `retry`: how long a write waits for the server
        (its `attempt_timeout_seconds` bounds each request). `name`: how its retries and
        health are reported (a document index's writer is named after the index)."""
        if tombstone_retention_seconds <= 0:
            raise ValueError("tombstone_retention_seconds must be positive")
        self.name = name
        self.client_kind = client_kind
        self.retry = retry.for_target(self.name)
        self.backend: SearchBackend = open_backend(
            client_kind, url, compat_headers, timeout_seconds=self.retry.attempt_timeout_seconds
        )
        self.tombstone_retention_seconds = tombstone_retention_seconds
        self.writer = SearchWriter(self.backend, self.retry)
        self.watermarks = SearchWatermarks(self.backend, self.retry)

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        search = route.search
        if search is None:
            return
        retried(
            lambda: ensure_index(self.backend, search, schema, self.tombstone_retention_seconds),
            is_transient,
            f"search ensure_target {search.index}",
            self.retry,
        )

    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        actions = to_actions(route, changes)
        if actions is None:
            return WriteResult()
        return self.writer.write_batch(actions)

    def holds(self, alias: str) -> bool:
        """Whether `alias` exists."""
        return retried(
            lambda: self.backend.alias_exists(alias),
            is_transient,
            f"search alias {alias}",
            self.retry,
        )

    def index_exists(self, index: str) -> bool:
        """Whether the concrete index `index` exists (a rebuild's, not behind its alias yet)."""
        return retried(
            lambda: self.backend.index_exists(index),
            is_transient,
            f"search index {index}",
            self.retry,
        )

    def next_generation(self, route: TableRoute) -> str:
        """A new concrete index for a rebuild of `route`'s index, not behind its alias yet."""
        search = route.search
        assert search is not None
        return retried(
            lambda: next_generation(self.backend, search, None, self.tombstone_retention_seconds),
            is_transient,
            f"search new index {search.index}",
            self.retry,
        )

    def promote(self, alias: str, index: str) -> None:
        """Swap `alias` to `index` atomically and delete what it pointed at."""
        self.backend.refresh(index)
        retried(
            lambda: promote(self.backend, alias, index),
            is_transient,
            f"search alias {alias} -> {index}",
            self.retry,
        )

    def write_documents(self, alias: str, actions: Sequence[BulkAction]) -> WriteResult:
        """Versioned actions built elsewhere (cdc_sync.documents), fenced like every write."""
        return self.writer.write_batch(SearchActions(alias, tuple(actions)))

    def truncate(self, route: TableRoute, truncate: Truncate) -> int:
        search = route.search
        if search is None:
            return 0
        shape = route.shape(self.name)
        marker = shape.markers[0] if marks_at_snapshot_end(shape, truncate) else None
        stored, marked = retried(
            lambda: (
                stored_marks(self.backend, search.index, marker)
                if marker is not None
                else (stored_versions(self.backend, search.index), set())
            ),
            is_transient,
            f"search scan {search.index}",
            self.retry,
        )
        actions = truncate_actions(route, truncate, stored, marked)
        return self.writer.write_batch(actions).applied if actions is not None else 0

    def record_watermark(self, routes: Mapping[str, TableRoute], position: int) -> None:
        self.watermarks.record(routes, position)

    def refresh(self, alias: str) -> None:
        """Make writes searchable now (tests); production relies on the index refresh policy."""
        self.backend.refresh(alias)

    def close(self) -> None:
        self.backend.close()
