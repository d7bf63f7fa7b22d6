"""`cdc-sync mappings validate`: a mapping file against the live catalog and search mappings.

Checks, each reported with the file and the field path to change: every captured table is routed
or ignored; routed tables exist and have a primary key; every column type converts; projections
and renames name real columns; explicit search field types suit the converted column types, and
an existing index agrees with the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from cdc_sync.core.model import TableId
from cdc_sync.debezium.connector import ConnectorFile, captured_tables
from cdc_sync.mapping import MappingFile, TableRoute
from cdc_sync.schema import ColumnType, RowSchema, SchemaConversionError, TypeKind
from cdc_sync.schema.catalog import (
    ConverterModes,
    primary_key_columns,
    quoted,
    row_schema_from_catalog,
)
from cdc_sync.shape.checks import shape_problems
from cdc_sync.sinks.search.backends import SearchBackend
from cdc_sync.sinks.search.readback import field_types
from cdc_sync.verify.document_check import document_findings

NUMBER_FIELDS = {
    "long",
    "integer",
    "short",
    "byte",
    "double",
    "float",
    "half_float",
    "scaled_float",
}
TEXT_FIELDS = {
    "text",
    "keyword",
    "match_only_text",
    "wildcard",
    "search_as_you_type",
    "constant_keyword",
}
DATE_FIELDS = {"date", "date_nanos"}
# Which search field types can hold a column of each kind (keyword holds any scalar as text).
COMPATIBLE: dict[TypeKind, set[str]] = {
    TypeKind.BOOLEAN: {"boolean", "keyword"},
    TypeKind.INT16: NUMBER_FIELDS | {"keyword"},
    TypeKind.INT32: NUMBER_FIELDS - {"byte", "short"} | {"keyword"},
    TypeKind.INT64: {"long", "double", "float", "scaled_float", "keyword", "unsigned_long"},
    TypeKind.FLOAT32: {"float", "double", "half_float", "scaled_float", "keyword"},
    TypeKind.FLOAT64: {"double", "float", "scaled_float", "keyword"},
    TypeKind.DECIMAL: {"double", "float", "scaled_float", "keyword", "text"},
    TypeKind.STRING: TEXT_FIELDS | {"ip", "flattened"},
    TypeKind.BYTES: {"binary"},
    TypeKind.DATE: DATE_FIELDS | {"keyword"},
    TypeKind.TIME: {"keyword", "text"},
    TypeKind.TIMESTAMP: DATE_FIELDS | {"keyword"},
    TypeKind.TIMESTAMP_TZ: DATE_FIELDS | {"keyword"},
    TypeKind.JSON: {"object", "nested", "flattened", "flat_object"},
    TypeKind.UUID: {"keyword", "text"},
}


@dataclass(frozen=True)
class Finding:
    path: str  # `<file>: <field path>`
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def validate_mapping(
    mapping: MappingFile,
    conn: psycopg.Connection[Any],
    connector: ConnectorFile | None,
    live_search_fields: Mapping[TableId, Mapping[str, str]] | None = None,
) -> list[Finding]:
    findings: list[Finding] = []
    at = lambda field: f"{mapping.path}: {field}"  # noqa: E731 - reads better than a def here
    modes = ConverterModes.from_connector(connector.config if connector else {})
    if connector is not None:
        captured = captured_tables(conn, connector)
        for table in mapping.uncovered(captured):
            findings.append(
                Finding(at("tables"), f"captured table {table} is neither routed nor ignored")
            )
        heartbeat = mapping.heartbeat_table
        if heartbeat is not None and heartbeat not in captured:
            findings.append(
                Finding(
                    at("source.heartbeat_table"),
                    f"{heartbeat} is not captured by {connector.path}: create it and add it to "
                    "table.include.list (its heartbeat.action.query writes it)",
                )
            )
    for table, route in mapping.tables.items():
        documents_only = route.documents and not route.sinks()
        where = f"documents ({table})" if documents_only else f"tables.{table}"
        findings += _check_table(conn, route, modes, at(where))
        live = (live_search_fields or {}).get(table)
        if live and route.search is not None:
            findings += _check_live_index(route, live, at(f"tables.{table}.search.mapping"))
    findings += [
        Finding(at(field), message) for field, message in document_findings(mapping, conn, modes)
    ]
    return findings


def _check_table(
    conn: psycopg.Connection[Any], route: TableRoute, modes: ConverterModes, path: str
) -> list[Finding]:
    table = route.table
    exists = conn.execute("SELECT to_regclass(%s)", (quoted(table),)).fetchone()
    if exists is None or exists[0] is None:
        return [Finding(path, f"table {table} does not exist in the source database")]
    findings: list[Finding] = []
    if not primary_key_columns(conn, table):
        findings.append(Finding(path, f"{table} has no primary key (sinks key rows by it)"))
    try:
        schema = row_schema_from_catalog(conn, table, modes)
    except SchemaConversionError as exc:
        return [*findings, Finding(path, str(exc))]
    names = set(schema.names)
    for column in route.columns or ():
        if column not in names:
            findings.append(Finding(f"{path}.columns", f"no column {column!r} in {table}"))
    for source in route.rename:
        if source not in names:
            findings.append(Finding(f"{path}.rename.{source}", f"no column {source!r} in {table}"))
    key = primary_key_columns(conn, table)
    shaping = [
        Finding(at, message) for at, message in shape_problems(route, route.shapes, schema, key)
    ]
    findings += shaping
    if route.search is not None and not shaping:
        findings += _check_search_fields(
            route, route.sink_schema("search", schema), f"{path}.search.mapping"
        )
    return findings


def _check_search_fields(route: TableRoute, schema: RowSchema, path: str) -> list[Finding]:
    assert route.search is not None
    properties = route.search.mapping.get("properties", {})
    types = {c.name: c.type for c in schema.columns}
    findings = []
    for name, spec in properties.items():
        field_path = f"{path}.properties.{name}"
        if name not in types:
            findings.append(Finding(field_path, "no such routed column (check columns/rename)"))
            continue
        field_type = spec.get("type", "object") if isinstance(spec, Mapping) else None
        if field_type not in _compatible(types[name]):
            findings.append(
                Finding(field_path, f"type {field_type!r} cannot hold a {types[name]} column")
            )
    return findings


def _check_live_index(route: TableRoute, live: Mapping[str, str], path: str) -> list[Finding]:
    assert route.search is not None
    findings = []
    for name, spec in route.search.mapping.get("properties", {}).items():
        wanted = spec.get("type", "object") if isinstance(spec, Mapping) else None
        if name in live and live[name] != wanted:
            findings.append(
                Finding(
                    f"{path}.properties.{name}",
                    f"the live index {route.search.index} maps it as {live[name]!r}, "
                    f"the file says {wanted!r} (a type change needs a reindex)",
                )
            )
    return findings


def _compatible(column_type: ColumnType) -> set[str]:
    if column_type.kind is TypeKind.ARRAY and column_type.element is not None:
        return _compatible(column_type.element)
    return COMPATIBLE[column_type.kind]


def live_search_fields(
    backend: SearchBackend, mapping: MappingFile
) -> dict[TableId, dict[str, str]]:
    """Field types of the indices that exist now, per routed table (absent when none exist)."""
    fields: dict[TableId, dict[str, str]] = {}
    for table, route in mapping.tables.items():
        if route.search is not None and (types := field_types(backend, route.search.index)):
            fields[table] = types
    return fields


def format_findings(findings: Iterable[Finding]) -> str:
    return "\n".join(str(f) for f in findings)
