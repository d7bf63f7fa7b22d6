"""What a Delta table holds: its rows, metadata columns (`_cdc_*`) included.

The one read path for verify and the tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cdc_sync.mapping import DeltaRoute
from cdc_sync.sinks.delta.target import open_table, table_path


def table_rows(warehouse: Path, delta: DeltaRoute) -> list[dict[str, Any]]:
    """Every row of the table (empty when it does not exist yet)."""
    table = open_table(table_path(warehouse, delta))
    return [] if table is None else table.to_pyarrow_table().to_pylist()
