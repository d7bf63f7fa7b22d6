"""Column types of a row, independent of where they came from (Connect schema, catalog)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property


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
