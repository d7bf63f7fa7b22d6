"""Debezium's placeholder for an unchanged TOAST value, in every form it takes per column type.

Under REPLICA IDENTITY DEFAULT an update (and the create of a primary-key move) leaves unchanged
out-of-line values out of the WAL, and Debezium puts `unavailable.value.placeholder` in their
place, encoded as the column's type allows. Observed with Debezium 3.x (pgoutput):

| column | placeholder |
| --- | --- |
| text, varchar, json, jsonb, xml, uuid, enum; bytea in `hex` mode | the marker string |
| bytea (`bytes` mode) | base64 of the marker's bytes |
| text[] and other string arrays | `[marker]` |
| int[], bigint[] and other number arrays | the marker's bytes as numbers |
| hstore (`json` mode / `map` mode) | `{"marker":"marker"}` as text / as a map |
| numeric[], other non-string, non-number arrays; bytea in `base64` modes | null (not converted) |

The last row cannot be told from a real null, so a null there in a create or update counts as
unavailable too: the job then reads the value from Postgres, which returns the true one, null
included, so a false alarm costs a read and never a wrong value. (`base64` bytea columns are
plain strings on the wire, indistinguishable from text: `cdc-sync connectors validate` warns
about that mode instead.)
"""

from __future__ import annotations

import base64
import json
from typing import Any

from cdc_sync.core.types import ColumnType, TypeKind

UNAVAILABLE_VALUE = "__debezium_unavailable_value"
_MARKER_BYTES = UNAVAILABLE_VALUE.encode("ascii")
_MARKER_BASE64 = base64.b64encode(_MARKER_BYTES).decode("ascii")
_MARKER_NUMBERS = list(_MARKER_BYTES)
_MARKER_MAP = {UNAVAILABLE_VALUE: UNAVAILABLE_VALUE}
_NUMBER_KINDS = {
    TypeKind.INT16,
    TypeKind.INT32,
    TypeKind.INT64,
    TypeKind.FLOAT32,
    TypeKind.FLOAT64,
}
_STRING_ELEMENT_KINDS = {TypeKind.STRING, TypeKind.JSON, TypeKind.UUID}


def is_unavailable(column_type: ColumnType, raw: Any, may_hold_placeholders: bool) -> bool:
    """Whether `raw` (the JSON value of a column in `after`) is the placeholder.
    `may_hold_placeholders`: the event is a create or an update (never a snapshot row)."""
    if not may_hold_placeholders:
        return False
    if raw is None:
        return _placeholder_may_be_null(column_type)
    if isinstance(raw, str):
        if raw == UNAVAILABLE_VALUE:
            return True
        if column_type.kind is TypeKind.BYTES:
            return raw == _MARKER_BASE64
        return column_type.kind is TypeKind.JSON and _is_marker_map_text(raw)
    if isinstance(raw, list):
        return raw == [UNAVAILABLE_VALUE] or (
            _element_kind(column_type) in _NUMBER_KINDS and raw == _MARKER_NUMBERS
        )
    return isinstance(raw, dict) and raw == _MARKER_MAP


def _placeholder_may_be_null(column_type: ColumnType) -> bool:
    element = _element_kind(column_type)
    return (
        column_type.kind is TypeKind.ARRAY
        and element is not None
        and element not in _NUMBER_KINDS
        and element not in _STRING_ELEMENT_KINDS
    )


def _element_kind(column_type: ColumnType) -> TypeKind | None:
    if column_type.kind is TypeKind.ARRAY and column_type.element is not None:
        return column_type.element.kind
    return None


def _is_marker_map_text(raw: str) -> bool:
    if UNAVAILABLE_VALUE not in raw:
        return False
    try:
        return bool(json.loads(raw) == _MARKER_MAP)
    except ValueError:
        return False
