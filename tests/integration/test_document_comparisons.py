"""Join values and array order against Postgres itself, over random rows (hypothesis).

For random pairs of columns of the types documents join (integers, numerics of any scale,
floats, text, varchar, char(n), name, citext, dates and timestamps, uuid, boolean) and random
values written to them, the job's join texts (`equality.link_text`, under the pair's
`pair_rule`) are equal exactly when Postgres's `=` holds; for random values of one column, the
job's array order (`order.sort_value`) is Postgres's `ORDER BY` under `COLLATE "C"`, nulls last.
The job's values are the JSON the sinks hold: read from Postgres by the project's row decoding
(`source_rows.read_table`, `sinks.documents.json_document`), as the TOAST fill and verify read.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg import sql

from cdc_sync.core.model import TableId
from cdc_sync.documents.comparisons import catalog_types
from cdc_sync.documents.equality import link_text, pair_rule
from cdc_sync.documents.order import sort_value
from cdc_sync.schema.catalog import ConverterModes, row_schema_from_catalog
from cdc_sync.schema.source_rows import read_table
from cdc_sync.sinks.documents import json_document
from tests.pg import private_database

pytestmark = pytest.mark.integration
TABLE = TableId("public", "pair")
EXAMPLES = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def conn(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    # Not prepared: every example writes a table `pair` of other types.
    with (
        private_database(pg_url, "comparisons") as database,
        psycopg.connect(database, autocommit=True, prepare_threshold=None) as connection,
    ):
        connection.execute("CREATE EXTENSION IF NOT EXISTS citext")
        connection.execute("SET TimeZone = 'UTC'")
        yield connection


Rows = list[tuple[str | None, ...]]

# -- values, written as Postgres literals of each type ------------------------------------------

NUMBER_TYPES = ["int2", "int4", "int8", "numeric", "numeric(10,2)", "float4", "float8"]
STRING_TYPES = ["text", "varchar(8)", "char(5)", "name", "citext"]
INSTANT_TYPES = ["date", "timestamp", "timestamptz"]
# Letters whose case mapping differs between Python's str.lower and Postgres's lower():
# dotted and dotless i, sharp s, sigma in all three forms (escaped: ruff flags look-alikes).
LETTERS = "aAbB zZ\u00e9\u00c9\u0130i\u0131\u00df\u1e9e\u03a3\u03c3\u03c2\t"

numbers = st.one_of(
    st.integers(-32768, 32767).map(Decimal),
    st.decimals(-(10**6), 10**6, places=3, allow_nan=False, allow_infinity=False),
    st.sampled_from([Decimal("0.1"), Decimal("-0"), Decimal("16777217"), Decimal("2.675")]),
)


def number_literal(pg_type: str, value: Decimal, zeros: int, special: str | None) -> str | None:
    """`value` as a literal of `pg_type`, with trailing zeros (5 -> 5.000), or a special value
    where the type has it; None where the value does not fit the type."""
    if special is not None:
        return special if pg_type in ("numeric", "float4", "float8") else None
    if pg_type.startswith("int"):
        limit = {"int2": 2**15, "int4": 2**31, "int8": 2**63}[pg_type]
        whole = int(value)
        return str(whole) if -limit <= whole < limit else None
    text = format(value, "f")
    return text + ("." if "." not in text else "") + "0" * zeros if zeros else text


def string_literal(value: str, form: int) -> str:
    """The same string in another form: as is, upper-cased, lower-cased, blank-padded (no
    longer than char(5) holds: 'ß' upper-cases to 'SS')."""
    return [value, value.upper()[:5], value.lower()[:5], value + "  ", value.rstrip(" ")][form]


def instant_literal(pg_type: str, moment: datetime, offset_hours: int) -> str:
    if pg_type == "date":
        return moment.date().isoformat()
    if pg_type == "timestamp":
        return moment.isoformat(sep=" ")
    zone = timezone(timedelta(hours=offset_hours))
    return moment.replace(tzinfo=UTC).astimezone(zone).isoformat(sep=" ")


@st.composite
def number_rows(draw: st.DrawFn) -> Rows:
    """Per row one number, or another, written in every numeric type (trailing zeros, special
    values where the type has them; null where it does not fit)."""
    rows: Rows = []
    for _ in range(draw(st.integers(1, 20))):
        base, special = draw(numbers), draw(st.sampled_from([None] * 4 + ["NaN", "Infinity"]))
        values = []
        for pg_type in NUMBER_TYPES:
            value = base if draw(st.integers(0, 3)) else draw(numbers)
            values.append(number_literal(pg_type, value, draw(st.integers(0, 3)), special))
        rows.append(tuple(values))
    return rows


@st.composite
def string_rows(draw: st.DrawFn) -> Rows:
    """Per row one string, or another, in each string type in another form (case, blanks)."""
    rows: Rows = []
    for _ in range(draw(st.integers(1, 20))):
        base = draw(st.text(LETTERS, max_size=5))
        rows.append(
            tuple(
                string_literal(
                    base if draw(st.integers(0, 3)) else draw(st.text(LETTERS, max_size=5)),
                    draw(st.integers(0, 4)),
                )
                for _ in STRING_TYPES
            )
        )
    return rows


moments = st.datetimes(datetime(1990, 1, 1), datetime(2040, 1, 1)).map(
    lambda m: m.replace(microsecond=m.microsecond // 1000 * 1000)
)


@st.composite
def instant_rows(draw: st.DrawFn) -> Rows:
    """Per row one moment (often a midnight: a date equals its timestamp), or another, in each
    type, a timestamptz in another zone."""
    rows: Rows = []
    for _ in range(draw(st.integers(1, 20))):
        base = draw(moments)
        if draw(st.booleans()):
            base = base.replace(hour=0, minute=0, second=0, microsecond=0)
        rows.append(
            tuple(
                instant_literal(
                    pg_type,
                    base if draw(st.integers(0, 3)) else draw(moments),
                    draw(st.integers(-12, 12)),
                )
                for pg_type in INSTANT_TYPES
            )
        )
    return rows


@st.composite
def other_rows(draw: st.DrawFn) -> Rows:
    """uuid (in either case) and boolean (in its spellings), each against itself."""
    rows: Rows = []
    for _ in range(draw(st.integers(1, 10))):
        uuid = str(draw(st.uuids()))
        flag = draw(st.sampled_from(["true", "false", "t", "f", "yes", "0"]))
        rows.append((uuid, uuid.upper() if draw(st.booleans()) else str(draw(st.uuids())), flag))
    return rows


FAMILIES = {
    "numbers": (NUMBER_TYPES, number_rows()),
    "strings": (STRING_TYPES, string_rows()),
    "instants": (INSTANT_TYPES, instant_rows()),
    "others": (["uuid", "uuid", "bool"], other_rows()),
}


# -- the columns in Postgres, and the JSON the sinks hold for them -------------------------------


def written(conn: psycopg.Connection[Any], types: tuple[str, ...], rows: Rows) -> dict[str, str]:
    """A table `pair` (n, c0, c1...) of `types` holding `rows`; its types from the catalog."""
    conn.execute("DROP TABLE IF EXISTS pair")
    columns = [
        sql.SQL("{} {}").format(sql.Identifier(f"c{i}"), sql.SQL(t)) for i, t in enumerate(types)
    ]
    conn.execute(
        sql.SQL("CREATE TABLE pair (n int PRIMARY KEY, {})").format(sql.SQL(", ").join(columns))
    )
    marks = sql.SQL(", ").join([sql.Placeholder()] * (len(types) + 1))
    with conn.cursor() as cursor:
        cursor.executemany(
            sql.SQL("INSERT INTO pair VALUES ({})").format(marks),
            [(n, *row) for n, row in enumerate(rows)],
        )
    return dict(catalog_types(conn, [TABLE])[TABLE].columns)


# The connector's exact decimal modes: a numeric as a Decimal (JSON "5.00") or as its text.
# (decimal.handling.mode=double rounds numerics to doubles before any join: not exact.)
DECIMAL_MODES = st.sampled_from([ConverterModes(), ConverterModes(decimal="string")])


def json_rows(conn: psycopg.Connection[Any], modes: ConverterModes) -> dict[int, dict[str, Any]]:
    """n -> the row as the sinks hold it, in the connector's `modes`."""
    schema = row_schema_from_catalog(conn, TABLE, modes)
    return {
        row["n"]: json_document(row, schema)
        for row in read_table(conn, TABLE, schema.columns, modes)
    }


@pytest.mark.parametrize("family", FAMILIES)
@EXAMPLES
@given(data=st.data())
def test_join_values_are_equal_exactly_when_postgres_equality_holds(
    conn: psycopg.Connection[Any], family: str, data: st.DataObject
) -> None:
    """Every pair of the family's columns that has a rule (each with itself too; that every
    pair Postgres compares has one: the test below), on every row."""
    names, rows = FAMILIES[family]
    types = written(conn, tuple(names), data.draw(rows))
    columns = [f"c{i}" for i in range(len(names))]
    pairs = [(a, b) for a in columns for b in columns if pair_rule(types[a], types[b])]
    tests = sql.SQL(", ").join(
        sql.SQL("{} = {}").format(sql.Identifier(a), sql.Identifier(b)) for a, b in pairs
    )
    equal = {
        n: found for n, *found in conn.execute(sql.SQL("SELECT n, {} FROM pair").format(tests))
    }
    for n, row in json_rows(conn, data.draw(DECIMAL_MODES)).items():
        for (a, b), postgres in zip(pairs, equal[n], strict=True):
            if postgres is None:
                continue  # a null: joins nothing, in Postgres and in the job
            rule = pair_rule(types[a], types[b])
            assert rule is not None
            ours = link_text(rule, types[a], row[a]) == link_text(rule, types[b], row[b])
            assert ours == postgres, (types[a], types[b], rule, row[a], row[b])


@pytest.mark.parametrize("family", FAMILIES)
@EXAMPLES
@given(data=st.data())
def test_arrays_sort_as_postgres_orders_the_column(
    conn: psycopg.Connection[Any], family: str, data: st.DataObject
) -> None:
    """Each column of the family, nulls among its values, in the order Postgres gives it."""
    names, rows = FAMILIES[family]
    found = data.draw(rows)
    found += [(None,) * len(names)] * data.draw(st.integers(0, 2))
    types = written(conn, tuple(names), found)
    json = json_rows(conn, data.draw(DECIMAL_MODES))
    for i in range(len(names)):
        column = f"c{i}"
        order: sql.Composable = sql.Identifier(column)
        if types[column] == "citext":  # as citext compares: lower-cased, then code points
            order = sql.SQL('lower({}::text) COLLATE "C"').format(order)
        elif types[column] in ("text", "varchar", "bpchar", "name"):
            order = sql.SQL('{} COLLATE "C"').format(order)
        query = sql.SQL("SELECT n FROM pair ORDER BY {}, n").format(order)
        postgres = [n for (n,) in conn.execute(query).fetchall()]
        ours = sorted(json, key=lambda n: (sort_value(types[column], json[n][column]), n))
        assert ours == postgres, (types[column], [json[n][column] for n in postgres])


def test_a_pair_with_a_rule_is_one_postgres_compares(conn: psycopg.Connection[Any]) -> None:
    """A pair of these types has a rule exactly when Postgres has an `=` for it: the rule never
    claims a join Postgres refuses, and joins every pair it compares."""
    names = [*NUMBER_TYPES, *STRING_TYPES, *INSTANT_TYPES, "uuid", "bool", "time", "jsonb"]
    written(conn, tuple(names), [])
    types = catalog_types(conn, [TABLE])[TABLE].columns
    for i, left in enumerate(names):
        for j, right in enumerate(names):
            query = sql.SQL("SELECT {} = {} FROM pair LIMIT 0").format(
                sql.Identifier(f"c{i}"), sql.Identifier(f"c{j}")
            )
            try:
                with conn.transaction():
                    conn.execute(query)
                comparable = True
            except psycopg.errors.UndefinedFunction:
                comparable = False
            assert (pair_rule(types[f"c{i}"], types[f"c{j}"]) is not None) == comparable, (
                left,
                right,
            )
