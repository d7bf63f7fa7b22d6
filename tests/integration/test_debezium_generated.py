"""Stored generated columns through real Debezium (issue 27, point 8).

Observed with the embedded engine (Debezium 3.6.3, pgoutput, Postgres 15): snapshot rows carry a
stored generated column with its value; streamed inserts and updates leave it out of the record
altogether (no field in the `after` schema, not a null). Before Postgres 18 pgoutput does not
publish such columns.

Then, as the job handles them (`job.write.generated`): the table's schema keeps the column (in its
catalog place, typed as the snapshot types it), so streamed changes are no schema change even
under `on_schema_change: fail`; and the write step's fill reads the column back from Postgres by
key, so every change carries the value Postgres computed (compared with Postgres's own SQL).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_sync.core.model import Change, Op, TableId
from cdc_sync.job.decode.fold import fold_key
from cdc_sync.job.settle.schema_changes import SchemaTracker
from cdc_sync.job.write.unavailable import SourceFiller
from cdc_sync.mapping import OnSchemaChange, Policies, TableRoute
from cdc_sync.schema.catalog import ConverterModes
from tests.changes import mapping_of
from tests.debezium_capture import RawRecord, TopicReader, captured
from tests.fixtures.services import KafkaEndpoint
from tests.pg import private_database

pytestmark = pytest.mark.integration
TABLE = TableId("gen", "books")
GENERATED = ("price", "title_len", "label")
# The column, and two more types: an int from text, a text from two columns.
SCHEMA = """
CREATE SCHEMA gen;
CREATE TABLE gen.books (
    id           int PRIMARY KEY,
    price        numeric GENERATED ALWAYS AS (price_cents / 100.0) STORED,
    title        text NOT NULL,
    price_cents  bigint NOT NULL,
    title_len    int GENERATED ALWAYS AS (length(title)) STORED,
    label        text GENERATED ALWAYS AS (title || ' @ ' || price_cents::text) STORED
);
"""
MODES = ConverterModes(decimal="precise", time_precision="adaptive_time_microseconds")
ROWS = 30


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    with private_database(pg_url, "generated") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(SCHEMA)
            conn.execute(
                "INSERT INTO gen.books (id, title, price_cents) "
                "SELECT g, 'book ' || g, g * 137 FROM generate_series(1, %s) g",
                (ROWS // 2,),
            )
        yield url


def after_fields(record: RawRecord) -> list[str]:
    assert record.value is not None
    schema = json.loads(record.value)["schema"]
    after = next(f for f in schema["fields"] if f["field"] == "after")
    return [f["field"] for f in after["fields"]]


def workload(url: str, seed: int) -> int:
    """Inserts, updates of the generated columns' inputs, deletes; returns how many records
    Debezium writes for them (a delete writes a tombstone too)."""
    rng = random.Random(seed)
    records = 0
    with psycopg.connect(url, autocommit=True) as conn:
        for id_ in range(ROWS // 2 + 1, ROWS + 1):
            conn.execute(
                "INSERT INTO gen.books (id, title, price_cents) VALUES (%s, %s, %s)",
                (id_, f"new {id_}", rng.randrange(10**9)),
            )
            records += 1
        for id_ in rng.sample(range(1, ROWS + 1), ROWS // 2):
            conn.execute(
                "UPDATE gen.books SET price_cents = %s, title = title || '!' WHERE id = %s",
                (rng.randrange(10**12), id_),
            )
            records += 1
        for id_ in rng.sample(range(1, ROWS + 1), 3):
            records += 2 * conn.execute("DELETE FROM gen.books WHERE id = %s", (id_,)).rowcount
    return records


def postgres_rows(url: str) -> dict[int, dict[str, Any]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT id, price, title_len, label FROM gen.books").fetchall()
    return {row[0]: dict(zip(GENERATED, row[1:], strict=True)) for row in rows}


def test_generated_columns_are_exact_in_every_change_the_job_writes(
    database: str, kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    with captured(database, kafka, tmp_path, [str(TABLE)]) as prefix:
        reader = TopicReader(kafka, f"{prefix}.{TABLE}")
        try:
            snapshot = list(reader.wait_count(ROWS // 2))
            records = reader.wait_count(ROWS // 2 + workload(database, seed=27))
        finally:
            reader.close()
    streamed = records[len(snapshot) :]

    # What Debezium sends: the snapshot carries the columns, streamed changes do not.
    assert all(set(GENERATED) <= set(after_fields(r)) for r in snapshot)
    written = [r for r in streamed if r.value and json.loads(r.value)["payload"]["after"]]
    assert written and all(not set(GENERATED) & set(after_fields(r)) for r in written)

    changes = [r.change() for r in records if r.value is not None]
    route = TableRoute(
        TABLE, None, {}, None, None, None, Policies(on_schema_change=OnSchemaChange.FAIL)
    )
    filler = SourceFiller(database, MODES)
    try:
        # The schema stays the snapshot's: no column dropped, none added, under `fail`.
        tracker = SchemaTracker(mapping_of(route), None, filler.generated)
        baseline = tracker.observe(route, changes[0].schema).schema
        assert baseline.names == ("id", "price", "title", "price_cents", "title_len", "label")
        for change in changes:
            if change.schema is not None:
                assert tracker.observe(route, change.schema).schema == baseline

        # The fold keeps the newest change per key; the fill reads what Postgres holds.
        by_key: dict[str, list[Change]] = {}
        for change in changes:
            by_key.setdefault(change.doc_id, []).append(change)
        folded = [fold_key(group) for group in by_key.values()]
        filled, gone = filler.fill(TABLE, folded, baseline)
    finally:
        filler.close()

    expected = postgres_rows(database)
    assert gone == 0
    written_rows = {int(c.doc_id): c for c in filled if c.op is not Op.DELETE}
    assert written_rows.keys() == expected.keys()
    for id_, change in written_rows.items():
        assert change.row is not None and not change.unavailable_columns
        assert {name: change.row[name] for name in GENERATED} == expected[id_], id_
