"""Applied watermarks in the warehouse: a small Delta table `<warehouse>/_cdc_watermarks`, one row
per topic (`topic`, `table`, `delta_table`, `lsn`, `lsn_text`, `updated_at`).

A MERGE updates a row only with a higher `lsn`, so it never goes down. Written through deltalake
whichever writer the data tables use (like the tombstone tables): one code path. The job writes it
about once per batch, so it keeps an hour of log and removed files, vacuumed now and then.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from cdc_sync.core.lsn import format_lsn
from cdc_sync.mapping import TableRoute
from cdc_sync.sinks.delta.merge_plan import datafusion_quote
from cdc_sync.sinks.delta.target import open_table

WATERMARK_TABLE = "_cdc_watermarks"
TOPIC, LSN = "topic", "lsn"
WATERMARK_SCHEMA = pa.schema(
    [
        pa.field(TOPIC, pa.string(), nullable=False),
        pa.field("table", pa.string(), nullable=False),
        pa.field("delta_table", pa.string(), nullable=False),
        pa.field(LSN, pa.int64(), nullable=False),
        pa.field("lsn_text", pa.string(), nullable=False),
        pa.field("updated_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)
RETENTION = "interval 1 hours"
CONFIGURATION = {
    "delta.logRetentionDuration": RETENTION,
    "delta.deletedFileRetentionDuration": RETENTION,
}
VACUUM_EVERY = 500  # writes


def watermark_path(warehouse: Path) -> Path:
    return warehouse / WATERMARK_TABLE


class DeltaWatermarks:
    def __init__(self, warehouse: Path) -> None:
        self.path = watermark_path(warehouse)
        self.writes = 0

    def record(self, routes: Mapping[str, TableRoute], position: int) -> None:
        source = watermark_rows(routes, position, datetime.now(tz=UTC))
        if source.num_rows == 0:
            return
        table = open_table(self.path)
        if table is None:
            self.path.mkdir(parents=True, exist_ok=True)
            table = DeltaTable.create(
                str(self.path), schema=WATERMARK_SCHEMA, mode="ignore", configuration=CONFIGURATION
            )
        q = datafusion_quote
        (
            table.merge(
                source, predicate=f"t.{q(TOPIC)} = s.{q(TOPIC)}", source_alias="s", target_alias="t"
            )
            .when_matched_update_all(predicate=f"s.{q(LSN)} > t.{q(LSN)}")
            .when_not_matched_insert_all()
            .execute()
        )
        self.writes += 1
        if self.writes % VACUUM_EVERY == 0:
            table.vacuum(dry_run=False)
            table.cleanup_metadata()


def watermark_rows(routes: Mapping[str, TableRoute], position: int, now: datetime) -> pa.Table:
    delta = {topic: route.delta for topic, route in routes.items() if route.delta is not None}
    topics = sorted(delta)
    return pa.table(
        {
            TOPIC: topics,
            "table": [str(routes[topic].table) for topic in topics],
            "delta_table": [f"{delta[topic].schema}.{delta[topic].table}" for topic in topics],
            LSN: [position] * len(topics),
            "lsn_text": [format_lsn(position)] * len(topics),
            "updated_at": [now] * len(topics),
        },
        schema=WATERMARK_SCHEMA,
    )
