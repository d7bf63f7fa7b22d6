"""Intervals reach the sinks exactly (issue 8): int64 microseconds, a month = 30.4375 days.

Debezium's numeric mode computes through a double and can be 1 µs off; the connector ships with
`interval.handling.mode=string`, whose ISO text is decoded here with integers only, and verify
reads the Postgres value with the same function.
"""

from __future__ import annotations

from decimal import ROUND_DOWN, Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_sync.core.types import ColumnType, TypeKind
from cdc_sync.schema import arrow_type, column_type_from_connect, convert_value
from cdc_sync.schema.catalog import CatalogColumn, ConverterModes, column_type_from_catalog
from cdc_sync.schema.interval import (
    MICROS_PER_MONTH,
    IntervalParts,
    interval_micros,
    iso_interval_micros,
    parse_iso_interval,
)
from cdc_sync.schema.search import search_field_mapping
from cdc_sync.schema.source_rows import IntervalLoader
from cdc_sync.verify.compare import canonical
from tests.envelopes import field

pytestmark = pytest.mark.unit

INTERVAL_STRING = field("c", "string", logical="io.debezium.time.Interval")
MICRO_DURATION = field("c", "int64", logical="io.debezium.time.MicroDuration")

# Postgres value, Debezium's string-mode text (Interval.toIsoString: every component, a sign on
# each), Postgres' own text under IntervalStyle=iso_8601 (what verify reads), exact microseconds.
CASES = [
    ("98 days 02:53:35.627452", "P0Y0M98DT2H53M35.627452S", "P98DT2H53M35.627452S", 8477615627452),
    (
        "1 year 2 mons 3 days 04:05:06.789012",
        "P1Y2M3DT4H5M6.789012S",
        "P1Y2M3DT4H5M6.789012S",
        14 * MICROS_PER_MONTH + 3 * 86_400_000_000 + 14_706_789_012,
    ),
    (
        "-1 mons -2 days 03:00:00.000001",
        "P0Y-1M-2DT3H0M0.000001S",
        "P-1M-2DT3H0.000001S",
        -MICROS_PER_MONTH - 2 * 86_400_000_000 + 10_800_000_001,
    ),
    ("-00:00:00.000001", "P0Y0M0DT0H0M-0.000001S", "PT-0.000001S", -1),
]
IDS = [case[0] for case in CASES]


def column(spec: dict[str, Any]) -> ColumnType:
    return column_type_from_connect(spec, spec["field"])


def test_a_month_is_30_4375_days_exactly() -> None:
    assert MICROS_PER_MONTH == 2_629_800_000_000
    assert interval_micros(12, 0, 0) == 365 * 86_400_000_000 + 6 * 3_600_000_000


@pytest.mark.parametrize(("postgres", "debezium", "pg_iso", "micros"), CASES, ids=IDS)
def test_debezium_string_mode_decodes_to_exact_microseconds(
    postgres: str, debezium: str, pg_iso: str, micros: int
) -> None:
    assert convert_value(column(INTERVAL_STRING), debezium) == micros


@pytest.mark.parametrize(("postgres", "debezium", "pg_iso", "micros"), CASES, ids=IDS)
def test_verify_reads_postgres_intervals_as_the_sinks_hold_them(
    postgres: str, debezium: str, pg_iso: str, micros: int
) -> None:
    source = IntervalLoader(0).load(pg_iso.encode())
    sink = convert_value(column(INTERVAL_STRING), debezium)
    assert source == micros
    assert canonical(source) == canonical(sink)


def test_the_issue_value_is_not_one_microsecond_off() -> None:
    # Debezium numeric mode (MicroDuration.durationMicros) sent 8477615627451 for this value.
    assert iso_interval_micros("P0Y0M98DT2H53M35.627452S") == 8_477_615_627_452
    assert canonical(IntervalLoader(0).load(b"P98DT2H53M35.627452S")) != canonical(8477615627451)


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("PT0S", IntervalParts(0, 0, 0)),
        ("P0Y0M0DT0H0M0S", IntervalParts(0, 0, 0)),
        ("P-1Y-2M3DT-4H-5M-6.5S", IntervalParts(-14, 3, -14_706_500_000)),
        ("PT-1H-30M", IntervalParts(0, 0, -5_400_000_000)),
        ("-P1M2DT1S", IntervalParts(-1, -2, -1_000_000)),
        ("P2W", IntervalParts(0, 14, 0)),
        ("PT1.5000000S", IntervalParts(0, 0, 1_500_000)),
        ("PT+3H", IntervalParts(0, 0, 10_800_000_000)),
        ("P178000000Y", IntervalParts(2_136_000_000, 0, 0)),  # Postgres' limit: ints, no overflow
    ],
)
def test_iso_sign_forms(text: str, parts: IntervalParts) -> None:
    assert parse_iso_interval(text) == parts


@pytest.mark.parametrize("text", ["", "P", "PT", "P1DT", "1D", "P1.5D", "P1S"])
def test_not_a_duration_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_iso_interval(text)


def test_string_mode_interval_is_stored_as_int64_microseconds() -> None:
    interval = column(INTERVAL_STRING)
    assert interval.kind is TypeKind.INT64
    assert str(arrow_type(interval)) == "int64"
    assert search_field_mapping(interval) == {"type": "long"}
    with pytest.raises(TypeError):
        convert_value(interval, 42)


def test_numeric_mode_keeps_debeziums_microseconds() -> None:
    # Nothing to correct exactly: the double's truncation already happened in Debezium.
    assert convert_value(column(MICRO_DURATION), 8477615627451) == 8477615627451


@pytest.mark.parametrize("mode", ["numeric", "string"])
def test_catalog_interval_type_matches_the_connect_schema(mode: str) -> None:
    catalog_column = CatalogColumn("c", "interval", "T", None, None, -1, False)
    from_catalog = column_type_from_catalog(
        catalog_column, ConverterModes.from_connector({"interval.handling.mode": mode}), "t.c"
    )
    spec = INTERVAL_STRING if mode == "string" else MICRO_DURATION
    assert from_catalog == column(spec)


# Postgres' interval range: months and days are int32, the time part int64 microseconds. pgjdbc
# (which Debezium parses intervals with) keeps hours in an int: larger time parts never reach
# the wire (pgjdbc's parse refuses them; what Debezium then does is not observed here).
PG_MONTHS = st.integers(-(2**31), 2**31 - 1)
PG_DAYS = st.integers(-(2**31), 2**31 - 1)
PGJDBC_MICROS = st.integers(-(2**31 - 1) * 3_600_000_000, (2**31 - 1) * 3_600_000_000)


def debezium_seconds_texts(whole: int, micro: int) -> set[str]:
    """The seconds Debezium 3.6 writes (`Interval.toIsoString(..., BigDecimal.valueOf(
    PGInterval.getSeconds()))`): a double `whole + micro / 1e6`, printed by `Double.toString`
    (shortest digits since JDK 19; JDK 17 may print more, up to 17 significant digits), cut
    to 9 decimals (RoundingMode.DOWN), trailing zeros stripped, plain notation."""
    seconds = float(whole) + float(micro) / 1e6  # both IEEE doubles, as in Java
    texts = set()
    for digits in (repr(seconds), format(seconds, ".17g")):
        value = Decimal(digits)
        if value.as_tuple().exponent < -9:  # type: ignore[operator]
            value = value.quantize(Decimal("1e-9"), rounding=ROUND_DOWN)
        texts.add(format(value.normalize(), "f"))
    return texts


def debezium_interval_texts(months: int, days: int, micros: int) -> set[str]:
    """The ISO text Debezium's string mode writes for a Postgres interval, as it computes it:
    Postgres renders the interval, pgjdbc parses it into years, months, days, hours, minutes
    (ints, each with the time part's sign) and seconds (a double)."""
    years, mons = int(months / 12), months - 12 * int(months / 12)  # C division: to zero
    sign = -1 if micros < 0 else 1
    hours, rest = divmod(abs(micros), 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    whole, micro = divmod(rest, 1_000_000)
    return {
        f"P{years}Y{mons}M{days}DT{sign * hours}H{sign * minutes}M{text}S"
        for text in debezium_seconds_texts(sign * whole, sign * micro)
    }


@settings(max_examples=500)
@given(PG_MONTHS, PG_DAYS, PGJDBC_MICROS)
def test_every_interval_debezium_writes_decodes_to_the_exact_value(
    months: int, days: int, micros: int
) -> None:
    for text in debezium_interval_texts(months, days, micros):
        assert parse_iso_interval(text) == IntervalParts(months, days, micros), text


@settings(max_examples=500)
@given(st.integers(-59_999_999, 59_999_999))
def test_seconds_with_double_noise_round_to_the_microsecond(micros: int) -> None:
    whole, micro = int(micros / 1e6), micros - int(micros / 1e6) * 1_000_000
    for text in debezium_seconds_texts(whole, micro):
        assert parse_iso_interval(f"PT{text}S").micros == micros, text


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("P0Y0M376DT4H29M31.800750999S", 376 * 86_400_000_000 + 16_171_800_751),  # issue 17
        ("PT0.0000005S", 1),  # half a microsecond: away from zero
        ("PT-0.0000005S", -1),
        ("PT0.000000499S", 0),
        ("PT-0.000000999S", -1),
        ("PT59.999999999S", 60_000_000),
        ("P0Y0M0DT0H0M-0.000001S", -1),
    ],
)
def test_nearest_microsecond(text: str, micros: int) -> None:
    assert parse_iso_interval(text).total_micros == micros
