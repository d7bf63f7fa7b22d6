"""Join values: a column's JSON value as the text two rows join on, per Postgres's `=`.

Rows join when Postgres's `=` between the two columns' types holds, not when their JSON agrees:
`numeric` 5.0 and `numeric(10,0)` 5 (JSON "5.0" and "5"), `int4` 1 and `numeric(12,2)` 1.00,
`varchar` 'cd' and `char(6)` 'cd    ', `citext` 'NORTH' and 'North' are equal in Postgres. Each
join pair (a parent column, a child column) gets the rule Postgres applies to its two types
(`pair_rule`), and both sides encode their values by it (`link_text`), so equal text is equal
in Postgres. Observed against Postgres in tests/integration/test_document_comparisons.py:

- integers and numerics compare by value (NUMBER); with a float on either side both are read
  as double precision, a `real` rounded to single precision first, as Postgres casts (FLOAT);
- `char(n)` compares without trailing blanks: against `char(n)` and `varchar` both sides drop
  them (BLANK_PADDED), against `text`, `name` or `citext` only the `char(n)` side (TEXT), which
  is otherwise exact; `citext` against `citext` compares lower-cased (CITEXT), as citext's
  `lower()` does in a UTF-8 locale: one character at a time;
- `date`, `timestamp` and `timestamptz` compare as instants, a date at midnight, a timestamp
  without zone as UTC (INSTANT: Postgres uses the session's TimeZone, UTC by default here);
- any other type against itself by its JSON (SAME); other pairs: `pair_rule` gives None and
  `mappings validate` refuses them, naming the field.
"""

from __future__ import annotations

import json
import math
import struct
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

INTEGERS = frozenset({"int2", "int4", "int8"})
NUMBERS = INTEGERS | {"numeric"}
FLOATS = frozenset({"float4", "float8"})
STRINGS = frozenset({"text", "varchar", "bpchar", "name", "citext"})
INSTANTS = frozenset({"date", "timestamp", "timestamptz"})
_NON_FINITE = {"NaN": "NaN", "Infinity": "Infinity", "-Infinity": "-Infinity"}


class Rule(StrEnum):
    NUMBER = "number"
    FLOAT = "float"
    TEXT = "text"
    BLANK_PADDED = "blank-padded"
    CITEXT = "citext"
    INSTANT = "instant"
    SAME = "same"


def pair_rule(left: str, right: str) -> Rule | None:
    """How Postgres's `=` compares a column of type `left` with one of type `right` (pg_type
    names of the base types); None: a pair cdc-sync does not join."""
    pair = {left, right}
    if pair <= NUMBERS | FLOATS:
        return Rule.FLOAT if pair & FLOATS else Rule.NUMBER
    if pair <= STRINGS:
        if pair == {"citext"}:
            return Rule.CITEXT
        if "bpchar" in pair and pair <= {"bpchar", "varchar"}:
            return Rule.BLANK_PADDED
        return Rule.TEXT
    if pair <= INSTANTS:
        return Rule.INSTANT
    return Rule.SAME if left == right else None


def link_text(rule: Rule, pg_type: str, value: Any) -> str | None:
    """`value` (a column of `pg_type`, as the JSON the sinks hold) as the text it joins on
    under `rule`; None for SQL NULL, which joins nothing."""
    if value is None:
        return None
    if rule is Rule.NUMBER:
        return str(value) if type(value) is int else number_text(value)
    if rule is Rule.FLOAT:
        return float_text(value, single=pg_type == "float4")
    if rule is Rule.TEXT:
        return str(value).rstrip(" ") if pg_type == "bpchar" else str(value)
    if rule is Rule.BLANK_PADDED:
        return str(value).rstrip(" ")
    if rule is Rule.CITEXT:
        return citext_lower(str(value))
    if rule is Rule.INSTANT:
        moment = instant(value)
        return moment.isoformat() if moment is not None else str(value)
    if type(value) in (int, str):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def number_text(value: Any) -> str:
    """A number's exact value, one spelling per value: 5, 5.0 and "5.00" are all "5"."""
    if isinstance(value, str) and value in _NON_FINITE:
        return value
    try:
        number = Decimal(repr(value) if isinstance(value, float) else str(value))
    except InvalidOperation:
        return str(value)
    if not number.is_finite():
        return "NaN" if number.is_nan() else ("Infinity" if number > 0 else "-Infinity")
    return "0" if number.is_zero() else format(number.normalize(), "f")


def float_text(value: Any, single: bool = False) -> str:
    """A number as Postgres compares it with a float: rounded to double precision (`single`:
    a `real`, to single precision first); NaN equals NaN and -0 equals 0, as in Postgres."""
    number = float(value) if not isinstance(value, bool) else float(int(value))
    if single and math.isfinite(number):
        number = struct.unpack("f", struct.pack("f", number))[0]
    if math.isnan(number):
        return "NaN"
    return repr(number + 0.0)  # -0.0 + 0.0 is 0.0


def citext_lower(value: str) -> str:
    """`lower()` as citext applies it in a UTF-8 libc locale: one character at a time (Python's
    `str.lower` maps 'İ' to two characters and a final 'Σ' to 'ς'; towlower does neither)."""
    return "".join(char.lower()[0] for char in value)


def instant(value: Any) -> datetime | None:
    """A date, timestamp or timestamptz value (ISO 8601 text) as a naive UTC datetime."""
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    # A date's text parses as its midnight.
    return parsed.astimezone(UTC).replace(tzinfo=None) if parsed.tzinfo is not None else parsed
