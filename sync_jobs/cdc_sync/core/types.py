"""Column types of a row, independent of where they came from (Connect schema, catalog)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any, TypeVar


class SchemaConversionError(ValueError):
    """A Connect schema or value that cannot be converted; the message names the field."""


class TypeKind(StrEnum):
    BOOLEAN = "boolean"
    INT16 = "int16"
    INT32 = "int32"
    INT64 = "int64"
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    STRING = "string"
    BYTES = "bytes"
    DECIMAL = "decimal"  # precision None = variable scale (Postgres numeric without typmod)
    DATE = "date"
    TIME = "time"  # kept as "HH:MM:SS[.ffffff]": Delta has no time type
    TIMESTAMP = "timestamp"  # without time zone
    TIMESTAMP_TZ = "timestamp_tz"  # UTC
    JSON = "json"  # JSON text, exact as Postgres rendered it
    UUID = "uuid"
    ARRAY = "array"


@dataclass(frozen=True)
class ColumnType:
    kind: TypeKind
    optional: bool = True
    precision: int | None = None
    scale: int | None = None
    element: ColumnType | None = None  # ARRAY only
    # How the value arrives, not how it is stored: TIME/TIMESTAMP "ms", "us", "ns" since
    # midnight/epoch; an INT64 interval "iso8601" (ISO duration text decoded to microseconds).
    unit: str | None = None

    def __str__(self) -> str:
        if self.kind is TypeKind.DECIMAL:
            return (
                f"decimal({self.precision or '*'},{self.scale if self.scale is not None else '*'})"
            )
        if self.kind is TypeKind.ARRAY and self.element is not None:
            return f"array<{self.element}>"
        return self.kind.value


@dataclass(frozen=True)
class Column:
    name: str
    type: ColumnType


@dataclass(frozen=True)
class RowSchema:
    columns: tuple[Column, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)

    @cached_property
    def fingerprint(self) -> str:
        text = ";".join(f"{c.name}:{c.type!r}" for c in self.columns)
        return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]


@dataclass(frozen=True)
class KnownSchema:
    """A table's key and row schemas, for records that carry none (schemas.enable=false)."""

    key: RowSchema
    row: RowSchema


# JSON form of a row schema: every field written explicitly, read back strictly, so a stored
# schema compares equal (and has the same fingerprint) as the one that was saved.
_T = TypeVar("_T")
_COLUMN_TYPE_KEYS = frozenset({"kind", "optional", "precision", "scale", "element", "unit"})


def column_type_to_json(column_type: ColumnType) -> dict[str, Any]:
    return {
        "kind": column_type.kind.value,
        "optional": column_type.optional,
        "precision": column_type.precision,
        "scale": column_type.scale,
        "element": column_type_to_json(column_type.element) if column_type.element else None,
        "unit": column_type.unit,
    }


def column_type_from_json(data: object) -> ColumnType:
    """Raises ValueError naming the offending key on anything `column_type_to_json` can't give."""
    if not isinstance(data, dict) or set(data) != _COLUMN_TYPE_KEYS:
        raise ValueError(f"a column type needs exactly the keys {sorted(_COLUMN_TYPE_KEYS)}")
    element = data["element"]
    return ColumnType(
        kind=TypeKind(_typed(data, "kind", str)),
        optional=_typed(data, "optional", bool),
        precision=_optional(data, "precision", int),
        scale=_optional(data, "scale", int),
        element=column_type_from_json(element) if element is not None else None,
        unit=_optional(data, "unit", str),
    )


def row_schema_to_json(schema: RowSchema) -> list[dict[str, Any]]:
    return [{"name": c.name, "type": column_type_to_json(c.type)} for c in schema.columns]


def row_schema_from_json(data: object) -> RowSchema:
    if not isinstance(data, list):
        raise ValueError("a row schema is a list of columns")
    columns = []
    for item in data:
        if not isinstance(item, dict) or set(item) != {"name", "type"}:
            raise ValueError("a column needs exactly the keys ['name', 'type']")
        columns.append(Column(_typed(item, "name", str), column_type_from_json(item["type"])))
    return RowSchema(tuple(columns))


def _typed(data: dict[str, Any], key: str, kind: type[_T]) -> _T:
    value = data[key]
    # bool is an int subclass: an int field must not accept true/false.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{key}: expected {kind.__name__}, got {value!r}")
    return value


def _optional(data: dict[str, Any], key: str, kind: type[_T]) -> _T | None:
    return None if data[key] is None else _typed(data, key, kind)
