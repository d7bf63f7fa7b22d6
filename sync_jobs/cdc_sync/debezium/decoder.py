"""Debezium envelopes -> :class:`Change`: every Kafka record is parsed here, once.

A Kafka record from a Debezium topic is one of:
- a change event (`op` c/u/d/r) -> :class:`Change`
- a tombstone (null value after a delete, for Kafka log compaction) -> :class:`Tombstone`
- a truncate event (`op` t, with no key: tests/integration/test_debezium_truncate.py) ->
  :class:`Truncate`
- something else -> :class:`MalformedRecord` raised, naming the field path.

Versions order changes the way Postgres committed them (`commit_order_version`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from cdc_sync.core.model import (
    OPS,
    Change,
    Coordinates,
    KnownSchemas,
    Op,
    TableId,
    Tombstone,
    Truncate,
)
from cdc_sync.core.types import RowSchema
from cdc_sync.schema import convert_row, row_schema_from_connect
from cdc_sync.schema.unavailable import is_unavailable, is_uncertain

TRUNCATE_OP = "t"


class MalformedRecord(ValueError):
    """A record that cannot be parsed; `field` is the JSON path that failed."""

    def __init__(self, coordinates: Coordinates, field_path: str, reason: str) -> None:
        super().__init__(f"{coordinates}: {field_path}: {reason}")
        self.coordinates = coordinates
        self.field_path = field_path
        self.reason = reason


def parse_record(
    key: bytes | None,
    value: bytes | None,
    coordinates: Coordinates,
    known: KnownSchemas | None = None,
    floor: int = 0,
    tables: Mapping[str, TableId] | None = None,
) -> Change | Tombstone | Truncate:
    """Parse one Kafka record written by Debezium's JsonConverter: with schemas.enable=true,
    or, when `known` schemas are given, without (plain JSON key and envelope). `floor`: the
    highest snapshot point before this record in its partition (`commit_order_version`);
    `tables`: the table of each topic (`MappingFile.topic_tables`), which a record without an
    envelope (a tombstone, a record without schema) is known by."""
    if known is not None:
        return _parse_schemaless(key, value, coordinates, known, floor, tables)
    key_doc = _load_json(key, coordinates, "key")
    value_doc = _load_json(value, coordinates, "value")
    # Debezium sends a truncate without a key; one keyed on the way (an SMT) is one all the same.
    truncate = _truncate(value_doc, coordinates, floor, with_schema=True)
    if truncate is not None:
        return truncate
    if key_doc is None:
        raise MalformedRecord(
            coordinates, "key", "record has no key (Debezium keys by primary key)"
        )
    key_tuple = _parse_key(key_doc, coordinates)
    if value_doc is None:
        return Tombstone(
            table=table_from_topic(coordinates, tables), key=key_tuple, coordinates=coordinates
        )
    return _parse_envelope(value_doc, key_tuple, coordinates, floor)


def _parse_schemaless(
    key: bytes | None,
    value: bytes | None,
    coordinates: Coordinates,
    known: KnownSchemas,
    floor: int,
    tables: Mapping[str, TableId] | None,
) -> Change | Tombstone | Truncate:
    table = table_from_topic(coordinates, tables)
    schema = known.get(table)
    if schema is None:
        raise MalformedRecord(coordinates, "topic", f"no catalog schema for {table}")
    key_doc = _load_json(key, coordinates, "key")
    value_doc = _load_json(value, coordinates, "value")
    truncate = _truncate(value_doc, coordinates, floor, with_schema=False)
    if truncate is not None:
        return truncate
    if not isinstance(key_doc, dict) or not key_doc:
        raise MalformedRecord(coordinates, "key", "expected a JSON object of the key columns")
    try:
        converted = convert_row(schema.key, key_doc)
    except ValueError as exc:
        raise MalformedRecord(coordinates, "key", str(exc)) from exc
    key_tuple = tuple((column.name, converted[column.name]) for column in schema.key.columns)
    if value_doc is None:
        return Tombstone(table=table, key=key_tuple, coordinates=coordinates)
    if not isinstance(value_doc, dict):
        raise MalformedRecord(coordinates, "value", "expected a JSON object (the envelope)")
    return _parse_payload(value_doc, key_tuple, coordinates, lambda: schema.row, "value", floor)


def _truncate(
    value_doc: Any, coordinates: Coordinates, floor: int, with_schema: bool
) -> Truncate | None:
    """A keyless record whose envelope says `op` t: the table's TRUNCATE, versioned like every
    streamed change. None when the record is something else (the caller names what is wrong)."""
    payload = value_doc.get("payload") if with_schema and isinstance(value_doc, dict) else value_doc
    if not isinstance(payload, dict) or payload.get("op") != TRUNCATE_OP:
        return None
    where = "value.payload" if with_schema else "value"
    source, version = _source_version(payload, where, coordinates, floor)
    ts_ms = source.get("ts_ms") if isinstance(source.get("ts_ms"), int) else None
    return Truncate(
        _table_from_source(source, coordinates), version, coordinates, _own_position(source), ts_ms
    )


def table_from_topic(
    coordinates: Coordinates, tables: Mapping[str, TableId] | None = None
) -> TableId:
    """The table of a record's topic: from `tables` (topic -> table) when it names the topic,
    else the topic's last two parts (a name Debezium changed, or one with a dot, reads wrong)."""
    if tables is not None and coordinates.topic in tables:
        return tables[coordinates.topic]
    parts = coordinates.topic.split(".")
    if len(parts) < 3:
        raise MalformedRecord(coordinates, "topic", "expected <prefix>.<schema>.<table>")
    return TableId(parts[-2], parts[-1])


def _load_json(raw: bytes | None, coordinates: Coordinates, where: str) -> Any:
    if raw is None:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass  # NaN/Infinity tokens or integers past 64 bits, which json reads and orjson not
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedRecord(coordinates, where, f"not JSON: {type(exc).__name__}") from exc


def _payload(doc: Any, coordinates: Coordinates, where: str) -> tuple[Any, Any]:
    if not isinstance(doc, dict) or "payload" not in doc or "schema" not in doc:
        raise MalformedRecord(
            coordinates,
            where,
            "expected {schema, payload} (JsonConverter with schemas.enable=true)",
        )
    return doc["schema"], doc["payload"]


def _parse_key(doc: Any, coordinates: Coordinates) -> tuple[tuple[str, Any], ...]:
    schema, payload = _payload(doc, coordinates, "key")
    if not isinstance(payload, dict) or not payload:
        raise MalformedRecord(coordinates, "key.payload", "expected a non-empty struct")
    try:
        key_schema = row_schema_from_connect(schema)
        converted = convert_row(key_schema, payload)
    except ValueError as exc:
        raise MalformedRecord(coordinates, "key.schema", str(exc)) from exc
    return tuple((column.name, converted[column.name]) for column in key_schema.columns)


def _parse_envelope(
    doc: Any, key: tuple[tuple[str, Any], ...], coordinates: Coordinates, floor: int
) -> Change:
    schema, payload = _payload(doc, coordinates, "value")
    if not isinstance(payload, dict):
        raise MalformedRecord(coordinates, "value.payload", "expected a struct")
    return _parse_payload(
        payload,
        key,
        coordinates,
        lambda: _after_schema(schema, coordinates),
        "value.payload",
        floor,
    )


def _parse_payload(
    payload: dict[str, Any],
    key: tuple[tuple[str, Any], ...],
    coordinates: Coordinates,
    row_schema_of: Callable[[], RowSchema],
    where: str,
    floor: int,
) -> Change:
    """The envelope fields (op, source, after), wherever the row schema comes from."""
    op = OPS.get(str(payload.get("op")))
    if op is None:
        raise MalformedRecord(coordinates, f"{where}.op", f"unknown op {payload.get('op')!r}")
    source, version = _source_version(payload, where, coordinates, floor)
    table = _table_from_source(source, coordinates)
    ts_ms = source.get("ts_ms") if isinstance(source.get("ts_ms"), int) else None
    position = _own_position(source)
    transaction = _first_transaction_id(source)
    if op is Op.DELETE:
        return Change(
            table,
            key,
            op,
            version,
            None,
            coordinates,
            ts_ms,
            position=position,
            transaction=transaction,
        )
    point = version if _is_snapshot_row(source) and _without_last_commit(source) else None
    after = payload.get("after")
    if not isinstance(after, dict):
        raise MalformedRecord(coordinates, f"{where}.after", f"missing for op {op.value!r}")
    row_schema = row_schema_of()
    # Unchanged TOAST values are left out of the row: the fold, the sinks or a read from
    # Postgres fill them (job.decode.fold, job.write.unavailable); they are never written as data.
    placeholders_possible = op in (Op.CREATE, Op.UPDATE)
    unavailable = frozenset(
        column.name
        for column in row_schema.columns
        if is_unavailable(column.type, after.get(column.name), placeholders_possible)
    )
    uncertain = frozenset(name for name in unavailable if is_uncertain(after.get(name)))
    try:
        row = convert_row(row_schema, after, skip=unavailable)
    except ValueError as exc:
        raise MalformedRecord(coordinates, f"{where}.after", str(exc)) from exc
    return Change(
        table,
        key,
        op,
        version,
        row,
        coordinates,
        ts_ms,
        unavailable,
        row_schema,
        position=position,
        snapshot_point=point,
        uncertain_columns=uncertain,
        transaction=transaction,
        ends_snapshot=op is Op.READ and source.get("snapshot") in SNAPSHOT_END_MARKERS,
        snapshot_continues=op is Op.READ and source.get("snapshot") in SNAPSHOT_GOES_ON,
    )


def commit_order_version(source: Mapping[str, Any], floor: int = 0) -> int | None:
    """The change's version: a position that orders changes the way Postgres committed them.

    pgoutput streams whole transactions in commit order, but a change's own `lsn` is where it
    was written, and interleaved transactions write in one order and commit in another.
    Debezium's `source.sequence` is `[last commit, lsn]`; observed on real capture
    (tests/integration/test_debezium_ordering.py), its first element is the end of the commit
    record of the transaction streamed just before this one: the same for every change of a
    transaction, strictly greater from one transaction to the next in commit order, and restored
    from the stored offsets after a restart. Changes of one transaction therefore share a version
    and keep their Kafka order (sinks fence with >=).

    Snapshot rows `[null, S]` carry the snapshot's consistent point S. The first transaction
    streamed after a snapshot has no last commit (`[null, lsn]`), and its own `lsn` can lie
    before S: a transaction that began before the consistent point and commits after it is not
    in the snapshot, yet written earlier. It is newer than the snapshot rows and older than the
    next transaction, whose version is its commit end: so its version is the larger of its
    `lsn` and `floor`, the highest snapshot point before it in its partition (a snapshot row
    read while capture had streamed no commit yet, `[null, S]`: `Change.snapshot_point`; the job
    keeps it across batches, `job/decode/version_floors.py`); equal to a snapshot row's, it still
    wins by Kafka order. Only the snapshot's point, not the partition's highest version: Debezium
    sends that transaction again, byte for byte, when it restarts from offsets stored before
    its first commit (observed in tests/integration/test_debezium_ordering.py), and the copy
    must not rise above the transactions that followed it. Its commit ends after S, so every
    later transaction's version exceeds max(lsn, S), and the copy keeps the original's version.
    Incremental-snapshot rows carry no `lsn`; their sequence is that of the chunk's closing
    watermark, ordering them after every change they reflect (Debezium drops chunk rows of keys
    changed inside the window) and before every transaction that commits after the window.
    """
    sequence = _sequence(source)
    if sequence and sequence[0] is not None:
        return sequence[0]
    lsn = _own_position(source)
    if lsn is not None:
        # `[null, lsn]` on a streamed change: the first transaction after a snapshot.
        first_after_snapshot = bool(sequence) and not _is_snapshot_row(source)
        return max(lsn, floor) if first_after_snapshot else lsn
    return sequence[-1] if sequence and sequence[-1] is not None else None


def _first_transaction_id(source: Mapping[str, Any]) -> int | None:
    """`source.txId` of a change of the first transaction streamed after a snapshot (`[null,
    lsn]`, versioned by its own position: `commit_order_version`), else None. Its changes
    differ in version; the id tells they are one transaction (job.decode.fold)."""
    tx_id = source.get("txId")
    if not isinstance(tx_id, int) or isinstance(tx_id, bool) or _is_snapshot_row(source):
        return None
    if not _without_last_commit(source) or _own_position(source) is None:
        return None
    return tx_id


def _without_last_commit(source: Mapping[str, Any]) -> bool:
    sequence = _sequence(source)
    return bool(sequence) and sequence[0] is None


def _own_position(source: Mapping[str, Any]) -> int | None:
    lsn = source.get("lsn")
    if isinstance(lsn, int) and not isinstance(lsn, bool) and lsn >= 0:
        return lsn
    return None


# Debezium marks the last row of each table of a full snapshot (initial or blocking)
# "last_in_data_collection", and the snapshot's very last row "last"; incremental-snapshot rows
# say "incremental". A table with no rows has no marker, and a one-row first table's row says
# "first" (docs/known-limits.md).
SNAPSHOT_END_MARKERS = ("last", "last_in_data_collection")
# A full snapshot's rows before its very last one ("last"); "true" is a row between its first
# and last.
SNAPSHOT_GOES_ON = ("first", "true", "first_in_data_collection", "last_in_data_collection")


def _is_snapshot_row(source: Mapping[str, Any]) -> bool:
    # Debezium's `snapshot`: "true", "first", "last", "incremental", ... for snapshot rows,
    # "false" (or absent) for streamed changes.
    return source.get("snapshot") not in (None, False, "false")


def _sequence(source: Mapping[str, Any]) -> list[int | None]:
    try:
        positions = orjson.loads(source.get("sequence") or "null")
        if not isinstance(positions, list):
            return []
        return [None if p is None else int(p) for p in positions]
    except (TypeError, ValueError):
        return []


def _source_version(
    payload: dict[str, Any], where: str, coordinates: Coordinates, floor: int
) -> tuple[dict[str, Any], int]:
    """The envelope's `source` block and the change's commit-order version."""
    source = payload.get("source")
    if not isinstance(source, dict):
        raise MalformedRecord(coordinates, f"{where}.source", "missing")
    version = commit_order_version(source, floor)
    if version is None:
        raise MalformedRecord(
            coordinates, f"{where}.source.sequence", "missing or holds no LSN (and no lsn)"
        )
    return source, version


def _table_from_source(source: Mapping[str, Any], coordinates: Coordinates) -> TableId:
    schema, table = source.get("schema"), source.get("table")
    if not isinstance(schema, str) or not isinstance(table, str):
        raise MalformedRecord(coordinates, "value.payload.source.table", "missing schema/table")
    return TableId(schema, table)


def _after_schema(envelope_schema: Any, coordinates: Coordinates) -> RowSchema:
    fields = envelope_schema.get("fields") if isinstance(envelope_schema, dict) else None
    for candidate in fields or []:
        if isinstance(candidate, dict) and candidate.get("field") == "after":
            try:
                return row_schema_from_connect(candidate)
            except ValueError as exc:
                raise MalformedRecord(coordinates, "value.schema.after", str(exc)) from exc
    raise MalformedRecord(coordinates, "value.schema", "no `after` field in the envelope schema")
