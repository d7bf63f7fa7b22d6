"""Connect JSON values -> Python values of a column's type, to JSON-safe values and back.

Python values in a converted row: bool, int, float, str, bytes, Decimal, date, datetime (naive
for TIMESTAMP, UTC-aware for TIMESTAMP_TZ), str for TIME ("HH:MM:SS[.ffffff]"), JSON and UUID
(exact text), list for ARRAY, int microseconds for an interval (MicroDuration, or the ISO text
of `interval.handling.mode=string`). The unchanged-TOAST marker is left untouched for the caller.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Mapping
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from cdc_sync.core.types import (
    ColumnType,
    RowSchema,
    SchemaConversionError,
    TypeKind,
)
from cdc_sync.schema.interval import ISO_8601, iso_interval_micros

EPOCH_DATE = date(1970, 1, 1)
EPOCH = datetime(1970, 1, 1)
MICROS_PER_DAY = 86_400_000_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def convert_row(
    schema: RowSchema, payload: Mapping[str, Any], skip: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """The columns of `schema` converted, except `skip` (unchanged-TOAST placeholders, see
    `schema.unavailable`), which are left out of the row."""
    row: dict[str, Any] = {}
    for column in schema.columns:
        if column.name in skip:
            continue
        raw = payload.get(column.name)
        try:
            row[column.name] = convert_value(column.type, raw)
        except (TypeError, ValueError, ArithmeticError, binascii.Error) as exc:
            raise SchemaConversionError(
                f"{column.name}: cannot read {type(raw).__name__} as {column.type}: "
                f"{type(exc).__name__}"
            ) from exc
    return row


def convert_value(column_type: ColumnType, raw: Any) -> Any:
    if raw is None:
        return None
    kind = column_type.kind
    if kind is TypeKind.ARRAY:
        element = column_type.element
        if not isinstance(raw, list) or element is None:
            raise TypeError("expected a JSON array")
        return [convert_value(element, item) for item in raw]
    reader = _READERS.get(kind)
    return raw if reader is None else reader(column_type, raw)


def _bool(_: ColumnType, raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise TypeError("expected a boolean")
    return raw


def _int(_: ColumnType, raw: Any) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise TypeError("expected an integer")
    return raw


def _int64(column_type: ColumnType, raw: Any) -> int:
    if column_type.unit == ISO_8601:  # interval.handling.mode=string
        if not isinstance(raw, str):
            raise TypeError("expected an ISO 8601 duration")
        micros = iso_interval_micros(raw)
        if not INT64_MIN <= micros <= INT64_MAX:
            # The sinks hold intervals as int64 µs (±292,277 years); Postgres goes further.
            raise OverflowError("interval beyond int64 microseconds (±292,277 years)")
        return micros
    return _int(column_type, raw)


def _float(_: ColumnType, raw: Any) -> float:
    # JsonConverter writes NaN/Infinity as strings.
    if isinstance(raw, str) and raw in ("NaN", "Infinity", "-Infinity"):
        return float(raw)
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise TypeError("expected a number")
    return float(raw)


def _str(_: ColumnType, raw: Any) -> str:
    if isinstance(raw, dict):  # map-typed columns (hstore as map)
        return json.dumps(raw, sort_keys=True)
    if not isinstance(raw, str):
        raise TypeError("expected a string")
    return raw


def _bytes(_: ColumnType, raw: Any) -> bytes:
    if not isinstance(raw, str):
        raise TypeError("expected base64 text")
    return base64.b64decode(raw, validate=True)


def _decimal(column_type: ColumnType, raw: Any) -> Decimal:
    if column_type.scale is None:  # VariableScaleDecimal {scale, value}
        if not isinstance(raw, dict):
            raise TypeError("expected a {scale, value} struct")
        return _unscaled(raw["value"], int(raw["scale"]))
    return _unscaled(raw, column_type.scale)


def _unscaled(encoded: Any, scale: int) -> Decimal:
    if not isinstance(encoded, str):
        raise TypeError("expected base64 text")
    unscaled = int.from_bytes(base64.b64decode(encoded, validate=True), "big", signed=True)
    return Decimal(unscaled).scaleb(-scale)


def _date(_: ColumnType, raw: Any) -> date:
    return EPOCH_DATE + timedelta(days=_int(_, raw))


def _micros(column_type: ColumnType, raw: Any) -> int:
    value = _int(column_type, raw)
    unit = column_type.unit or "us"
    return value * 1000 if unit == "ms" else value // 1000 if unit == "ns" else value


def _time(column_type: ColumnType, raw: Any) -> str:
    micros = _micros(column_type, raw)
    if micros == MICROS_PER_DAY:
        return "24:00:00"  # Postgres allows 24:00:00; datetime.time does not
    seconds, micro = divmod(micros, 1_000_000)
    hours, rest = divmod(seconds, 3600)
    return time(hours, rest // 60, rest % 60, micro).isoformat()


def _timestamp(column_type: ColumnType, raw: Any) -> datetime:
    return EPOCH + timedelta(microseconds=_micros(column_type, raw))


def _timestamp_tz(_: ColumnType, raw: Any) -> datetime:
    if not isinstance(raw, str):
        raise TypeError("expected ISO 8601 text")
    parsed = datetime.fromisoformat(raw)
    if parsed.tzinfo is None:
        raise ValueError("timestamp without a zone")
    return parsed.astimezone(UTC)


_READERS = {
    TypeKind.BOOLEAN: _bool,
    TypeKind.INT16: _int,
    TypeKind.INT32: _int,
    TypeKind.INT64: _int64,
    TypeKind.FLOAT32: _float,
    TypeKind.FLOAT64: _float,
    TypeKind.STRING: _str,
    TypeKind.JSON: _str,
    TypeKind.UUID: _str,
    TypeKind.BYTES: _bytes,
    TypeKind.DECIMAL: _decimal,
    TypeKind.DATE: _date,
    TypeKind.TIME: _time,
    TypeKind.TIMESTAMP: _timestamp,
    TypeKind.TIMESTAMP_TZ: _timestamp_tz,
}


def to_json_value(column_type: ColumnType, value: Any) -> Any:
    """A converted value as a JSON document holds it (search `_source`, cache `row`)."""
    if value is None:
        return None
    kind = column_type.kind
    if kind is TypeKind.ARRAY and column_type.element is not None:
        return [to_json_value(column_type.element, item) for item in value]
    if kind is TypeKind.JSON and isinstance(value, str):
        return json.loads(value)
    if isinstance(value, Decimal):
        return format(value, "f")  # a float would round: every digit, plain (str gives 1E-7)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, float) and not math.isfinite(value):
        # JSON has no NaN/Infinity: their text as Postgres and Debezium write it (not "inf").
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    return value


def from_json_value(column_type: ColumnType, value: Any) -> Any:
    """The converted value a JSON document holds (`to_json_value` undone): rows kept as JSON
    (the documents' state) back in the types SQL over them expects. A JSON column comes back as
    its JSON re-serialized, not the exact text Postgres held."""
    if value is None:
        return None
    if column_type.kind is TypeKind.ARRAY and column_type.element is not None:
        return [from_json_value(column_type.element, item) for item in value]
    parse = _FROM_JSON.get(column_type.kind)
    return value if parse is None else parse(value)


_FROM_JSON: dict[TypeKind, Callable[[Any], Any]] = {
    TypeKind.FLOAT32: float,  # "NaN", "Infinity", "-Infinity" included
    TypeKind.FLOAT64: float,
    TypeKind.DECIMAL: lambda text: Decimal(str(text)),
    TypeKind.DATE: date.fromisoformat,
    TypeKind.TIMESTAMP: datetime.fromisoformat,
    TypeKind.TIMESTAMP_TZ: lambda text: datetime.fromisoformat(text).astimezone(UTC),
    TypeKind.BYTES: lambda text: base64.b64decode(text, validate=True),
    TypeKind.JSON: lambda value: json.dumps(value, ensure_ascii=False),
}
