"""Convergence check: every sink holds exactly the source table's rows (DESIGN invariant 1).

Reads the routed tables from Postgres and the documents, cache entries and Delta rows the
conventions say they map to, canonicalises values (decimals, timestamps, JSON) so encodings
that are equal by meaning compare equal, and reports per table and sink.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import psycopg
import redis
from psycopg import sql
from psycopg.abc import Buffer
from psycopg.adapt import Loader

from cdc_sync.core.model import TableId, document_id
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.connector import converter_modes
from cdc_sync.debezium.database import SourceDatabase, source_database
from cdc_sync.mapping import MappingFile, TableRoute
from cdc_sync.schema import RowSchema
from cdc_sync.schema.catalog import (
    ConverterModes,
    catalog_columns,
    primary_key_columns,
    row_schema_from_catalog,
)
from cdc_sync.schema.source_rows import array_as_text, read_table, register_value_loaders
from cdc_sync.shape.rows import marked_deleted, sink_rows
from cdc_sync.shape.spec import SOFT_DELETE_COLUMNS
from cdc_sync.sinks.delta import history
from cdc_sync.sinks.delta import readback as delta_readback
from cdc_sync.sinks.redis import readback as cache_readback
from cdc_sync.sinks.search import readback as search_readback
from cdc_sync.sinks.search.backends import SearchBackend, open_backend
from cdc_sync.verify.documents import DocumentOracle
from cdc_sync.verify.soft_deletes import SoftDeleteSink

Rows = dict[str, dict[str, Any]]  # doc id -> canonical row
DOCUMENT_CHUNK = 500  # documents compared at a time
_NUMERIC = re.compile(r"-?\d+(\.\d+)?")
_MONEY_NOISE = re.compile(rb"[^0-9.\-]")
_ZONED_TIME = re.compile(r"\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}(:?\d{2})?)")


@dataclass
class SinkComparison:
    sink: str
    count: int
    missing: list[str] = field(default_factory=list)  # ids in source, absent in sink
    extra: list[str] = field(default_factory=list)  # ids in sink, absent in source
    different: list[str] = field(default_factory=list)  # ids whose values differ

    @property
    def matches(self) -> bool:
        return not (self.missing or self.extra or self.different)


@dataclass
class TableComparison:
    table: TableId
    source_count: int
    sinks: list[SinkComparison]

    @property
    def matches(self) -> bool:
        return all(s.matches for s in self.sinks)


@dataclass
class Report:
    tables: list[TableComparison]

    @property
    def converged(self) -> bool:
        return all(t.matches for t in self.tables)

    def table(self) -> str:
        sinks = sorted({s.sink for t in self.tables for s in t.sinks})
        header = ["table", "source", *sinks, "match"]
        lines = [header]
        for comparison in self.tables:
            counts = {s.sink: str(s.count) for s in comparison.sinks}
            lines.append(
                [
                    str(comparison.table),
                    str(comparison.source_count),
                    *(counts.get(s, "-") for s in sinks),
                    "yes" if comparison.matches else "NO",
                ]
            )
        widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
        text = "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in lines
        )
        problems = [
            f"  {t.table} {s.sink}: missing {s.missing[:5]} extra {s.extra[:5]} "
            f"different {s.different[:5]}"
            for t in self.tables
            for s in t.sinks
            if not s.matches
        ]
        return "\n".join([text, *problems])


class MoneyLoader(Loader):
    """`money` as a Decimal: Postgres renders it with the locale's symbol and separators."""

    def load(self, data: Buffer) -> Decimal:
        return Decimal(_MONEY_NOISE.sub(b"", bytes(data)).decode("ascii"))


def register_loaders(conn: psycopg.Connection[Any]) -> None:
    """Read Postgres values in the form the sinks' values are compared with."""
    conn.adapters.register_loader("money", MoneyLoader)
    register_value_loaders(conn)  # interval as int64 µs, time 24:00:00


def canonical(value: Any) -> Any:
    """One representation per meaning: sinks encode decimals, times and JSON differently."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float | Decimal):
        return _number(value)
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=UTC)
        return aware.astimezone(UTC).isoformat()
    if isinstance(value, time) and value.tzinfo is not None:
        return _utc_time(value)
    if isinstance(value, date | time):
        return value.isoformat()
    if isinstance(value, timedelta):  # a month-free interval (verify reads them as int µs)
        return _number(value // timedelta(microseconds=1))
    if isinstance(value, bytes | bytearray | memoryview):
        # JSON documents hold bytes as base64 text: compare in that form.
        return _canonical_string(base64.b64encode(bytes(value)).decode("ascii"))
    if isinstance(value, Mapping):
        return json.dumps({k: canonical(v) for k, v in value.items()}, sort_keys=True)
    if isinstance(value, list | tuple):
        return [canonical(v) for v in value]
    if isinstance(value, str):
        return _canonical_string(value)
    return str(value)


def _utc_time(value: time) -> str:
    moment = datetime.combine(date(2000, 1, 1), value).astimezone(UTC)
    return moment.time().isoformat() + "Z"


def _number(value: int | float | Decimal) -> str:
    try:
        normal = Decimal(str(value)).normalize()
    except InvalidOperation:
        return str(value)
    return format(normal, "f")


def _canonical_string(value: str) -> Any:
    stripped = value.strip()
    if stripped[:1] in "{[":
        try:
            return canonical(json.loads(stripped))
        except ValueError:
            return value
    if _NUMERIC.fullmatch(stripped):
        return _number(Decimal(stripped))
    if _ZONED_TIME.fullmatch(stripped):  # timetz, as Debezium's ZonedTime writes it
        try:
            return _utc_time(time.fromisoformat(stripped))
        except ValueError:
            return value
    if len(stripped) >= 19 and stripped[4:5] == "-" and stripped[10:11] in "T ":
        try:
            return canonical(datetime.fromisoformat(stripped.replace("Z", "+00:00")))
        except ValueError:
            return value
    return value


def canonical_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {name: canonical(value) for name, value in row.items()}


primary_key = primary_key_columns


def source_rows(conn: psycopg.Connection[Any], route: TableRoute) -> Rows:
    table = route.table
    key = primary_key(conn, table)
    columns = [
        sql.SQL("{}::text[] AS {}" if array_as_text(c) else "{}").format(
            sql.Identifier(c.name), sql.Identifier(c.name)
        )
        for c in catalog_columns(conn, table)
    ]
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(columns), sql.Identifier(table.schema, table.table)
    )
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cursor:
        cursor.execute(query)
        return {
            document_id(tuple((k, row[k]) for k in key)): canonical_row(route.project(row))
            for row in cursor
        }


def source_keys(conn: psycopg.Connection[Any], table: TableId) -> dict[str, tuple[Any, ...]]:
    """doc id -> primary-key values (in key order) of every row the table holds now."""
    key = primary_key(conn, table)
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(sql.Identifier(c) for c in key),
        sql.Identifier(table.schema, table.table),
    )
    with conn.cursor() as cursor:
        cursor.execute(query)
        return {document_id(tuple(zip(key, row, strict=True))): tuple(row) for row in cursor}


def search_rows(backend: SearchBackend, route: TableRoute) -> Rows:
    return canonical_rows(search_held(backend, route))


def cache_rows(client: redis.Redis, route: TableRoute) -> Rows:
    return canonical_rows(cache_held(client, route))


def delta_rows(warehouse: Path, route: TableRoute, key: list[str]) -> Rows:
    return canonical_rows(delta_held(warehouse, route, key))


def canonical_rows(held: Rows) -> Rows:
    return {ident: canonical_row(row) for ident, row in held.items()}


def search_held(backend: SearchBackend, route: TableRoute) -> Rows:
    """doc id -> `_source`, as the index holds it."""
    assert route.search is not None
    held = search_readback.documents(backend, route.search.index)
    return {ident: source for ident, (_, source) in held.items()}


def cache_held(client: redis.Redis, route: TableRoute) -> Rows:
    """doc id -> the cached row, as the cache holds it."""
    assert route.cache is not None
    return cache_readback.rows(client, route.cache, route.table)


def delta_held(warehouse: Path, route: TableRoute, key: list[str]) -> Rows:
    """doc id -> the row's columns (metadata columns left out), as the table holds them."""
    assert route.delta is not None
    held = delta_readback.rows_by_id(warehouse, route.delta, [route.rename.get(k, k) for k in key])
    markers = SOFT_DELETE_COLUMNS["delta"]  # row columns of `on_delete: soft`, not metadata
    return {
        ident: {k: v for k, v in row.items() if not k.startswith("_cdc_") or k in markers}
        for ident, row in held.items()
    }


class ShapedSource:
    """What each sink of a route should hold: the Postgres rows, shaped per sink by the job's
    rule (`cdc_sync.shape`: filters, computed / masked / hashed / dropped fields, markers)."""

    def __init__(
        self,
        conn: psycopg.Connection[Any],
        route: TableRoute,
        key: list[str],
        plain: Rows,
        modes: ConverterModes,
    ) -> None:
        """`plain`: every row Postgres holds, routed (doc id -> canonical row)."""
        self.conn, self.route, self.key, self.plain, self.modes = conn, route, key, plain, modes
        self._schema: RowSchema | None = None
        self._rows: list[dict[str, Any]] | None = None

    def rows_for(self, sink: str) -> Rows:
        shape = self.route.shape(sink)
        if shape.plain:
            return self.plain
        schema, rows = self._read()
        shaped = sink_rows(self.route, shape, self.route.table, schema, self.key, rows)
        return {ident: canonical_row(row) for ident, row in shaped.items()}

    def compare(self, sink: str, held: Rows) -> SinkComparison:
        """What `sink` holds (`held`: as the sink holds it) against what it should."""
        shape = self.route.shape(sink)
        gone = {
            ident: row
            for ident, row in held.items()
            if ident not in self.plain and marked_deleted(shape, row)
        }
        misplaced = (
            SoftDeleteSink(self.route, shape, self._read()[0]).misplaced(
                self.conn, catalog_columns(self.conn, self.route.table), self.key, gone
            )
            if gone
            else set()
        )
        return compare_sink(
            self.route, sink, self.rows_for(sink), canonical_rows(held), self.plain, misplaced
        )

    def _read(self) -> tuple[RowSchema, list[dict[str, Any]]]:
        if self._schema is None or self._rows is None:
            self._schema = row_schema_from_catalog(self.conn, self.route.table, self.modes)
            self._rows = read_table(self.conn, self.route.table, self._schema.columns, self.modes)
        return self._schema, self._rows


def compare_sink(
    route: TableRoute,
    sink: str,
    expected: Rows,
    actual: Rows,
    present: Collection[str] = frozenset(),
    misplaced: Collection[str] = frozenset(),
) -> SinkComparison:
    """`compare`, where a soft-deleted row (`on_delete: soft`) is expected only where Postgres
    lacks the row (`verify.soft_deletes`). `present`: the ids of every row Postgres holds; a
    marked one differs when the sink should hold it live, and is extra when its filter
    excludes it. `misplaced`: marked rows of keys Postgres lacks that the sink cannot have
    marked (stubs, rows outside its filter): extra."""
    shape = route.shape(sink)
    marked = {ident for ident, row in actual.items() if marked_deleted(shape, row)}
    live = {ident: row for ident, row in actual.items() if ident not in marked}
    if shape.soft:  # rows written before `on_delete: soft` was set have no marker: not deleted
        deleted = shape.markers[0]
        live = {
            i: row if row.get(deleted) is not None else row | {deleted: False}
            for i, row in live.items()
        }
    result = compare(sink, expected, live)
    result.count = len(actual)
    result.missing = [ident for ident in result.missing if ident not in marked]
    result.different = sorted({*result.different, *(marked & expected.keys())})
    excluded = (marked & set(present)) - expected.keys()
    result.extra = sorted({*result.extra, *excluded, *(marked & set(misplaced))})
    return result


def history_rows(warehouse: Path, route: TableRoute) -> tuple[Rows, list[str]]:
    """The history's current rows (`_is_current`) by doc id, and the ids whose versions break
    the interval rules (gaps, overlaps, more than one current row)."""
    assert route.delta is not None
    by_id: dict[str, list[dict[str, Any]]] = {}
    for row in delta_readback.history_rows(warehouse, route.delta):
        by_id.setdefault(str(row[history.ID]), []).append(row)
    current = {
        ident: canonical_row({k: v for k, v in row.items() if k not in history.HISTORY_COLUMNS})
        for ident, rows in by_id.items()
        for row in rows
        if row[history.IS_CURRENT]
    }
    broken = sorted(ident for ident, rows in by_id.items() if history.interval_problems(rows))
    return current, broken


def document_comparison(
    conn: psycopg.Connection[Any],
    mapping: MappingFile,
    name: str,
    backend: SearchBackend,
    modes: ConverterModes,
    chunk: int = DOCUMENT_CHUNK,
) -> TableComparison:
    """A document index against every document Postgres computes now (`verify.documents`: the
    spec's join as SQL), a chunk at a time: the documents stream from Postgres, the index is
    read by their ids; what it holds beyond them is extra. Memory: a chunk and the ids."""
    spec = mapping.documents[name]
    held = set(search_readback.stored_versions(backend, spec.index))
    result = SinkComparison(f"{DOCUMENT_PREFIX}{name}", len(held))
    seen: set[str] = set()
    documents = DocumentOracle(conn, spec, modes).documents(chunk)
    while expected := dict(itertools.islice(documents, chunk)):
        actual = search_readback.sources(backend, spec.index, sorted(expected))
        for ident, document in expected.items():
            if ident not in actual:
                result.missing.append(ident)
            elif canonical_row(document) != canonical_row(as_source_has(actual[ident], document)):
                result.different.append(ident)
        seen.update(expected)
    result.missing.sort()
    result.different.sort()
    result.extra = sorted(held - seen)
    return TableComparison(spec.table, len(seen), [result])


def as_source_has(held: Any, wanted: Any) -> Any:
    """`held` with only the fields `wanted` has, at every level of a nested document: as for a
    flat row (`compare`), a column dropped in Postgres may stay in documents written before."""
    if isinstance(held, Mapping) and isinstance(wanted, Mapping):
        return {k: as_source_has(held[k], wanted[k]) for k in wanted if k in held}
    if isinstance(held, list) and isinstance(wanted, list) and len(held) == len(wanted):
        return [as_source_has(h, w) for h, w in zip(held, wanted, strict=True)]
    return held


def compare(sink: str, expected: Rows, actual: Rows) -> SinkComparison:
    result = SinkComparison(sink, len(actual))
    result.missing = sorted(set(expected) - set(actual))
    result.extra = sorted(set(actual) - set(expected))
    for ident in sorted(set(expected) & set(actual)):
        # The source's columns decide: a column dropped in Postgres may stay in a sink (the
        # evolve policy keeps it for older rows), and must not count as a difference.
        wanted = expected[ident]
        held = {name: actual[ident].get(name) for name in wanted}
        if wanted != held:
            result.different.append(ident)
    return result


SINK_NAMES = ("search", "cache", "delta")
# A document index's column in the report (documents live in the search server: `search`).
DOCUMENT_PREFIX = "document "


def verify_all(
    mapping: MappingFile,
    connections: Connections,
    tables: Collection[TableId] | None = None,
    sinks: Collection[str] | None = None,
    source: SourceDatabase | None = None,
) -> Report:
    """Every routed table (or those in `tables`) against every sink (or those in `sinks`).
    `source`: the captured database (default: resolved from the mapping's connector)."""
    source = source or source_database(connections, mapping.connector)
    warehouse = Path(connections.require("warehouse"))
    wanted = set(SINK_NAMES if sinks is None else sinks)
    cache = (
        redis.Redis.from_url(connections.redis_url)
        if connections.redis_url and "cache" in wanted
        else None
    )
    search = (
        open_backend(connections.search_client, connections.search_url)
        if connections.search_url and "search" in wanted
        else None
    )
    report: list[TableComparison] = []
    modes = converter_modes(mapping.connector)
    try:
        with psycopg.connect(source.conninfo) as conn:
            # Verify reads only; the filters it evaluates in Postgres (`soft_deletes`) too.
            conn.read_only = True
            register_loaders(conn)
            for route in mapping.tables.values():
                if tables is not None and route.table not in tables:
                    continue
                if not route.sinks():
                    continue  # only document indices hold its rows: checked with them below
                expected = source_rows(conn, route)
                key = primary_key(conn, route.table)
                held: list[tuple[str, Rows]] = []
                if route.search is not None and "search" in wanted:
                    backend = search or open_backend(
                        connections.search_client, connections.require("search_url")
                    )
                    held.append(("search", search_held(backend, route)))
                if route.cache is not None and cache is not None:
                    held.append(("cache", cache_held(cache, route)))
                if route.delta is not None and "delta" in wanted:
                    held.append(("delta", delta_held(warehouse, route, key)))
                shaped = ShapedSource(conn, route, key, expected, modes)
                comparisons = [shaped.compare(name, rows) for name, rows in held]
                if route.delta is not None and route.delta.history and "delta" in wanted:
                    # A history's Delta shape is plain (mapping): its rows are the table's.
                    current, broken = history_rows(warehouse, route)
                    checked = compare("history", expected, current)
                    checked.different = sorted({*checked.different, *broken})
                    comparisons.append(checked)
                report.append(TableComparison(route.table, len(expected), comparisons))
            if "search" in wanted:
                for name, spec in mapping.documents.items():
                    if tables is None or spec.table in tables:
                        backend = search or open_backend(
                            connections.search_client, connections.require("search_url")
                        )
                        report.append(document_comparison(conn, mapping, name, backend, modes))
    finally:  # repeated verifies (repair, tests polling) must not leak connections
        if cache is not None:
            cache.close()
        if search is not None:
            search.close()
    return Report(report)
