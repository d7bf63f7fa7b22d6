"""What the cache holds for a routed table: its hashes (`row` JSON and `version` fields).

The one read path for verify and the tests.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis

from cdc_sync.core.model import TableId
from cdc_sync.mapping import WATERMARKS_KEY_SUFFIX, CacheRoute
from cdc_sync.sinks.redis.actions import parsed_version

ROW_FIELD = "row"
VERSION_FIELD = "version"  # zero-padded decimal (actions.VERSION_WIDTH), when the pipeline's


def entries(client: redis.Redis, cache: CacheRoute, table: TableId) -> dict[str, dict[str, str]]:
    """doc id -> every field of its hash, decoded (tombstone keys are not rows; a field that is
    not UTF-8, which only a foreign writer leaves, is read with replacement characters)."""
    prefix = cache.key(table, "")
    found: dict[str, dict[str, str]] = {}
    for key in client.scan_iter(match=f"{_glob_escape(prefix)}*", count=1000):
        fields: dict[bytes, bytes] = client.hgetall(key)  # type: ignore[assignment]
        if fields:
            found[key.decode()[len(prefix) :]] = {
                k.decode(errors="replace"): v.decode(errors="replace") for k, v in fields.items()
            }
    return found


def rows(client: redis.Redis, cache: CacheRoute, table: TableId) -> dict[str, dict[str, Any]]:
    """doc id -> the cached row (the JSON in the `row` field)."""
    return {
        doc_id: json.loads(fields[ROW_FIELD])
        for doc_id, fields in entries(client, cache, table).items()
        if ROW_FIELD in fields
    }


@dataclass(frozen=True)
class Foreign:
    """A row key the pipeline did not write: its version field is missing or not the pipeline's
    form (`actions.parsed_version`). Its version orders nothing (`apply.lua`)."""

    field: bytes | None  # the version field as read (None: the hash has none)


def versions(
    client: redis.Redis, cache: CacheRoute, table: TableId, ids: Sequence[str]
) -> dict[str, int | Foreign]:
    """doc id -> stored version (or `Foreign`), for those of `ids` the cache holds a row for."""
    pipe = client.pipeline(transaction=False)
    for doc_id in ids:
        pipe.hmget(cache.key(table, doc_id), [ROW_FIELD, VERSION_FIELD])
    stored = pipe.execute() if ids else []
    found: dict[str, int | Foreign] = {}
    for doc_id, (row, version) in zip(ids, stored, strict=True):
        if row is None and version is None:
            continue
        parsed = parsed_version(version)
        found[doc_id] = Foreign(version) if parsed is None else parsed
    return found


def tombstone_versions(
    client: redis.Redis, cache: CacheRoute, table: TableId, ids: Sequence[str]
) -> dict[str, int]:
    """doc id -> the version of the delete the cache remembers (its tombstone key, until the
    retention), for those of `ids` that have one."""
    stored = client.mget([cache.tombstone_key(table, doc_id) for doc_id in ids]) if ids else []
    return {doc_id: int(v) for doc_id, v in zip(ids, stored, strict=True) if v is not None}


def all_versions(
    client: redis.Redis, cache: CacheRoute, table: TableId, page: int = 1000
) -> dict[str, int]:
    """doc id -> stored version of every row the cache holds for `table` (tombstone keys are
    not rows): one SCAN, a pipelined HGET per page of keys."""
    prefix = cache.key(table, "")
    found: dict[str, int] = {}
    keys: list[bytes] = []

    def read(page_keys: list[bytes]) -> None:
        pipe = client.pipeline(transaction=False)
        for key in page_keys:
            pipe.hget(key, VERSION_FIELD)
        for key, version in zip(page_keys, pipe.execute(), strict=True):
            if version is not None:
                found[key.decode()[len(prefix) :]] = _ordering(version)

    for key in client.scan_iter(match=f"{_glob_escape(prefix)}*", count=page):
        keys.append(key)
        if len(keys) >= page:
            read(keys)
            keys = []
    if keys:
        read(keys)
    return found


def stored_marks(
    client: redis.Redis, cache: CacheRoute, table: TableId, marker: str
) -> tuple[dict[str, int], set[str]]:
    """doc id -> stored version of every row the cache holds for `table`, and the ids whose
    row has the boolean member `marker` true (soft-deleted rows: `on_delete: soft`)."""
    versions: dict[str, int] = {}
    marked: set[str] = set()
    for doc_id, fields in entries(client, cache, table).items():
        if VERSION_FIELD not in fields:
            continue
        versions[doc_id] = _ordering(fields[VERSION_FIELD])
        if ROW_FIELD in fields and json.loads(fields[ROW_FIELD]).get(marker) is True:
            marked.add(doc_id)
    return versions, marked


def watermarks(client: redis.Redis, prefix: str | None = None) -> dict[str, int]:
    """Applied watermarks, topic -> WAL position, from `<prefix>:_cdc:watermarks` (every
    prefix's hash when `prefix` is None; a topic in several takes the lowest)."""
    if prefix is not None:
        keys = [CacheRoute(prefix).watermarks_key().encode()]
    else:
        keys = list(client.scan_iter(match=f"*:{WATERMARKS_KEY_SUFFIX}", count=1000))
    found: dict[str, int] = {}
    for key in keys:
        fields: dict[bytes, bytes] = client.hgetall(key)  # type: ignore[assignment]
        for topic, value in fields.items():
            name = topic.decode()
            found[name] = min(int(value), found.get(name, int(value)))
    return found


def _ordering(field: bytes | str) -> int:
    """Where a stored version orders a row against a change: a foreign one before every change
    (0), as `apply.lua` treats it."""
    return parsed_version(field) or 0


def _glob_escape(text: str) -> str:
    # SCAN MATCH is a glob: a prefix holding *, ?, [ or \ must match itself only.
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)
