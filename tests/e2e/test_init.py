"""A database of one's own, from nothing but `cdc-sync init` (issues 21 and 27), as the README's
quickstart goes: a schema the project has never seen (composite keys, numeric, jsonb, text[],
timestamptz, a TOASTed text, an enum, a text domain key, quoted names differing by case alone,
a reserved word and a name Kafka cannot carry as table names, stored generated columns, a
month-partitioned table and a table without a key), `init --apply`, both validators, capture
(the embedded engine) and the job acting as the role init made, a workload that moves rows
between partitions and attaches and detaches a partition while streaming, and `cdc-sync verify`
converges. Nested documents over the same schema are added to init's mapping, as a user would,
and verify checks them against the documents Postgres computes (`DOCUMENTS`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from cdc_sync.cli import main
from cdc_sync.connectors.engine import CaptureEngine
from cdc_sync.core.settings import Connections, write_env_file
from cdc_sync.job.observe.console import is_quiet
from cdc_sync.job.settle.applier import BatchApplier, BatchMetrics
from cdc_sync.mapping import load_mapping
from tests.e2e.conftest import Services
from tests.e2e.harness import SyncHarness
from tests.pg import private_database

pytestmark = pytest.mark.e2e
REDIS_DB = 11  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8, others 9, 10

SCHEMA = """
CREATE SCHEMA garden;
CREATE TABLE garden.beds (
    site        text,
    bed         int,
    area        numeric(8, 2) NOT NULL,
    soil        jsonb,
    crops       text[],
    planted_at  timestamptz,
    journal     text,
    PRIMARY KEY (site, bed)
);
ALTER TABLE garden.beds ALTER COLUMN journal SET STORAGE EXTERNAL;
CREATE TABLE garden.harvests (
    id         bigint PRIMARY KEY,
    site       text NOT NULL,
    bed        int NOT NULL,
    kg         numeric,
    picked_at  timestamptz NOT NULL
);
-- Issue 27's schema: an enum, a text domain key, names differing by case alone, a reserved word,
-- a name Kafka cannot carry, stored generated columns, a month-partitioned table, no key.
CREATE TYPE garden.season AS ENUM ('spring', 'summer', 'autumn', 'winter');
CREATE DOMAIN garden.code AS text CHECK (VALUE ~ '^[A-Z][A-Z0-9-]*$');
CREATE TABLE garden."Varieties" (code garden.code PRIMARY KEY, name text NOT NULL,
                                 sown garden.season);
CREATE TABLE garden.varieties (code text PRIMARY KEY, note text);
CREATE TABLE garden."order" (id int PRIMARY KEY, variety garden.code, qty int NOT NULL);
CREATE TABLE garden."tool shed" (id int PRIMARY KEY, tool text);
CREATE TABLE garden.seeds (
    id           int PRIMARY KEY,
    price_cents  bigint NOT NULL,
    price        numeric GENERATED ALWAYS AS (price_cents / 100.0) STORED,
    label        text GENERATED ALWAYS AS ('#' || id || ' ' || price_cents) STORED
);
CREATE TABLE garden.readings (sensor int, at timestamptz, value numeric,
                              PRIMARY KEY (sensor, at)) PARTITION BY RANGE (at);
CREATE TABLE garden.readings_2026_01 PARTITION OF garden.readings
    FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
CREATE TABLE garden.readings_2026_02 PARTITION OF garden.readings
    FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
CREATE TABLE garden.notes (body text);
"""
# Hex text compresses poorly: kept out of line, so an update of another column sends
# Debezium's unavailable-value placeholder for it (filled from Postgres, as init's role).
JOURNAL = (
    "(SELECT string_agg(md5(g::text || '{salt}'), '' ORDER BY g) FROM generate_series(1, 400) g)"
)
SEED = [
    "INSERT INTO garden.beds VALUES ('north|1', 1, 12.50, '{\"ph\": 6.5}', '{kale,leek}', "
    f"'2026-03-01 08:00+01', {JOURNAL.format(salt='a')})",
    "INSERT INTO garden.beds VALUES ('south', 2, 7.25, NULL, '{}', NULL, 'short')",
    "INSERT INTO garden.harvests VALUES (1, 'south', 2, 3.141592653589793238, '2026-06-01 10:00Z')",
    "INSERT INTO garden.\"Varieties\" VALUES ('KALE-1', 'Nero', 'autumn'), ('LEEK', 'Blue', NULL)",
    "INSERT INTO garden.varieties VALUES ('kale-1', 'lower case, another table')",
    "INSERT INTO garden.\"order\" VALUES (1, 'KALE-1', 3)",
    "INSERT INTO garden.\"tool shed\" VALUES (1, 'spade'), (2, 'rake')",
    "INSERT INTO garden.seeds (id, price_cents) SELECT g, g * 199 FROM generate_series(1, 5) g",
    "INSERT INTO garden.readings SELECT s, '2026-01-01'::timestamptz + g * interval '9 hours', g "
    "FROM generate_series(1, 3) s, generate_series(1, 100) g",  # January and February
    "INSERT INTO garden.notes VALUES ('no key: left out')",
]
WORKLOAD = [
    "INSERT INTO garden.beds VALUES ('south', 3, 1.00, '{\"ph\": 7}', "
    f"ARRAY['bean \"x\"', NULL], now(), {JOURNAL.format(salt='b')})",
    "UPDATE garden.beds SET area = 13.75 WHERE site = 'north|1' AND bed = 1",  # journal unchanged
    "UPDATE garden.beds SET crops = array_append(crops, 'chard'), soil = soil || '{\"n\": 3}' "
    "WHERE site = 'north|1'",
    "INSERT INTO garden.harvests SELECT g, 'south', 3, g * 0.5, now() "
    "FROM generate_series(2, 40) g",
    "UPDATE garden.harvests SET kg = kg + 0.001 WHERE id % 3 = 0",
    "DELETE FROM garden.harvests WHERE id % 5 = 0",
    "DELETE FROM garden.beds WHERE site = 'south' AND bed = 2",
    "INSERT INTO garden.\"Varieties\" VALUES ('CHARD', 'Ruby', 'spring')",
    "UPDATE garden.\"Varieties\" SET sown = 'summer' WHERE code = 'LEEK'",
    "UPDATE garden.varieties SET note = 'still its own row' WHERE code = 'kale-1'",
    "INSERT INTO garden.\"order\" VALUES (2, 'CHARD', 1)",
    'UPDATE garden."order" SET qty = qty + 1 WHERE id = 1',
    "UPDATE garden.\"tool shed\" SET tool = 'hoe' WHERE id = 1",
    'DELETE FROM garden."tool shed" WHERE id = 2',  # a tombstone on a topic Debezium renamed
    # The generated columns change with their inputs; streamed changes do not carry them.
    "UPDATE garden.seeds SET price_cents = price_cents * 3 + id WHERE id % 2 = 1",
    "INSERT INTO garden.seeds (id, price_cents) VALUES (6, 1234567)",
    "DELETE FROM garden.seeds WHERE id = 2",
    # A row moving between partitions: a delete of its old key and a create of the new one.
    "UPDATE garden.readings SET at = at + interval '31 days' WHERE sensor = 1 "
    "AND at < '2026-01-10'",
    "UPDATE garden.readings SET value = value * 2 WHERE sensor = 2 AND at > '2026-02-20'",
    # A partition attached with rows (no change event: the event trigger signals a snapshot).
    "CREATE TABLE garden.readings_2026_03 (LIKE garden.readings)",
    "INSERT INTO garden.readings_2026_03 "
    "SELECT 9, '2026-03-01'::timestamptz + g * interval '1 day', g FROM generate_series(0, 20) g",
    "ALTER TABLE garden.readings ATTACH PARTITION garden.readings_2026_03 "
    "FOR VALUES FROM ('2026-03-01') TO ('2026-04-01')",
    "UPDATE garden.readings SET value = -1 WHERE sensor = 9 AND at = '2026-03-05'",
]
# Document indices a user adds to init's mapping, over the odd parts of the schema: a composite
# key whose value holds the id separator and a composite join; a reserved word as the root and a
# domain-typed key joined to a table whose name differs from another's by case alone; stored
# generated columns (which streamed changes lack) under a filter; a partitioned root whose rows
# move between partitions, and whose partitions are attached and detached.
DOCUMENTS = """
documents:
  garden_bed_documents:
    root: garden.beds
    relations:
      harvests:
        table: garden.harvests
        join: {site: site, bed: bed}
        type: nested
        order_by: [kg]
  garden_order_documents:
    root: garden.order
    relations:
      sort: {table: garden.Varieties, kind: one, join: {variety: code}}
  garden_seed_documents:
    root: garden.seeds
    filter: "CAST(price AS numeric(38, 10)) > 5"
  garden_reading_documents:
    root: garden.readings
    filter: "CAST(value AS numeric(38, 10)) >= 0"
"""
# A partition detached (its rows leave the table without a change event): a blocking snapshot
# of the root, whose end removes them from every sink.
DETACH = ["ALTER TABLE garden.readings DETACH PARTITION garden.readings_2026_01"]
ROUTED = {
    "garden.beds",
    "garden.harvests",
    "garden.Varieties",
    "garden.varieties",
    "garden.order",
    "garden.tool shed",
    "garden.seeds",
    "garden.readings",
}


def as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))


def env_file(path: Path, connections: Connections) -> Path:
    values = {
        "CDC_SYNC_PG_URL": connections.pg_url,
        "CDC_SYNC_KAFKA_BOOTSTRAP": connections.kafka_bootstrap,
        "CDC_SYNC_KAFKA_FLAVOR": connections.kafka_flavor,
        "CDC_SYNC_SEARCH_URL": connections.search_url,
        "CDC_SYNC_SEARCH_CLIENT": connections.search_client,
        "CDC_SYNC_REDIS_URL": connections.redis_url,
        "CDC_SYNC_WAREHOUSE": connections.warehouse,
    }
    write_env_file(path, {k: v for k, v in values.items() if v is not None})
    return path


def run_sql(url: str, statements: list[str]) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement.encode())


@pytest.fixture
def admin_url(services: Services) -> Iterator[tuple[str, str]]:
    """(a new database with the garden schema and seed rows, a connector name); the role
    init makes is dropped after the database."""
    name = f"garden{uuid.uuid4().hex[:6]}"
    with private_database(services.pg_url, "init_e2e") as url:
        run_sql(url, [SCHEMA, *SEED])
        yield url, name
    run_sql(services.pg_url, [f'DROP ROLE IF EXISTS "cdc_sync_{name}"'])


def test_init_then_capture_run_and_verify_converge(
    services: Services,
    admin_url: tuple[str, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, name = admin_url
    init = ["init", "--pg-url", url, "--tables", "garden.*", "--name", name, "--out", str(tmp_path)]
    assert main([*init, "--apply"]) == 0
    said = capsys.readouterr().out
    assert [line for line in said.splitlines() if line.startswith("left out:")] == [
        "left out: garden.notes: no primary key: the sinks key every row by it. Fix: ALTER TABLE "
        '"garden"."notes" ADD PRIMARY KEY (<columns>)'
    ]
    assert "garden.seeds: stored generated columns price, label: not published" in said
    connector = tmp_path / "connectors" / f"{name}.json"
    mapping_file = tmp_path / "mappings" / f"{name}.yaml"
    with mapping_file.open("a") as mapping_text:
        mapping_text.write(DOCUMENTS)

    # From here on everything acts as the role the setup SQL made, as the README says.
    connections = services.connections(as_role(url, f"cdc_sync_{name}"), REDIS_DB, tmp_path)
    settings = ["--env-file", str(env_file(tmp_path / "stack.env", connections))]
    assert main([*settings, "connectors", "validate", "--connector", str(connector),
                 "--mapping", str(mapping_file)]) == 0  # fmt: skip
    assert main([*settings, "mappings", "validate", "--mapping", str(mapping_file)]) == 0

    mapping = load_mapping(mapping_file)
    assert {str(t) for t in mapping.tables} == ROUTED
    indices = [r.search.index for r in mapping.tables.values() if r.search is not None]
    assert len(set(indices)) == len(indices)  # Varieties and varieties: one index each
    assert len(mapping.documents) == 4
    job = SyncHarness(services.spark, mapping, connections, tmp_path)
    with ExitStack() as stack:
        capture = CaptureEngine.from_file(
            connector, connections, tmp_path / "capture", {"slot.drop.on.stop": "true"}
        )
        capture.start()
        stack.callback(capture.stop)
        capture.wait_ready(timeout_seconds=120)
        job.start()
        stack.callback(job.stop)
        run_sql(url, WORKLOAD)
        report = job.wait_converged(timeout_seconds=300)
        assert {str(t.table) for t in report.tables} == ROUTED
        assert main([*settings, "verify", "--mapping", str(mapping_file)]) == 0
        run_sql(url, DETACH)
        job.wait_converged(timeout_seconds=300)
        assert main([*settings, "verify", "--mapping", str(mapping_file)]) == 0
        assert job.job is not None
        heartbeat = idle_batch(job.job.consumer("search").applier)
        # What the console's idle line reports: a lag from the heartbeat's commit time.
        assert heartbeat.source_ts_ms is not None
        assert 0 <= time.time() * 1000 - heartbeat.source_ts_ms < 30_000


def idle_batch(applier: BatchApplier, timeout_seconds: float = 30.0) -> BatchMetrics:
    """The next batch of heartbeats only (the connector beats every second)."""
    seen: list[BatchMetrics] = []
    applier.observers.append(seen.append)
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        quiet = [m for m in seen if is_quiet(m) and m.records]
        if quiet:
            return quiet[0]
        time.sleep(0.5)
    raise AssertionError(f"no heartbeat-only batch in {timeout_seconds}s: {seen}")
