"""Unchanged-TOAST placeholders the batch could not fill are filled from Postgres, by key.

After the per-key fold a change may still lack columns Debezium sent as placeholders: the key
moved (a primary-key update arrives as delete + create, and the create's unchanged values are
placeholders), the topic was compacted, a cache entry expired, or a sink is new. Writing such a
row would leave the column empty in any sink that does not hold the row, so the values are read
from the source of truth instead, read-only, in one query per table and batch.

The value read may be newer than the change (the row changed again since); it is written with
the change's own version, so the later change, still on its way through the log, overwrites it
as usual: the sinks converge. A key no longer in Postgres was deleted since; its delete follows
in the log, so the change is left out rather than written incomplete. A column the table no
longer has (dropped or renamed since) has no value to read: it stays unavailable, so the sinks
keep what they hold, and the schema change, which follows in the log, meets the mapping's
`on_schema_change` policy. Each change is read with its own schema: a batch can hold changes
written before and after a column was added. Stored generated columns, which pgoutput leaves
out of streamed changes before Postgres 18, are read back the same way (`job.write.generated`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg

from cdc_sync.core.model import Change, Op, TableId
from cdc_sync.core.retry import DEFAULT_POLICY, retried
from cdc_sync.core.types import Column, RowSchema
from cdc_sync.job.write.generated import GeneratedColumns
from cdc_sync.schema.catalog import ConverterModes
from cdc_sync.schema.source_rows import read_columns

log = logging.getLogger(__name__)
_T = TypeVar("_T")


def needs_source(change: Change) -> bool:
    return change.resolve_from_source or (not change.is_delete and bool(change.unavailable_columns))


def _wanted_columns(change: Change) -> frozenset[str]:
    if change.resolve_from_source and change.schema is not None:
        return frozenset(change.schema.names)  # the whole row, if the key is present
    return change.unavailable_columns


class SourceFiller:
    def __init__(self, pg_url: str, modes: ConverterModes) -> None:
        self.pg_url = pg_url
        self.modes = modes
        self._conn: psycopg.Connection[Any] | None = None
        # Stored generated columns a change lacks are read back with the placeholders.
        self.generated = GeneratedColumns(self._connection, modes)

    def fill(
        self, table: TableId, changes: Sequence[Change], schema: RowSchema | None = None
    ) -> tuple[list[Change], int]:
        """The changes with every placeholder filled, and how many were left out (gone).
        `schema`: the table's accepted one, which a delete to settle is read with when it
        travels without one (the key's create was in an earlier batch: job.decode.fold). A stored
        generated column a change lacks (`job.write.generated`) is read back here too."""
        if schema is not None:
            changes = [_with_schema(change, schema) for change in changes]
        changes = self._postgres(
            lambda: self.generated.unpublished(table, changes, schema),
            f"read the generated columns of {table} from the catalog",
        )
        pending = [c for c in changes if needs_source(c)]
        if not pending:
            return list(changes), 0
        found = self._postgres(
            lambda: self._read(table, pending),
            f"read unchanged TOAST and generated values of {table} from Postgres",
        )
        filled: list[Change] = []
        gone = 0
        for change in changes:
            values = found.get(_key(change)) if needs_source(change) else None
            if not needs_source(change):
                filled.append(change)
            elif change.resolve_from_source:
                filled.append(_settled(change, values))
            elif values is not None:
                filled.append(_with_values(change, values))
            else:
                gone += 1
                log.info("%s: %s is no longer in Postgres: left out", change.coordinates, table)
        return filled, gone

    def _postgres(self, read: Callable[[], _T], what: str) -> _T:
        """`read`, again while Postgres is unreachable (a broken connection is replaced)."""

        def attempt() -> _T:
            try:
                return read()
            except psycopg.OperationalError:
                self.close()
                raise

        return retried(
            attempt,
            lambda exc: isinstance(exc, psycopg.OperationalError),
            what,
            DEFAULT_POLICY.for_target("postgres"),
        )

    def _read(self, table: TableId, pending: Sequence[Change]) -> dict[tuple[Any, ...], Any]:
        found: dict[tuple[Any, ...], Any] = {}
        for schema, group in _by_schema(pending):
            wanted = sorted({name for c in group for name in _wanted_columns(c)})
            found |= read_columns(
                self._connection(),
                table,
                _columns(schema, [name for name, _ in group[0].key]),
                [_key(c) for c in group],
                _columns(schema, [name for name in wanted if name in schema.names]),
                self.modes,
            )
        return found

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(
                self.pg_url, autocommit=True, options="-c default_transaction_read_only=on"
            )
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _key(change: Change) -> tuple[Any, ...]:
    return tuple(value for _, value in change.key)


def _by_schema(pending: Sequence[Change]) -> list[tuple[RowSchema, list[Change]]]:
    """The changes grouped by the schema they were written with (one key per change: the
    batch is folded); a change without one (a delete) goes with the first schema."""
    fallback = next((c.schema for c in pending if c.schema is not None), None)
    groups: dict[str, tuple[RowSchema, list[Change]]] = {}
    for change in pending:
        schema = change.schema or fallback
        if schema is not None:
            groups.setdefault(schema.fingerprint, (schema, []))[1].append(change)
    return list(groups.values())


def _columns(schema: RowSchema, names: Sequence[str]) -> list[Column]:
    return [schema.column(name) for name in names]


def _with_schema(change: Change, schema: RowSchema) -> Change:
    if not change.resolve_from_source or change.schema is not None:
        return change
    if not all(name in schema.names for name, _ in change.key):
        return change  # no usable schema yet: settled by another change's, or left a delete
    return dataclasses.replace(change, schema=schema)


def _settled(delete: Change, values: dict[str, Any] | None) -> Change:
    """A delete after a create in one transaction: the row Postgres holds, or the delete."""
    if values is None or delete.schema is None:
        return dataclasses.replace(delete, resolve_from_source=False)
    row = {name: values[name] for name in delete.schema.names if name in values}
    unread = frozenset(delete.schema.names) - row.keys()  # columns the table no longer has
    return dataclasses.replace(
        delete, op=Op.UPDATE, row=row, unavailable_columns=unread, resolve_from_source=False
    )


def _with_values(change: Change, values: dict[str, Any]) -> Change:
    assert change.row is not None
    recovered = {name: values[name] for name in change.unavailable_columns if name in values}
    return dataclasses.replace(
        change,
        row={**change.row, **recovered},
        unavailable_columns=change.unavailable_columns - recovered.keys(),
        uncertain_columns=change.uncertain_columns - recovered.keys(),
    )
