"""Replication slots and the WAL they retain (`cdc-sync connectors slots`)."""

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


def list_slots(conn: psycopg.Connection[Any]) -> list[Slot]:
    rows = conn.execute(
        "SELECT slot_name, database, plugin, active, wal_status, "
        "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
        "pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint "
        "FROM pg_replication_slots ORDER BY slot_name"
    ).fetchall()
    return [Slot(*row) for row in rows]


def format_slots(slots: list[Slot]) -> str:
    if not slots:
        return "no replication slots"
    header = (
        f"{'slot':<32} {'database':<20} {'plugin':<10} {'active':<6} {'wal_status':<10} "
        f"{'retained':>12} {'lag':>12}"
    )
    lines = [header]
    for s in slots:
        lines.append(
            f"{s.name:<32} {s.database or '-':<20} {s.plugin or '-':<10} "
            f"{'yes' if s.active else 'no':<6} {s.wal_status or '-':<10} "
            f"{_size(s.retained_bytes):>12} {_size(s.lag_bytes):>12}"
        )
    return "\n".join(lines)


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(value) < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value = value / 1024  # type: ignore[assignment]
    return str(value)
