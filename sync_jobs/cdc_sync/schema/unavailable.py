"""Debezium's placeholder for an unchanged TOAST value, in every form it takes per column type.

Under REPLICA IDENTITY DEFAULT an update (and the create of a primary-key move) leaves unchanged
out-of-line values out of the WAL, and Debezium puts `unavailable.value.placeholder` in their
place, encoded as the column's type allows. Observed with Debezium 3.6 (pgoutput, Postgres 15;
tests/integration/test_debezium_toast_arrays.py records every array type):

| column | placeholder |
| --- | --- |
| text, varchar, json, jsonb, xml, uuid, enum; bytea in `hex` mode | the marker string |
| bytea (`bytes` mode) | base64 of the marker's bytes |
| text[], varchar[], varchar(n)[], char(n)[], json[], jsonb[] | `[marker]` |
| int4[], int8[]; date[] (days since 1970: dates in April 1970) | the marker's bytes as numbers |
| uuid[] | `["b68a35a7-17ad-35b3-af2a-ae46edb4545a"]` (Java's name-based UUID of the marker) |
| bytea[] | `[base64 of the marker]` (`[hex]`/`[base64]` text in the string modes) |
| int2[], real[], float8[], numeric[], bool[], time[], timestamp[], timestamptz[] | null |
| inet[], cidr[], citext[], enum arrays, any other array | null (not converted) |
| interval[], money[], xml[] | absent: Debezium has no schema for them and leaves the column out |
| hstore (`json` mode / `map` mode) | `{"marker":"marker"}` as text / as a map |
| bytea in `base64` modes | null (not converted) |

(Debezium before 3.6, such as the Connect worker's 3.0, may send null for uuid[] and bytea[]: a
null counts for every array. For a NOT NULL array of a null-placeholder type Debezium's own
converter raises, per its code: it has no value to send.)

A null cannot be told from a real null, so a null in an array column of a create or update
counts as unavailable too, and as *uncertain* (`is_uncertain`): it is never filled from an older
change of the key (that could bring back a value the row no longer holds) but read from Postgres,
which returns the true one, null included: a false alarm costs a read and never a wrong value.
Non-null forms are Debezium's encodings of its marker: a real value equal to one of them is
taken for the placeholder, as Debezium's own marker string is for text. (`base64` bytea columns
are plain strings on the wire, indistinguishable from text: `cdc-sync connectors validate` warns
about that mode instead.)
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from typing import Any

from cdc_sync.core.types import ColumnType, TypeKind

UNAVAILABLE_VALUE = "__debezium_unavailable_value"
_MARKER_BYTES = UNAVAILABLE_VALUE.encode("ascii")
_MARKER_BASE64 = base64.b64encode(_MARKER_BYTES).decode("ascii")
_MARKER_MAP = {UNAVAILABLE_VALUE: UNAVAILABLE_VALUE}
# Java's UUID.nameUUIDFromBytes: an MD5 (version 3) UUID of the marker's bytes.
_MARKER_UUID = str(uuid.UUID(bytes=hashlib.md5(_MARKER_BYTES).digest(), version=3))
# Array placeholders that are lists, by element kind: the element converter's reading of the
# marker (a list of one string, or the marker's bytes as int/bigint/date-day numbers).
_MARKER_STRINGS = [UNAVAILABLE_VALUE]
_MARKER_NUMBERS = list(_MARKER_BYTES)
_LIST_FORMS: dict[TypeKind, tuple[list[Any], ...]] = {
    TypeKind.STRING: (_MARKER_STRINGS, [_MARKER_BASE64], [_MARKER_BYTES.hex()]),
    TypeKind.JSON: (_MARKER_STRINGS,),
    TypeKind.UUID: (_MARKER_STRINGS, [_MARKER_UUID]),
    TypeKind.BYTES: ([_MARKER_BASE64],),
    TypeKind.INT16: (_MARKER_NUMBERS,),
    TypeKind.INT32: (_MARKER_NUMBERS,),
    TypeKind.INT64: (_MARKER_NUMBERS,),
    TypeKind.DATE: (_MARKER_NUMBERS,),
}


def is_unavailable(column_type: ColumnType, raw: Any, may_hold_placeholders: bool) -> bool:
    """Whether `raw` (the JSON value of a column in `after`) is the placeholder.
    `may_hold_placeholders`: the event is a create or an update (never a snapshot row)."""
    if not may_hold_placeholders:
        return False
    if raw is None:
        return column_type.kind is TypeKind.ARRAY
    if isinstance(raw, str):
        if raw == UNAVAILABLE_VALUE:
            return True
        if column_type.kind is TypeKind.BYTES:
            return raw == _MARKER_BASE64
        return column_type.kind is TypeKind.JSON and _is_marker_map_text(raw)
    if isinstance(raw, list):
        if column_type.kind is not TypeKind.ARRAY or column_type.element is None:
            return False
        return raw in _LIST_FORMS.get(column_type.element.kind, (_MARKER_STRINGS,))
    return isinstance(raw, dict) and raw == _MARKER_MAP


def is_uncertain(raw: Any) -> bool:
    """Whether a placeholder (`is_unavailable`) may as well be the column's real value: a null,
    which Debezium sends for both. Only Postgres can tell."""
    return raw is None


def _is_marker_map_text(raw: str) -> bool:
    if UNAVAILABLE_VALUE not in raw:
        return False
    try:
        return bool(json.loads(raw) == _MARKER_MAP)
    except ValueError:
        return False
