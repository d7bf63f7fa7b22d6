"""What a search index holds: documents (with versions) and field types, through the backend.

The one read path for verify, the mapping check and the tests (no raw HTTP beside the client).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cdc_sync.sinks.search.backends import SearchBackend
from cdc_sync.sinks.search.watermarks import WATERMARK_INDEX

PAGE = 1000


def documents(backend: SearchBackend, alias: str) -> dict[str, tuple[int | None, dict[str, Any]]]:
    """doc id -> (version, `_source`) of every document behind `alias`; empty if none exists.
    Refreshes first: Elasticsearch does not show writes to search before a refresh."""
    if not backend.alias_exists(alias):
        return {}
    backend.refresh(alias)
    return {
        hit["_id"]: (hit.get("_version"), hit["_source"])
        for hits in backend.scan(alias, PAGE)
        for hit in hits
    }


def stored_versions(backend: SearchBackend, alias: str) -> dict[str, int]:
    """doc id -> version of every document behind `alias` (no `_source`); empty if none exists."""
    if not backend.alias_exists(alias):
        return {}
    backend.refresh(alias)
    return {
        hit["_id"]: int(hit["_version"])
        for hits in backend.scan(alias, PAGE, source=False)
        for hit in hits
    }


def stored_marks(
    backend: SearchBackend, alias: str, marker: str
) -> tuple[dict[str, int], set[str]]:
    """doc id -> version of every document behind `alias`, and the ids whose boolean field
    `marker` is true (soft-deleted rows: `on_delete: soft`); reads that field only."""
    if not backend.alias_exists(alias):
        return {}, set()
    backend.refresh(alias)
    versions: dict[str, int] = {}
    marked: set[str] = set()
    for hits in backend.scan(alias, PAGE, source=[marker]):
        for hit in hits:
            versions[hit["_id"]] = int(hit["_version"])
            if hit.get("_source", {}).get(marker) is True:
                marked.add(hit["_id"])
    return versions, marked


def field_types(backend: SearchBackend, alias: str) -> dict[str, str]:
    """Top-level field name -> mapping type (`object` when it has properties only)."""
    if not backend.alias_exists(alias):
        return {}
    types: dict[str, str] = {}
    for mapping in backend.mappings(alias).values():
        for name, spec in mapping.get("properties", {}).items():
            types[name] = spec.get("type", "object")
    return types


def versions(backend: SearchBackend, alias: str, ids: Sequence[str]) -> dict[str, int]:
    """doc id -> stored version, for those of `ids` the index holds."""
    if not ids or not backend.alias_exists(alias):
        return {}
    docs = backend.mget(alias, ids)
    return {d["_id"]: int(d["_version"]) for d in docs if d.get("found")}


def sources(backend: SearchBackend, alias: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """doc id -> `_source`, for those of `ids` the index holds (no refresh: a get by id reads
    the latest write)."""
    if not ids or not backend.alias_exists(alias):
        return {}
    return {d["_id"]: d["_source"] for d in backend.mget(alias, ids) if d.get("found")}


def watermarks(backend: SearchBackend) -> dict[str, int]:
    """Applied watermarks, topic -> WAL position (empty before the job recorded one)."""
    return {
        doc_id: int(source["lsn"])
        for doc_id, (_, source) in documents(backend, WATERMARK_INDEX).items()
    }
