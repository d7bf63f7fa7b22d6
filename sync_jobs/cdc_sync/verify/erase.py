"""`cdc-sync erase`: remove keys from every sink of a table, its Delta history included, and with
`--purge` from the Delta files older table versions still read (docs/erasure.md).

The source row must be deleted first: erase refuses keys Postgres still holds, since the stream
would bring them back. Search, cache and the Delta table delete at the version they store
(`extra_rows.delete_extra_rows`, the same fenced delete repair uses), which leaves each sink's
delete tombstone, so a stale change replayed within the tombstone retention stays out; the
topic's newest change of the key is its delete, so a replay ends with the key deleted. The
history's rows of the key are deleted and the key is recorded with the newest version the
sinks held (`history_writer.record_erased`): a replay of the topic writes none of its versions
up to that one into the history again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from cdc_sync.core.errors import ConfigError
from cdc_sync.mapping import TableRoute
from cdc_sync.sinks.delta import readback as delta_readback
from cdc_sync.sinks.delta.history import ID, VERSION_LAST
from cdc_sync.sinks.delta.history_writer import erased_versions, record_erased
from cdc_sync.sinks.delta.merge_plan import datafusion_quote
from cdc_sync.sinks.delta.target import history_path, open_table, table_path
from cdc_sync.sinks.delta.tombstones import TombstoneStore
from cdc_sync.verify.extra_rows import RepairSinks, delete_extra_rows


@dataclass
class Erasure:
    """What erase did, one line per place."""

    lines: list[str] = field(default_factory=list)
    failed: bool = False

    def add(self, place: str, what: str) -> None:
        self.lines.append(f"{place}: {what}")


def erase(
    sinks: RepairSinks,
    route: TableRoute,
    key_columns: Sequence[str],
    ids: Sequence[str],
    source_ids: Callable[[], Collection[str]],
    purge: bool = False,
) -> Erasure:
    """Remove `ids` (document ids) of `route`'s table from every sink it routes to.
    `source_ids`: the ids of those Postgres holds now (refused when any)."""
    present = sorted(set(source_ids()) & set(ids))
    if present:
        raise ConfigError(
            "command line",
            "--key",
            f"{route.table} still holds {present} in Postgres: delete the rows there first "
            "(the stream would bring them back), then erase",
        )
    outcome = Erasure()
    routed = {"search": route.search, "cache": route.cache, "delta": route.delta}
    names = [name for name, section in routed.items() if section is not None]
    warehouse = Path(sinks.connections.require("warehouse")) if route.delta else None
    # Read before the deletes: the newest version the history and the Delta table hold.
    newest = _newest_versions(sinks, route, key_columns, ids, warehouse)
    for name in names:
        removed = delete_extra_rows(sinks, name, route, key_columns, ids, source_ids)
        outcome.add(f"{name} {_place(route, name)}", removed.describe())
        outcome.failed |= bool(removed.failures or removed.fenced)
    if warehouse is not None and route.delta is not None and route.delta.history:
        outcome.add(
            f"history {route.delta.history_name()}",
            f"{_delete_history(warehouse, route, ids)} rows deleted",
        )
        record_erased(warehouse, route.delta, newest)
        unknown = sorted(set(ids) - newest.keys())
        outcome.add(
            "history erased-keys record",
            f"{len(newest)} keys recorded"
            + (f" ({len(unknown)} without a known version: {unknown[:5]})" if unknown else ""),
        )
    if purge and warehouse is not None and route.delta is not None:
        for path, label in _purged_tables(warehouse, route):
            table = open_table(path)
            if table is None:
                continue
            gone = table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
            outcome.add(f"purge {label}", f"{len(gone)} files no longer read vacuumed")
    return outcome


def _place(route: TableRoute, name: str) -> str:
    if name == "search" and route.search is not None:
        return route.search.index
    if name == "cache" and route.cache is not None:
        return f"{route.cache.prefix}:{route.table}"
    assert route.delta is not None
    return f"{route.delta.schema}.{route.delta.table}"


def _newest_versions(
    sinks: RepairSinks,
    route: TableRoute,
    key_columns: Sequence[str],
    ids: Sequence[str],
    warehouse: Path | None,
) -> dict[str, int]:
    """doc id -> the newest version the Delta table, its tombstones or its history hold."""
    if warehouse is None or route.delta is None:
        return {}
    delta = route.delta
    newest = dict(erased_versions(warehouse, delta, list(ids)))

    def raise_to(doc_id: str, version: int) -> None:
        newest[doc_id] = max(version, newest.get(doc_id, version))

    for doc_id, (version, _) in sinks.stored("delta", route, key_columns, ids).items():
        raise_to(doc_id, version)
    stones = TombstoneStore(warehouse, retention_seconds=0)
    for doc_id, version in stones._recorded_deletes(delta, list(ids)).items():
        raise_to(doc_id, version)
    for row in delta_readback.history_rows(warehouse, delta):
        if row[ID] in ids:
            raise_to(str(row[ID]), int(row[VERSION_LAST]))
    return newest


def _delete_history(warehouse: Path, route: TableRoute, ids: Sequence[str]) -> int:
    assert route.delta is not None
    table = open_table(history_path(warehouse, route.delta))
    if table is None:
        return 0
    data = table.to_pyarrow_table(columns=[ID])
    held = pc.is_in(data[ID].cast(pa.string()), pa.array(list(ids), type=pa.string()))
    if not pc.any(held).as_py():
        return 0
    quoted = ", ".join("'" + i.replace("'", "''") + "'" for i in ids)
    metrics = table.delete(f"{datafusion_quote(ID)} IN ({quoted})")
    return int(metrics.get("num_deleted_rows", 0))


def _purged_tables(warehouse: Path, route: TableRoute) -> list[tuple[Path, str]]:
    assert route.delta is not None
    delta = route.delta
    tables = [(table_path(warehouse, delta), f"{delta.schema}.{delta.table}")]
    if delta.history:
        tables.append((history_path(warehouse, delta), delta.history_name()))
    return tables
