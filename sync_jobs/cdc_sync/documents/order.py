"""Sort values: an array of nested rows in the order Postgres's `ORDER BY` gives it.

A column sorts by its Postgres type, not by its JSON (a `numeric` arrives as text: "-10.00"
sorts before "-2.00" as text, after it as a number): numbers by value (NaN above every number,
as Postgres sorts it), booleans false first, dates and timestamps in time, strings by code
point, which is `COLLATE "C"` (verify's SQL orders with it too: a database's own collation
may order strings otherwise), `char(n)` without trailing blanks and `citext` lower-cased, as
they compare. Nulls last, as Postgres's default ascending order. A column of a type known only
by its JSON (no catalog) sorts by that JSON: numbers, then strings, then the rest.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal, InvalidOperation
from typing import Any

from cdc_sync.documents.equality import FLOATS, INSTANTS, NUMBERS, STRINGS, citext_lower, instant

# Ranks: every value of a column sorts within its rank; NaN after numbers, null after all.
_VALUE, _NAN, _NULL = 0, 1, 2
# Types whose JSON (a boolean, or text) sorts as Postgres sorts them under COLLATE "C": uuid
# as lower-case hex, times as fixed-width "HH:MM:SS[.ffffff]".
_AS_JSON = STRINGS | {"bool", "uuid", "time"}


def sort_value(pg_type: str, value: Any) -> tuple[Any, ...]:
    """`value` (a column of `pg_type`, as the JSON the sinks hold) as its place in ascending
    order among the column's values."""
    if value is None:
        return (_NULL,)
    if pg_type in NUMBERS or pg_type == "money":
        return _number(value)
    if pg_type in FLOATS:
        number = float(value)
        return (_NAN,) if math.isnan(number) else (_VALUE, number)
    if pg_type in INSTANTS:
        moment = instant(value)
        return (_VALUE, moment) if moment is not None else (_VALUE, str(value))
    if pg_type == "bpchar":
        return (_VALUE, str(value).rstrip(" "))
    if pg_type == "citext":
        return (_VALUE, citext_lower(str(value)))
    if pg_type in _AS_JSON and isinstance(value, bool | str):
        return (_VALUE, value)
    return _by_json(value)


def _number(value: Any) -> tuple[Any, ...]:
    try:
        number = Decimal(repr(value) if isinstance(value, float) else str(value))
    except InvalidOperation:
        return (_VALUE, Decimal(0), str(value))
    return (_NAN,) if number.is_nan() else (_VALUE, number)


def _by_json(value: Any) -> tuple[Any, ...]:
    """A column sorted by its JSON (a type known only by it, or JSON itself): numbers (by
    value), then strings, then other JSON."""
    if isinstance(value, bool):
        return (_VALUE, 0, int(value))
    if isinstance(value, int | float):
        return (_NAN,) if isinstance(value, float) and math.isnan(value) else (_VALUE, 1, value)
    if isinstance(value, str):
        return (_VALUE, 2, value)
    return (_VALUE, 3, json.dumps(value, sort_keys=True))
