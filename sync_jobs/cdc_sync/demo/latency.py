"""Commit -> visible latency: update one row in Postgres, time until every sink shows it.

Each probe writes a unique marker into `shop.customers.full_name`, commits, then polls the
search document, the cache entry and the Delta row for that marker. The time is wall-clock from
the commit returning to the last sink showing the marker (so it includes capture, the broker, the
micro-batch trigger and every sink write).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.compute as pc
import redis
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from cdc_sync.core.model import TableId
from cdc_sync.core.settings import Connections
from cdc_sync.mapping import MappingFile, TableRoute

PROBE_TABLE = TableId("shop", "customers")
PROBE_COLUMN = "full_name"


@dataclass(frozen=True)
class LatencySample:
    seconds: float  # commit -> visible in the slowest sink
    per_sink: dict[str, float]


class LatencyProbe:
    def __init__(self, mapping: MappingFile, connections: Connections) -> None:
        self.route: TableRoute = mapping.tables[PROBE_TABLE]
        self.connections = connections
        self.cache = redis.Redis.from_url(connections.require("redis_url"))
        self.warehouse = Path(connections.require("warehouse"))

    def sample(self, timeout_seconds: float = 60.0) -> LatencySample:
        marker = f"probe-{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.connections.require("pg_url"), autocommit=True) as conn:
            row = conn.execute(
                f"UPDATE shop.customers SET {PROBE_COLUMN} = %s, updated_at = now() "
                "WHERE id = (SELECT min(id) FROM shop.customers) RETURNING id",
                (marker,),
            ).fetchone()
        committed = time.monotonic()
        if row is None:
            raise RuntimeError("latency probe needs at least one row in shop.customers")
        doc_id = str(row[0])
        pending = {name: check for name, check in self._checks(doc_id, marker).items()}
        seen: dict[str, float] = {}
        while pending:
            if time.monotonic() - committed > timeout_seconds:
                raise TimeoutError(
                    f"change not visible in {sorted(pending)} after {timeout_seconds}s"
                )
            for name, check in list(pending.items()):
                if check():
                    seen[name] = time.monotonic() - committed
                    del pending[name]
            time.sleep(0.02)
        return LatencySample(max(seen.values()), seen)

    def _checks(self, doc_id: str, marker: str) -> dict[str, Any]:
        checks: dict[str, Any] = {}
        if self.route.search is not None:
            url = (
                f"{self.connections.require('search_url')}/{self.route.search.index}/_doc/{doc_id}"
            )
            checks["search"] = lambda: _search_value(url) == marker
        if self.route.cache is not None:
            key = self.route.cache.key(PROBE_TABLE, doc_id)
            checks["cache"] = lambda: _cache_value(self.cache, key) == marker
        if self.route.delta is not None:
            path = self.warehouse / self.route.delta.relative_path()
            checks["delta"] = lambda: _delta_value(path, int(doc_id)) == marker
        return checks

    def close(self) -> None:
        self.cache.close()


def _search_value(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return json.loads(response.read()).get("_source", {}).get(PROBE_COLUMN)
    except urllib.error.HTTPError:
        return None


def _cache_value(client: redis.Redis, key: str) -> Any:
    stored = client.hget(key, "row")
    return None if stored is None else json.loads(stored).get(PROBE_COLUMN)


def _delta_value(path: Path, row_id: int) -> Any:
    try:
        table = DeltaTable(str(path)).to_pyarrow_table(columns=["id", PROBE_COLUMN])
    except TableNotFoundError:
        return None
    matched = table.filter(pc.equal(table["id"], row_id))
    return matched[PROBE_COLUMN][0].as_py() if matched.num_rows else None
