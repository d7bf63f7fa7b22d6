"""`connectors validate` checks against a real catalog: what the sinks cannot get right."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from cdc_sync.connectors.checks import run_checks
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


@pytest.mark.parametrize(
    ("key", "identity", "flagged"),
    [
        ("PRIMARY KEY DEFERRABLE INITIALLY DEFERRED", "DEFAULT", True),
        ("PRIMARY KEY DEFERRABLE", "DEFAULT", True),
        ("PRIMARY KEY DEFERRABLE INITIALLY DEFERRED", "FULL", False),
        ("PRIMARY KEY", "DEFAULT", False),
    ],
)
def test_a_deferrable_primary_key_needs_replica_identity_full(
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
