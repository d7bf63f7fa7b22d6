"""Cache actions without a server: keys, padded versions, TOAST names, deletes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_sync.sinks.redis.actions import (
    VERSION_WIDTH,
    parsed_version,
    to_actions,
    version_string,
)
from tests.changes import change, products_route
from tests.envelopes import UNAVAILABLE, product

pytestmark = pytest.mark.unit
ROUTE = products_route(prefix="cache")


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_a_stored_version_reads_back_as_written(version: int) -> None:
    assert parsed_version(version_string(version)) == version
    assert parsed_version(version_string(version).encode()) == version


@given(st.binary(max_size=30) | st.text(max_size=30))
def test_only_the_pipelines_20_digits_are_a_version(field: bytes | str) -> None:
    text = field.decode("latin-1") if isinstance(field, bytes) else field
    ours = len(text) == VERSION_WIDTH and all(c in "0123456789" for c in text)
    assert (parsed_version(field) is not None) == ours


def test_keys_follow_the_cache_convention() -> None:
    [action] = to_actions(ROUTE, [change(ROUTE, "c", 7, 42, product(42))])
    assert action.key == "cache:shop.products:42"
    assert action.tombstone_key == "cache:_tombstone:shop.products:42"
    assert action.op == "upsert"
    assert json.loads(action.row_json)["price"] == "89.90"


def test_versions_compare_as_fixed_width_strings() -> None:
    small, big = version_string(9), version_string(2**64 - 1)
    assert len(small) == len(big) == VERSION_WIDTH
    assert small < big  # string order == numeric order, beyond what a Lua double holds
    with pytest.raises(ValueError):
        version_string(10**VERSION_WIDTH)


def test_unchanged_toast_columns_are_named_and_left_out_of_the_row() -> None:
    [action] = to_actions(ROUTE, [change(ROUTE, "u", 9, 1, product(1, description=UNAVAILABLE))])
    assert action.unavailable == ("description",)
    assert "description" not in json.loads(action.row_json)


def test_deletes_carry_only_the_version() -> None:
    [action] = to_actions(ROUTE, [change(ROUTE, "d", 11, 1)])
    assert (action.op, action.row_json, action.version) == ("delete", "", version_string(11))
    assert action.script_args(3600)[-1] == 3600  # tombstone TTL
