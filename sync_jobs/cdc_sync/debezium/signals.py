"""Debezium signals through the source database: an incremental snapshot of chosen tables.

The connector reads its signal table (`signal.data.collection`) from the WAL like any captured
table, so the table must exist before the publication is created and be in
`table.include.list`. Snapshot rows flow through the same fenced sinks as changes: a snapshot
row never overwrites a newer change of the same key.

A snapshot can be narrowed to some rows with Debezium's `additional-conditions` (a SQL filter
per table, run by the connector on its database); `key_filters` builds one that matches a list
of primary keys exactly, split so that each signal fits the signal table's `data` column.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import sql
from psycopg.abc import AdaptContext

from cdc_sync.core.errors import ConfigError
from cdc_sync.core.model import TableId

SIGNAL_SETTING = "signal.data.collection"
SIGNAL_DATA_CHARS = 2048  # the `data` column below: a longer signal does not fit
SIGNAL_TABLE_DDL = (
    "CREATE TABLE IF NOT EXISTS {table} "
    f"(id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar({SIGNAL_DATA_CHARS}))"
)


def signal_table(config: Mapping[str, str]) -> str:
    table = config.get(SIGNAL_SETTING, "")
    if not table:
        raise ConfigError(
            config.get("name", "connector"),
            f"config.{SIGNAL_SETTING}",
            "is not set: incremental snapshots are requested through a signal table",
        )
    include = config.get("table.include.list", "")
    if include and table not in [t.strip() for t in include.split(",")]:
        raise ConfigError(
            config.get("name", "connector"),
            "config.table.include.list",
            f"must include the signal table {table} (the connector reads signals from the WAL)",
        )
    return table


def snapshot_signal_data(tables: Sequence[str], conditions: Mapping[str, str] | None = None) -> str:
    """The `data` of an `execute-snapshot` signal: `tables` (schema.table), each narrowed to
    the rows its filter in `conditions` matches (a table without one is read whole)."""
    doc: dict[str, Any] = {"data-collections": list(tables), "type": "incremental"}
    if conditions:
        doc["additional-conditions"] = [
            {"data-collection": table, "filter": condition}
            for table, condition in conditions.items()
        ]
    return json.dumps(doc)


def request_snapshot(
    conn: psycopg.Connection[Any],
    config: Mapping[str, str],
    tables: Sequence[str],
    conditions: Mapping[str, str] | None = None,
) -> str:
    """Insert an `execute-snapshot` signal for `tables` (schema.table), narrowed by
    `conditions` (table -> SQL filter, see `key_filters`); returns its id."""
    data = snapshot_signal_data(tables, conditions)
    if len(data) > SIGNAL_DATA_CHARS:
        raise ValueError(
            f"snapshot signal of {len(data)} characters exceeds the signal table's "
            f"{SIGNAL_DATA_CHARS}: split the filters (key_filters with a smaller budget)"
        )
    return _signal(conn, config, "snapshot", "execute-snapshot", data)


def request_log(conn: psycopg.Connection[Any], config: Mapping[str, str], message: str) -> str:
    """Insert a `log` signal (Debezium logs `message`; its transaction is streamed like any
    captured table's); returns its id."""
    return _signal(conn, config, "log", "log", json.dumps({"message": message}))


def _signal(
    conn: psycopg.Connection[Any], config: Mapping[str, str], prefix: str, kind: str, data: str
) -> str:
    """Insert a signal of type `kind` (id `<prefix>-<uuid>`) into the connector's table."""
    table = signal_table(config)
    found = signal_table_id(table)
    if found is None:
        raise ConfigError(
            config.get("name", "connector"),
            f"config.{SIGNAL_SETTING}",
            f"{table!r}: expected schema.table (a part holding a dot double-quoted)",
        )
    name = sql.Identifier(found.schema, found.table)
    conn.execute(sql.SQL(SIGNAL_TABLE_DDL).format(table=name))
    signal_id = f"{prefix}-{uuid.uuid4()}"
    conn.execute(
        sql.SQL("INSERT INTO {} (id, type, data) VALUES (%s, %s, %s)").format(name),
        (signal_id, kind, data),
    )
    return signal_id


def signal_table_id(setting: str) -> TableId | None:
    """The table `signal.data.collection` names (`schema.table`, a part holding a dot quoted;
    a database prefix is allowed), None when it names none."""
    try:
        return TableId.parse(setting)
    except ValueError:
        parts = setting.split(".")
        return TableId(parts[-2], parts[-1]) if len(parts) >= 2 else None


def filter_budget(table: str) -> int:
    """Characters a filter for `table` may take (as JSON text) in a signal of its own."""
    return SIGNAL_DATA_CHARS - len(snapshot_signal_data([table], {table: ""}))


def key_filters(
    context: AdaptContext | None,
    key_columns: Sequence[str],
    keys: Sequence[Sequence[Any]],
    budget: int,
) -> list[str] | None:
    """SQL filters that together match exactly the rows with primary key in `keys` (values in
    `key_columns` order): `("id") IN (1, 2)`, `("a", "b") IN (('x', 1), ('y', 2))`, with
    literals quoted by psycopg for `context` (the connection whose database runs the filter).
    Each filter's JSON text fits `budget` characters; None when one key alone does not."""
    columns = ", ".join(sql.Identifier(c).as_string(context) for c in key_columns)
    head, tail = f"({columns}) IN (", ")"
    frame = _json_chars(head + tail)  # JSON escaping is per character: lengths add up
    filters: list[str] = []
    items: list[str] = []
    used = frame
    for key in keys:
        literals = [sql.Literal(v).as_string(context).strip() for v in key]
        item = literals[0] if len(literals) == 1 else f"({', '.join(literals)})"
        cost = _json_chars(item) + (2 if items else 0)  # ", " before all but the first
        if used + cost <= budget:
            items.append(item)
            used += cost
            continue
        if frame + _json_chars(item) > budget:
            return None  # this key alone is longer than a signal holds
        filters.append(head + ", ".join(items) + tail)
        items, used = [item], frame + _json_chars(item)
    if items:
        filters.append(head + ", ".join(items) + tail)
    return filters


def _json_chars(text: str) -> int:
    return len(json.dumps(text)) - 2  # as it appears inside the signal's JSON
