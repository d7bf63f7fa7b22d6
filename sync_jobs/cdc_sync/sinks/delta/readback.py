"""What a Delta table holds: its rows, metadata columns (`_cdc_*`) included.

The one read path for verify and the tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cdc_sync.core.model import document_id
from cdc_sync.mapping import DeltaRoute
from cdc_sync.schema.arrow import python_value
from cdc_sync.sinks.delta.target import history_path, open_table, table_path
from cdc_sync.sinks.delta.watermarks import LSN, TOPIC, watermark_path


def table_rows(warehouse: Path, delta: DeltaRoute) -> list[dict[str, Any]]:
    """Every row of the table (empty when it does not exist yet)."""
    return _rows(table_path(warehouse, delta))


def history_rows(warehouse: Path, delta: DeltaRoute) -> list[dict[str, Any]]:
    """Every row of the table's SCD type 2 history (`delta.history`; empty when none)."""
    return _rows(history_path(warehouse, delta))


def _rows(path: Path) -> list[dict[str, Any]]:
    table = open_table(path)
    if table is None:
        return []
    data = table.to_pyarrow_table()
    types = {field.name: field.type for field in data.schema}
    return [
        {name: python_value(types[name], value) for name, value in row.items()}
        for row in data.to_pylist()
    ]


def rows_by_id(
    warehouse: Path, delta: DeltaRoute, key_names: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """doc id (the key columns `key_names`, as named in the table) -> row, metadata included."""
    return {
        document_id(tuple((k, row[k]) for k in key_names)): row
        for row in table_rows(warehouse, delta)
    }


def watermarks(warehouse: Path) -> dict[str, int]:
    """Applied watermarks, topic -> WAL position (empty before the job recorded one)."""
    table = open_table(watermark_path(warehouse))
    if table is None:
        return {}
    rows = table.to_pyarrow_table(columns=[TOPIC, LSN]).to_pylist()
    return {row[TOPIC]: int(row[LSN]) for row in rows}
