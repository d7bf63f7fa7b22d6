"""Postgres `interval` -> int64 microseconds, exactly (integers only, no floats).

The one home of the rule, used by the decoder (Debezium `interval.handling.mode=string`) and by
verify (the Postgres side). The sinks store what Debezium's `MicroDuration` means: microseconds
with a month counted as 30.4375 days (365.25 / 12) and a year as 12 months. Debezium computes
both modes through a double: numeric mode truncates and can be 1 µs off; string mode's seconds
can carry the double's noise (`31.800750999`), which rounds back to the exact microsecond here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MICROS_PER_SECOND = 1_000_000
MICROS_PER_DAY = 86_400 * MICROS_PER_SECOND
MICROS_PER_MONTH = 2_629_800 * MICROS_PER_SECOND  # 30.4375 days, Debezium's DAYS_PER_MONTH_AVG
ISO_8601 = "iso8601"  # ColumnType.unit of an INT64 interval column that arrives as ISO text

# ISO 8601 duration with a sign per component, as Debezium writes it (`P1Y-2M3DT4H5M-6.789S`,
# always every component) and Postgres does with IntervalStyle=iso_8601 (`P-1M-2DT3H0.000001S`,
# zero components left out); a leading sign (`-PT1S`) negates the whole duration.
_INT = r"[-+]?\d+"
_ISO_DURATION = re.compile(
    rf"(?P<sign>[-+])?P(?!$)"
    rf"(?:(?P<years>{_INT})Y)?(?:(?P<months>{_INT})M)?(?:(?P<weeks>{_INT})W)?(?:(?P<days>{_INT})D)?"
    rf"(?:T(?!$)(?:(?P<hours>{_INT})H)?(?:(?P<minutes>{_INT})M)?"
    rf"(?:(?P<seconds>[-+]?\d+(?:[.,]\d+)?)S)?)?"
)


@dataclass(frozen=True)
class IntervalParts:
    """Postgres keeps an interval as three independent fields: months, days, microseconds."""

    months: int
    days: int
    micros: int

    @property
    def total_micros(self) -> int:
        return interval_micros(self.months, self.days, self.micros)


def interval_micros(months: int, days: int, micros: int) -> int:
    """The sinks' representation of an interval (Debezium's MicroDuration convention)."""
    return months * MICROS_PER_MONTH + days * MICROS_PER_DAY + micros


def parse_iso_interval(text: str) -> IntervalParts:
    """Months, days and microseconds of an ISO 8601 duration; ValueError if not one."""
    match = _ISO_DURATION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not an ISO 8601 duration: {text!r}")
    part = match.groupdict()

    def number(name: str) -> int:
        value = part[name]
        return int(value) if value is not None else 0

    hours_minutes = number("hours") * 60 + number("minutes")
    micros = hours_minutes * 60 * MICROS_PER_SECOND + _seconds_micros(part["seconds"] or "0")
    sign = -1 if part["sign"] == "-" else 1
    return IntervalParts(
        months=sign * (number("years") * 12 + number("months")),
        days=sign * (number("weeks") * 7 + number("days")),
        micros=sign * micros,
    )


def iso_interval_micros(text: str) -> int:
    return parse_iso_interval(text).total_micros


def _seconds_micros(text: str) -> int:
    """`-6.789012` -> -6789012, in integers: a float would round (the defect this avoids).

    Debezium computes the seconds through a double (`PGInterval.getSeconds()`, printed by
    `Double.toString` and cut to 9 decimals), so `31.800751` can arrive as `31.800750999`.
    Postgres holds whole microseconds and the double is far closer than half a microsecond to
    the value it stands for: the nearest microsecond (half away from zero) is the exact value.
    """
    negative = text.startswith("-")
    whole, _, fraction = text.lstrip("+-").replace(",", ".").partition(".")
    micros = int(whole) * MICROS_PER_SECOND + int((fraction[:6] or "0").ljust(6, "0"))
    if fraction[6:7] >= "5":  # the rest is at least half a microsecond
        micros += 1
    return -micros if negative else micros
