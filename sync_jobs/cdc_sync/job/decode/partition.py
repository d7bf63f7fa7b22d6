"""Executor-side stages of a micro-batch, as `mapInArrow` functions (pure, unit-testable).

decode: Kafka rows -> one row per record: routing columns plus the parsed `Change` (pickled, without
its schema; each distinct schema travels once per partition in `schema_blob`), or the reason the
record is a tombstone or malformed.
fold:   rows sorted by (table, doc_id, version, partition, offset) -> the newest change per key,
with unchanged TOAST columns filled from older changes of that key (compaction.fold).
decode_and_fold: both, within one input partition, with no shuffle: Debezium keys a table's
records by primary key, so every change of a key sits in one Kafka partition, which the Kafka
source reads as one Spark partition (see `job.stream`). Besides the folded changes it yields the
partition's side rows for the driver: rejected records, truncates, per-table schemas and record
counts, and the keys its last transaction left open for the next batch
(job.decode.open_transactions).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import uuid
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from cdc_sync.core.model import (
    UNVERSIONED,
    Change,
    Coordinates,
    KnownSchemas,
    Op,
    TableId,
    Tombstone,
    Truncate,
    tombstone_delete,
)
from cdc_sync.debezium.decoder import MalformedRecord, parse_record, table_from_topic
from cdc_sync.job.decode.batch_state import Where
from cdc_sync.job.decode.fold import OpenTransaction, Transaction, fold_key, left_open

KIND_CHANGE = "change"
KIND_TOMBSTONE = "tombstone"  # a tombstone the table's policy does not apply (skip / fail)
KIND_TOMBSTONE_DELETE = "tombstone_delete"  # a tombstone applied as a delete: folded like changes
CHANGE_KINDS = (KIND_CHANGE, KIND_TOMBSTONE_DELETE)
KIND_MALFORMED = "malformed"
KIND_TRUNCATE = "truncate"  # a table's TRUNCATE: applied by the driver before the writes
KIND_STATS = "stats"  # records of one kind read from one topic-partition, and the last offset
KIND_TABLE = "table"  # per table: its folded changes, the newest one's schema (schema policy)
KIND_OPEN = "open"  # per partition: its last transaction and the keys it created (job.decode.fold)
# The last row of a table's full snapshot (Change.ends_snapshot): besides its change, a side row
# the driver applies like a truncate at the snapshot's version (job.settle.truncates).
KIND_SNAPSHOT_END = "snapshot_end"

DECODED_SCHEMA = pa.schema(
    [
        pa.field("kind", pa.string()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("table", pa.string()),
        pa.field("doc_id", pa.string()),
        pa.field("version", pa.int64()),
        pa.field("bound", pa.int64()),  # Change.commit_bound: the read-your-writes candidate
        pa.field("floor", pa.int64()),  # Change.snapshot_point: the partition's floor
        pa.field("ts", pa.int64()),  # Change.source_ts_ms: the console's lag, heartbeats too
        pa.field("position", pa.int64()),  # a truncate's own WAL position (Truncate.fence)
        pa.field("op", pa.string()),  # Change.op
        pa.field("transaction", pa.int64()),  # Change.transaction
        pa.field("ends_snapshot", pa.bool_()),  # Change.ends_snapshot (KIND_SNAPSHOT_END)
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


# decode_and_fold's output: the decoded columns plus the counts of stats rows.
# The task token tells the driver which stats rows came from one task (see job.stream).
# A table row's `keys`: its folded keys' hashes (`key_hashes`), for the driver's check that no
# key sits in two partitions of one batch (job.stream.SideRows).
FOLDED_SCHEMA = (
    DECODED_SCHEMA.append(pa.field("counted", pa.string()))
    .append(pa.field("count", pa.int64()))
    .append(pa.field("task", pa.string()))
    .append(pa.field("keys", pa.binary()))
)
FOLD_ORDER = [(name, "ascending") for name in ("table", "doc_id", "version", "partition", "offset")]


def _decode_row(
    key: bytes | None,
    value: bytes | None,
    coords: Coordinates,
    seen: set[str],
    known: KnownSchemas | None,
    tombstone_deletes: frozenset[str] | None = None,
    floors: dict[tuple[str, int], int] | None = None,
    tables: Mapping[str, TableId] | None = None,
) -> dict[str, object]:
    row: dict[str, object] = {
        "topic": coords.topic,
        "partition": coords.partition,
        "offset": coords.offset,
    }
    where = (coords.topic, coords.partition)
    floor = floors.get(where, 0) if floors is not None else 0
    try:
        parsed = parse_record(key, value, coords, known, floor, tables)
    except MalformedRecord as exc:
        # The raw bytes travel on so the dead-letter entry loses nothing.
        return row | {
            "kind": KIND_MALFORMED,
            "table": _table_or_none(coords, tables),
            "error_field": exc.field_path,
            "error_class": type(exc.__cause__ or exc).__name__,
            "error_message": exc.reason,
            "key": key,
            "value": value,
        }
    if isinstance(parsed, Truncate):
        return row | {
            "kind": KIND_TRUNCATE,
            "table": str(parsed.table),
            "version": parsed.version,
            "bound": parsed.commit_bound,
            "position": parsed.position,
            "ts": parsed.source_ts_ms,
        }
    if isinstance(parsed, Tombstone):
        if tombstone_deletes is not None and str(parsed.table) in tombstone_deletes:
            return row | _change_columns(tombstone_delete(parsed), seen, KIND_TOMBSTONE_DELETE)
        return row | {"kind": KIND_TOMBSTONE, "table": str(parsed.table), "key": key}
    if floors is not None and parsed.snapshot_point is not None:
        floors[where] = max(floor, parsed.snapshot_point)
    return row | _change_columns(parsed, seen)


def _table_or_none(coords: Coordinates, tables: Mapping[str, TableId] | None) -> str | None:
    try:
        return str(table_from_topic(coords, tables))
    except MalformedRecord:
        return None


def _change_columns(change: Change, seen: set[str], kind: str = KIND_CHANGE) -> dict[str, object]:
    columns: dict[str, object] = {
        "kind": kind,
        "table": str(change.table),
        "doc_id": change.doc_id,
        "version": change.version,
        "op": change.op.value,
        "transaction": change.transaction,
        "bound": change.commit_bound,
        "floor": change.snapshot_point,
        "ts": change.source_ts_ms,
        "ends_snapshot": change.ends_snapshot,
        "change": pickle.dumps(change.evolve(schema=None), protocol=5),
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
    tables: Mapping[str, TableId] | None = None,
) -> Iterator[pa.RecordBatch]:
    """`known`: catalog schemas when records carry none (mapping `source.schemas: catalog`);
    `tombstone_deletes`: tables (`schema.table`) whose tombstones are deletes (`on_tombstone:
    delete`), the others' are handed to the driver's policy; `floors`: the highest snapshot
    point per (topic, partition) of earlier batches (`job.decode.version_floors`), raised here
    record by record, which needs each partition's records in offset order, as the sources give
    them; `tables`: the table of each topic (`MappingFile.topic_tables`)."""
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
                tables,
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


def fold_batches(
    batches: Iterator[pa.RecordBatch],
    open_keys: OpenKeys | None = None,
    history_tables: frozenset[str] = frozenset(),
) -> Iterator[pa.RecordBatch]:
    """Input sorted by key (then version); a key's changes may span Arrow batches. A key is
    (table, doc_id): doc ids are injective per table (DESIGN.md). `open_keys`: what the batch
    before left open, and where this batch's open keys are collected. `history_tables`: tables
    (`schema.table`) whose folded changes keep their earlier versions (`Change.earlier`)."""
    keys = open_keys or OpenKeys({}, {})
    pending: list[dict[str, object]] = []
    group: list[dict[str, object]] = []
    for batch in batches:
        for row in batch.to_pylist():
            if group and (group[0]["table"], group[0]["doc_id"]) != (row["table"], row["doc_id"]):
                pending.append(_folded_group(group, keys, history_tables))
                group = []
            group.append(row)
        if len(pending) >= 4096:
            yield pa.RecordBatch.from_pylist(pending, schema=DECODED_SCHEMA)
            pending = []
    if group:
        pending.append(_folded_group(group, keys, history_tables))
    if pending:
        yield pa.RecordBatch.from_pylist(pending, schema=DECODED_SCHEMA)


# A decoded change row's columns that a folded row carries as they are.
FOLDED_COLUMNS = ("topic", "partition", "offset", "table", "doc_id", "version", "bound", "change",
                  "schema_fp", "op", "transaction")  # fmt: skip


def _folded_group(
    rows: list[dict[str, object]],
    open_keys: OpenKeys,
    history_tables: frozenset[str] = frozenset(),
) -> dict[str, object]:
    where = (str(rows[0]["topic"]), int(str(rows[0]["partition"])))
    doc_id = str(rows[0]["doc_id"])
    carried = open_keys.carried_for(where, doc_id)
    if len(rows) == 1 and carried is None:
        # A key changed once in the batch (every key of a snapshot): folding leaves the change
        # as it is, so its decoded row is its folded row, without unpickling and pickling it.
        row = rows[0]
        open_keys.note_one(where, doc_id, row)
        return {"kind": KIND_CHANGE} | {name: row[name] for name in FOLDED_COLUMNS}
    group = [load_change(row) for row in rows]
    fingerprints = {c.coordinates: row["schema_fp"] for c, row in zip(group, rows, strict=True)}
    state = fold_key(group, carried, keep_earlier=str(rows[0]["table"]) in history_tables)
    open_keys.note(where, doc_id, state, group, carried)
    source = state
    if state.resolve_from_source:  # read as a whole row: with the create's schema, if here
        transaction = Transaction.of(state)
        source = max(
            (c for c in group if not c.is_delete and transaction.holds(c)),
            key=lambda c: c.coordinates.position,
            # created in an earlier batch: the table's schema (job.write.unavailable)
            default=state,
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
        "bound": change.commit_bound,
        "change": pickle.dumps(change, protocol=5),
        "schema_fp": schema_fp,
        "op": change.op.value,
        "transaction": change.transaction,
    }


class OpenKeys:
    """Per partition of one batch: the open transaction the batch before left (`carried`), this
    batch's last transaction (`tails`, job.decode.fold.OpenTransaction), and the keys it leaves
    open."""

    def __init__(
        self, carried: Mapping[Where, OpenTransaction], tails: Mapping[Where, Transaction]
    ) -> None:
        self.carried = carried
        self.tails = tails
        self.opened: dict[Where, set[str]] = defaultdict(set)
        self.folded: dict[Where, set[str]] = defaultdict(set)  # of the carried partitions

    def carried_for(self, where: Where, doc_id: str) -> Transaction | None:
        open_ = self.carried.get(where)
        return open_.carried(doc_id) if open_ is not None else None

    def note(
        self,
        where: Where,
        doc_id: str,
        state: Change,
        changes: Sequence[Change],
        carried: Transaction | None,
    ) -> None:
        if where in self.carried:
            self.folded[where].add(doc_id)
        tail = self.tails.get(where)
        if tail is not None and left_open(state, changes, tail, carried):
            self.opened[where].add(doc_id)

    def note_one(self, where: Where, doc_id: str, row: dict[str, object]) -> None:
        """A key with one change in the batch, not carried: open if it is the tail's create."""
        if where in self.carried:
            self.folded[where].add(doc_id)
        tail = self.tails.get(where)
        version, txid = row["version"], row["transaction"]
        assert isinstance(version, int) and (txid is None or isinstance(txid, int))
        if tail is not None and row["op"] == Op.CREATE.value and tail.matches(version, txid):
            self.opened[where].add(doc_id)

    def rows(self) -> list[dict[str, object]]:
        """One side row per partition with a versioned change in the batch: its last transaction
        and the keys left open (a carried key this batch did not touch stays open while the
        transaction goes on)."""
        rows: list[dict[str, object]] = []
        for (topic, partition), tail in sorted(self.tails.items()):
            keys = set(self.opened.get((topic, partition), ()))
            before = self.carried.get((topic, partition))
            if before is not None and before.transaction.same_as(tail):
                keys |= before.keys - self.folded.get((topic, partition), set())
            rows.append(
                {
                    "kind": KIND_OPEN,
                    "topic": topic,
                    "partition": partition,
                    "version": tail.version,
                    "transaction": tail.txid,
                    "keys": json.dumps(sorted(keys)).encode(),
                }
            )
        return rows


def open_transaction(row: Mapping[str, object]) -> OpenTransaction:
    """A `KIND_OPEN` side row, read back on the driver."""
    keys = row["keys"]
    assert isinstance(keys, bytes)
    version, txid = row["version"], row["transaction"]
    assert isinstance(version, int)
    assert txid is None or isinstance(txid, int)
    return OpenTransaction(Transaction(version, txid), frozenset(json.loads(keys)))


def last_transactions(decoded: pa.Table) -> dict[Where, Transaction]:
    """Per partition, the transaction of its last versioned change in Kafka order."""
    last: dict[Where, tuple[int, int, int | None]] = {}
    columns = decoded.select(["topic", "partition", "offset", "version", "transaction"])
    for topic, partition, offset, version, txid in zip(
        *(columns[name].to_pylist() for name in columns.column_names), strict=True
    ):
        if version is None or version == UNVERSIONED:
            continue
        known = last.get((topic, partition))
        if known is None or offset > known[0]:
            last[(topic, partition)] = (offset, version, txid)
    return {where: Transaction(version, txid) for where, (_, version, txid) in last.items()}


def decode_and_fold(
    batches: Iterator[pa.RecordBatch],
    known: KnownSchemas | None = None,
    tombstone_deletes: frozenset[str] | None = None,
    floors: Mapping[tuple[str, int], int] | None = None,
    open_transactions: Mapping[Where, OpenTransaction] | None = None,
    history_tables: frozenset[str] = frozenset(),
    tables: Mapping[str, TableId] | None = None,
) -> Iterator[pa.RecordBatch]:
    """One input partition: its records decoded, its changes folded per key (sorted here, in
    the task: no shuffle), then its side rows. A folded change's schema travels as a
    fingerprint; the first row of each fingerprint carries the pickled schema. `floors`: see
    `decode_batches`; the stats rows carry each partition's highest snapshot point.
    `open_transactions`: what the batch before left open per partition
    (job.decode.open_transactions); a `KIND_OPEN` side row per partition tells what this batch
    leaves. `history_tables`: see `fold_batches`; `tables`: see `decode_batches`."""
    decoded = pa.Table.from_batches(
        list(decode_batches(batches, known, tombstone_deletes, floors, tables)),
        schema=DECODED_SCHEMA,
    )
    if decoded.num_rows == 0:
        return
    is_change = pc.is_in(decoded["kind"], pa.array(CHANGE_KINDS))
    changes = decoded.filter(is_change).sort_by(FOLD_ORDER)
    open_keys = OpenKeys(open_transactions or {}, last_transactions(changes))
    blobs = {
        fp: blob
        for fp, blob in zip(
            changes["schema_fp"].to_pylist(), changes["schema_blob"].to_pylist(), strict=True
        )
        if blob is not None
    }
    sent: set[str] = set()
    # Per table (every table with a change, deletes only too): the newest (version, schema_fp).
    newest: dict[str, tuple[int | None, str | None]] = {}
    folded: dict[str, int] = defaultdict(int)  # per table, its folded changes
    keys: dict[str, list[str]] = defaultdict(list)  # per table, its folded keys (doc ids)
    where: dict[str, tuple[str, int]] = {}  # per table, the (topic, partition) read
    for batch in fold_batches(iter(changes.to_batches()), open_keys, history_tables):
        rows = batch.to_pylist()
        for row in rows:
            fingerprint = row["schema_fp"]
            newest.setdefault(str(row["table"]), (None, None))
            folded[str(row["table"])] += 1
            keys[str(row["table"])].append(str(row["doc_id"]))
            where[str(row["table"])] = (str(row["topic"]), int(row["partition"]))
            if fingerprint is None:
                continue
            if fingerprint not in sent:
                sent.add(fingerprint)
                row["schema_blob"] = blobs.get(fingerprint)
            table, version = str(row["table"]), int(row["version"])
            best = newest[table][0]
            if best is None or version >= best:
                newest[table] = (version, fingerprint)
        yield pa.RecordBatch.from_pylist(rows, schema=FOLDED_SCHEMA)
    side = decoded.filter(pc.invert(is_change)).to_pylist()
    side += _snapshot_end_rows(decoded)
    side += [
        {
            "kind": KIND_TABLE,
            "table": table,
            "version": version,
            "schema_fp": fingerprint,
            "schema_blob": blobs.get(fingerprint) if fingerprint else None,
            "count": folded[table],
            "topic": where[table][0],
            "partition": where[table][1],
            "keys": key_hashes(keys[table]),
        }
        for table, (version, fingerprint) in newest.items()
    ]
    side += open_keys.rows()
    side += _stats_rows(decoded, uuid.uuid4().hex)
    yield pa.RecordBatch.from_pylist(side, schema=FOLDED_SCHEMA)


def _snapshot_end_rows(decoded: pa.Table) -> list[dict[str, object]]:
    """A side row per table snapshot that ended in this partition (its last row's coordinates,
    version and time); the row itself is folded like any change."""
    ended = decoded.filter(pc.fill_null(decoded["ends_snapshot"], False))
    columns = ["table", "version", "topic", "partition", "offset", "ts"]
    return [row | {"kind": KIND_SNAPSHOT_END} for row in ended.select(columns).to_pylist()]


def key_hashes(doc_ids: list[str]) -> bytes:
    """64-bit hashes of a partition's keys, packed: the driver intersects them across partitions
    (job.stream). Stable across processes, unlike `hash()`; a collision (about 1 in 10^9 for
    two partitions of 100,000 keys each) fails the batch for nothing, nothing worse."""
    return b"".join(hashlib.blake2b(d.encode(), digest_size=8).digest() for d in doc_ids)


def _stats_rows(decoded: pa.Table, task: str) -> list[dict[str, object]]:
    # Single-threaded: a partition's rows are few on the driver and share the executor's core
    # in a task; Acero's thread pool cost 3x the CPU of the grouping itself on a small batch,
    # and hops between threads that wait for a core on a busy driver (17 ms a batch, py-spy).
    grouped = decoded.group_by(["kind", "topic", "partition"], use_threads=False).aggregate(
        [
            ("offset", "count"),
            ("offset", "max"),
            ("floor", "max"),
            ("bound", "max"),
            ("ts", "max"),
        ]
    )
    return [
        {
            "kind": KIND_STATS,
            "counted": row["kind"],
            "topic": row["topic"],
            "partition": row["partition"],
            "offset": row["offset_max"],
            "count": row["offset_count"],
            "floor": row["floor_max"],
            "bound": row["bound_max"],
            "ts": row["ts_max"],
            "task": task,
        }
        for row in grouped.to_pylist()
    ]
