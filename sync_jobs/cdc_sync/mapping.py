"""Mapping files (`mappings/*.yaml`): table -> search index, cache prefix, Delta table, projection.

Loaded and validated once; every error names the file and the field path. Every captured table
must be routed or listed under `ignore` (checked against the connector's table list).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from cdc_sync.core.errors import ConfigError, FieldReader
from cdc_sync.core.model import Change, TableId, Truncate
from cdc_sync.names import (
    Claim,
    collisions,
    delta_problem,
    describe,
    index_for,
    index_problem,
    topic_name,
)
from cdc_sync.relations import DocumentSpec, parse_documents
from cdc_sync.schema import Column, RowSchema
from cdc_sync.shape.changes import sink_changes, sink_schema
from cdc_sync.shape.engine import ExpressionError, parse
from cdc_sync.shape.spec import (
    SHAPE_KEYS,
    SINK_SHAPE_KEYS,
    SinkShape,
    combine,
    read_settings,
)


class OnTombstone(StrEnum):
    # The compacted log's delete: after the log cleaner ran, a consumer behind it may see only
    # the tombstone of a deleted key (job.decode.fold gives it its version).
    DELETE = "delete"
    SKIP = "skip"  # only for topics that are never compacted
    FAIL = "fail"


class OnMalformed(StrEnum):
    FAIL = "fail"
    DEAD_LETTER = "dead_letter"


class OnSnapshotEnd(StrEnum):
    # A full snapshot of a table (initial, or after lost offsets) is the whole table at its
    # point: rows the sinks hold older than it that it did not write are gone
    # (job.settle.truncates).
    SWEEP = "sweep"
    # For snapshots that read only part of a table (`snapshot.select.statement.overrides`, a
    # blocking snapshot with `additional-conditions`): sweeping would remove the rest.
    KEEP = "keep"


class SchemaSource(StrEnum):
    ENVELOPE = "envelope"  # JsonConverter schemas.enable=true: each record carries its schema
    CATALOG = "catalog"  # schemas.enable=false: types read from the Postgres catalog at start


class OnSchemaChange(StrEnum):
    FAIL = "fail"
    EVOLVE = "evolve"
    IGNORE = "ignore"


@dataclass(frozen=True)
class Policies:
    on_tombstone: OnTombstone = OnTombstone.DELETE
    on_malformed: OnMalformed = OnMalformed.FAIL
    on_schema_change: OnSchemaChange = OnSchemaChange.FAIL
    on_snapshot_end: OnSnapshotEnd = OnSnapshotEnd.SWEEP

    def applies(self, truncate: Truncate) -> bool:
        """Whether the table's stores apply `truncate`: a TRUNCATE always, the end of a full
        snapshot unless the table keeps what its snapshot did not read (`on_snapshot_end`)."""
        return not truncate.snapshot_end or self.on_snapshot_end is not OnSnapshotEnd.KEEP


@dataclass(frozen=True)
class SearchRoute:
    index: str  # the alias applications query; the concrete index is `<alias>_v1`
    mapping: Mapping[str, Any] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)


WATERMARKS_KEY_SUFFIX = "_cdc:watermarks"
# A sink's name (`Sink.name`) -> its section in a table's mapping.
_SINK_SECTIONS = {"redis": "cache"}


def sink_section(sink_name: str) -> str:
    return _SINK_SECTIONS.get(sink_name, sink_name)


@dataclass(frozen=True)
class CacheRoute:
    prefix: str
    ttl_seconds: int | None = None

    def key(self, table: TableId, doc_id: str) -> str:
        return f"{self.prefix}:{table}:{doc_id}"

    def tombstone_key(self, table: TableId, doc_id: str) -> str:
        return f"{self.prefix}:_tombstone:{table}:{doc_id}"

    def watermarks_key(self) -> str:
        """Hash of applied watermarks: topic -> WAL position (decimal), read-your-writes."""
        return f"{self.prefix}:{WATERMARKS_KEY_SUFFIX}"


@dataclass(frozen=True)
class DeltaRoute:
    schema: str
    table: str
    partition_by: tuple[str, ...] = ()
    # Delta's Change Data Feed (`delta.enableChangeDataFeed`): downstream jobs read the table's
    # row-level changes (`table_changes`, deltalake `load_cdf`).
    change_data_feed: bool = False
    # SCD type 2 history (sinks.delta.history): a second table with one row per version of each
    # key; `track`: the (source) columns whose changes open a new version, None = every column.
    history: bool = False
    track: tuple[str, ...] | None = None
    history_table: TableId | None = None  # default `<schema>.<table>__history`

    def relative_path(self) -> str:
        return f"{self.schema}/{self.table}"

    def history_target(self) -> TableId:
        return self.history_table or TableId(self.schema, f"{self.table}{HISTORY_SUFFIX}")

    def history_relative_path(self) -> str:
        target = self.history_target()
        return f"{target.schema}/{target.table}"

    def history_name(self) -> str:
        return str(self.history_target())


HISTORY_SUFFIX = "__history"


@dataclass(frozen=True)
class TableRoute:
    table: TableId
    columns: tuple[str, ...] | None  # projection; None = every column
    rename: Mapping[str, str]
    search: SearchRoute | None
    cache: CacheRoute | None
    delta: DeltaRoute | None
    policies: Policies
    # Per sink (search, cache, delta): filters, computed/masked/hashed/dropped fields, soft
    # deletes (`cdc_sync.shape`); a sink without an entry gets the routed rows as they are.
    shapes: Mapping[str, SinkShape] = field(default_factory=dict)
    # Its rows feed document indices (`documents`): the job keeps them in the documents' state.
    documents: bool = False
    # project_schema's results by the table schema's fingerprint: a batch's changes share a
    # few schemas, and a new projected schema per change cost ~30 us and was pickled once per
    # change when the routed changes went back to the driver (Delta, documents).
    _projected: dict[str, RowSchema] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def sinks(self) -> tuple[str, ...]:
        """The sinks this table is routed to."""
        routed = (("search", self.search), ("cache", self.cache), ("delta", self.delta))
        return tuple(name for name, section in routed if section is not None)

    def shape(self, sink: str) -> SinkShape:
        return self.shapes.get(sink) or SinkShape(sink, str(self.table))

    def sink_schema(self, sink: str, schema: RowSchema) -> RowSchema:
        """The fields `sink` holds, typed (`ensure_target` creates and evolves with these)."""
        return sink_schema(self, self.shape(sink), schema)

    def sink_changes(
        self, schema: RowSchema | None, changes: Sequence[Change]
    ) -> dict[str, list[Change]]:
        """Each routed sink's changes (`changes`: full rows, filled; `schema`: the table's)."""
        return sink_changes(self, {s: self.shape(s) for s in self.sinks()}, schema, changes)

    def project(self, row: Mapping[str, Any]) -> dict[str, Any]:
        kept = dict(row) if self.columns is None else {c: row[c] for c in self.columns if c in row}
        if not self.rename:  # the common route, once a record: no dict rebuilt name by name
            return kept
        return {self.rename.get(name, name): value for name, value in kept.items()}

    def project_columns(self, names: frozenset[str]) -> frozenset[str]:
        if not names:  # nearly every change: no unavailable or uncertain column
            return names
        kept = names if self.columns is None else names & frozenset(self.columns)
        return frozenset(self.rename.get(name, name) for name in kept)

    def project_schema(self, schema: RowSchema) -> RowSchema:
        projected = self._projected.get(schema.fingerprint)
        if projected is None:
            kept = [c for c in schema.columns if self.columns is None or c.name in self.columns]
            projected = RowSchema(
                tuple(Column(self.rename.get(c.name, c.name), c.type) for c in kept)
            )
            self._projected[schema.fingerprint] = projected
        return projected

    def route(self, change: Change) -> Change:
        """The change as the sinks see it: projected and renamed row columns and schema."""
        if change.row is None:
            return change
        return change.evolve(
            row=self.project(change.row),
            unavailable_columns=self.project_columns(change.unavailable_columns),
            uncertain_columns=self.project_columns(change.uncertain_columns),
            schema=None if change.schema is None else self.project_schema(change.schema),
        )


@dataclass(frozen=True)
class MappingFile:
    path: Path
    topic_prefix: str
    connector: Path | None
    dead_letter_topic: str
    tombstone_retention_seconds: int
    tables: Mapping[TableId, TableRoute]
    ignored: frozenset[TableId]
    default_policies: Policies = Policies()
    schema_source: SchemaSource = SchemaSource.ENVELOPE
    # Captured only so read-your-writes watermarks advance while the routed tables are idle
    # (the connector's `heartbeat.action.query` writes it); subscribed, never written to sinks.
    heartbeat_table: TableId | None = None
    # Document indices (`documents`, cdc_sync.relations): name -> spec. Their tables are routed
    # (`tables`), those without a section of their own with no sink (`TableRoute.documents`).
    documents: Mapping[str, DocumentSpec] = field(default_factory=dict)

    def route_for(self, table: TableId) -> TableRoute | None:
        return self.tables.get(table)

    def policies_for(self, table: TableId | None) -> Policies:
        route = self.tables.get(table) if table is not None else None
        return route.policies if route is not None else self.default_policies

    def setting_path(self, table: TableId | None, policy: str) -> str:
        """Where a policy is set, for error messages: the table's key or `defaults`."""
        if table is not None and table in self.tables:
            return f"{self.path}: tables.{table}.{policy} (or defaults.{policy})"
        return f"{self.path}: defaults.{policy}"

    def document_filter_path(self, name: str) -> str:
        """Where document `name`'s root filter is set, for errors naming it."""
        return f"{self.path}: documents.{name}.filter"

    def tombstone_delete_tables(self) -> frozenset[str]:
        """Routed tables (`schema.table`) whose tombstones are deletes (`on_tombstone: delete`)."""
        return frozenset(
            str(table)
            for table, route in self.tables.items()
            if route.policies.on_tombstone is OnTombstone.DELETE
        )

    def history_tables(self) -> frozenset[str]:
        """Routed tables (`schema.table`) with a Delta history (`delta.history`)."""
        return frozenset(
            str(table)
            for table, route in self.tables.items()
            if route.delta is not None and route.delta.history
        )

    def read_tables(self) -> list[TableId]:
        """The tables whose topics the job reads: the routed ones and the heartbeat table."""
        return [*self.tables, *([self.heartbeat_table] if self.heartbeat_table else [])]

    def topic(self, table: TableId) -> str:
        """The topic Debezium writes `table`'s changes to (its naming rule: `names.topic_name`)."""
        return topic_name(self.topic_prefix, table)

    def topics(self) -> list[str]:
        """The topics the job reads (`read_tables`)."""
        return sorted(self.topic_tables())

    def topic_tables(self) -> dict[str, TableId]:
        """The table of each topic the job reads: a topic's name alone may not say it (Debezium
        replaces characters Kafka does not allow; a name may hold a dot)."""
        return {self.topic(table): table for table in self.read_tables()}

    def chosen(self, names: Iterable[str], option: str = "--table") -> frozenset[TableId] | None:
        """Routed tables named on a command line (`schema.table`); None when none are named."""
        chosen = set()
        for name in names:
            try:
                table = TableId.parse(name)
            except ValueError as exc:
                raise ConfigError("command line", option, str(exc)) from exc
            if table not in self.tables:
                routed = ", ".join(sorted(str(t) for t in self.tables))
                message = f"{name} is not routed by {self.path} (routed: {routed})"
                raise ConfigError("command line", option, message)
            chosen.add(table)
        return frozenset(chosen) or None

    def uncovered(self, captured: Iterable[TableId]) -> list[TableId]:
        """Captured tables neither routed nor ignored: the one home of that rule (the
        heartbeat table counts as covered)."""
        covered = {*self.tables, *self.ignored, self.heartbeat_table}
        return [t for t in captured if t not in covered]


_TOP_KEYS = ("version", "source", "defaults", "dead_letter", "tables", "documents", "ignore")
_TABLE_KEYS = (
    "columns",
    "rename",
    "search",
    "cache",
    "delta",
    *Policies.__dataclass_fields__,
    *SHAPE_KEYS,
)
_POLICY_ENUMS: dict[str, type[StrEnum]] = {
    "on_tombstone": OnTombstone,
    "on_malformed": OnMalformed,
    "on_schema_change": OnSchemaChange,
    "on_snapshot_end": OnSnapshotEnd,
}


def load_mapping(path: Path) -> MappingFile:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(path, "<file>", f"cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(path, "<file>", f"not valid YAML: {exc}") from exc
    root = FieldReader(path, "", data)
    root.reject_unknown(_TOP_KEYS)
    if root.data.get("version", 1) != 1:
        raise root.error("version", "only version 1 is supported")

    source = root.child("source")
    source.reject_unknown(("topic_prefix", "connector", "schemas", "heartbeat_table"))
    connector = source.optional_str("connector")
    schemas_raw = source.str_("schemas", SchemaSource.ENVELOPE.value)
    if schemas_raw not in {s.value for s in SchemaSource}:
        raise source.error("schemas", "expected one of envelope, catalog")
    schema_source = SchemaSource(schemas_raw)

    defaults = root.child("defaults")
    defaults.reject_unknown((*_POLICY_ENUMS, "cache_prefix", "tombstone_retention_seconds"))
    default_policies = _policies(defaults, Policies())
    cache_prefix = defaults.str_("cache_prefix", "cdc")

    dead_letter = root.child("dead_letter")
    dead_letter.reject_unknown(("topic",))
    topic_prefix = source.str_("topic_prefix")

    tables_reader = root.child("tables")
    routes: dict[TableId, TableRoute] = {}
    for name in tables_reader.data:
        table = _table_id(tables_reader, str(name))
        reader = tables_reader.child(str(name))
        routes[table] = _table_route(table, reader, default_policies, cache_prefix)

    documents = parse_documents(root.child("documents"))
    routes = _with_document_tables(routes, documents, default_policies)
    ignore_raw = root.str_list("ignore") or ()
    ignored = frozenset(_table_id(root, name) for name in ignore_raw)
    both = sorted(str(t) for t in ignored & routes.keys())
    if both:
        raise root.error("ignore", f"tables both routed and ignored: {', '.join(both)}")
    heartbeat_table = _heartbeat_table(source, routes.keys() | ignored)
    captured = [*routes, *ignored, *([heartbeat_table] if heartbeat_table else [])]
    _refuse_shared_names(root, routes, documents, topic_prefix, captured)
    return MappingFile(
        path=path,
        topic_prefix=topic_prefix,
        connector=(path.parent / connector).resolve() if connector else None,
        dead_letter_topic=dead_letter.str_("topic", f"{topic_prefix}.cdc_sync.dead_letter"),
        tombstone_retention_seconds=defaults.int_("tombstone_retention_seconds", 24 * 3600),
        tables=routes,
        ignored=ignored,
        default_policies=default_policies,
        schema_source=schema_source,
        heartbeat_table=heartbeat_table,
        documents=documents,
    )


def _with_document_tables(
    routes: dict[TableId, TableRoute], documents: Mapping[str, DocumentSpec], defaults: Policies
) -> dict[TableId, TableRoute]:
    """The routes with every document table marked; a table only documents hold is routed
    to no sink of its own (its changes feed the documents' state)."""
    members = {table for spec in documents.values() for table in spec.tables()}
    out = dict(routes)
    for table in sorted(members):
        route = out.get(table) or TableRoute(table, None, {}, None, None, None, defaults)
        out[table] = replace(route, documents=True)
    return out


def _heartbeat_table(source: FieldReader, listed: Iterable[TableId]) -> TableId | None:
    name = source.optional_str("heartbeat_table")
    if name is None:
        return None
    try:
        table = TableId.parse(name)
    except ValueError as exc:
        raise source.error("heartbeat_table", str(exc)) from exc
    if table in set(listed):
        raise source.error(
            "heartbeat_table",
            f"{table} is also under tables or ignore: the heartbeat table only advances "
            "watermarks; remove it from there",
        )
    return table


def _table_id(reader: FieldReader, name: str) -> TableId:
    try:
        return TableId.parse(name)
    except ValueError as exc:
        raise reader.error(name, str(exc)) from exc


def _policies(reader: FieldReader, base: Policies) -> Policies:
    values = {
        name: enum(reader.choice(name, [m.value for m in enum], getattr(base, name).value))
        for name, enum in _POLICY_ENUMS.items()
    }
    return Policies(**values)  # type: ignore[arg-type]


def _table_route(
    table: TableId, reader: FieldReader, defaults: Policies, cache_prefix: str
) -> TableRoute:
    reader.reject_unknown(_TABLE_KEYS)
    route = TableRoute(
        table=table,
        columns=reader.str_list("columns"),
        rename=reader.str_map("rename"),
        search=_search_route(reader, table),
        cache=_cache_route(reader, cache_prefix),
        delta=_delta_route(reader, table),
        policies=_policies(reader, defaults),
    )
    route = replace(route, shapes=_shapes(reader, route))
    if route.delta is not None and route.delta.history and not route.shape("delta").plain:
        # The history is written from the routed rows; shaping its versions is not built yet.
        raise reader.error(
            "delta.history",
            "not supported with a Delta shape (filter, computed, mask, hash, "
            "drop, on_delete or columns in the delta section or at table level)",
        )
    return route


def _shapes(reader: FieldReader, route: TableRoute) -> dict[str, SinkShape]:
    """Each routed sink's shape (table-level keys, then the sink section's); every expression
    parsed here, so a syntax error fails at load naming the file and field path."""
    table_level = read_settings(reader, with_columns=False)
    shapes = {}
    for sink in route.sinks():
        section = _section(reader, sink)
        own = read_settings(section, with_columns=True) if section is not None else None
        shape = combine(sink, table_level, own)
        if not shape.plain:
            shapes[sink] = shape
    levels = [*shapes.values(), combine("", table_level, None)]  # table level even unrouted
    for shape in levels:
        for path, sql in (*shape.filters, *shape.computed.values()):
            try:
                parse(path, sql)
            except ExpressionError as exc:
                raise ConfigError(reader.source, path.partition(": ")[2], exc.message) from exc
    return shapes


def _section(reader: FieldReader, name: str) -> FieldReader | None:
    """A sink section: absent or `false` disables the sink for this table."""
    value = reader.data.get(name)
    if value is False or value is None:
        return None
    return reader.child(name) if value is not True else FieldReader(reader.source, name, {})


def _search_route(reader: FieldReader, table: TableId) -> SearchRoute | None:
    section = _section(reader, "search")
    if section is None:
        return None
    section.reject_unknown(("index", "mapping", "settings", *SINK_SHAPE_KEYS))
    mapping, settings = section.data.get("mapping", {}), section.data.get("settings", {})
    for name, value in (("mapping", mapping), ("settings", settings)):
        if not isinstance(value, Mapping):
            raise section.error(name, "expected a mapping")
    index = section.str_("index", index_for(table.schema, table.table))
    problem = index_problem(index)
    if problem is not None:
        raise section.error("index", f"{index!r}: {problem}; set another name")
    return SearchRoute(index=index, mapping=mapping, settings=settings)


def _cache_route(reader: FieldReader, cache_prefix: str) -> CacheRoute | None:
    section = _section(reader, "cache")
    if section is None:
        return None
    section.reject_unknown(("prefix", "ttl_seconds", *SINK_SHAPE_KEYS))
    ttl = section.data.get("ttl_seconds")
    return CacheRoute(
        prefix=section.str_("prefix", cache_prefix),
        ttl_seconds=None if ttl is None else section.int_("ttl_seconds", 0),
    )


def _delta_route(reader: FieldReader, table: TableId) -> DeltaRoute | None:
    section = _section(reader, "delta")
    if section is None:
        return None
    section.reject_unknown(
        (
            "table",
            "partition_by",
            "change_data_feed",
            "history",
            "track",
            "history_table",
            *SINK_SHAPE_KEYS,
        )
    )
    target = _qualified(section, "table", str(table))
    history = section.bool_("history", False)
    track = section.str_list("track")
    history_table = section.optional_str("history_table")
    if not history and (track is not None or history_table is not None):
        raise section.error("history", "track and history_table need history: true")
    columns = reader.str_list("columns")
    untracked = [c for c in track or () if columns is not None and c not in columns]
    if untracked:
        raise section.error("track", f"{untracked} not among the table's columns {columns}")
    if track is not None and not track:
        raise section.error("track", "empty: list at least one column, or leave track out")
    return DeltaRoute(
        target.schema,
        target.table,
        section.str_list("partition_by") or (),
        change_data_feed=section.bool_("change_data_feed", False),
        history=history,
        track=tuple(track) if track is not None else None,
        history_table=(
            _qualified(section, "history_table", history_table) if history_table else None
        ),
    )


def _qualified(section: FieldReader, name: str, default: str) -> TableId:
    try:
        target = TableId.parse(section.str_(name, default))
    except ValueError as exc:
        raise section.error(name, str(exc)) from exc
    for part in (target.schema, target.table):
        problem = delta_problem(part)
        if problem is not None:
            raise section.error(name, f"{str(target)!r}: {problem}; set another name")
    return target


def _refuse_shared_names(
    root: FieldReader,
    routes: Mapping[TableId, TableRoute],
    documents: Mapping[str, DocumentSpec],
    topic_prefix: str,
    captured: Iterable[TableId],
) -> None:
    """Two tables sharing an index, a cache key space, a Delta directory or a topic would
    overwrite each other's rows (`Users` and `users` in one index, by id): refused, naming
    the settings that give each its own."""
    claims = []
    for table, route in routes.items():
        at, owner = f"tables.{table}", str(table)
        if route.search is not None:
            claims.append(Claim("search index", route.search.index, owner, f"{at}.search.index"))
        if route.cache is not None:
            key = route.cache.key(table, "")
            claims.append(Claim("cache key space", key, owner, f"{at}.cache.prefix", key + "*"))
        if route.delta is not None:
            delta = route.delta
            paths = [delta.relative_path()] + ([delta.history_relative_path()] * delta.history)
            for path in paths:
                # Compared without case: catalogs (Hive, Glue, Unity) and some file systems
                # do not tell `Users` from `users`.
                claims.append(Claim("Delta table", path.casefold(), owner, f"{at}.delta", path))
    for name, spec in documents.items():
        claims.append(Claim("search index", spec.index, f"document {name}", f"documents.{name}"))
    for table in captured:
        topic = topic_name(topic_prefix, table)
        # Kafka refuses a topic whose name differs from another's only by "." and "_".
        claims.append(Claim("Kafka topic", topic.replace(".", "_"), str(table), "topic", topic))
    shared = collisions(claims)
    if shared:
        fixes = {
            "search index": "give each its own search.index",
            "cache key space": "give each its own cache.prefix",
            "Delta table": "give each its own delta.table",
            "Kafka topic": "rename one of the tables, or capture them with two connectors "
            "(each its own topic.prefix)",
        }
        raise root.error(
            "tables",
            "; ".join(f"{describe(group)}: {fixes[group[0].store]}" for group in shared),
        )
