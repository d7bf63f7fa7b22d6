"""Executor side of the writes: one task per input partition writes its tables' row sinks.

`write_partition` is a `mapInArrow` function over the folded changes of one partition (with
their schemas, see `job.decode.partition.decode_and_fold`). It opens the row sinks once per Python
worker (`job.write.task_sinks`), writes each routed table (`job.write.table_writes.write_table`:
TOAST fill from Postgres, conform to the schema the driver accepted, route, write), and yields one
row: the pickled `TableWrite`s, which carry results, refused records, timings and, for the sinks
that commit on the driver, the routed changes. A write that raises fails the task, and so the batch.
"""

from __future__ import annotations

import pickle
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from cdc_sync.core.collector import collecting_less
from cdc_sync.core.model import Change, TruncateFence
from cdc_sync.job.decode.partition import load_change
from cdc_sync.job.settle.schema_changes import SchemaState
from cdc_sync.job.write.table_writes import TableWrite, write_table
from cdc_sync.job.write.task_sinks import TaskSinkSpec, task_sinks
from cdc_sync.mapping import TableRoute
from cdc_sync.schema import RowSchema

WRITES_SCHEMA = pa.schema([pa.field("writes", pa.binary())])
WRITE_COLUMNS = ("table", "change", "schema_fp", "schema_blob")


@dataclass(frozen=True)
class WritePlan:
    """What the driver settled for this batch, shipped to every write task."""

    tables: Mapping[str, tuple[TableRoute, SchemaState]]  # routed tables, by `schema.table`
    spec: TaskSinkSpec
    defer: bool  # sinks commit on the driver: hand the routed changes back
    # Per table (`schema.table`), its newest TRUNCATE: older changes are dropped
    # (job.settle.truncates).
    fences: Mapping[str, TruncateFence] = field(default_factory=dict)


def write_partition(batches: Iterator[pa.RecordBatch], plan: WritePlan) -> Iterator[pa.RecordBatch]:
    # The partition's changes live until its writes end: collected less often meanwhile.
    with collecting_less():
        writes = _written(batches, plan)
    if writes is not None:
        yield pa.RecordBatch.from_pylist([{"writes": writes}], schema=WRITES_SCHEMA)


def _written(batches: Iterator[pa.RecordBatch], plan: WritePlan) -> bytes | None:
    """The partition's `TableWrite`s, pickled; None when it holds no change."""
    by_table = _changes_by_table(batches)
    if not by_table:
        return None
    writes: list[TableWrite] = []
    with task_sinks(plan.spec) as opened:
        for table, changes in by_table.items():
            if table in plan.tables:
                route, state = plan.tables[table]
                fence = plan.fences.get(table)
                writes.append(
                    write_table(
                        route, state, changes, opened.sinks, opened.filler, plan.defer, fence
                    )
                )
    return pickle.dumps(writes, protocol=5)


def _changes_by_table(batches: Iterator[pa.RecordBatch]) -> dict[str, list[Change]]:
    """The partition's changes with their schemas; each schema's first row carries it."""
    schemas: dict[str, RowSchema] = {}
    by_table: dict[str, list[Change]] = defaultdict(list)
    for batch in batches:
        for row in batch.to_pylist():
            fingerprint, blob = row["schema_fp"], row["schema_blob"]
            if blob is not None and fingerprint not in schemas:
                schema = pickle.loads(blob)
                assert isinstance(schema, RowSchema)
                schemas[fingerprint] = schema
            change = load_change(row)
            if fingerprint is not None:
                if fingerprint not in schemas:
                    raise RuntimeError(
                        f"{change.coordinates}: schema {fingerprint} arrived without its "
                        "definition (the partition's rows were reordered)"
                    )
                change = change.evolve(schema=schemas[fingerprint])
            by_table[row["table"]].append(change)
    return by_table


def load_writes(rows: list[dict[str, object]]) -> list[list[TableWrite]]:
    """Per task, its `TableWrite`s."""
    tasks: list[list[TableWrite]] = []
    with collecting_less():
        for row in rows:
            blob = row["writes"]
            assert isinstance(blob, bytes)
            tasks.append(pickle.loads(blob))
    return tasks
