"""End-to-end cases as data (flink-cdc style): SQL to run, then the rows every sink must hold.

`expect` maps `<schema>.<table>` -> document id -> either `null` (absent from every sink) or the
columns that must hold these values (compared canonically: "39.50" == 39.5). Special values:
`absent` (the column must not be there: projected out), `{repeat: s, times: n}` (s * n) and
`{value: v, per_sink: {cache: w}}` (w in the cache, v elsewhere: a masked or hashed field).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cdc_sync.core.model import TableId
from cdc_sync.verify.compare import canonical

CASES_DIR = Path(__file__).parent / "cases"
ABSENT = "absent"


@dataclass(frozen=True)
class Case:
    name: str
    sql: tuple[str, ...]
    expect: dict[TableId, dict[str, dict[str, Any] | None]]


def load_cases() -> list[Case]:
    cases = []
    for path in sorted(CASES_DIR.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        expect = {
            TableId.parse(table): {str(ident): row for ident, row in rows.items()}
            for table, rows in (doc.get("expect") or {}).items()
        }
        cases.append(Case(doc["name"], tuple(doc.get("sql") or ()), expect))
    return cases


def expected_value(value: Any, sink: str | None = None) -> Any:
    if isinstance(value, dict) and set(value) == {"value", "per_sink"}:
        # A sink that shapes the field (mask, hash): `{value: v, per_sink: {cache: "***"}}`.
        return expected_value(value["per_sink"].get(sink, value["value"]), sink)
    if isinstance(value, dict) and set(value) == {"repeat", "times"}:
        return canonical(value["repeat"] * value["times"])
    if isinstance(value, dict) and set(value) == {"md5_series"}:
        return canonical(md5_series(value["md5_series"]))
    return canonical(value)


def md5_series(count: int) -> str:
    """`(SELECT string_agg(md5(g::text), '' ORDER BY g) FROM generate_series(1, count) g)`:
    hex text that compresses poorly, so Postgres stores it out of line (TOASTed) and Debezium
    sends the unchanged-value placeholder for it (a repeated phrase compresses inline)."""
    return "".join(
        hashlib.md5(str(g).encode(), usedforsecurity=False).hexdigest() for g in range(1, count + 1)
    )


def mismatches(
    sink: str, rows: dict[str, dict[str, Any]], expected: dict[str, dict[str, Any] | None]
) -> list[str]:
    """What differs between a sink's canonical rows and a case's expectations (empty: all good)."""
    problems = []
    for ident, columns in expected.items():
        row = rows.get(ident)
        if columns is None:
            if row is not None:
                problems.append(f"{sink}: {ident} should be absent")
            continue
        if row is None:
            problems.append(f"{sink}: {ident} missing")
            continue
        for column, value in columns.items():
            if value == ABSENT:
                if column in row:
                    problems.append(f"{sink}: {ident}.{column} should be projected out")
            elif row.get(column) != expected_value(value, sink):
                problems.append(f"{sink}: {ident}.{column} = {row.get(column)!r}")
    return problems
