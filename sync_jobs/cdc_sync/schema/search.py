"""Default search field mapping per column type (a mapping file's explicit mapping wins)."""

from __future__ import annotations

from typing import Any

from cdc_sync.core.types import ColumnType, TypeKind

_MAPPINGS: dict[TypeKind, dict[str, Any]] = {
    TypeKind.BOOLEAN: {"type": "boolean"},
    # Every integer is a long: a widened column (int4 -> int8) then needs no reindex.
    TypeKind.INT16: {"type": "long"},
    TypeKind.INT32: {"type": "long"},
    TypeKind.INT64: {"type": "long"},
    TypeKind.FLOAT32: {"type": "float"},
    TypeKind.FLOAT64: {"type": "double"},
    TypeKind.STRING: {
        "type": "text",
        "fields": {"keyword": {"type": "keyword", "ignore_above": 256}},
    },
    TypeKind.BYTES: {"type": "binary"},
    # _source keeps the exact decimal text; the indexed double serves range queries and sorting.
    TypeKind.DECIMAL: {"type": "double"},
    TypeKind.DATE: {"type": "date"},
    TypeKind.TIME: {"type": "keyword"},
    TypeKind.TIMESTAMP: {"type": "date"},
    TypeKind.TIMESTAMP_TZ: {"type": "date"},
    TypeKind.JSON: {"type": "object", "enabled": False},
    TypeKind.UUID: {"type": "keyword"},
}


def search_field_mapping(column_type: ColumnType) -> dict[str, Any]:
    if column_type.kind is TypeKind.ARRAY and column_type.element is not None:
        return search_field_mapping(column_type.element)  # search fields are multi-valued
    return dict(_MAPPINGS[column_type.kind])
