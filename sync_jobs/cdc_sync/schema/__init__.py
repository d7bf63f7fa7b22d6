"""Debezium/Kafka Connect schemas -> row schemas, Arrow/Spark types, Python and JSON values."""

from cdc_sync.core.types import (
    Column,
    ColumnType,
    RowSchema,
    SchemaConversionError,
    TypeKind,
)
from cdc_sync.schema.arrow import arrow_type, arrow_value
from cdc_sync.schema.connect import column_type_from_connect, row_schema_from_connect
from cdc_sync.schema.search import search_field_mapping
from cdc_sync.schema.unavailable import UNAVAILABLE_VALUE
from cdc_sync.schema.values import convert_row, convert_value, from_json_value, to_json_value

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
    "from_json_value",
    "row_schema_from_connect",
    "search_field_mapping",
    "to_json_value",
]
