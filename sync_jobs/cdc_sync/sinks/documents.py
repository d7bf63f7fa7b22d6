"""Routed rows -> JSON-safe documents (search `_source`, cache `row`), shared by both sinks.

Values are encoded by their column type when the change carries a schema (`to_json_value`), else
by Python type: exact types stay exact (Decimal as a string, not a float), times as ISO 8601.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from cdc_sync.schema import ColumnType, RowSchema, to_json_value


def json_document(row: Mapping[str, Any], schema: RowSchema | None) -> dict[str, Any]:
    types: dict[str, ColumnType] = (
        {column.name: column.type for column in schema.columns} if schema is not None else {}
    )
    return {
        name: (to_json_value(types[name], value) if name in types else json_by_python_type(value))
        for name, value in row.items()
    }


def json_by_python_type(value: Any) -> Any:
    """Fallback when no column type is known (unit tests, columns outside the change's schema)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Decimal):
        return str(value)  # a float would round: keep every digit
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): json_by_python_type(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [json_by_python_type(v) for v in value]
    raise TypeError(f"no JSON encoding for a value of type {type(value).__name__}")
