"""`cdc-sync connectors slots`: replication slots and the WAL they retain, as a table. The query
lives in `cdc_sync.debezium.slots`, below the job, whose metrics read it too."""

from __future__ import annotations

from cdc_sync.debezium.slots import Slot


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
