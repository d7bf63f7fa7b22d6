"""Cache sink (Redis): one HASH per row (`row` JSON + `version`), fenced by `apply.lua`.

Deletes remove the row key and leave a tombstone key holding the delete's version for the
tombstone retention, so a stale update after a delete does not resurrect the row. A route's
`ttl_seconds` expires row keys; once a row key has expired nothing fences an older replay of it,
which is the usual trade of an expiring cache.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from cdc_sync.core.model import Change, Truncate
from cdc_sync.core.retry import DEFAULT_POLICY, RetryPolicy, retried
from cdc_sync.mapping import TableRoute
from cdc_sync.schema import RowSchema
from cdc_sync.sinks.base import WriteResult
from cdc_sync.sinks.redis.actions import to_actions, truncate_actions
from cdc_sync.sinks.redis.client import RedisWriter, is_transient
from cdc_sync.sinks.redis.readback import Foreign, all_versions, stored_marks
from cdc_sync.sinks.redis.watermarks import CacheWatermarks
from cdc_sync.sinks.truncates import marks_at_snapshot_end

__all__ = ["RedisSink"]


class RedisSink:
    name = "redis"

    def __init__(
        self, url: str, tombstone_retention_seconds: int, retry: RetryPolicy = DEFAULT_POLICY
    ) -> None:
        if tombstone_retention_seconds <= 0:
            raise ValueError("tombstone_retention_seconds must be positive")
        self.retry = retry.for_target(self.name)
        timeout = self.retry.attempt_timeout_seconds
        # The client's own retries are off: core.retry owns retrying (one backoff policy). Its
        # socket timeouts default to none, so a frozen server would block an attempt forever.
        self.client = redis.Redis.from_url(
            url,
            retry=Retry(NoBackoff(), 0),
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
        )
        self.writer = RedisWriter(self.client, tombstone_retention_seconds, self.retry)
        self.watermarks = CacheWatermarks(self.client, self.retry)
        self._script_loaded = False

    def ensure_target(self, route: TableRoute, schema: RowSchema | None) -> None:
        # Nothing to create per table; load the script once so a bad server fails early.
        if route.cache is not None and not self._script_loaded:
            self.writer.load_script()
            self._script_loaded = True

    def apply(self, route: TableRoute, changes: Sequence[Change]) -> WriteResult:
        actions = to_actions(route, changes)
        if not actions:
            return WriteResult()
        return self.writer.write_batch(actions)

    def truncate(self, route: TableRoute, truncate: Truncate) -> int:
        cache = route.cache
        if cache is None:
            return 0
        shape = route.shape("cache")
        marker = shape.markers[0] if marks_at_snapshot_end(shape, truncate) else None
        stored, marked = retried(
            lambda: (
                stored_marks(self.client, cache, route.table, marker)
                if marker is not None
                else (all_versions(self.client, cache, route.table), set())
            ),
            is_transient,
            f"redis scan {cache.key(route.table, '*')}",
            self.retry,
        )
        actions = truncate_actions(route, truncate, stored, marked)
        return self.writer.write_batch(actions).applied if actions else 0

    def drop_foreign(self, route: TableRoute, foreign: Mapping[str, Foreign]) -> set[str]:
        """Delete the row keys of `foreign` (doc id -> what `readback.versions` read), each only
        if it still holds what was read; returns the doc ids deleted. Repair's delete of an
        extra row whose version is not the pipeline's, which a fenced delete cannot order."""
        cache = route.cache
        if cache is None or not foreign:
            return set()
        keys = {cache.key(route.table, i): i for i in foreign}
        dropped = self.writer.drop_foreign({key: foreign[i].field for key, i in keys.items()})
        return {keys[key] for key in dropped}

    def record_watermark(self, routes: Mapping[str, TableRoute], position: int) -> None:
        self.watermarks.record(routes, position)

    def close(self) -> None:
        self.client.close()
