"""Debezium signals through the source database: an incremental snapshot of chosen tables.

The connector reads its signal table (`signal.data.collection`) from the WAL like any captured
table, so the table must exist before the publication is created and be in
`table.include.list`. Snapshot rows flow through the same fenced sinks as changes: a snapshot
row never overwrites a newer change of the same key.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

from cdc_sync.core.errors import ConfigError

SIGNAL_SETTING = "signal.data.collection"
SIGNAL_TABLE_DDL = (
    "CREATE TABLE IF NOT EXISTS {table} "
    "(id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048))"
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


def request_snapshot(
    conn: psycopg.Connection[Any], config: Mapping[str, str], tables: Sequence[str]
) -> str:
    """Insert an `execute-snapshot` signal for `tables` (schema.table); returns its id."""
    table = signal_table(config)
    schema, _, name = table.partition(".")
    quoted = f'"{schema}"."{name}"'
    conn.execute(SIGNAL_TABLE_DDL.format(table=quoted).encode())
    signal_id = f"snapshot-{uuid.uuid4()}"
    data = json.dumps({"data-collections": list(tables), "type": "incremental"})
    conn.execute(
        f"INSERT INTO {quoted} (id, type, data) VALUES (%s, 'execute-snapshot', %s)".encode(),
        (signal_id, data),
    )
    return signal_id
