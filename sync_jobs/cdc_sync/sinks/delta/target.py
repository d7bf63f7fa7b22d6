"""Delta table setup, separate from data writes: create, and evolve by adding columns."""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, Field, write_deltalake
from deltalake.exceptions import TableNotFoundError

from cdc_sync.mapping import DeltaRoute
from cdc_sync.shape.spec import SOFT_DELETE_COLUMNS
from cdc_sync.sinks.delta import history as history
from cdc_sync.sinks.delta.actions import METADATA_FIELDS, VERSION

log = logging.getLogger(__name__)

HISTORY_FIELDS = (
    pa.field(history.ID, pa.string(), nullable=False),
    pa.field(history.VERSION_FROM, pa.int64(), nullable=False),
    pa.field(history.VERSION_LAST, pa.int64(), nullable=False),
    pa.field(history.VERSION_TO, pa.int64()),
    pa.field(history.VALID_FROM, pa.timestamp("us", tz="UTC")),
    pa.field(history.VALID_TO, pa.timestamp("us", tz="UTC")),
    pa.field(history.IS_CURRENT, pa.bool_(), nullable=False),
    pa.field(history.OP, pa.string(), nullable=False),
)

TOMBSTONE_ROOT = "_cdc_tombstones"
TOMBSTONE_ID = "_cdc_id"
TOMBSTONE_DELETED_AT = "_cdc_deleted_at"
TOMBSTONE_SCHEMA = pa.schema(
    [
        pa.field(TOMBSTONE_ID, pa.string(), nullable=False),
        pa.field(VERSION, pa.int64(), nullable=False),
        pa.field(TOMBSTONE_DELETED_AT, pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


def table_path(warehouse: Path, route: DeltaRoute) -> Path:
    return warehouse / route.relative_path()


def tombstone_path(warehouse: Path, route: DeltaRoute) -> Path:
    """Deleted keys with their delete version: fences stale updates after a delete."""
    return warehouse / TOMBSTONE_ROOT / route.relative_path()


def history_path(warehouse: Path, route: DeltaRoute) -> Path:
    """The SCD type 2 history table (`delta.history`): `<schema>/<table>__history` by default."""
    return warehouse / route.history_relative_path()


def erased_path(warehouse: Path, route: DeltaRoute) -> Path:
    """Keys erased by `cdc-sync erase` with the newest version erased: a replay of the topic
    must not write their older versions into the history again (never pruned)."""
    return warehouse / ERASED_ROOT / route.history_relative_path()


ERASED_ROOT = "_cdc_erased"


def open_table(path: Path) -> DeltaTable | None:
    try:
        return DeltaTable(str(path))
    except TableNotFoundError:
        return None


def target_schema(row_schema: pa.Schema) -> pa.Schema:
    # Metadata columns come last, from METADATA_FIELDS; the soft-delete markers
    # (`on_delete: soft`) are row columns the job writes.
    fields = [
        f.with_nullable(True)
        for f in row_schema
        if not f.name.startswith("_cdc_") or f.name in SOFT_DELETE_COLUMNS["delta"]
    ]
    return pa.schema([*fields, *METADATA_FIELDS])


CHANGE_DATA_FEED = "delta.enableChangeDataFeed"


def table_properties(route: DeltaRoute) -> dict[str, str]:
    """The Delta table properties the mapping asks for."""
    return {CHANGE_DATA_FEED: "true"} if route.change_data_feed else {}


def ensure_properties(table: DeltaTable, route: DeltaRoute) -> list[str]:
    """Set the properties an existing table lacks (a mapping turned them on later); returns
    their names. A property the mapping no longer asks for is left as it is."""
    current = table.metadata().configuration
    missing = {k: v for k, v in table_properties(route).items() if current.get(k) != v}
    if missing:
        table.alter.set_table_properties(missing)
        log.info("set %s on Delta table %s.%s", sorted(missing), route.schema, route.table)
    return sorted(missing)


def ensure_table(warehouse: Path, route: DeltaRoute, row_schema: pa.Schema) -> list[str]:
    """Create the table, or add the columns it lacks. Returns the added column names."""
    path = table_path(warehouse, route)
    wanted = target_schema(row_schema)
    table = open_table(path)
    if table is None:
        path.mkdir(parents=True, exist_ok=True)
        DeltaTable.create(
            str(path),
            schema=wanted,
            mode="ignore",
            partition_by=list(route.partition_by) or None,
            name=f"{route.schema}.{route.table}",
            configuration=table_properties(route) or None,
        )
        log.info("created Delta table %s.%s at %s", route.schema, route.table, path)
        ensure_tombstones(warehouse, route)
        return list(wanted.names)
    ensure_properties(table, route)
    added = _evolve(path, table, wanted, "Delta table")
    ensure_tombstones(warehouse, route)
    return added


def _evolve(path: Path, table: DeltaTable, wanted: pa.Schema, what: str) -> list[str]:
    """Number columns widened (a rewrite), then the missing columns added; their names."""
    current = pa.schema(table.schema().to_arrow())
    widened = [f for f in wanted if f.name in current.names and _retyped(current.field(f.name), f)]
    if widened:
        table = _rewrite_widened(path, table, widened)
        current = pa.schema(table.schema().to_arrow())
    added = [f for f in wanted if f.name not in current.names]
    if added:
        table.alter.add_columns([Field.from_arrow(f) for f in added])
        log.info("added columns %s to %s %s", [f.name for f in added], what, path)
    return [f.name for f in added]


def _retyped(current: pa.Field, wanted: pa.Field) -> bool:
    """A stored number column whose type differs from the wanted one. The job's schema-change
    policy has already decided the change is a widening (`cdc_sync.schema.widening`); only
    numbers widen, and other types may read back from Delta in another representation (string
    views, list field names) that needs no rewrite."""
    numeric = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)
    both_numeric = any(f(current.type) for f in numeric) and any(f(wanted.type) for f in numeric)
    return both_numeric and current.type != wanted.type


def _rewrite_widened(path: Path, table: DeltaTable, widened: list[pa.Field]) -> DeltaTable:
    """Delta (delta-rs) cannot change a column type in place: rewrite the table with the wider
    types, as one new version (older versions stay readable by time travel). Costs a full
    rewrite, which a type widening in the source is rare enough to afford."""
    data = table.to_pyarrow_table()
    for wanted in widened:
        index = data.schema.get_field_index(wanted.name)
        data = data.set_column(
            index, wanted.with_nullable(True), data[wanted.name].cast(wanted.type)
        )
    write_deltalake(str(path), data, mode="overwrite", schema_mode="overwrite")
    log.warning(
        "widened columns %s of Delta table %s (table rewritten)",
        [f"{f.name}: {f.type}" for f in widened],
        path,
    )
    return DeltaTable(str(path))


def ensure_history(warehouse: Path, route: DeltaRoute, row_schema: pa.Schema) -> list[str]:
    """Create the history table, or evolve it as `ensure_table` does the table (columns added,
    number columns widened by a rewrite). Returns the added column names."""
    path = history_path(warehouse, route)
    fields = [f.with_nullable(True) for f in row_schema if not f.name.startswith("_cdc_")]
    wanted = pa.schema([*fields, *HISTORY_FIELDS])
    table = open_table(path)
    if table is None:
        path.mkdir(parents=True, exist_ok=True)
        DeltaTable.create(str(path), schema=wanted, mode="ignore", name=route.history_name())
        log.info("created Delta history table %s at %s", route.history_name(), path)
        return list(wanted.names)
    return _evolve(path, table, wanted, "Delta history table")


def ensure_tombstones(warehouse: Path, route: DeltaRoute) -> None:
    path = tombstone_path(warehouse, route)
    if open_table(path) is None:
        path.mkdir(parents=True, exist_ok=True)
        DeltaTable.create(str(path), schema=TOMBSTONE_SCHEMA, mode="ignore")
