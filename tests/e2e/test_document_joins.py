"""Document rows joined and ordered as Postgres compares their types, through real Debezium,
Spark and the search server (mapping tests/e2e/documents/joins.yaml): an `int4` key nests the
`numeric(12,2)` rows that name it (1 = 1.00), a `numeric` foreign key finds its `numeric(10,0)`
row (5.0 = 5), a `varchar` its `char(6)` row ('cd  ' = 'cd    '), a `citext` its row written
in another case ('NORTH' = 'North'); lines sort by a numeric price as numbers, nulls last.
After each step `verify` compares the index with every document computed by Postgres itself
(SQL generated from the spec, `verify.documents`); the documents are also read where the join
or the order is the point."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_sync.demo.workload import create_demo_schema
from cdc_sync.sinks.search import readback as search_readback
from cdc_sync.sinks.search.backends import open_backend
from cdc_sync.verify.compare import verify_all
from cdc_sync.verify.repair import RepairOptions, repair
from cdc_sync.verify.resnapshot import SnapshotChannel
from tests.e2e.conftest import Services, running_pipeline
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.pg import private_database

pytestmark = pytest.mark.e2e
REDIS_DB = 14  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8, others 9-13
MAPPING = Path(__file__).parent / "documents" / "joins.yaml"
DOCUMENT = "dj_order_documents"
TABLES = ("dj_accounts", "dj_tiers", "dj_regions", "dj_orders", "dj_lines")
SCHEMA = [
    "CREATE EXTENSION IF NOT EXISTS citext",
    "CREATE TABLE shop.dj_accounts (code char(6) PRIMARY KEY, name text NOT NULL)",
    "CREATE TABLE shop.dj_tiers (id numeric(10, 0) PRIMARY KEY, label text NOT NULL)",
    "CREATE TABLE shop.dj_regions (name citext PRIMARY KEY, zone text NOT NULL)",
    "CREATE TABLE shop.dj_orders "
    "(id integer PRIMARY KEY, account_code varchar(10), tier_id numeric, region_name citext)",
    "CREATE TABLE shop.dj_lines (order_id numeric(12, 2) NOT NULL, line_no integer NOT NULL, "
    "price numeric(10, 2), PRIMARY KEY (order_id, line_no))",
    "INSERT INTO shop.dj_accounts VALUES ('ab', 'Account AB'), ('cd', 'Account CD')",
    "INSERT INTO shop.dj_tiers VALUES (5, 'gold'), (7, 'silver')",
    "INSERT INTO shop.dj_regions VALUES ('North', 'n-zone'), ('South', 's-zone')",
    "INSERT INTO shop.dj_orders VALUES (1, 'ab', 5.0, 'NORTH'), (2, 'cd  ', 7.000, 'south')",
    "INSERT INTO shop.dj_lines VALUES (1.00, 1, 10.00), (1, 2, -2.00), (1, 3, 9.50), "
    "(1, 4, -10.00), (1, 5, NULL), (2, 1, 3.00)",
]


@pytest.fixture(scope="module")
def pipeline(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncHarness]:
    root = tmp_path_factory.mktemp("e2e-document-joins")
    with private_database(services.pg_url, "document_joins_e2e") as database:
        connections = services.connections(database, REDIS_DB, root)
        create_demo_schema(database)  # the signal and heartbeat tables the connector uses
        with psycopg.connect(database, autocommit=True) as conn:
            for statement in SCHEMA:
                conn.execute(statement.encode())
        mapping = e2e_mapping(f"dj{uuid.uuid4().hex[:6]}", MAPPING)
        captured = [*TABLES, "cdc_sync_signal", "cdc_sync_heartbeat"]
        overrides = {"table.include.list": ",".join(f"shop.{t}" for t in captured)}
        with running_pipeline(services.spark, mapping, connections, root, overrides) as harness:
            harness.wait_converged()  # the documents of the snapshot
            yield harness


def documents(pipeline: SyncHarness) -> dict[str, dict[str, Any]]:
    return pipeline.documents(DOCUMENT)


def step(pipeline: SyncHarness, *statements: str) -> dict[str, Any]:
    """Run the statements, wait until verify finds no difference; order 1's document."""
    pipeline.run_sql(list(statements))
    report = pipeline.wait_converged()
    assert report.converged, report.table()
    return documents(pipeline)["1"]


def prices(document: dict[str, Any]) -> list[str | None]:
    return [line["price"] for line in document["lines"]]


def test_rows_join_and_sort_as_postgres_compares_their_types(pipeline: SyncHarness) -> None:
    held = documents(pipeline)
    first, second = held["1"], held["2"]
    assert first["account"]["name"] == "Account AB"  # varchar 'ab' = char(6) 'ab    '
    assert second["account"]["name"] == "Account CD"  # varchar 'cd  ' = char(6) 'cd    '
    assert first["tier"]["label"] == "gold"  # numeric 5.0 = numeric(10,0) 5
    assert first["region"]["zone"] == "n-zone"  # citext 'NORTH' = citext 'North'
    assert second["region"]["zone"] == "s-zone"
    assert [line["line_no"] for line in second["lines"]] == [1]  # int4 2 = numeric 2.00
    assert prices(first) == ["-10.00", "-2.00", "9.50", "10.00", None]  # by value, nulls last
    # A parent's change reaches its roots through each kind of join.
    assert step(pipeline, "UPDATE shop.dj_tiers SET label = 'platinum' WHERE id = 5")["tier"] == {
        "id": "5",
        "label": "platinum",
    }
    moved = step(pipeline, "UPDATE shop.dj_regions SET zone = 'north-2' WHERE name = 'north'")
    assert moved["region"]["zone"] == "north-2"
    renamed = step(pipeline, "UPDATE shop.dj_accounts SET name = 'Renamed' WHERE code = 'ab'")
    assert renamed["account"]["name"] == "Renamed"
    # The root's foreign keys move, written in yet other forms.
    moved = step(
        pipeline, "UPDATE shop.dj_orders SET tier_id = 7.00, region_name = 'SOUTH' WHERE id = 1"
    )
    assert (moved["tier"]["label"], moved["region"]["zone"]) == ("silver", "s-zone")
    # A child with a lower price sorts first; one whose key is written 1.0 still joins 1.
    added = step(pipeline, "INSERT INTO shop.dj_lines VALUES (1.0, 6, -100.50)")
    assert prices(added) == ["-100.50", "-10.00", "-2.00", "9.50", "10.00", None]
    updated = step(
        pipeline, "UPDATE shop.dj_lines SET price = 9.49 WHERE order_id = 1 AND line_no = 1"
    )
    assert prices(updated) == ["-100.50", "-10.00", "-2.00", "9.49", "9.50", None]


def test_repair_rewrites_damaged_documents_itself_and_newer_renders_pass(
    pipeline: SyncHarness,
) -> None:
    """A document deleted, one corrupted at its own version, one invented: `repair` rewrites
    the first two as Postgres computes them (at its fence version, no snapshot) and deletes the
    third; the job's next render of a changed root replaces the repaired document."""
    pipeline.wait_converged()
    spec = pipeline.mapping.documents[DOCUMENT]
    connections = pipeline.connections
    backend = open_backend(connections.search_client, connections.require("search_url"))
    try:
        stored = search_readback.documents(backend, spec.index)["1"][0]
        versioned = {"version": stored, "version_type": "external_gte"}
        invented = {"_index": spec.index, "_id": "99", "version": 5, "version_type": "external"}
        backend.bulk(
            [
                {"delete": {"_index": spec.index, "_id": "2"}},
                {"index": {"_index": spec.index, "_id": "1", **versioned}},
                {"id": 1, "account": None},
                {"index": invented},
                {"id": 99},
            ]
        )
    finally:
        backend.close()
    damaged = {s.sink: s for t in verify_all(pipeline.mapping, connections).tables for s in t.sinks}
    found = damaged[f"document {DOCUMENT}"]
    assert (found.missing, found.different, found.extra) == (["2"], ["1"], ["99"])
    printed: list[str] = []
    channel = SnapshotChannel(  # documents need the signal table only: no snapshot runs
        config={"signal.data.collection": "shop.cdc_sync_signal"},
        conninfo=connections.require("pg_url"),
        kafka={},
    )
    options = RepairOptions(tables={spec.table}, sinks={"search"}, settle_seconds=30)
    result = repair(pipeline.mapping, connections, channel, options, printed.append)
    text = "\n".join(printed)
    assert result.converged, text
    assert f"document {DOCUMENT}: 1 extra: 1 deleted at their stored version" in text, text
    assert f"document {DOCUMENT}: 1 missing, 1 different: 2 rewritten at version" in text, text
    repaired = documents(pipeline)
    assert repaired["1"]["account"]["name"] == "Renamed" and "99" not in repaired
    # A later change renders above the fence: the job's newer document replaces the repaired one.
    assert (
        step(pipeline, "UPDATE shop.dj_accounts SET name = 'Again' WHERE code = 'ab'")["account"][
            "name"
        ]
        == "Again"
    )
