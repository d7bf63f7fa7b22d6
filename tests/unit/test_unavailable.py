"""Every form Debezium gives the unchanged-TOAST placeholder is recognised, and never written
as data (forms observed with Debezium 3.x on Postgres 15, see schema/unavailable.py)."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_sync.core.model import Change
from cdc_sync.debezium.decoder import parse_record
from tests.envelopes import (
    PRODUCT_FIELDS,
    UNAVAILABLE,
    coords,
    envelope_bytes,
    field,
    key_bytes,
    product,
)

pytestmark = pytest.mark.unit

MARKER_BASE64 = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="
MARKER_CODES = list(UNAVAILABLE.encode())
HSTORE_JSON = '{"__debezium_unavailable_value":"__debezium_unavailable_value"}'
VARIABLE_SCALE = {
    "type": "struct",
    "optional": True,
    "name": "io.debezium.data.VariableScaleDecimal",
    "fields": [field("scale", "int32", False), field("value", "bytes", False)],
}
DATE = {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1}
UUID = {"type": "string", "optional": True, "name": "io.debezium.data.Uuid", "version": 1}


def array(name: str, items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items, "optional": True, "field": name}


TOASTABLE_FIELDS = [
    *PRODUCT_FIELDS,
    field("b", "bytes"),
    {"type": "array", "items": {"type": "int32"}, "optional": True, "field": "ia"},
    {"type": "array", "items": {"type": "int64"}, "optional": True, "field": "ba"},
    {"type": "array", "items": {"type": "string"}, "optional": True, "field": "ta"},
    {"type": "array", "items": VARIABLE_SCALE, "optional": True, "field": "na"},
    field("jb", "string", logical="io.debezium.data.Json"),
    field("h", "string", logical="io.debezium.data.Json"),
    {
        "type": "map",
        "keys": {"type": "string"},
        "values": {"type": "string"},
        "optional": True,
        "field": "hm",
    },
    field("x", "string", logical="io.debezium.data.Xml"),
    array("fa", {"type": "double", "optional": True}),
    array("sa", {"type": "int16", "optional": True}),
    array("da", DATE),
    array("ua", UUID),
    array("bya", {"type": "bytes", "optional": True}),
    array("ea", {"type": "string", "optional": True}),  # inet[], citext[], enum arrays
    array("hexa", {"type": "string", "optional": True}),  # bytea[] in hex mode
]
PLACEHOLDERS = {
    "description": UNAVAILABLE,
    "b": MARKER_BASE64,
    "ia": MARKER_CODES,
    "ba": MARKER_CODES,
    "ta": [UNAVAILABLE],
    "na": None,  # Debezium cannot convert the marker into a numeric[]: it sends null
    "jb": UNAVAILABLE,
    "h": HSTORE_JSON,
    "hm": {UNAVAILABLE: UNAVAILABLE},
    "x": UNAVAILABLE,
    # Arrays: observed with Debezium 3.6.3 (tests/integration/test_debezium_toast_arrays.py).
    "fa": None,
    "sa": None,
    "da": MARKER_CODES,  # days since 1970: the dates in April 1970 of issue 17
    "ua": ["b68a35a7-17ad-35b3-af2a-ae46edb4545a"],
    "bya": [MARKER_BASE64],
    "ea": None,
    "hexa": [UNAVAILABLE.encode().hex()],
}
NULL_PLACEHOLDERS = frozenset(name for name, raw in PLACEHOLDERS.items() if raw is None)


def parsed(op: str, after: dict[str, Any]) -> Change:
    change = parse_record(
        key_bytes("products", {"id": 7}),
        envelope_bytes("products", op, 50, after, fields=TOASTABLE_FIELDS),
        coords(1),
    )
    assert isinstance(change, Change)
    return change


@pytest.mark.parametrize("op", ["u", "c"])  # "c": the create of a primary-key move
def test_every_placeholder_form_is_unavailable_and_left_out_of_the_row(op: str) -> None:
    change = parsed(op, product(7) | PLACEHOLDERS)
    assert change.unavailable_columns == frozenset(PLACEHOLDERS)
    assert change.uncertain_columns == NULL_PLACEHOLDERS
    assert change.row is not None and not set(PLACEHOLDERS) & set(change.row)
    assert change.row["name"] == "Keyboard"


def test_real_values_of_the_same_columns_are_data() -> None:
    values = {
        "b": "3q2+7w==",
        "ia": [1, 2, 3],
        "ba": [9000000000],
        "ta": ["a", "b"],
        "na": [{"scale": 1, "value": "Dw=="}],
        "jb": '{"k": 1}',
        "h": '{"a":"1"}',
        "hm": {"a": "1"},
        "x": "<a/>",
        "fa": [95.5, 1.0],
        "sa": [95, 95],
        "da": [95, 95, 100],
        "ua": ["5f5f6465-6265-7a69-756d-5f756e617661"],
        "bya": ["X19k"],
        "ea": ["10.0.0.1"],
        "hexa": ["5f5f"],
    }
    change = parsed("u", product(7) | values)
    assert change.unavailable_columns == frozenset()
    assert change.row is not None and change.row["b"] == bytes.fromhex("deadbeef")


def test_snapshot_rows_never_hold_placeholders() -> None:
    # A snapshot reads whole rows: a null numeric[] there is a real null.
    change = parsed("r", product(7) | {"na": None})
    assert change.unavailable_columns == frozenset()
    assert change.row is not None and change.row["na"] is None
