"""Replication slots: where the Debezium connector stands in the WAL, and what it keeps.

The one home of the `pg_replication_slots` query: the job's metrics and the connector tooling
(`cdc-sync connectors slots`) both read slots through `list_slots`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg


@dataclass(frozen=True)
class Slot:
    name: str
    database: str | None  # slots are per server; each belongs to one database
    plugin: str | None
    active: bool
    wal_status: str | None  # reserved | extended | unreserved | lost
    retained_bytes: int | None  # WAL kept for this slot
    lag_bytes: int | None  # WAL written since the consumer's confirmed position


_QUERY = (
    "SELECT slot_name, database, plugin, active, wal_status, "
    "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
    "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
    "FROM pg_replication_slots"
)


def list_slots(conn: psycopg.Connection[Any], database: str | None = None) -> list[Slot]:
    """Every slot on the server, or only those of `database`, by name."""
    if database is None:
        cursor = conn.execute(f"{_QUERY} ORDER BY slot_name")
    else:
        cursor = conn.execute(f"{_QUERY} WHERE database = %s ORDER BY slot_name", (database,))
    return [Slot(*row) for row in cursor.fetchall()]


@dataclass(frozen=True)
class SlotPosition:
    """A slot's place in the server's WAL, as integers (LSNs)."""

    exists: bool
    restart_lsn: int | None  # the oldest WAL the slot keeps; None without the slot
    current_lsn: int  # pg_current_wal_lsn()


def slot_position(conn: psycopg.Connection[Any], name: str) -> SlotPosition:
    """Where slot `name` stands against the server's WAL (`exists` False when there is none)."""
    row = conn.execute(
        "SELECT s.slot_name IS NOT NULL, "
        "pg_wal_lsn_diff(s.restart_lsn, '0/0')::numeric, "
        "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::numeric "
        "FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots AS s ON s.slot_name = %s",
        (name,),
    ).fetchone()
    assert row is not None  # the outer side is one row
    exists, restart, current = row
    return SlotPosition(bool(exists), None if restart is None else int(restart), int(current))
