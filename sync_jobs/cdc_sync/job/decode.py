"""Executor-side stages of a micro-batch, as `mapInArrow` functions (pure, unit-testable).

decode: Kafka rows -> one row per record: routing columns plus the parsed `Change` (pickled, without
its schema; each distinct schema travels once per partition in `schema_blob`), or the reason the
record is a tombstone or malformed.
fold:   rows sorted by (table, doc_id, version, partition, offset) -> the newest change per key,
with unchanged TOAST columns filled from older changes of that key (compaction.fold).
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterator, Mapping

import pyarrow as pa

from cdc_sync.core.model import Change, Coordinates, KnownSchemas, Tombstone, tombstone_delete
from cdc_sync.debezium.decoder import MalformedRecord, parse_record, table_from_topic
from cdc_sync.job.fold import fold_key

KIND_CHANGE = "change"
KIND_TOMBSTONE = "tombstone"  # a tombstone the table's policy does not apply (skip / fail)
KIND_TOMBSTONE_DELETE = "tombstone_delete"  # a tombstone applied as a delete: folded like changes
CHANGE_KINDS = (KIND_CHANGE, KIND_TOMBSTONE_DELETE)
KIND_MALFORMED = "malformed"

DECODED_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("table", pa.string()),
        pa.field("doc_id", pa.string()),
        pa.field("version", pa.int64()),
        pa.field("change", pa.binary()),
        pa.field("schema_fp", pa.string()),
        pa.field("schema_blob", pa.binary()),
        pa.field("error_field", pa.string()),
        pa.field("error_class", pa.string()),
        pa.field("error_message", pa.string()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
    ]
)


def _decode_row(
    key: bytes | None,
    value: bytes | None,
    coords: Coordinates,
    seen: set[str],
    known: KnownSchemas | None,
    tombstone_deletes: frozenset[str] | None = None,
    floors: dict[tuple[str, int], int] | None = None,
) -> dict[str, object]:
    row: dict[str, object] = {
        "topic": coords.topic,
        "partition": coords.partition,
        "offset": coords.offset,
    }
    where = (coords.topic, coords.partition)
    floor = floors.get(where, 0) if floors is not None else 0
    try:
        parsed = parse_record(key, value, coords, known, floor)
    except MalformedRecord as exc:
        # The raw bytes travel on so the dead-letter entry loses nothing.
        return row | {
            "kind": KIND_MALFORMED,
            "table": _table_or_none(coords),
            "error_field": exc.field_path,
            "error_class": type(exc.__cause__ or exc).__name__,
            "error_message": exc.reason,
            "key": key,
            "value": value,
        }
    if isinstance(parsed, Tombstone):
        if tombstone_deletes is not None and str(parsed.table) in tombstone_deletes:
            return row | _change_columns(tombstone_delete(parsed), seen, KIND_TOMBSTONE_DELETE)
        return row | {"kind": KIND_TOMBSTONE, "table": str(parsed.table), "key": key}
    if floors is not None:
        floors[where] = max(floor, parsed.version)
    return row | _change_columns(parsed, seen)


def _table_or_none(coords: Coordinates) -> str | None:
    try:
        return str(table_from_topic(coords))
    except MalformedRecord:
        return None


def _change_columns(change: Change, seen: set[str], kind: str = KIND_CHANGE) -> dict[str, object]:
    columns: dict[str, object] = {
        "kind": kind,
        "table": str(change.table),
        "doc_id": change.doc_id,
        "version": change.version,
        "change": pickle.dumps(dataclasses.replace(change, schema=None), protocol=5),
    }
    if change.schema is not None:
        fingerprint = change.schema.fingerprint
        columns["schema_fp"] = fingerprint
        if fingerprint not in seen:
            seen.add(fingerprint)
            columns["schema_blob"] = pickle.dumps(change.schema, protocol=5)
    return columns


def decode_batches(
    batches: Iterator[pa.RecordBatch],
    known: KnownSchemas | None = None,
    tombstone_deletes: frozenset[str] | None = None,
    floors: Mapping[tuple[str, int], int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """`known`: catalog schemas when records carry none (mapping `source.schemas: catalog`);
    `tombstone_deletes`: tables (`schema.table`) whose tombstones are deletes (`on_tombstone:
    delete`), the others' are handed to the driver's policy; `floors`: the highest version
    per (topic, partition) of earlier batches (`job.version_floors`), raised here record by
    record, which needs each partition's records in offset order, as the sources give them."""
    seen: set[str] = set()
    running = dict(floors or {})
    for batch in batches:
        data = batch.to_pydict()
        rows = [
            _decode_row(
                key,
                value,
                Coordinates(topic, int(partition), int(offset)),
                seen,
                known,
                tombstone_deletes,
                running,
            )
            for key, value, topic, partition, offset in zip(
                data["key"],
                data["value"],
                data["topic"],
                data["partition"],
                data["offset"],
                strict=True,
            )
        ]
        yield pa.RecordBatch.from_pylist(rows, schema=DECODED_SCHEMA)


def load_change(row: dict[str, object]) -> Change:
    blob = row["change"]
    assert isinstance(blob, bytes)
    change = pickle.loads(blob)
    assert isinstance(change, Change)
    return change


def fold_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Input sorted by key (then version); a key's changes may span Arrow batches."""
    pending: list[dict[str, object]] = []
    group: list[Change] = []
    fingerprints: dict[Coordinates, object] = {}
    for batch in batches:
        for row in batch.to_pylist():
            change = load_change(row)
            if group and (group[0].table, group[0].key) != (change.table, change.key):
                pending.append(_folded_group(group, fingerprints))
                group, fingerprints = [], {}
            group.append(change)
            fingerprints[change.coordinates] = row["schema_fp"]
        if len(pending) >= 4096:
            yield pa.RecordBatch.from_pylist(pending, schema=DECODED_SCHEMA)
            pending = []
    if group:
        pending.append(_folded_group(group, fingerprints))
    if pending:
        yield pa.RecordBatch.from_pylist(pending, schema=DECODED_SCHEMA)


def _folded_group(
    group: list[Change], fingerprints: dict[Coordinates, object]
) -> dict[str, object]:
    state = fold_key(group)
    source = state
    if state.resolve_from_source:  # read as a whole row: it travels with the create's schema
        source = max(
            (c for c in group if not c.is_delete and c.version == state.version),
            key=lambda c: c.coordinates.position,
        )
    return _folded_row(state, fingerprints.get(source.coordinates))


def _folded_row(change: Change, schema_fp: object) -> dict[str, object]:
    return {
        "kind": KIND_CHANGE,
        "topic": change.coordinates.topic,
        "partition": change.coordinates.partition,
        "offset": change.coordinates.offset,
        "table": str(change.table),
        "doc_id": change.doc_id,
        "version": change.version,
        "change": pickle.dumps(change, protocol=5),
        "schema_fp": schema_fp,
    }
