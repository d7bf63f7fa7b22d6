"""The fenced MERGE, as SQL expressions shared by the deltalake and delta-spark writers.

    MERGE INTO t USING s ON <key equality>
    WHEN MATCHED AND s._cdc_deleted AND (s._cdc_version >= t._cdc_version
                                          OR s._cdc_version < 0) THEN DELETE
    WHEN MATCHED AND NOT s._cdc_deleted AND s._cdc_version >= t._cdc_version THEN UPDATE SET
         col = CASE WHEN s._cdc_keep__col THEN t.col ELSE s.col END, ...
    WHEN NOT MATCHED AND NOT s._cdc_deleted AND NOT s._cdc_mark THEN INSERT ...

A soft delete's mark (`_cdc_mark`) is an update of the stored row (the columns it does not
carry kept) and never an insert: a row the table does not hold is not marked.

Equal versions apply (>=): the changes of one transaction share their commit-order version
(debezium.decoder.commit_order_version) and must keep their Kafka order across micro-batches;
re-applying a batch rewrites the same values, so it stays harmless (invariant 3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cdc_sync.sinks.delta.actions import (
    DELETED,
    MARK,
    METADATA_FIELDS,
    VERSION,
    DeltaActions,
    keep_flag,
)

Quote = Callable[[str], str]


def datafusion_quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def datafusion_string(value: str) -> str:
    """`value` as a DataFusion SQL string literal."""
    return "'" + value.replace("'", "''") + "'"


def spark_quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


@dataclass(frozen=True)
class MergePlan:
    predicate: str
    delete_when: str
    update_when: str
    updates: dict[str, str]
    insert_when: str
    inserts: dict[str, str]


def merge_plan(actions: DeltaActions, quote: Quote) -> MergePlan:
    def s(col: str) -> str:
        return f"s.{quote(col)}"

    def t(col: str) -> str:
        return f"t.{quote(col)}"

    newer = f"{s(VERSION)} >= {t(VERSION)}"
    written = [*actions.data_columns, *(f.name for f in METADATA_FIELDS)]
    updates = {}
    for column in written:
        if column in actions.key_columns:
            continue
        if column in actions.kept_columns:
            updates[quote(column)] = (
                f"CASE WHEN {s(keep_flag(column))} THEN {t(column)} ELSE {s(column)} END"
            )
        else:
            updates[quote(column)] = s(column)
    return MergePlan(
        predicate=" AND ".join(f"{t(k)} = {s(k)}" for k in actions.key_columns),
        # A tombstone without a version (UNVERSIONED, negative) deletes whatever is stored.
        delete_when=f"{s(DELETED)} AND ({newer} OR {s(VERSION)} < 0)",
        update_when=f"NOT {s(DELETED)} AND {newer}",
        updates=updates,
        insert_when=f"NOT {s(DELETED)} AND NOT {s(MARK)}",
        inserts={quote(column): s(column) for column in written},
    )
