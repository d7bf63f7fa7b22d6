"""Debezium envelopes -> :class:`Change`: every Kafka record is parsed here, once.

A Kafka record from a Debezium topic is one of:
- a change event (`op` c/u/d/r) -> :class:`Change`
- a tombstone (null value after a delete, for Kafka log compaction) -> :class:`Tombstone`
- something else -> :class:`MalformedRecord` raised, naming the field path.

Versions come from the source LSN (`source.lsn`): it only grows per row, and snapshot rows (`r`)
carry the snapshot's LSN, so a newer streamed change always wins over a snapshot row.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from cdc_sync.core.model import Change, Coordinates, KnownSchemas, Op, TableId, Tombstone
from cdc_sync.core.types import RowSchema
from cdc_sync.schema import convert_row, row_schema_from_connect
from cdc_sync.schema.unavailable import is_unavailable


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
) -> Change | Tombstone:
    """Parse one Kafka record written by Debezium's JsonConverter: with schemas.enable=true,
    or, when `known` schemas are given, without (plain JSON key and envelope)."""
    if known is not None:
        return _parse_schemaless(key, value, coordinates, known)
    key_doc = _load_json(key, coordinates, "key")
    if key_doc is None:
        raise MalformedRecord(
            coordinates, "key", "record has no key (Debezium keys by primary key)"
        )
    key_tuple = _parse_key(key_doc, coordinates)
    value_doc = _load_json(value, coordinates, "value")
    if value_doc is None:
        return Tombstone(
            table=table_from_topic(coordinates), key=key_tuple, coordinates=coordinates
        )
    return _parse_envelope(value_doc, key_tuple, coordinates)


def _parse_schemaless(
    key: bytes | None, value: bytes | None, coordinates: Coordinates, known: KnownSchemas
) -> Change | Tombstone:
    table = table_from_topic(coordinates)
    schema = known.get(table)
    if schema is None:
        raise MalformedRecord(coordinates, "topic", f"no catalog schema for {table}")
    key_doc = _load_json(key, coordinates, "key")
    if not isinstance(key_doc, dict) or not key_doc:
        raise MalformedRecord(coordinates, "key", "expected a JSON object of the key columns")
    try:
        converted = convert_row(schema.key, key_doc)
    except ValueError as exc:
        raise MalformedRecord(coordinates, "key", str(exc)) from exc
    key_tuple = tuple((column.name, converted[column.name]) for column in schema.key.columns)
    value_doc = _load_json(value, coordinates, "value")
    if value_doc is None:
        return Tombstone(table=table, key=key_tuple, coordinates=coordinates)
    if not isinstance(value_doc, dict):
        raise MalformedRecord(coordinates, "value", "expected a JSON object (the envelope)")
    return _parse_payload(value_doc, key_tuple, coordinates, lambda: schema.row, "value")


def table_from_topic(coordinates: Coordinates) -> TableId:
    parts = coordinates.topic.split(".")
    if len(parts) < 3:
        raise MalformedRecord(coordinates, "topic", "expected <prefix>.<schema>.<table>")
    return TableId(parts[-2], parts[-1])


def _load_json(raw: bytes | None, coordinates: Coordinates, where: str) -> Any:
    if raw is None:
        return None
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


def _parse_envelope(doc: Any, key: tuple[tuple[str, Any], ...], coordinates: Coordinates) -> Change:
    schema, payload = _payload(doc, coordinates, "value")
    if not isinstance(payload, dict):
        raise MalformedRecord(coordinates, "value.payload", "expected a struct")
    return _parse_payload(
        payload, key, coordinates, lambda: _after_schema(schema, coordinates), "value.payload"
    )


def _parse_payload(
    payload: dict[str, Any],
    key: tuple[tuple[str, Any], ...],
    coordinates: Coordinates,
    row_schema_of: Callable[[], RowSchema],
    where: str,
) -> Change:
    """The envelope fields (op, source, after), wherever the row schema comes from."""
    try:
        op = Op(str(payload.get("op")))
    except ValueError as exc:
        raise MalformedRecord(
            coordinates, f"{where}.op", f"unknown op {payload.get('op')!r}"
        ) from exc
    source = payload.get("source")
    if not isinstance(source, dict):
        raise MalformedRecord(coordinates, f"{where}.source", "missing")
    version = source.get("lsn")
    if version is None and source.get("snapshot") == "incremental":
        version = _incremental_snapshot_position(source)
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise MalformedRecord(coordinates, f"{where}.source.lsn", "missing or not an LSN")
    table = _table_from_source(source, coordinates)
    ts_ms = source.get("ts_ms") if isinstance(source.get("ts_ms"), int) else None
    if op is Op.DELETE:
        return Change(table, key, op, version, None, coordinates, ts_ms)
    after = payload.get("after")
    if not isinstance(after, dict):
        raise MalformedRecord(coordinates, f"{where}.after", f"missing for op {op.value!r}")
    row_schema = row_schema_of()
    # Unchanged TOAST values are left out of the row: the fold, the sinks or a read from
    # Postgres fill them (job.fold, job.unavailable); they are never written as data.
    placeholders_possible = op in (Op.CREATE, Op.UPDATE)
    unavailable = frozenset(
        column.name
        for column in row_schema.columns
        if is_unavailable(column.type, after.get(column.name), placeholders_possible)
    )
    try:
        row = convert_row(row_schema, after, skip=unavailable)
    except ValueError as exc:
        raise MalformedRecord(coordinates, f"{where}.after", str(exc)) from exc
    return Change(table, key, op, version, row, coordinates, ts_ms, unavailable, row_schema)


def _incremental_snapshot_position(source: Mapping[str, Any]) -> int | None:
    """Incremental-snapshot rows carry no `lsn`; `sequence` holds [last commit LSN, current LSN]
    as strings. The current LSN orders the row after every change it reflects; changes to the
    same key during the chunk's window are de-duplicated by Debezium itself."""
    try:
        positions = json.loads(source.get("sequence") or "null")
        return int(next(p for p in reversed(positions) if p is not None))
    except (TypeError, ValueError, StopIteration):
        return None


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
