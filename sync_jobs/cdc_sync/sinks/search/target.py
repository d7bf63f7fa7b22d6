"""Index setup, separate from data writes: create `<alias>_v1` behind the alias, add new fields.

The mapping is explicit: the route's mapping first, then a field per schema column it lacks
(`search_field_mapping`). `index.gc_deletes` is the tombstone retention: for that long the index
remembers a deleted document's version, which fences stale updates arriving after the delete;
it is applied to existing indices too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from cdc_sync.mapping import SearchRoute
from cdc_sync.schema import RowSchema, search_field_mapping
from cdc_sync.sinks.search.actions import concrete_index
from cdc_sync.sinks.search.backends import SearchBackend

log = logging.getLogger(__name__)


def index_settings(route: SearchRoute, tombstone_retention_seconds: int) -> dict[str, Any]:
    """The route's settings with `index.gc_deletes` set to the tombstone retention."""
    settings = {k: v for k, v in route.settings.items() if k not in ("index.gc_deletes",)}
    nested = dict(settings.pop("index", None) or {})
    nested["gc_deletes"] = f"{tombstone_retention_seconds}s"
    return {**settings, "index": nested}


def schema_fields(schema: RowSchema | None) -> dict[str, dict[str, Any]]:
    if schema is None:
        return {}
    fields = {column.name: search_field_mapping(column.type) for column in schema.columns}
    return {name: field for name, field in fields.items() if field}


def initial_mappings(route: SearchRoute, schema: RowSchema | None) -> dict[str, Any]:
    """The route's mapping wins; schema columns it does not name get a derived field."""
    properties = dict(route.mapping.get("properties", {}))
    for name, field in schema_fields(schema).items():
        properties.setdefault(name, field)
    return {**route.mapping, "properties": properties}


def ensure_index(
    backend: SearchBackend,
    route: SearchRoute,
    schema: RowSchema | None,
    tombstone_retention_seconds: int,
) -> list[str]:
    """Create the index behind the alias, or add the schema fields it lacks (idempotent).

    Returns the names of the fields added to an existing index.
    """
    alias = route.index
    if not backend.alias_exists(alias):
        index = concrete_index(alias)
        if backend.index_exists(index):  # created by hand or by an older release: just link it
            backend.put_alias(index, alias)
        else:
            backend.create_index(
                index,
                initial_mappings(route, schema),
                index_settings(route, tombstone_retention_seconds),
                alias,
            )
            log.info("created search index %s behind alias %s", index, alias)
            return []
    apply_gc_deletes(backend, alias, tombstone_retention_seconds)
    return add_missing_fields(backend, alias, schema_fields(schema))


def apply_gc_deletes(backend: SearchBackend, alias: str, tombstone_retention_seconds: int) -> None:
    """An index made earlier (by hand, an older release, another retention) fences deletes only
    as long as its `index.gc_deletes`: set it to the retention (a dynamic setting)."""
    wanted = f"{tombstone_retention_seconds}s"
    for index, settings in backend.settings(alias).items():
        if settings.get("index", {}).get("gc_deletes") != wanted:
            backend.put_settings(index, {"index": {"gc_deletes": wanted}})
            log.info("set index.gc_deletes=%s on search index %s", wanted, index)


def add_missing_fields(
    backend: SearchBackend, alias: str, wanted: Mapping[str, dict[str, Any]]
) -> list[str]:
    added: set[str] = set()
    for index, mappings in backend.mappings(alias).items():
        present = mappings.get("properties", {})
        missing = {name: field for name, field in wanted.items() if name not in present}
        if missing:
            backend.put_mapping(index, missing)
            log.info("added fields %s to search index %s", sorted(missing), index)
            added.update(missing)
    return sorted(added)


def next_generation(
    backend: SearchBackend,
    route: SearchRoute,
    schema: RowSchema | None,
    tombstone_retention_seconds: int,
) -> str:
    """A new concrete index for `route`, beside the one its alias points at and not behind the
    alias yet (a rebuild fills it, then `promote` swaps the alias): `<alias>_v<n+1>`."""
    held = backend.mappings(route.index) if backend.alias_exists(route.index) else {}
    generations = [_generation(route.index, name) for name in held]
    index = f"{route.index}_v{max(generations, default=0) + 1}"
    if backend.index_exists(index):  # a rebuild that did not finish: start it over
        backend.delete_index(index)
    backend.create_index(
        index,
        initial_mappings(route, schema),
        index_settings(route, tombstone_retention_seconds),
        None,
    )
    return index


def promote(backend: SearchBackend, alias: str, index: str) -> list[str]:
    """Point `alias` at `index` in one request (readers see the old index or the new one,
    never a half-built one), then delete the indices it pointed at before. Returns them."""
    old = sorted(backend.mappings(alias)) if backend.alias_exists(alias) else []
    backend.move_alias(alias, index, [name for name in old if name != index])
    for name in old:
        if name != index:
            backend.delete_index(name)
    log.info("search alias %s now points at %s (was %s)", alias, index, old)
    return old


def _generation(alias: str, index: str) -> int:
    suffix = index.removeprefix(f"{alias}_v")
    return int(suffix) if suffix != index and suffix.isdigit() else 0
