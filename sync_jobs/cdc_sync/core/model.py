"""The change model: one frozen event type per row change (flink-cdc `DataChangeEvent` style).

The Debezium decoder (`cdc_sync.debezium.decoder`) builds these from Kafka records; everything
above it (fold, routing, sinks, verify) works on them and never on raw envelopes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from cdc_sync.core.types import KnownSchema, RowSchema

KEY_SEPARATOR = "|"
# The version of a delete known only from a Kafka tombstone whose delete event the log cleaner
# removed (or that a batch holds without it): it deletes whatever version a sink holds, and any
# change after it in the log wins. The fold gives a tombstone the version of the change before it
# in the batch when there is one (job.decode.fold.version_tombstones).
UNVERSIONED = -1
ESCAPE = "\\"


class Op(StrEnum):
    CREATE = "c"
    UPDATE = "u"
    DELETE = "d"
    READ = "r"  # snapshot row


# Each op by its value: a dict lookup, where Op(value) costs ten times as much a record.
OPS = {op.value: op for op in Op}


@dataclass(frozen=True, order=True)
class TableId:
    schema: str
    table: str

    def __str__(self) -> str:
        """`schema.table`; a part holding a dot (or starting with `"`) is double-quoted, SQL
        style (`app."order.items"`), so that `parse` reads every name back as it was."""
        return f"{_spelled(self.schema)}.{_spelled(self.table)}"

    @classmethod
    def parse(cls, qualified: str) -> TableId:
        """`schema.table`, either part optionally double-quoted with `""` for a quote inside
        (`"My.Schema"."a""b"`): the form `str` writes, mapping files and command lines use."""
        schema, rest = _identifier(qualified, qualified)
        if not rest.startswith(".") or len(rest) == 1:
            raise ValueError(f"expected <schema>.<table>, got {qualified!r}")
        table, tail = _identifier(rest[1:], qualified)
        if tail:
            raise ValueError(f"expected <schema>.<table>, got {qualified!r}")
        return cls(schema, table)


def _spelled(part: str) -> str:
    if "." in part or part.startswith('"'):
        return '"' + part.replace('"', '""') + '"'
    return part


def _identifier(text: str, whole: str) -> tuple[str, str]:
    """One part at the start of `text` (quoted, or up to the next dot) and what follows it."""
    if not text.startswith('"'):
        name, dot, rest = text.partition(".")
        if not name:
            raise ValueError(f"expected <schema>.<table>, got {whole!r}")
        return name, dot + rest
    chars: list[str] = []
    at = 1
    while at < len(text):
        if text[at] == '"':
            if text[at + 1 : at + 2] != '"':
                if not chars:
                    break
                return "".join(chars), text[at + 1 :]
            at += 1
        chars.append(text[at])
        at += 1
    raise ValueError(f"unterminated or empty quoted name in {whole!r}")


@dataclass(frozen=True)
class Coordinates:
    """Where a record sits in Kafka: named in every log line and dead-letter entry."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]@{self.offset}"

    @property
    def position(self) -> tuple[int, int]:
        return (self.partition, self.offset)


@dataclass(frozen=True)
class Change:
    table: TableId
    key: tuple[tuple[str, Any], ...]  # primary-key columns in key order
    op: Op
    version: int
    row: Mapping[str, Any] | None  # after image (converted values); None for deletes
    coordinates: Coordinates
    source_ts_ms: int | None = None
    unavailable_columns: frozenset[str] = frozenset()
    schema: RowSchema | None = field(default=None, compare=False, repr=False)
    # A delete that follows a create of the same key in the same transaction: either the row was
    # created and deleted, or two rows swapped keys (deferrable keys) and the key is present.
    # Only Postgres can tell (job.write.unavailable reads it).
    resolve_from_source: bool = False
    # The change's own WAL position (Debezium's `source.lsn`); None where it has none
    # (incremental-snapshot rows, tombstones).
    position: int | None = None
    # A snapshot row read before capture streamed any commit (`source.sequence` `[null, S]`):
    # its point S, the version floor of the first transaction streamed after it
    # (debezium.decoder.commit_order_version). None for every other change.
    snapshot_point: int | None = None
    # The unavailable columns whose placeholder could be the real value (a null: Debezium sends
    # null for both, `schema.unavailable`). Never filled from an older change: only Postgres
    # can tell (job.write.unavailable reads it).
    uncertain_columns: frozenset[str] = frozenset()
    # Debezium's `source.txId`, kept only for the changes of the first transaction streamed
    # after a snapshot (`source.sequence` `[null, lsn]`): versioned by their own positions, they
    # differ in version within their transaction, and this tells they are one (job.decode.fold).
    # None for every other change: its version (the commit before its transaction) identifies it.
    transaction: int | None = None
    # The last row of its table in a full (initial or blocking) snapshot, Debezium's
    # `source.snapshot` "last" / "last_in_data_collection": the table's snapshot is complete,
    # and every row the sinks hold older than it that the snapshot did not write is gone
    # (job.settle.truncates applies it as a `Truncate` with `snapshot_end`).
    ends_snapshot: bool = False
    # A row of a full snapshot that is not the snapshot's very last one (Debezium's
    # `source.snapshot` "first", "true", "first_in_data_collection" or "last_in_data_collection";
    # "last" ends the whole snapshot, "incremental" rows interleave with the stream): rows the
    # snapshot has yet to read may belong with it (documents.builds: no document is rendered
    # from such rows alone).
    snapshot_continues: bool = False
    # Tables with a Delta history (`delta.history`): the key's earlier states in the batch, one
    # per version (the last change of each), oldest first. The fold keeps only the newest state;
    # the history needs every version (sinks.delta.history). Empty for every other table.
    earlier: tuple[Change, ...] = field(default=(), compare=False, repr=False)
    # A delete: the row the key held just before it, when the batch held the change that wrote
    # it, whole (no unchanged-TOAST column left out): the fold keeps it (job.decode.fold), so a
    # soft-delete sink's filter reads the row as it was deleted (`cdc_sync.shape`). None when
    # the batch did not hold it: the sink holds that state, if it matched.
    deleted_row: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    # A soft delete (`on_delete: soft`, `cdc_sync.shape`): `row` holds the markers (and the key,
    # or the whole shaped `deleted_row`). A sink writes it over the row it holds for the key,
    # fenced by version, keeping the stored fields the mark does not carry; a sink that holds no
    # row for the key applies it as the plain delete at the same version (a tombstone, which
    # still fences): a row the sink never held is never marked.
    marks_deleted: bool = False

    def evolve(self, **changes: Any) -> Change:
        """This change with `changes` set, as `dataclasses.replace` makes it, without replace's
        generic pass over the fields and `__init__` (~0.6 us instead of ~5): the per-record paths
        (decode, route, conform) call it several times a record. Change has no `__post_init__`
        to skip. A name that is not a field raises, as replace does."""
        unknown = changes.keys() - _CHANGE_FIELDS
        if unknown:
            raise TypeError(f"Change has no field {sorted(unknown)}")
        evolved = object.__new__(Change)
        evolved.__dict__.update(self.__dict__, **changes)
        return evolved

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as plain values (its table, op and coordinates as their parts, the other
        fields in field order, no names): a change is pickled by the decode task and loaded
        by the write task, and the changes a driver sink commits once more
        (job.decode.partition, job.write.task_writes); plain values pickle and load in C.
        Loaded as `evolve` builds a copy."""
        state = self.__dict__
        table, where = self.table, self.coordinates
        head = (
            table.schema,
            table.table,
            self.op.value,
            where.topic,
            where.partition,
            where.offset,
        )
        return (_change, (head, tuple(state[name] for name in _CHANGE_PLAIN_FIELDS)))

    @property
    def is_delete(self) -> bool:
        return self.op is Op.DELETE

    @property
    def is_unversioned(self) -> bool:
        """A delete known only from a compacted topic's tombstone: see `UNVERSIONED`."""
        return self.version == UNVERSIONED

    @property
    def doc_id(self) -> str:
        return document_id(self.key)

    @property
    def commit_bound(self) -> int | None:
        """A WAL position P such that Debezium streamed every transaction whose commit record
        ends at or before P before this change (the read-your-writes watermark's candidate).

        Both the version (the commit end of the transaction streamed just before this one) and
        the change's own position qualify: pgoutput streams whole transactions in commit order,
        and a transaction whose commit was written before this change commits before this
        change's transaction. None for snapshot rows (rows of other tables still follow them)
        and for deletes known only from a tombstone."""
        if self.op is Op.READ or self.is_unversioned:
            return None
        return max(self.version, self.position if self.position is not None else -1)


_CHANGE_FIELDS = frozenset(f.name for f in fields(Change))
_CHANGE_PLAIN_FIELDS = tuple(
    f.name for f in fields(Change) if f.name not in ("table", "op", "coordinates")
)
_TABLES: dict[tuple[str, str], TableId] = {}  # one per table and process: few, never dropped


def _change(head: tuple[Any, ...], values: tuple[Any, ...]) -> Change:
    """A change from its pickled values (`Change.__reduce__`)."""
    schema, name, op, topic, partition, offset = head
    table = _TABLES.get((schema, name))
    if table is None:
        table = _TABLES.setdefault((schema, name), TableId(schema, name))
    coordinates = object.__new__(Coordinates)
    coordinates.__dict__.update(topic=topic, partition=partition, offset=offset)
    change = object.__new__(Change)
    state = change.__dict__
    state.update(zip(_CHANGE_PLAIN_FIELDS, values, strict=True))
    state.update(table=table, op=OPS[op], coordinates=coordinates)
    return change


@dataclass(frozen=True)
class Tombstone:
    table: TableId
    key: tuple[tuple[str, Any], ...]
    coordinates: Coordinates


@dataclass(frozen=True)
class Truncate:
    """A TRUNCATE of `table` (Debezium op `t`: no key, no row): every row of the table older
    than it is gone. `version` follows the rule of every streamed change
    (`debezium.decoder.commit_order_version`); `position` is its own WAL position, which orders
    it among the changes of its own transaction (they share its version)."""

    table: TableId
    version: int
    coordinates: Coordinates
    position: int | None = None
    source_ts_ms: int | None = None
    # Not a TRUNCATE statement: the end of a full snapshot of the table at `version` (its
    # consistent point; `Change.ends_snapshot`). A row the snapshot did not write and no later
    # change wrote is older than it and gone from Postgres (deleted while capture did not
    # publish it: a re-snapshot after lost offsets), so it leaves the sinks the same way.
    snapshot_end: bool = False

    @property
    def fence(self) -> TruncateFence:
        return TruncateFence(self.version, self.position if self.position is not None else -1)

    @property
    def commit_bound(self) -> int:
        """As `Change.commit_bound`: a streamed change's read-your-writes candidate."""
        return max(self.version, self.position if self.position is not None else -1)


@dataclass(frozen=True, order=True)
class TruncateFence:
    """The newest TRUNCATE of a table applied so far: changes older than it are dropped, so a
    stale change (replayed, re-sent, or read late from another partition) cannot bring a
    truncated row back. Ordered by (version, position), the order of the truncates."""

    version: int
    position: int = -1

    def covers(self, change: Change) -> bool:
        """`change` happened before the truncate: an older transaction, or its own transaction
        before the TRUNCATE statement (own WAL position before it). A delete known only from a
        tombstone (unversioned) is never dropped: it removes, never brings back."""
        if change.is_unversioned:
            return False
        if change.version != self.version:
            return change.version < self.version
        return change.position is not None and change.position < self.position


def document_id(key: tuple[tuple[str, Any], ...]) -> str:
    """`_id` / cache id. A one-column key is its value as a string. A composite key joins its
    values in key order with `|`, each value with `\\` and `|` escaped by a `\\`, so the id is
    injective: ('x|y', 'z') -> `x\\|y|z`, ('x', 'y|z') -> `x|y\\|z`."""
    if len(key) == 1:
        return str(key[0][1])
    return KEY_SEPARATOR.join(_escaped(str(value)) for _, value in key)


def id_digest(doc_id: str) -> str:
    """SHA-256 of a document id, as hex: what a fence against a deleted key keeps instead of
    the key (which may itself be erased data: an email as the key). It only confirms a key
    someone already knows."""
    return hashlib.sha256(doc_id.encode()).hexdigest()


def _escaped(part: str) -> str:
    return part.replace(ESCAPE, ESCAPE * 2).replace(KEY_SEPARATOR, ESCAPE + KEY_SEPARATOR)


KnownSchemas = Mapping[TableId, KnownSchema]


def tombstone_delete(tombstone: Tombstone) -> Change:
    """A compacted topic's tombstone as the delete it stands for (log-compaction semantics)."""
    return Change(
        tombstone.table, tombstone.key, Op.DELETE, UNVERSIONED, None, tombstone.coordinates
    )
