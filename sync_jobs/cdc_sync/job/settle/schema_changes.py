"""Schema changes seen in the stream, handled by the per-mapping `on_schema_change` policy.

- evolve: new columns are added to the targets (Delta column, search field) without a restart;
  a dropped column stays in the targets (older rows keep their values, newer rows hold null);
  a widened type (int2 -> int4 -> int8, float4 -> float8, a numeric gaining precision at the same
  scale) widens the targets. A rename arrives as a dropped column plus an added one.
- ignore: the targets keep the schema first seen; new columns are left out of every write.
- fail: the batch fails with an error naming the table, the columns and the setting.
Any other type change (narrowing, int -> text, ...) is never applied silently: it fails under
every policy but `ignore`.

The accepted schema survives restarts (`schema_store.py`: a JSON file per table beside the Spark
checkpoint), so a change made while the job was stopped meets the policy like any other: `fail`
stops, `ignore` keeps it out of the sinks. Without a stored schema (a new checkpoint) the first
schema seen is the baseline.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import psycopg

from cdc_sync.core.model import Change, TableId
from cdc_sync.core.retry import DEFAULT_POLICY, retried
from cdc_sync.job.settle.schema_store import SchemaStore
from cdc_sync.job.write.generated import GeneratedColumns
from cdc_sync.mapping import MappingFile, OnSchemaChange, TableRoute
from cdc_sync.schema import ColumnType, RowSchema
from cdc_sync.schema.widening import widens


class SchemaChangeRejected(RuntimeError):
    pass


@dataclass(frozen=True)
class SchemaState:
    schema: RowSchema
    evolved: bool  # targets must be (re)checked with `ensure_target`
    allowed_columns: frozenset[str] | None = None  # None = every column of the change

    def conform(self, change: Change) -> Change:
        if self.allowed_columns is None or change.row is None:
            return change
        return change.evolve(
            row={k: v for k, v in change.row.items() if k in self.allowed_columns},
            unavailable_columns=change.unavailable_columns & self.allowed_columns,
            uncertain_columns=change.uncertain_columns & self.allowed_columns,
            schema=self.schema,
        )


class SchemaTracker:
    """The accepted schema per table, and the policy deciding what a different one does.

    With a store, the accepted schema is loaded on a table's first batch after a restart, so a
    change made while the job was down meets the policy instead of becoming the baseline. It is
    saved when the decision is final and before the caller evolves the targets (`_accept`); the
    caller confirms the targets with `targets_ready`, and until then each observation asks for
    `ensure_target` again, so a crash or failed batch between the two re-checks the targets.
    """

    def __init__(
        self,
        mapping: MappingFile,
        store: SchemaStore | None = None,
        generated: GeneratedColumns | None = None,
    ) -> None:
        """`generated`: the tables' stored generated columns, which streamed changes lack
        before Postgres 18 (`job.write.generated`): part of the schema all the same."""
        self.mapping = mapping
        self.store = store
        self.generated = generated
        self.current: dict[TableId, RowSchema] = {}
        self._loaded: set[TableId] = set()
        self._targets_ready: set[TableId] = set()

    def observe(self, route: TableRoute, incoming: RowSchema | None) -> SchemaState:
        table = route.table
        known = self._known(table)
        if incoming is not None and self.generated is not None:
            incoming = self._with_generated(table, incoming)
        if incoming is None:
            return SchemaState(known, False) if known else SchemaState(RowSchema(()), False)
        if known is None:
            self._accept(table, incoming)
            return SchemaState(incoming, True)
        unchecked = table not in self._targets_ready
        if known.fingerprint == incoming.fingerprint:
            return SchemaState(known, unchecked)
        if _stored_types(known) == _stored_types(incoming):
            # Only the wire encoding changed (a connector mode, e.g. interval.handling.mode
            # numeric -> string): the targets store the same types, so there is nothing to apply.
            if self.store is not None:
                self.store.save(table, incoming)
            self.current[table] = incoming
            return SchemaState(incoming, unchecked)
        policy = route.policies.on_schema_change
        added, dropped, retyped = _diff(known, incoming)
        if policy is OnSchemaChange.EVOLVE:
            retyped = [name for name in retyped if not _widens(known, incoming, name)]
        if policy is OnSchemaChange.IGNORE:
            return SchemaState(known, unchecked, frozenset(c.name for c in known.columns))
        if retyped or policy is OnSchemaChange.FAIL:
            raise SchemaChangeRejected(
                f"schema of {table} changed (added {added or '-'}, dropped {dropped or '-'}, "
                f"type changed {retyped or '-'}); "
                + ("a narrowing or incompatible type change is not applied; " if retyped else "")
                + f"set {self.mapping.setting_path(table, 'on_schema_change')} to choose "
                "(fail | evolve | ignore)"
            )
        merged = RowSchema(incoming.columns + tuple(c for c in known.columns if c.name in dropped))
        if merged.fingerprint == known.fingerprint:
            return SchemaState(known, unchecked)  # only columns dropped earlier are missing
        self._accept(table, merged)
        return SchemaState(merged, True)

    def _with_generated(self, table: TableId, incoming: RowSchema) -> RowSchema:
        generated = self.generated
        assert generated is not None
        return retried(
            lambda: generated.complete(table, incoming),
            lambda exc: isinstance(exc, psycopg.OperationalError),
            f"read the generated columns of {table} from the catalog",
            DEFAULT_POLICY.for_target("postgres"),
        )

    def targets_ready(self, table: TableId) -> None:
        """Every sink's target holds the accepted schema of `table` (ensure_target succeeded)."""
        self._targets_ready.add(table)

    def _known(self, table: TableId) -> RowSchema | None:
        if table not in self._loaded and self.store is not None:
            stored = self.store.load(table)  # raises on a corrupt file: fail, naming it
            if stored is not None:
                self.current[table] = stored
        self._loaded.add(table)
        return self.current.get(table)

    def _accept(self, table: TableId, schema: RowSchema) -> None:
        # Saved first: if saving fails nothing changed; if a sink then fails, the re-run finds
        # this schema accepted and, its targets unconfirmed, evolves them again (idempotent).
        if self.store is not None:
            self.store.save(table, schema)
        self.current[table] = schema
        self._targets_ready.discard(table)


def _stored_types(schema: RowSchema) -> RowSchema:
    return RowSchema(tuple(dataclasses.replace(c, type=_stored(c.type)) for c in schema.columns))


def _stored(column_type: ColumnType) -> ColumnType:
    """The type without `unit`, which says how values arrive, not how the targets store them."""
    element = _stored(column_type.element) if column_type.element is not None else None
    return dataclasses.replace(column_type, unit=None, element=element)


def _diff(old: RowSchema, new: RowSchema) -> tuple[list[str], list[str], list[str]]:
    old_types = {c.name: c.type for c in old.columns}
    new_types = {c.name: c.type for c in new.columns}
    added = [name for name in new_types if name not in old_types]
    dropped = [name for name in old_types if name not in new_types]
    retyped = [
        name
        for name in new_types
        if name in old_types and _comparable(old_types[name]) != _comparable(new_types[name])
    ]
    return added, dropped, retyped


def _widens(old: RowSchema, new: RowSchema, name: str) -> bool:
    return widens(old.column(name).type, new.column(name).type)


def _comparable(column_type: object) -> object:
    # Optionality differences (NOT NULL added/removed) are not type changes.
    if dataclasses.is_dataclass(column_type) and hasattr(column_type, "optional"):
        return dataclasses.replace(column_type, optional=True)  # type: ignore[type-var]
    return column_type
