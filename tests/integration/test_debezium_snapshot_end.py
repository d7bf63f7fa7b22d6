"""How real Debezium marks the end of each table's snapshot (the job sweeps at it).

Observed with the embedded engine (Debezium 3.6.3, pgoutput, Postgres 15): the rows of an
initial snapshot say `source.snapshot` "first" (the snapshot's first row), "true", then
"last_in_data_collection" on each table's last row, and "last" on the snapshot's final row; a
table without rows sends nothing. Every row of one snapshot carries the same version (the
snapshot's consistent point), so the sweep at it never removes the snapshot's own rows. The
decoder marks exactly the table-ending rows (`Change.ends_snapshot`), and every row before the
snapshot's final one as a snapshot that goes on (`Change.snapshot_continues`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from cdc_sync.core.model import Change
from cdc_sync.debezium.decoder import parse_record
from tests.debezium_capture import RawRecord, TopicReader, captured
from tests.fixtures.services import KafkaEndpoint
from tests.pg import private_database

pytestmark = pytest.mark.integration
ROWS = {"se.a": 3, "se.b": 2, "se.c": 1, "se.empty": 0}


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    with private_database(pg_url, "snapshot_end") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA se")
            for table, count in ROWS.items():
                conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
                for i in range(count):
                    conn.execute(f"INSERT INTO {table} VALUES (%s, 'x')", (i,))
        yield url


def marker(record: RawRecord) -> str:
    assert record.value is not None
    return str(json.loads(record.value)["payload"]["source"]["snapshot"])


def test_each_tables_last_snapshot_row_ends_its_snapshot(
    database: str, kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    tables = sorted(ROWS)
    with captured(database, kafka, tmp_path, tables) as prefix:
        readers = {t: TopicReader(kafka, f"{prefix}.{t}") for t in tables if ROWS[t]}
        try:
            records = {t: reader.wait_count(ROWS[t]) for t, reader in readers.items()}
        finally:
            for reader in readers.values():
                reader.close()

    markers = {t: [marker(r) for r in rs] for t, rs in records.items()}
    every = [m for ms in markers.values() for m in ms]
    assert every.count("first") == 1 and every.count("last") == 1
    for table, seen in markers.items():
        assert all(m in ("first", "true", "first_in_data_collection") for m in seen[:-1]), seen
        if len(seen) > 1:  # a one-row table snapshotted first says "first" (known limit)
            assert seen[-1] in ("last", "last_in_data_collection"), (table, seen)

    decoded = {
        t: [parse_record(r.key, r.value, r.coordinates) for r in rs] for t, rs in records.items()
    }
    changes = [c for cs in decoded.values() for c in cs]
    assert all(isinstance(c, Change) for c in changes)
    assert len({c.version for c in changes if isinstance(c, Change)}) == 1  # one point
    for table, cs in decoded.items():
        ends = [isinstance(c, Change) and c.ends_snapshot for c in cs]
        expected = [m in ("last", "last_in_data_collection") for m in markers[table]]
        assert ends == expected, table
        if len(cs) > 1:
            assert ends[-1] and not any(ends[:-1])
        # Every row but the snapshot's very last says the snapshot goes on (documents wait).
        goes_on = [isinstance(c, Change) and c.snapshot_continues for c in cs]
        assert goes_on == [m != "last" for m in markers[table]], table


@pytest.mark.parametrize("listed", [["se.b", "se.a"], ["se.a", "se.b"]])
def test_the_snapshot_reads_the_tables_in_table_include_list_order(
    database: str, kafka: KafkaEndpoint, tmp_path: Path, listed: list[str]
) -> None:
    """What documents rely on to render while a snapshot goes on (documents.md): a root table
    listed after the tables its documents read is read after them, whole tables one by one."""
    with captured(database, kafka, tmp_path, listed) as prefix:
        readers = {t: TopicReader(kafka, f"{prefix}.{t}") for t in listed}
        try:
            records = {t: reader.wait_count(ROWS[t]) for t, reader in readers.items()}
        finally:
            for reader in readers.values():
                reader.close()
    first, second = ([marker(r) for r in records[t]] for t in listed)
    assert first[0] == "first" and first[-1] == "last_in_data_collection", first
    assert second[0] == "first_in_data_collection" and second[-1] == "last", second
