"""Debezium/Kafka Connect schemas -> row schemas, Arrow/Spark types, Python and JSON values."""

from sync_jobs.schema.arrow import arrow_type, arrow_value
from sync_jobs.schema.connect import column_type_from_connect, row_schema_from_connect
from sync_jobs.schema.search import search_field_mapping
from sync_jobs.schema.types import (
    UNAVAILABLE_VALUE,
    Column,
    ColumnType,
    RowSchema,
    SchemaConversionError,
    TypeKind,
)
from sync_jobs.schema.values import convert_row, convert_value, to_json_value

__all__ = [
    "UNAVAILABLE_VALUE",
    "Column",
    "ColumnType",
    "RowSchema",
    "SchemaConversionError",
    "TypeKind",
    "arrow_type",
    "arrow_value",
    "column_type_from_connect",
    "convert_row",
    "convert_value",
    "row_schema_from_connect",
    "search_field_mapping",
    "to_json_value",
]
