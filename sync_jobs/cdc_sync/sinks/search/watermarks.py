"""Applied watermarks in search: alias `cdc_sync_watermarks` (index `cdc_sync_watermarks_v1`), one
document per topic.

The document's version is the WAL position itself (`version_type=external_gte`), so the index
never takes a lower one: a stale write answers 409, which is the fencing working.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from cdc_sync.core.lsn import format_lsn
from cdc_sync.core.retry import RetryPolicy, retried
from cdc_sync.mapping import TableRoute
from cdc_sync.sinks.search.actions import VERSION_TYPE, concrete_index
from cdc_sync.sinks.search.backends import SearchBackend, is_transient_status
from cdc_sync.sinks.search.client import ItemsToRetry, is_retryable

WATERMARK_INDEX = "cdc_sync_watermarks"  # the alias; writes and reads go through it
WATERMARK_MAPPINGS: dict[str, Any] = {
    "properties": {
        "topic": {"type": "keyword"},
        "table": {"type": "keyword"},
        "index": {"type": "keyword"},
        "lsn": {"type": "long"},
        "lsn_text": {"type": "keyword"},
        "updated_at": {"type": "date"},
    }
}


class SearchWatermarks:
    def __init__(self, backend: SearchBackend, policy: RetryPolicy) -> None:
        self.backend = backend
        self.policy = policy
        self._index_ready = False

    def record(self, routes: Mapping[str, TableRoute], position: int) -> None:
        operations = watermark_operations(routes, position, datetime.now(tz=UTC))
        if not operations:
            return
        retried(lambda: self._write(operations), is_retryable, "search watermarks", self.policy)

    def _write(self, operations: list[dict[str, Any]]) -> None:
        if not self._index_ready:
            if not self.backend.alias_exists(WATERMARK_INDEX):
                index = concrete_index(WATERMARK_INDEX)
                self.backend.create_index(index, WATERMARK_MAPPINGS, {}, WATERMARK_INDEX)
            self._index_ready = True
        answer = self.backend.bulk(operations)
        statuses = [_status(item) for item in answer.get("items", [])]
        if any(is_transient_status(status) for status in statuses):
            raise ItemsToRetry(len(statuses))
        refused = [s for s in statuses if not (s == 409 or (isinstance(s, int) and s < 300))]
        if refused:
            raise RuntimeError(f"{WATERMARK_INDEX}: watermark writes answered {refused}")


def _status(item: Mapping[str, Any]) -> object:
    outcome = next(iter(item.values()), None)
    return outcome.get("status") if isinstance(outcome, Mapping) else None


def watermark_operations(
    routes: Mapping[str, TableRoute], position: int, now: datetime
) -> list[dict[str, Any]]:
    """Bulk lines (header, document) for every routed topic with a search route."""
    operations: list[dict[str, Any]] = []
    for topic, route in sorted(routes.items()):
        if route.search is None:
            continue
        operations.append(
            {
                "index": {
                    "_index": WATERMARK_INDEX,
                    "_id": topic,
                    "version": position,
                    "version_type": VERSION_TYPE,
                }
            }
        )
        operations.append(
            {
                "topic": topic,
                "table": str(route.table),
                "index": route.search.index,
                "lsn": position,
                "lsn_text": format_lsn(position),
                "updated_at": now.isoformat(),
            }
        )
    return operations
