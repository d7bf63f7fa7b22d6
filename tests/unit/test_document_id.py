"""Document ids are injective: two different keys never share a search document or cache key."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_sync.core.model import document_id

pytestmark = pytest.mark.unit


def key(*values: object) -> tuple[tuple[str, object], ...]:
    return tuple((f"k{i}", value) for i, value in enumerate(values))


def test_simple_keys_are_their_value() -> None:
    assert document_id(key(7)) == "7"
    assert document_id(key("a|b\\c")) == "a|b\\c"  # one column: nothing to separate


def test_composite_keys_without_separators_keep_the_plain_join() -> None:
    assert document_id(key(10, 2)) == "10|2"
    assert document_id(key("eu", "x-1", 3)) == "eu|x-1|3"


def test_a_separator_inside_a_value_is_escaped() -> None:
    assert document_id(key("x|y", "z")) == "x\\|y|z"
    assert document_id(key("x", "y|z")) == "x|y\\|z"
    assert document_id(key("x\\", "z")) == "x\\\\|z"
    assert document_id(key("x", "\\|z")) != document_id(key("x\\", "|z"))


@given(
    st.tuples(st.text(alphabet="ab|\\", max_size=4), st.text(alphabet="ab|\\", max_size=4)),
    st.tuples(st.text(alphabet="ab|\\", max_size=4), st.text(alphabet="ab|\\", max_size=4)),
)
def test_composite_ids_are_injective(first: tuple[str, str], second: tuple[str, str]) -> None:
    if first != second:
        assert document_id(key(*first)) != document_id(key(*second))


PARTS = st.text(alphabet="ab|\\", max_size=4)


@given(PARTS, PARTS, PARTS)
def test_moving_a_separator_between_values_changes_the_id(a: str, b: str, c: str) -> None:
    # A plain join maps both keys to `a|b|c`.
    assert document_id(key(f"{a}|{b}", c)) != document_id(key(a, f"{b}|{c}"))
