"""Stored generated columns, which pgoutput does not publish before Postgres 18.

Observed on real capture (tests/integration/test_debezium_generated.py, Debezium 3.6.3, Postgres
15): snapshot rows carry a stored generated column with its value; streamed inserts and updates
leave it out of the record altogether (the field is missing from the `after` schema, not null).
Written as they come, the sinks would lose the column (search, cache) or hold a stale value
(Delta, whose schema keeps it), and the table's schema would seem to drop the column at every
streamed change.

So the column stays in the table's schema (`complete`: where the catalog puts it, typed as
Debezium types it in the snapshot), and a change that lacks it has it read back from Postgres by
key in the same batch, as an unchanged-TOAST value is (`job.write.unavailable`): it joins the
change's unavailable columns after the fold, so only Postgres fills it, never an older change of
the key or what a sink holds. A change that carries the column (a snapshot row; Postgres 18 with
`publish_generated_columns = stored`) is left as it is. The catalog is read once per table and
`ttl_seconds`: a generated column added later is seen within that time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc_sync.core.model import Change, TableId
from cdc_sync.core.types import Column, RowSchema, SchemaConversionError
from cdc_sync.schema.catalog import ConverterModes, catalog_columns, column_type_from_catalog


@dataclass(frozen=True)
class TableGenerated:
    """A table's column names in catalog order and its stored generated columns, typed."""

    order: tuple[str, ...]
    columns: tuple[Column, ...]

    def complete(self, schema: RowSchema) -> RowSchema:
        """`schema` with the generated columns it lacks, each after the nearest column that
        precedes it in the catalog (so a snapshot's schema and a streamed one agree)."""
        columns = list(schema.columns)
        for column in self.columns:
            if column.name in schema.names:
                continue
            before = self.order[: self.order.index(column.name)]
            names = [c.name for c in columns]
            at = max((names.index(n) + 1 for n in before if n in names), default=0)
            columns.insert(at, column)
        return RowSchema(tuple(columns))

    def unpublished(self, change: Change, accepted: RowSchema | None) -> Change:
        """`change` with the generated columns it lacks (and the table's accepted schema has)
        marked for reading back from Postgres."""
        if change.row is None and not change.resolve_from_source:
            return change
        kept = accepted.names if accepted is not None else frozenset()
        row = change.row or {}
        missing = [
            c.name
            for c in self.columns
            if c.name in kept and c.name not in row and c.name not in change.unavailable_columns
        ]
        if not missing or change.schema is None:
            return change
        schema = self.complete(change.schema)
        if change.resolve_from_source:  # read back as a whole row, by its schema's names
            return dataclasses.replace(change, schema=schema)
        return dataclasses.replace(
            change, schema=schema, unavailable_columns=change.unavailable_columns.union(missing)
        )


NONE = TableGenerated((), ())


class GeneratedColumns:
    """Each table's stored generated columns, from the catalog of the captured database."""

    def __init__(
        self,
        connection: Callable[[], psycopg.Connection[Any]],
        modes: ConverterModes,
        ttl_seconds: float = 30.0,
    ) -> None:
        self.connection = connection
        self.modes = modes
        self.ttl_seconds = ttl_seconds
        self._read: dict[TableId, tuple[float, TableGenerated]] = {}
        self._held: list[psycopg.Connection[Any]] = []  # connections of its own, to close

    @classmethod
    def for_database(cls, conninfo: str, modes: ConverterModes) -> GeneratedColumns:
        """Reading the catalog of `conninfo` on a read-only connection of its own (the
        driver's, one per consumer of the log, held while the job runs: `close` ends it)."""
        held: list[psycopg.Connection[Any]] = []

        def connection() -> psycopg.Connection[Any]:
            if not held or held[0].closed:
                held[:] = [
                    psycopg.connect(
                        conninfo, autocommit=True, options="-c default_transaction_read_only=on"
                    )
                ]
            return held[0]

        generated = cls(connection, modes)
        generated._held = held
        return generated

    def close(self) -> None:
        """End the connection `for_database` opened, if any."""
        for conn in self._held:
            conn.close()
        self._held.clear()

    def of(self, table: TableId) -> TableGenerated:
        cached = self._read.get(table)
        if cached is not None and time.monotonic() - cached[0] < self.ttl_seconds:
            return cached[1]
        found = _generated(self.connection(), table, self.modes)
        self._read[table] = (time.monotonic(), found)
        return found

    def complete(self, table: TableId, schema: RowSchema) -> RowSchema:
        """`schema` of `table` with its generated columns (the schema-change policy's input)."""
        generated = self.of(table)
        return generated.complete(schema) if generated.columns else schema

    def unpublished(
        self, table: TableId, changes: Sequence[Change], accepted: RowSchema | None
    ) -> list[Change]:
        generated = self.of(table)
        if not generated.columns:
            return list(changes)
        return [generated.unpublished(change, accepted) for change in changes]


def _generated(
    conn: psycopg.Connection[Any], table: TableId, modes: ConverterModes
) -> TableGenerated:
    catalog = catalog_columns(conn, table)
    columns = []
    for column in catalog:
        if not column.generated:
            continue
        try:
            column_type = column_type_from_catalog(column, modes, f"{table}.{column.name}")
            columns.append(Column(column.name, column_type))
        except SchemaConversionError:
            continue  # a type the job cannot convert: no value to read back either
    if not columns:
        return NONE
    return TableGenerated(tuple(c.name for c in catalog), tuple(columns))
