"""The shape settings of one sink of one table, parsed from a mapping (table level + sink level).

A sink's section may set `filter`, `computed`, `mask`, `hash`, `drop`, `columns` and
`on_delete`; the table level sets the same keys (but `columns`, which is the table's
projection) for every sink. The sink's own values add to the table's: both filters must hold,
computed/mask entries of the sink win on the same name.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from cdc_sync.core.errors import ConfigError, FieldReader
from cdc_sync.core.types import Column, ColumnType, TypeKind


class OnDelete(StrEnum):
    DELETE = "delete"  # the row leaves the sink (a fenced delete)
    SOFT = "soft"  # the row stays, marked deleted at the delete's version and commit time


# Soft-delete marker columns per sink: documents gain `_deleted` / `_deleted_at`; Delta keeps
# its metadata columns prefixed `_cdc_` (`_cdc_deleted` is already the MERGE's control column).
SOFT_DELETE_COLUMNS: Mapping[str, tuple[str, str]] = {
    "search": ("_deleted", "_deleted_at"),
    "cache": ("_deleted", "_deleted_at"),
    "delta": ("_cdc_is_deleted", "_cdc_deleted_at"),
}
DELETED_TYPE = ColumnType(TypeKind.BOOLEAN)
DELETED_AT_TYPE = ColumnType(TypeKind.TIMESTAMP_TZ)
HASH_TYPE = ColumnType(TypeKind.STRING)
MASK_TYPE = ColumnType(TypeKind.STRING)

SHAPE_KEYS = ("filter", "computed", "mask", "hash", "drop", "on_delete")
SINK_SHAPE_KEYS = (*SHAPE_KEYS, "columns")


@dataclass(frozen=True)
class HashSpec:
    """Salted HMAC-SHA256 of `fields`, keyed by the secret in environment variable `secret_env`
    (read where the rows are shaped; never logged, never held in the mapping)."""

    fields: tuple[str, ...]
    secret_env: str
    path: str  # where it is set: `<file>: tables.<t>.<sink>.hash`, for errors
    # Read once at job start on the driver (`bound`) and carried to the write tasks with the
    # route, so executors need no environment of their own; never printed.
    key: bytes | None = field(default=None, repr=False, compare=False)

    def bound(self) -> HashSpec:
        return replace(self, key=self.secret())

    def secret(self) -> bytes:
        if self.key is not None:
            return self.key
        value = os.environ.get(self.secret_env)
        if not value:
            raise ConfigError(
                self.path.partition(": ")[0],
                f"{self.path.partition(': ')[2]}.secret_env",
                f"environment variable {self.secret_env} is not set "
                f"(it keys the hash of {', '.join(self.fields)})",
            )
        return value.encode()


@dataclass(frozen=True)
class SinkShape:
    """One sink's view of a table's rows. Names: `computed` and `filter` read the table's
    source columns (before projection and renames); `mask`, `hash`, `drop`, `columns` name the
    sink's fields (after renames, computed fields included)."""

    sink: str
    path: str  # `<file>: tables.<schema.table>.<sink>`: named in errors
    filters: tuple[tuple[str, str], ...] = ()  # (field path, SQL predicate): all must hold
    computed: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # name -> (path, SQL)
    mask: Mapping[str, str] = field(default_factory=dict)  # field -> fixed replacement
    hash: HashSpec | None = None
    drop: tuple[str, ...] = ()
    columns: tuple[str, ...] | None = None  # the sink's fields; None = all
    on_delete: OnDelete = OnDelete.DELETE

    @property
    def plain(self) -> bool:
        """Nothing to shape: the sink gets the routed rows as they are."""
        return not (
            self.filters
            or self.computed
            or self.mask
            or self.hash
            or self.drop
            or self.columns is not None
            or self.soft
        )

    @property
    def soft(self) -> bool:
        return self.on_delete is OnDelete.SOFT

    @property
    def markers(self) -> tuple[str, str]:
        return SOFT_DELETE_COLUMNS[self.sink]

    def marker_columns(self) -> tuple[Column, ...]:
        deleted, at = self.markers
        return (Column(deleted, DELETED_TYPE), Column(at, DELETED_AT_TYPE)) if self.soft else ()

    def mark(self, source_ts_ms: int | None) -> dict[str, Any]:
        """The markers of a row deleted at commit time `source_ts_ms` (None: unknown)."""
        deleted, at = self.markers
        when = None if source_ts_ms is None else datetime.fromtimestamp(source_ts_ms / 1000, UTC)
        return {deleted: True, at: when}

    def keeps(self, name: str) -> bool:
        """Whether the sink holds field `name` (after `columns` and `drop`)."""
        if name in self.drop:
            return False
        return self.columns is None or name in self.columns or name in self.markers

    def bound(self) -> SinkShape:
        """With the hash secret read (ConfigError naming the field when it is unset)."""
        return self if self.hash is None else replace(self, hash=self.hash.bound())

    def hashed(self, name: str) -> bool:
        return self.hash is not None and name in self.hash.fields


@dataclass(frozen=True)
class ShapeSettings:
    """The keys of one level (table or sink), before the two levels are combined."""

    path: str
    filter: str | None = None
    computed: Mapping[str, str] = field(default_factory=dict)
    mask: Mapping[str, str] = field(default_factory=dict)
    hash: HashSpec | None = None
    drop: tuple[str, ...] = ()
    columns: tuple[str, ...] | None = None
    on_delete: OnDelete | None = None


def read_settings(reader: FieldReader, with_columns: bool) -> ShapeSettings:
    """The shape keys of a table or sink section (other keys are the caller's)."""
    data = reader.data
    where = f"{reader.source}: {reader.path}"
    predicate = reader.optional_str("filter")
    computed = reader.str_map("computed")
    mask = _mask(reader)
    on_delete = data.get("on_delete")
    if on_delete is not None:
        on_delete = OnDelete(reader.choice("on_delete", [m.value for m in OnDelete], "delete"))
    return ShapeSettings(
        path=where,
        filter=predicate,
        computed=computed,
        mask=mask,
        hash=_hash(reader, where) if data.get("hash") is not None else None,
        drop=reader.str_list("drop") or (),
        columns=reader.str_list("columns") if with_columns else None,
        on_delete=on_delete,
    )


def _mask(reader: FieldReader) -> dict[str, str]:
    value = reader.data.get("mask") or {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise reader.error("mask", "expected a mapping of field: replacement text")
    return dict(value)


def _hash(reader: FieldReader, where: str) -> HashSpec:
    section = reader.child("hash")
    section.reject_unknown(("fields", "secret_env"))
    fields = section.str_list("fields")
    if not fields:
        raise section.error("fields", "expected a non-empty list of field names")
    return HashSpec(fields, section.str_("secret_env"), f"{where}.hash")


def combine(sink: str, table: ShapeSettings, own: ShapeSettings | None) -> SinkShape:
    """A sink's shape: the table's settings, then the sink's (filters both hold)."""
    levels = [table, *([own] if own is not None else [])]
    filters = tuple((f"{s.path}.filter", s.filter) for s in levels if s.filter)
    computed = {
        name: (f"{s.path}.computed.{name}", sql) for s in levels for name, sql in s.computed.items()
    }
    on_delete = next((s.on_delete for s in reversed(levels) if s.on_delete), OnDelete.DELETE)
    hashes = [s.hash for s in levels if s.hash is not None]
    return SinkShape(
        sink=sink,
        path=levels[-1].path,
        filters=filters,
        computed=computed,
        mask={k: v for s in levels for k, v in s.mask.items()},
        hash=hashes[-1] if hashes else None,
        drop=tuple(dict.fromkeys(name for s in levels for name in s.drop)),
        columns=own.columns if own is not None else None,
        on_delete=on_delete,
    )
