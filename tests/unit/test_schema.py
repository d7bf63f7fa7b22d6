"""Connect schema -> column types, Connect JSON values -> Python values, and back to JSON/Arrow."""

from __future__ import annotations

import base64
import json
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_sync.schema import (
    UNAVAILABLE_VALUE,
    ColumnType,
    SchemaConversionError,
    TypeKind,
    arrow_value,
    column_type_from_connect,
    convert_row,
    convert_value,
    from_json_value,
    row_schema_from_connect,
    search_field_mapping,
    to_json_value,
)
from cdc_sync.schema.arrow import arrow_schema, python_value
from cdc_sync.schema.source_rows import TimeLoader
from cdc_sync.schema.spark import spark_schema
from tests.envelopes import decimal_field, encode_decimal, field

pytestmark = pytest.mark.unit


micro_time = field("a", "int64", logical="io.debezium.time.MicroTime")
micro_duration = field("a", "int64", logical="io.debezium.time.MicroDuration")


def column(spec: dict[str, Any]) -> ColumnType:
    return column_type_from_connect(spec, spec["field"])


@pytest.mark.parametrize(
    ("spec", "raw", "expected"),
    [
        (field("a", "int16"), 7, 7),
        (field("a", "int64"), 2**62, 2**62),
        (field("a", "boolean"), True, True),
        (field("a", "double"), 1.5, 1.5),
        (field("a", "float"), 2, 2.0),
        (field("a", "string"), "héllo", "héllo"),
        (field("a", "bytes"), base64.b64encode(b"\x00\xff").decode(), b"\x00\xff"),
        (decimal_field("a", 2, 10), encode_decimal(Decimal("-1234.50"), 2), Decimal("-1234.50")),
        (field("a", "int32", logical="io.debezium.time.Date"), 19723, date(2024, 1, 1)),
        (
            micro_time,
            45_296_000_001,
            "12:34:56.000001",
        ),
        (field("a", "int32", logical="io.debezium.time.Time"), 45_296_000, "12:34:56"),
        (micro_time, 86_400_000_000, "24:00:00"),
        (
            field("a", "int64", logical="io.debezium.time.MicroTimestamp"),
            1_704_067_200_000_001,
            datetime(2024, 1, 1, 0, 0, 0, 1),
        ),
        (
            field("a", "int64", logical="io.debezium.time.Timestamp"),
            1_704_067_200_123,
            datetime(2024, 1, 1, 0, 0, 0, 123000),
        ),
        (
            field("a", "string", logical="io.debezium.time.ZonedTimestamp"),
            "2024-01-01T10:00:00.5+02:00",
            datetime(2024, 1, 1, 8, 0, 0, 500000, tzinfo=UTC),
        ),
        (field("a", "string", logical="io.debezium.data.Json"), '{"k": [1]}', '{"k": [1]}'),
        (field("a", "string", logical="io.debezium.data.Uuid"), "a0eebc99", "a0eebc99"),
        (field("a", "string", logical="io.debezium.data.Enum"), "gold", "gold"),
        (
            micro_duration,
            3_600_000_000,
            3_600_000_000,
        ),
        (field("a", "double"), "NaN", float("nan")),
    ],
)
def test_values_convert_by_connect_type(spec: dict[str, Any], raw: Any, expected: Any) -> None:
    value = convert_value(column(spec), raw)
    if expected != expected:  # NaN
        assert value != value
    else:
        assert value == expected and type(value) is type(expected)


def test_variable_scale_decimal_keeps_its_scale_and_is_text_in_arrow() -> None:
    spec = field("n", "struct", logical="io.debezium.data.VariableScaleDecimal")
    column_type = column(spec)
    raw = {"scale": 3, "value": encode_decimal(Decimal("12.345"), 3)}
    value = convert_value(column_type, raw)
    assert value == Decimal("12.345") and str(value) == "12.345"
    assert (
        arrow_schema(row_schema_from_connect({"type": "struct", "fields": [spec]})).field("n").type
        == pa.string()
    )
    assert arrow_value(column_type, value) == "12.345"


def test_arrays_convert_element_wise() -> None:
    spec = {"type": "array", "optional": True, "field": "tags", "items": decimal_field("x", 1, 5)}
    column_type = column(spec)
    assert column_type.kind is TypeKind.ARRAY
    value = convert_value(column_type, [encode_decimal(Decimal("1.5"), 1), None])
    assert value == [Decimal("1.5"), None]
    assert to_json_value(column_type, value) == ["1.5", None]
    assert search_field_mapping(column_type) == {"type": "double"}


def test_row_schema_arrow_types_and_nullability() -> None:
    schema = row_schema_from_connect(
        {
            "type": "struct",
            "fields": [
                field("id", "int32", optional=False),
                decimal_field("price", 2, 10),
                field("at", "string", logical="io.debezium.time.ZonedTimestamp"),
                field("d", "int32", logical="io.debezium.time.Date"),
            ],
        }
    )
    arrow = arrow_schema(schema)
    assert arrow.field("id").type == pa.int32() and not arrow.field("id").nullable
    assert arrow.field("price").type == pa.decimal128(10, 2)
    assert arrow.field("at").type == pa.timestamp("us", tz="UTC")
    assert arrow.field("d").type == pa.date32()
    assert schema.names == ("id", "price", "at", "d")


def test_fingerprint_changes_with_types_not_identity() -> None:
    def schema(kind: str) -> Any:
        return row_schema_from_connect({"type": "struct", "fields": [field("a", kind)]})

    assert schema("int32").fingerprint == schema("int32").fingerprint
    assert schema("int32").fingerprint != schema("int64").fingerprint


def test_unavailable_toast_marker_is_left_for_the_caller() -> None:
    schema = row_schema_from_connect(
        {"type": "struct", "fields": [field("id", "int32"), field("doc", "string")]}
    )
    assert convert_row(schema, {"id": 1, "doc": UNAVAILABLE_VALUE}) == {
        "id": 1,
        "doc": UNAVAILABLE_VALUE,
    }


def test_bad_value_names_the_column() -> None:
    schema = row_schema_from_connect({"type": "struct", "fields": [field("qty", "int32")]})
    with pytest.raises(SchemaConversionError, match="qty"):
        convert_row(schema, {"qty": "seven"})


def test_unsupported_type_names_the_field() -> None:
    with pytest.raises(SchemaConversionError, match="geo"):
        row_schema_from_connect({"type": "struct", "fields": [field("geo", "struct")]})


def test_json_values_become_objects_in_documents() -> None:
    json_type = ColumnType(TypeKind.JSON)
    assert to_json_value(json_type, '{"a": [1, 2]}') == {"a": [1, 2]}
    assert to_json_value(ColumnType(TypeKind.TIMESTAMP_TZ), datetime(2024, 1, 1, tzinfo=UTC)) == (
        "2024-01-01T00:00:00+00:00"
    )
    assert to_json_value(ColumnType(TypeKind.BYTES), b"\x01") == "AQ=="


def test_spark_schema_mirrors_the_arrow_schema() -> None:
    schema = row_schema_from_connect(
        {
            "type": "struct",
            "fields": [
                field("id", "int64", optional=False),
                decimal_field("price", 2, 10),
                field("at", "string", logical="io.debezium.time.ZonedTimestamp"),
            ],
        }
    )
    spark = spark_schema(schema)
    assert [f.name for f in spark.fields] == ["id", "price", "at"]
    assert spark["id"].dataType.simpleString() == "bigint" and not spark["id"].nullable
    assert spark["price"].dataType.simpleString() == "decimal(10,2)"
    assert spark["at"].dataType.simpleString() == "timestamp"


def test_a_schema_is_converted_once_per_distinct_text_and_a_changed_one_again() -> None:
    # Every record carries its schema: a topic's records share one converted RowSchema (and its
    # fingerprint), and a schema change (a column added) converts anew.
    def spec(*names: str) -> dict[str, Any]:
        return {"type": "struct", "fields": [field(n, "int32") for n in names]}

    assert row_schema_from_connect(spec("a", "b")) is row_schema_from_connect(spec("a", "b"))
    widened = row_schema_from_connect(spec("a", "b", "c"))
    assert widened.names == ("a", "b", "c")
    assert widened.fingerprint != row_schema_from_connect(spec("a", "b")).fingerprint
    with pytest.raises(SchemaConversionError):  # errors are raised every time, never cached
        row_schema_from_connect({"type": "struct", "fields": [{"type": "int32"}]})
    with pytest.raises(SchemaConversionError):
        row_schema_from_connect({"type": "struct", "fields": [{"type": "int32"}]})


def test_a_schema_json_cannot_write_is_converted_and_cached_all_the_same() -> None:
    # The cache keys schemas by their JSON text; a schema the stdlib parser read (an integer
    # past 64 bits somewhere in it, which orjson neither reads nor writes) is keyed by repr.
    huge = {"type": "struct", "fields": [field("a", "int64") | {"default": 2**70}]}
    assert row_schema_from_connect(huge).names == ("a",)
    assert row_schema_from_connect(huge) is row_schema_from_connect(dict(huge))


# Found by tests/integration/test_debezium_values.py (random values through real Debezium).
@pytest.mark.parametrize(
    ("value", "document"),
    [
        (Decimal("1E-7"), "0.0000001"),  # str() would write 1E-7; Postgres prints 0.0000001
        (Decimal("1.500"), "1.500"),
        (float("inf"), "Infinity"),  # as Postgres and Debezium write it (str() gives inf)
        (float("-inf"), "-Infinity"),
        (float("nan"), "NaN"),
    ],
)
def test_json_documents_hold_numbers_as_postgres_prints_them(value: Any, document: str) -> None:
    kind = TypeKind.DECIMAL if isinstance(value, Decimal) else TypeKind.FLOAT64
    assert to_json_value(ColumnType(kind, True), value) == document


def test_an_interval_beyond_int64_microseconds_is_refused_by_name() -> None:
    interval = ColumnType(TypeKind.INT64, True, unit="iso8601")
    assert convert_value(interval, "P292000Y") == 292000 * 12 * 2_629_800_000_000
    with pytest.raises(OverflowError, match="int64 microseconds"):
        convert_value(interval, "P178000000Y")


def test_float32_read_back_from_arrow_is_the_decimal_postgres_prints() -> None:
    [held] = pa.array([0.1], type=pa.float32()).to_pylist()
    assert held != 0.1 and python_value(pa.float32(), held) == 0.1
    assert python_value(pa.list_(pa.float32()), [held, None]) == [0.1, None]


def test_time_24_00_is_read_from_postgres_as_the_decoder_gives_it() -> None:
    assert TimeLoader(0).load(b"24:00:00") == "24:00:00"
    assert TimeLoader(0).load(b"12:00:00.5") == time(12, 0, 0, 500000)


def _typed(kind: TypeKind, values: st.SearchStrategy[Any], **spec: Any) -> st.SearchStrategy[Any]:
    return st.tuples(st.just(ColumnType(kind, True, **spec)), values)


JSON_SCALARS = st.none() | st.booleans() | st.integers(-(10**15), 10**15) | st.text(max_size=5)
DECODED = st.one_of(
    _typed(TypeKind.BOOLEAN, st.booleans()),
    _typed(TypeKind.INT64, st.integers(-(2**63), 2**63 - 1)),
    _typed(TypeKind.FLOAT64, st.floats(allow_nan=False)),
    _typed(TypeKind.STRING, st.text()),
    _typed(TypeKind.BYTES, st.binary()),
    _typed(
        TypeKind.DECIMAL,
        st.decimals(places=2, allow_nan=False, allow_infinity=False),
        precision=12,
        scale=2,
    ),
    _typed(TypeKind.DECIMAL, st.decimals(allow_nan=False, allow_infinity=False)),
    _typed(TypeKind.DATE, st.dates()),
    _typed(TypeKind.TIME, st.times().map(time.isoformat)),
    _typed(TypeKind.TIMESTAMP, st.datetimes()),
    _typed(TypeKind.TIMESTAMP_TZ, st.datetimes(timezones=st.just(UTC))),
    _typed(TypeKind.UUID, st.uuids().map(str)),
    # jsonb's text: keys and values as Postgres prints them (json.dumps' separators)
    _typed(
        TypeKind.JSON,
        st.dictionaries(st.text(max_size=5), JSON_SCALARS).map(
            lambda d: json.dumps(d, ensure_ascii=False)
        ),
    ),
    _typed(
        TypeKind.ARRAY,
        st.lists(st.none() | st.decimals(places=1, allow_nan=False, allow_infinity=False)),
        element=ColumnType(TypeKind.DECIMAL, True, precision=9, scale=1),
    ),
)


@given(DECODED)
def test_a_value_in_a_json_document_reads_back_as_the_decoded_value(
    typed: tuple[ColumnType, Any],
) -> None:
    """The documents' state keeps rows as JSON documents and reads them back for SQL."""
    column_type, value = typed
    assert from_json_value(column_type, to_json_value(column_type, value)) == value


@pytest.mark.parametrize("text", ["NaN", "Infinity", "-Infinity"])
def test_a_non_finite_float_in_a_json_document_reads_back(text: str) -> None:
    read = from_json_value(ColumnType(TypeKind.FLOAT64, True), text)
    assert str(read) == str(float(text))
