"""What real Debezium sends for an unchanged TOASTed array of every element type, and that the
decoder marks each one unavailable (never a value).

REPLICA IDENTITY DEFAULT; each array column holds over 3 kB, stored out of line (`SET
STORAGE EXTERNAL`); the row is then updated in another column only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_sync.core.model import TableId
from cdc_sync.debezium.connector import load_connector
from cdc_sync.schema import UNAVAILABLE_VALUE
from cdc_sync.schema.catalog import ConverterModes
from cdc_sync.schema.source_rows import read_columns
from tests.debezium_capture import CONNECTOR, TopicReader, captured
from tests.fixtures.services import KafkaEndpoint
from tests.pg import private_database

pytestmark = pytest.mark.integration
TABLE = "toast.arrays"

# column -> (type, an expression for one element of it from g, bytes an element takes on disk).
# Every array is sized to more than TOAST_TUPLE_TARGET (~2 kB) on its own, so the toaster moves
# each one out of line (not just the largest), and the records stay under the broker's limit.
ARRAYS: dict[str, tuple[str, str, int]] = {
    "a_int2": ("int2[]", "(g % 30000)::int2", 2),
    "a_int4": ("int4[]", "g * 7919", 4),
    "a_int8": ("int8[]", "g::int8 * 1000000007", 8),
    "a_float4": ("real[]", "g / 7.0::real", 4),
    "a_float8": ("float8[]", "g / 7.0::float8", 8),
    "a_numeric": ("numeric[]", "g / 7.0::numeric", 12),
    "a_bool": ("bool[]", "g % 3 = 0", 1),
    "a_text": ("text[]", "md5(g::text)", 33),
    "a_varchar": ("varchar[]", "md5(g::text)", 33),
    "a_varchar_n": ("varchar(40)[]", "md5(g::text)", 33),
    "a_char": ("char(8)[]", "left(md5(g::text), 8)", 9),
    "a_date": ("date[]", "date '2000-01-01' + g", 4),
    "a_time": ("time[]", "time '00:00' + g * interval '1 second'", 8),
    "a_timestamp": ("timestamp[]", "timestamp '2000-01-01' + g * interval '1 minute'", 8),
    "a_timestamptz": ("timestamptz[]", "timestamptz '2000-01-01Z' + g * interval '1 minute'", 8),
    "a_uuid": ("uuid[]", "md5(g::text)::uuid", 16),
    "a_json": ("json[]", "json_build_object('k', g)", 12),
    "a_jsonb": ("jsonb[]", "jsonb_build_object('k', g)", 20),
    "a_bytea": ("bytea[]", "decode(md5(g::text), 'hex')", 17),
    "a_inet": ("inet[]", "('10.0.' || (g / 256) % 256 || '.' || g % 256)::inet", 8),
    "a_enum": ("toast.mood[]", "(ARRAY['sad', 'ok', 'happy']::toast.mood[])[g % 3 + 1]", 4),
    "a_citext": ("citext[]", "md5(g::text)::citext", 33),
    "a_interval": ("interval[]", "g * interval '1.5 second'", 16),
}
ARRAY_BYTES = 3000


def citext_available(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'citext'").fetchone()
    return row is not None


@pytest.fixture
def database(pg_url: str) -> Iterator[tuple[str, dict[str, tuple[str, str, int]]]]:
    with private_database(pg_url, "toast_arrays") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            columns = dict(ARRAYS)
            if citext_available(conn):
                conn.execute("CREATE EXTENSION citext")
            else:
                del columns["a_citext"]
            conn.execute("CREATE SCHEMA toast")
            conn.execute("CREATE TYPE toast.mood AS ENUM ('sad', 'ok', 'happy')")
            definitions = ", ".join(f"{name} {type_}" for name, (type_, *_) in columns.items())
            conn.execute(f"CREATE TABLE {TABLE} (id int PRIMARY KEY, n int, {definitions})")
            for name in columns:
                conn.execute(f"ALTER TABLE {TABLE} ALTER COLUMN {name} SET STORAGE EXTERNAL")
            values = ", ".join(
                f"(SELECT array_agg({expr} ORDER BY g) "
                f"FROM generate_series(1, {ARRAY_BYTES // size + 1}) g)"
                for _, expr, size in columns.values()
            )
            conn.execute(f"INSERT INTO {TABLE} SELECT 1, 0, {values}")
            toasted = conn.execute(
                "SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = %s::regclass",
                (TABLE,),
            ).fetchone()
            assert toasted is not None and toasted[0] > 0, "the arrays must be out of line"
        yield url, columns


def test_unchanged_toasted_arrays_of_every_type_are_unavailable(
    database: tuple[str, dict[str, tuple[str, str, int]]],
    kafka: KafkaEndpoint,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    url, columns = database
    with captured(url, kafka, tmp_path, [TABLE]) as prefix:
        reader = TopicReader(kafka, f"{prefix}.{TABLE}")
        try:
            [snapshot] = reader.wait_count(1)
            capfd.readouterr()
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f"UPDATE {TABLE} SET n = 1 WHERE id = 1")
            update = reader.wait_count(2)[1]
        finally:
            reader.close()
    # Debezium's warning and stack trace per null placeholder (the engine's log4j2.properties):
    # expected on every such update, and the job reads the values back: not on the console.
    assert "Failed to properly convert" not in capfd.readouterr().err
    assert update.value is not None
    after = json.loads(update.value)["payload"]["after"]
    # What Debezium sent for each column (the forms schema/unavailable.py's table lists).
    observed = {name: placeholder_form(after[name]) for name in columns if name in after}
    assert observed == OBSERVED_FORMS | ({} if "a_citext" in columns else {"a_citext": None})
    change = update.change()
    assert change.unavailable_columns == frozenset(observed)
    assert change.uncertain_columns == frozenset(n for n, form in observed.items() if form is None)
    assert change.row is not None and change.row["n"] == 1

    # The read-back that fills them (job.write.unavailable) gives what Debezium sent in the
    # snapshot.
    sent = snapshot.change()
    assert sent.unavailable_columns == frozenset() and sent.row is not None
    assert sent.schema is not None and change.schema is not None
    with psycopg.connect(url) as conn:
        read = read_columns(
            conn,
            TableId("toast", "arrays"),
            [change.schema.column("id")],
            [(1,)],
            [change.schema.column(name) for name in sorted(change.unavailable_columns)],
            ConverterModes.from_connector(load_connector(CONNECTOR).config),
        )
    assert read[(1,)] == {name: sent.row[name] for name in change.unavailable_columns}


def placeholder_form(raw: object) -> object:
    """A placeholder as the table in schema/unavailable.py names it."""
    if isinstance(raw, list) and len(raw) > 1:
        assert raw == list(UNAVAILABLE_VALUE.encode())
        return "marker bytes"
    return raw


MARKER_BASE64 = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ=="
OBSERVED_FORMS: dict[str, object] = {  # Debezium 3.6.3, pgoutput, Postgres 15
    "a_int2": None,
    "a_int4": "marker bytes",
    "a_int8": "marker bytes",
    "a_float4": None,
    "a_float8": None,
    "a_numeric": None,
    "a_bool": None,
    "a_text": [UNAVAILABLE_VALUE],
    "a_varchar": [UNAVAILABLE_VALUE],
    "a_varchar_n": [UNAVAILABLE_VALUE],
    "a_char": [UNAVAILABLE_VALUE],
    "a_date": "marker bytes",
    "a_time": None,
    "a_timestamp": None,
    "a_timestamptz": None,
    "a_uuid": ["b68a35a7-17ad-35b3-af2a-ae46edb4545a"],
    "a_json": [UNAVAILABLE_VALUE],
    "a_jsonb": [UNAVAILABLE_VALUE],
    "a_bytea": [MARKER_BASE64],
    "a_inet": None,
    "a_enum": None,
    "a_citext": None,
    # interval[]: Debezium has no schema for it and leaves the column out of the record.
}
