"""Raw sink contents (versions included) for replay comparisons, and per-document lookups."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import redis
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from cdc_sync.core.settings import Connections
from cdc_sync.mapping import MappingFile, TableRoute
from cdc_sync.verify.compare import canonical_row


def http_json(url: str, body: dict[str, Any] | None = None, method: str = "GET") -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def search_state(search_url: str, route: TableRoute) -> dict[str, Any]:
    assert route.search is not None
    alias = route.search.index
    http_json(f"{search_url}/{alias}/_refresh", {}, "POST")
    answer = http_json(
        f"{search_url}/{alias}/_search",
        {"query": {"match_all": {}}, "size": 10000, "version": True},
        "POST",
    )
    return {hit["_id"]: (hit.get("_version"), hit["_source"]) for hit in answer["hits"]["hits"]}


def cache_state(client: redis.Redis, route: TableRoute) -> dict[str, Any]:
    assert route.cache is not None
    prefix = route.cache.key(route.table, "")
    state: dict[str, Any] = {}
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        fields: dict[bytes, bytes] = client.hgetall(key)  # type: ignore[assignment]
        state[key.decode()] = {k.decode(): v.decode() for k, v in fields.items()}
    return state


def delta_state(warehouse: Path, route: TableRoute) -> list[dict[str, Any]]:
    assert route.delta is not None
    try:
        table = DeltaTable(str(warehouse / route.delta.relative_path())).to_pyarrow_table()
    except TableNotFoundError:
        return []
    rows = table.to_pylist()
    return sorted(rows, key=lambda row: json.dumps(canonical_row(row), sort_keys=True))


def all_sinks_state(mapping: MappingFile, connections: Connections) -> dict[str, Any]:
    """Everything every sink holds for the mapping's tables, versions and metadata included."""
    client = redis.Redis.from_url(connections.require("redis_url"))
    warehouse = Path(connections.require("warehouse"))
    state: dict[str, Any] = {}
    try:
        for table, route in mapping.tables.items():
            state[f"search/{table}"] = search_state(connections.require("search_url"), route)
            state[f"cache/{table}"] = cache_state(client, route)
            state[f"delta/{table}"] = delta_state(warehouse, route)
    finally:
        client.close()
    return state
