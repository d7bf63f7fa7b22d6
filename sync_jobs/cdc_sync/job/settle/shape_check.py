"""At start: the mapping's shapes (filters, computed fields, hashes) hold against the captured
tables' columns, and every hash secret is set; else the job does not start, naming the file and
field path (`mappings validate` reports the same expression problems). The hash secrets are
read here, once, on the driver."""

from __future__ import annotations

from dataclasses import replace

import psycopg

from cdc_sync.core.errors import ConfigError
from cdc_sync.debezium.database import SourceDatabase
from cdc_sync.mapping import MappingFile
from cdc_sync.schema.catalog import (
    ConverterModes,
    primary_key_columns,
    row_schema_from_catalog,
)
from cdc_sync.shape.checks import missing_secrets, shape_problems


def check_shapes(
    mapping: MappingFile, source: SourceDatabase, modes: ConverterModes
) -> MappingFile:
    """The mapping with its hash secrets read (carried to the write tasks with the routes)."""
    shaped = [route for route in mapping.tables.values() if route.shapes]
    if not shaped:
        return mapping
    for route in shaped:
        for error in missing_secrets(route.shapes):
            raise error
    with psycopg.connect(source.conninfo) as conn:
        for route in shaped:
            schema = row_schema_from_catalog(conn, route.table, modes)
            key = primary_key_columns(conn, route.table)
            for where, message in shape_problems(route, route.shapes, schema, key):
                source_file, _, path = where.partition(": ")
                raise ConfigError(source_file, path, message)
    bound = {
        table: replace(route, shapes={s: shape.bound() for s, shape in route.shapes.items()})
        for table, route in mapping.tables.items()
    }
    return replace(mapping, tables=bound)
