"""`connectors validate` checks against a real catalog: what the sinks cannot get right."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_sync.connectors.checks import Check, run_checks
from cdc_sync.debezium.connector import ConnectorFile, load_connector
from tests.pg import private_database

pytestmark = pytest.mark.integration
SHOP = Path("connectors/shop.json")


@pytest.mark.parametrize(("mode", "warned"), [("base64", True), ("bytes", False), ("hex", False)])
def test_base64_binary_mode_is_flagged_for_bytea_tables(
    pg_url: str, mode: str, warned: bool
) -> None:
    with private_database(pg_url, "checks") as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA t")
        conn.execute("CREATE TABLE t.files (id int PRIMARY KEY, body bytea)")
        base = load_connector(SHOP)
        user = conn.execute("SELECT current_user").fetchone()
        assert user is not None
        config = dict(base.config) | {
            "binary.handling.mode": mode,
            "schema.include.list": "t",
            "table.include.list": "t.files",
            "database.user": str(user[0]),
        }
        checks = run_checks(ConnectorFile(base.path, base.name, config), config, conn)
    flagged = [c for c in checks if c.setting == "binary.handling.mode"]
    assert bool(flagged) is warned
    if warned:
        assert flagged[0].severity == "warning" and "t.files" in flagged[0].message


def _connector(
    folder: Path, conn: psycopg.Connection[Any], name: str = "mine", **settings: str
) -> tuple[ConnectorFile, dict[str, str]]:
    """A connector file of the shop's settings capturing schema t, written into `folder`."""
    base = load_connector(SHOP)
    user = conn.execute("SELECT current_user").fetchone()
    assert user is not None
    config = dict(base.config) | {
        "schema.include.list": "t",
        "table.include.list": "t.items,t.cdc_sync_signal,t.cdc_sync_heartbeat",
        "signal.data.collection": "t.cdc_sync_signal",
        "heartbeat.action.query": HEARTBEAT_QUERY,
        "slot.name": f"{name}_slot",
        "publication.name": f"{name}_pub",
        "notification.sink.topic.name": f"{name}.notifications",
        "database.user": str(user[0]),
    }
    config |= settings
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"name": name, "config": config}))
    return ConnectorFile(path, name, config), config


HEARTBEAT_QUERY = (
    "INSERT INTO t.cdc_sync_heartbeat (connector, beat_at) VALUES ('mine', now()) "
    "ON CONFLICT (connector) DO UPDATE SET beat_at = EXCLUDED.beat_at"
)
CONTROL_TABLES = (
    "CREATE TABLE t.cdc_sync_signal (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, "
    "data varchar(2048))",
    "CREATE TABLE t.cdc_sync_heartbeat (connector text PRIMARY KEY, beat_at timestamptz)",
)


@pytest.fixture
def schema_t(pg_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A private database with schema t: a table t.items and the signal and heartbeat tables."""
    with private_database(pg_url, "checks") as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA t")
        conn.execute("CREATE TABLE t.items (id int PRIMARY KEY, body text)")
        for statement in CONTROL_TABLES:
            conn.execute(statement.encode())
        yield conn


def _errors(checks: list[Check], setting: str) -> list[Check]:
    return [c for c in checks if c.severity == "error" and c.setting == setting]


def test_a_complete_connector_has_none_of_these_errors(
    schema_t: psycopg.Connection[Any], tmp_path: Path
) -> None:
    connector, config = _connector(tmp_path, schema_t)
    checks = run_checks(connector, config, schema_t)
    assert not [c for c in checks if c.severity == "error"], checks


def test_a_heartbeat_query_on_a_missing_table_is_an_error(
    schema_t: psycopg.Connection[Any], tmp_path: Path
) -> None:
    schema_t.execute("DROP TABLE t.cdc_sync_heartbeat")
    connector, config = _connector(tmp_path, schema_t)
    [error] = _errors(run_checks(connector, config, schema_t), "heartbeat.action.query")
    assert "t.cdc_sync_heartbeat" in error.message and "does not exist" in error.message


@pytest.mark.parametrize("key", ["slot.name", "publication.name", "notification.sink.topic.name"])
def test_a_name_shared_with_another_connector_file_in_the_folder_is_an_error(
    schema_t: psycopg.Connection[Any], tmp_path: Path, key: str
) -> None:
    connector, config = _connector(tmp_path, schema_t)
    _connector(tmp_path, schema_t, name="other")  # its own names: no finding
    assert not _errors(run_checks(connector, config, schema_t), key)
    _connector(tmp_path, schema_t, name="copy", **{key: config[key]})
    [error] = _errors(run_checks(connector, config, schema_t), key)
    assert str(tmp_path / "copy.json") in error.message


def test_a_missing_signal_table_is_an_error(
    schema_t: psycopg.Connection[Any], tmp_path: Path
) -> None:
    schema_t.execute("DROP TABLE t.cdc_sync_signal")
    connector, config = _connector(tmp_path, schema_t)
    [error] = _errors(run_checks(connector, config, schema_t), "signal.data.collection")
    assert "t.cdc_sync_signal does not exist" in error.message


def test_a_signal_table_not_captured_is_an_error(
    schema_t: psycopg.Connection[Any], tmp_path: Path
) -> None:
    connector, config = _connector(
        tmp_path, schema_t, **{"table.include.list": "t.items,t.cdc_sync_heartbeat"}
    )
    [error] = _errors(run_checks(connector, config, schema_t), "signal.data.collection")
    assert "table.include.list" in error.message


@pytest.mark.parametrize(("identity", "flagged"), [("DEFAULT", True), ("FULL", False)])
def test_a_deferrable_primary_key_needs_replica_identity_full(
    schema_t: psycopg.Connection[Any], tmp_path: Path, identity: str, flagged: bool
) -> None:
    schema_t.execute("DROP TABLE t.items")
    schema_t.execute("CREATE TABLE t.items (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED)")
    schema_t.execute(f"ALTER TABLE t.items REPLICA IDENTITY {identity}".encode())
    connector, config = _connector(tmp_path, schema_t)
    errors = _errors(run_checks(connector, config, schema_t), "REPLICA IDENTITY of t.items")
    assert bool(errors) is flagged
    if flagged:
        assert "DEFERRABLE" in errors[0].message and "REPLICA IDENTITY FULL" in errors[0].message


def test_an_unlogged_table_is_an_error(schema_t: psycopg.Connection[Any], tmp_path: Path) -> None:
    schema_t.execute("ALTER TABLE t.items SET UNLOGGED")
    connector, config = _connector(tmp_path, schema_t)
    [error] = _errors(run_checks(connector, config, schema_t), "t.items")
    assert "UNLOGGED" in error.message and "SET LOGGED" in error.message


@pytest.mark.parametrize(
    ("key", "identity", "flagged"),
    [
        ("PRIMARY KEY DEFERRABLE INITIALLY DEFERRED", "DEFAULT", True),
        ("PRIMARY KEY DEFERRABLE", "DEFAULT", True),
        ("PRIMARY KEY DEFERRABLE INITIALLY DEFERRED", "FULL", False),
        ("PRIMARY KEY", "DEFAULT", False),
    ],
)
def test_deferrable_key_forms_need_replica_identity_full(
    pg_url: str, key: str, identity: str, flagged: bool
) -> None:
    with private_database(pg_url, "checks") as url, psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA t")
        conn.execute(f"CREATE TABLE t.pairs (id int {key}, v text)")
        conn.execute(f"ALTER TABLE t.pairs REPLICA IDENTITY {identity}")
        base = load_connector(SHOP)
        user = conn.execute("SELECT current_user").fetchone()
        assert user is not None
        config = dict(base.config) | {
            "schema.include.list": "t",
            "table.include.list": "t.pairs",
            "database.user": str(user[0]),
        }
        checks = run_checks(ConnectorFile(base.path, base.name, config), config, conn)
    found = [c for c in checks if "DEFERRABLE" in c.message]
    assert bool(found) is flagged
    if flagged:
        (check,) = found
        assert check.severity == "error"
        assert check.setting == "REPLICA IDENTITY of t.pairs"
        assert 'ALTER TABLE "t"."pairs" REPLICA IDENTITY FULL' in check.message


PARTITIONED = (
    "CREATE TABLE t.events (id bigint, at date, PRIMARY KEY (id, at)) PARTITION BY RANGE (at)",
    "CREATE TABLE t.events_2026 PARTITION OF t.events "
    "FOR VALUES FROM ('2026-01-01') TO ('2027-01-01')",
)
WITH_EVENTS = "t.items,t.events,t.cdc_sync_signal,t.cdc_sync_heartbeat"


def _run(schema_t: psycopg.Connection[Any], folder: Path, **settings: str) -> list[Check]:
    connector, config = _connector(folder, schema_t, **settings)
    return run_checks(connector, config, schema_t)


def test_a_partitioned_table_needs_a_publication_through_its_root(
    schema_t: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # Before: not checked; Debezium's own publication streams nothing of the partitions
    # (observed: tests/integration/test_debezium_partitions.py).
    for statement in PARTITIONED:
        schema_t.execute(statement.encode())
    checks = _run(schema_t, tmp_path, **{"table.include.list": WITH_EVENTS})
    [autocreated] = _errors(checks, "publication.autocreate.mode")
    assert "publish_via_partition_root" in autocreated.message and "t.events" in autocreated.message
    [no_trigger] = [c for c in checks if c.setting == "partitions of t.events"]
    assert no_trigger.severity == "warning" and "cdc_sync_mine_partitions" in no_trigger.message

    schema_t.execute("CREATE PUBLICATION mine_pub FOR TABLE t.items, t.events")
    checks = _run(schema_t, tmp_path, **{"table.include.list": WITH_EVENTS})
    [not_via_root] = _errors(checks, "publication.name")
    assert "ALTER PUBLICATION mine_pub SET (publish_via_partition_root = true)" in (
        not_via_root.message
    )
    schema_t.execute("ALTER PUBLICATION mine_pub SET (publish_via_partition_root = true)")
    assert not _errors(_run(schema_t, tmp_path, **{"table.include.list": WITH_EVENTS}),
                       "publication.name")  # fmt: skip


def test_a_partition_listed_beside_its_root_is_refused(
    schema_t: psycopg.Connection[Any], tmp_path: Path
) -> None:
    for statement in PARTITIONED:
        schema_t.execute(statement.encode())
    checks = _run(schema_t, tmp_path, **{"table.include.list": r"t\.events.*,t\.items"})
    [listed] = _errors(checks, "table.include.list")
    assert "t.events_2026 is a partition of t.events, which is captured too" in listed.message


def test_an_identity_index_without_the_key_is_refused(
    schema_t: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # Before: accepted; a delete would carry only the index's columns, not the key.
    schema_t.execute("CREATE UNIQUE INDEX items_body ON t.items (body)")
    schema_t.execute("ALTER TABLE t.items ALTER COLUMN body SET NOT NULL")
    schema_t.execute("ALTER TABLE t.items REPLICA IDENTITY USING INDEX items_body")
    [error] = _errors(_run(schema_t, tmp_path), "REPLICA IDENTITY of t.items")
    assert "does not hold the primary key (id)" in error.message


def test_generated_columns_are_named_with_how_they_reach_the_sinks(
    schema_t: psycopg.Connection[Any], tmp_path: Path
) -> None:
    # Before: `connectors validate` said nothing about them.
    schema_t.execute(
        "ALTER TABLE t.items ADD COLUMN size int GENERATED ALWAYS AS (length(body)) STORED"
    )
    [note] = [c for c in _run(schema_t, tmp_path) if c.setting == "t.items"]
    assert note.severity == "note"
    assert note.message.startswith("stored generated columns size: not published by Postgres")
    assert "reads them back from Postgres by key" in note.message
