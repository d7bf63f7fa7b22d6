"""`cdc-sync init` on a real catalog: what it flags, the files it writes pass both validators as
the least-privilege role it creates, and a re-run on a changed schema diffs instead of writing;
names with dots, quotes and case alone apart, partitioned tables (whose partition changes the
setup's event trigger turns into Debezium signals) and generated columns."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import Connection

from cdc_sync.cli import main
from cdc_sync.connectors.checks import run_checks
from cdc_sync.core.model import TableId
from cdc_sync.debezium.connector import ConnectorFile, load_connector
from cdc_sync.mapping import MappingFile, load_mapping
from cdc_sync.verify.mapping_check import validate_mapping
from tests.pg import private_database

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE SCHEMA app;
CREATE TABLE app.users (id bigint PRIMARY KEY, email text NOT NULL, score numeric(8, 3),
                        tags text[], meta jsonb, seen_at timestamptz);
CREATE TABLE app.visits (user_id bigint, day date, n int, PRIMARY KEY (user_id, day));
CREATE TABLE app.no_key (body text);
CREATE TABLE app.nothing (id int PRIMARY KEY);
ALTER TABLE app.nothing REPLICA IDENTITY NOTHING;
CREATE TABLE app.deferred (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED);
CREATE UNLOGGED TABLE app.scratch (id int PRIMARY KEY);
CREATE TABLE app.shapes (id int PRIMARY KEY, p point);
CREATE TABLE app.by_email (id int PRIMARY KEY, email text NOT NULL UNIQUE);
ALTER TABLE app.by_email REPLICA IDENTITY USING INDEX by_email_email_key;
"""
LEFT_OUT = {
    "app.no_key": "ADD PRIMARY KEY",
    "app.nothing": "REPLICA IDENTITY DEFAULT",
    "app.deferred": "REPLICA IDENTITY FULL",
    "app.scratch": "SET LOGGED",
    "app.shapes": "'point'",
    "app.by_email": "REPLICA IDENTITY DEFAULT (or USING INDEX on a unique index",
}


def database_with(pg_url: str, prefix: str, schema: str) -> Iterator[tuple[str, str]]:
    """(database URL, connector name): a database with `schema`; the role init makes is
    dropped after it."""
    name = f"{prefix}{uuid.uuid4().hex[:6]}"
    with private_database(pg_url, f"init_{prefix}") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(schema.encode())
        yield url, name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP ROLE IF EXISTS "cdc_sync_{name}"'.encode())


@pytest.fixture
def app_db(pg_url: str) -> Iterator[tuple[str, str]]:
    yield from database_with(pg_url, "app", SCHEMA)


def as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.hostname}:{parts.port}"))


def applied(
    url: str, name: str, tables: str, folder: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[list[str], str]:
    """`init --apply` run on `tables`: its arguments (without --apply) and what it printed."""
    argv = ["init", "--pg-url", url, "--tables", tables, "--name", name, "--out", str(folder)]
    assert main([*argv, "--apply"]) == 0
    return argv, capsys.readouterr().out


def written(folder: Path, name: str) -> tuple[ConnectorFile, MappingFile]:
    """The connector and mapping files init wrote, loaded as the job loads them."""
    connector = load_connector(folder / "connectors" / f"{name}.json")
    return connector, load_mapping(folder / "mappings" / f"{name}.yaml")


def as_its_role(
    url: str, name: str, connector: ConnectorFile, mapping: MappingFile
) -> Connection[Any]:
    """A connection as the role init made, once both validators found no error with it."""
    role = f"cdc_sync_{name}"
    conn = psycopg.connect(as_role(url, role))
    checks = run_checks(connector, _resolved(connector.config, role), conn, mapping)
    assert not [c for c in checks if c.severity == "error"], checks
    assert validate_mapping(mapping, conn, connector) == []
    return conn


def test_init_writes_files_that_pass_both_validators_as_its_role(
    app_db: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, name = app_db
    argv, out = applied(url, name, "app.*", tmp_path, capsys)
    for table, fix in LEFT_OUT.items():
        [line] = [line for line in out.splitlines() if line.startswith(f"left out: {table}:")]
        assert fix in line
    connector, mapping = written(tmp_path, name)
    assert {str(t) for t in mapping.tables} == {"app.users", "app.visits"}

    with as_its_role(url, name, connector, mapping) as conn:
        # The least privilege: reads of the captured tables, nothing of the others.
        conn.execute("SELECT count(*) FROM app.visits")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT count(*) FROM app.no_key")

    # Run again unchanged: up to date. On a changed schema: a diff, and nothing written.
    assert main(argv) == 0
    assert "would change" not in capsys.readouterr().out
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE app.visits ADD COLUMN note text")
    mapping_file = tmp_path / "mappings" / f"{name}.yaml"
    before = mapping_file.read_text()
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "+          note:" in out and "1 file(s) would change" in out
    assert mapping_file.read_text() == before
    assert main([*argv, "--force"]) == 0
    route = load_mapping(mapping_file).tables[TableId("app", "visits")]
    assert route.search is not None and "note" in route.search.mapping["properties"]


def test_a_glob_that_matches_nothing_is_refused_by_name(
    app_db: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, name = app_db
    argv = ["init", "--pg-url", url, "--tables", "app.users,ap.*", "--name", name]
    assert main([*argv, "--out", str(tmp_path)]) == 2
    assert "--tables: ap.* matches no table" in capsys.readouterr().err
    assert not (tmp_path / "connectors").exists()


def _resolved(config: Any, role: str) -> dict[str, str]:
    return dict(config) | {"database.user": role}


ODD_SCHEMA = """
CREATE SCHEMA "We.ird";
CREATE TABLE "We.ird"."a.b" (id int PRIMARY KEY, "Note" text);
CREATE TABLE "We.ird"."Users" (id int PRIMARY KEY);
CREATE TABLE "We.ird".users (id int PRIMARY KEY);
CREATE TABLE "We.ird"."say ""hi"" there" (id int PRIMARY KEY);
CREATE TABLE "We.ird"."order" (id int PRIMARY KEY,
                                cents bigint NOT NULL,
                                price numeric GENERATED ALWAYS AS (cents / 100.0) STORED);
CREATE TABLE "We.ird".events (id bigint, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
CREATE TABLE "We.ird".events_2026_01 PARTITION OF "We.ird".events
    FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
INSERT INTO "We.ird".events VALUES (1, '2026-01-05');
"""


@pytest.fixture
def odd_db(pg_url: str) -> Iterator[tuple[str, str]]:
    yield from database_with(pg_url, "odd", ODD_SCHEMA)


def test_odd_names_partitions_and_generated_columns_go_through_init(
    odd_db: tuple[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Before: a dot or a quote in a name aborted init with a psycopg error (or `--tables` could
    # not name the schema), a partitioned table was left out, and Users and users were routed
    # to one index.
    url, name = odd_db
    _, out = applied(url, name, '"We.ird".*', tmp_path, capsys)
    # Debezium cannot snapshot a name with a quote (test_debezium_names.py): left out.
    [left_out] = [line for line in out.splitlines() if line.startswith("left out")]
    assert left_out.startswith('left out: "We.ird".say "hi" there: a double quote in its name')
    assert '"We.ird".order: stored generated columns price: not published by Postgres < 18' in out
    assert '"We.ird".events: partitioned (1 partitions now)' in out
    connector, mapping = written(tmp_path, name)
    odd = [TableId("We.ird", t) for t in ("Users", "a.b", "events", "order", "users")]
    assert sorted(mapping.tables) == odd
    indices = [r.search.index for r in mapping.tables.values() if r.search is not None]
    assert len(set(indices)) == len(indices)
    with as_its_role(url, name, connector, mapping) as conn:
        assert conn.execute('SELECT count(*) FROM "We.ird".events').fetchone() == (1,)
    with psycopg.connect(url) as conn:
        pubviaroot = conn.execute(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (f"cdc_sync_{name}",)
        ).fetchone()
    assert pubviaroot == (True,)


def test_partition_changes_become_debezium_signals(odd_db: tuple[str, str], tmp_path: Path) -> None:
    url, name = odd_db
    argv = ["init", "--pg-url", url, "--tables", '"We.ird".events', "--name", name]
    assert main([*argv, "--out", str(tmp_path), "--apply"]) == 0
    ddl = [
        # Created while streaming: its rows arrive as the root's changes; nothing to signal.
        'CREATE TABLE "We.ird".events_2026_02 PARTITION OF "We.ird".events '
        "FOR VALUES FROM ('2026-02-01') TO ('2026-03-01')",
        # Attached with rows: an incremental snapshot of the root, narrowed to its rows.
        'CREATE TABLE "We.ird".events_2026_03 (LIKE "We.ird".events)',
        "INSERT INTO \"We.ird\".events_2026_03 VALUES (3, '2026-03-03')",
        'ALTER TABLE "We.ird".events ATTACH PARTITION "We.ird".events_2026_03 '
        "FOR VALUES FROM ('2026-03-01') TO ('2026-04-01')",
        'ALTER TABLE "We.ird".events ADD COLUMN note text',  # not about partitions
        # Detached: a blocking snapshot of the root (its end sweeps the rows that left).
        'ALTER TABLE "We.ird".events DETACH PARTITION "We.ird".events_2026_01',
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in ddl:
            conn.execute(statement.encode())
        signals = conn.execute('SELECT data FROM "We.ird".cdc_sync_signal ORDER BY id').fetchall()
    data = sorted((json.loads(row[0]) for row in signals), key=lambda d: d["type"])
    assert [d["type"] for d in data] == ["blocking", "incremental"]
    blocking, incremental = data
    assert blocking["data-collections"] == incremental["data-collections"] == ['"We.ird".events']
    [condition] = incremental["additional-conditions"]
    assert condition["data-collection"] == '"We.ird".events'
    assert "2026-03-01" in condition["filter"] and "2026-04-01" in condition["filter"]
