"""Convergence comparison: values equal by meaning compare equal, real differences do not."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from cdc_sync.verify.compare import MoneyLoader, as_source_has, canonical, compare

pytestmark = pytest.mark.unit
PLUS_2 = timezone(timedelta(hours=2))


@pytest.mark.parametrize(
    ("source", "sink"),
    [
        (Decimal("39.50"), "39.5"),
        (Decimal("39.50"), 39.5),
        (12, "12"),
        (b"\x00\xff", "AP8="),  # bytea vs base64 in a JSON document
        (b"\x00\xff", b"\x00\xff"),  # vs Delta binary
        (time(12, 0, tzinfo=PLUS_2), "10:00:00Z"),  # timetz vs Debezium ZonedTime
        (timedelta(days=1, hours=2), 93_600_000_000),  # interval vs MicroDuration
        ({"a": [1, 2]}, '{"a": [1, 2]}'),  # jsonb vs JSON text (Delta)
        (datetime(2024, 1, 1, 10, tzinfo=PLUS_2), "2024-01-01T08:00:00Z"),
        (datetime(2024, 1, 1, 8), "2024-01-01T08:00:00"),
        (date(2024, 1, 1), "2024-01-01"),
        (time(12, 34, 56, 789000), "12:34:56.789000"),
        ([Decimal("1.5"), None], ["1.50", None]),
    ],
)
def test_equal_by_meaning(source: Any, sink: Any) -> None:
    assert canonical(source) == canonical(sink)


@pytest.mark.parametrize(
    ("source", "sink"),
    [
        (Decimal("39.50"), "39.51"),
        (b"\x00\xff", "AP4="),
        (datetime(2024, 1, 1, 8, tzinfo=UTC), "2024-01-01T08:00:01Z"),
        ({"a": 1}, '{"a": 2}'),
        ("text", None),
    ],
)
def test_different_values_stay_different(source: Any, sink: Any) -> None:
    assert canonical(source) != canonical(sink)


def test_compare_reports_missing_extra_and_different_rows() -> None:
    expected = {"1": {"a": "x"}, "2": {"a": "y"}, "3": {"a": "z"}}
    actual = {"1": {"a": "x"}, "2": {"a": "changed"}, "4": {"a": "w"}}
    result = compare("search", expected, actual)
    assert (result.missing, result.extra, result.different) == (["3"], ["4"], ["2"])
    assert not result.matches


def test_a_column_dropped_at_the_source_may_stay_in_a_sink() -> None:
    result = compare("delta", {"1": {"a": "x"}}, {"1": {"a": "x", "dropped": "old"}})
    assert result.matches
    assert not compare("delta", {"1": {"a": "x", "b": None}}, {"1": {"a": "x"}}).different


def test_money_text_loads_as_a_decimal() -> None:
    loader = MoneyLoader(0)
    assert loader.load(b"-$1,234.56") == Decimal("-1234.56")


def test_a_column_dropped_in_postgres_may_stay_at_any_level_of_a_document() -> None:
    held = {"id": 1, "gone": 2, "customer": {"id": 3, "tier": "x"}, "lines": [{"n": 1, "old": 0}]}
    wanted = {"id": 1, "customer": {"id": 3}, "lines": [{"n": 1}]}
    assert as_source_has(held, wanted) == wanted
    # A missing element, or an object where Postgres has none, stays different.
    assert as_source_has({"lines": [{"n": 1}]}, {"lines": []}) == {"lines": [{"n": 1}]}
    assert as_source_has({"customer": {"id": 3}}, {"customer": None}) == {"customer": {"id": 3}}
