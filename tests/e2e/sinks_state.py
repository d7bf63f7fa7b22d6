"""Raw sink contents (versions and metadata included) for replay comparisons, read through each
sink's own read-back module."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import redis

from cdc_sync.core.settings import Connections
from cdc_sync.mapping import MappingFile
from cdc_sync.sinks.delta import readback as delta_readback
from cdc_sync.sinks.redis import readback as cache_readback
from cdc_sync.sinks.search import readback as search_readback
from cdc_sync.sinks.search.backends import open_backend
from cdc_sync.verify.compare import canonical_row


def all_sinks_state(mapping: MappingFile, connections: Connections) -> dict[str, Any]:
    """Everything every sink holds for the mapping's tables, versions and metadata included."""
    client = redis.Redis.from_url(connections.require("redis_url"))
    search = open_backend(connections.search_client, connections.require("search_url"))
    warehouse = Path(connections.require("warehouse"))
    state: dict[str, Any] = {}
    try:
        for table, route in mapping.tables.items():
            if route.search is not None:
                state[f"search/{table}"] = search_readback.documents(search, route.search.index)
            if route.cache is not None:
                state[f"cache/{table}"] = cache_readback.entries(client, route.cache, table)
            if route.delta is not None:
                rows = delta_readback.table_rows(warehouse, route.delta)
                state[f"delta/{table}"] = sorted(
                    rows, key=lambda row: json.dumps(canonical_row(row), sort_keys=True)
                )
        for name, spec in mapping.documents.items():
            # A document's version depends on where batches fell (documents.sync): sources only.
            held = search_readback.documents(search, spec.index)
            state[f"document/{name}"] = {ident: doc for ident, (_, doc) in held.items()}
    finally:
        client.close()
        search.close()
    return state


def clean_sinks(mapping: MappingFile, connections: Connections) -> None:
    """Indices and cache keys of earlier runs on a shared server must not leak into this one."""
    client = redis.Redis.from_url(connections.require("redis_url"))
    client.flushdb()
    client.close()
    search_url = connections.require("search_url")
    aliases = [route.search.index for route in mapping.tables.values() if route.search]
    aliases += [spec.index for spec in mapping.documents.values()]
    search = open_backend(connections.search_client, search_url)
    try:
        # Every index behind an alias (a rebuild or a replay's build made `<alias>_v2`, ...).
        behind = [name for a in aliases if search.alias_exists(a) for name in search.mappings(a)]
    finally:
        search.close()
    for name in [*behind, *aliases, *(f"{alias}_v1" for alias in aliases)]:
        request = urllib.request.Request(f"{search_url}/{name}", method="DELETE")
        with contextlib.suppress(urllib.error.HTTPError):  # absent: nothing to clean
            urllib.request.urlopen(request, timeout=30).close()
