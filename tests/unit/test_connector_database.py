"""Which database `cdc-sync connectors` acts on: the connector's own `database.*` settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc_sync.connectors.ops import placeholder_env, report_snapshot
from cdc_sync.core.errors import ConfigError
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.connector import describe_database, load_connector, source_conninfo
from cdc_sync.debezium.notifications import (
    Notification,
    describe,
    notification_topic,
    parse_notification,
)

pytestmark = pytest.mark.unit
SHOP = Path("connectors/shop.json")
ENV = {
    "CDC_SYNC_PG_HOST": "db.internal",
    "CDC_SYNC_PG_PORT": "6543",
    "CDC_SYNC_PG_USER": "cdc@capture",
    "CDC_SYNC_PG_PASSWORD": "s3cret word",
    "CDC_SYNC_PG_DB": "shop",
}


def test_placeholders_resolve_from_the_environment() -> None:
    params = conninfo_to_dict(source_conninfo(load_connector(SHOP), ENV))
    assert params == {
        "host": "db.internal",
        "port": "6543",
        "user": "cdc@capture",
        "password": "s3cret word",
        "dbname": "shop",
    }


def test_overrides_apply_before_placeholders_resolve() -> None:
    env = {k: v for k, v in ENV.items() if k != "CDC_SYNC_PG_DB"} | {"OTHER_DB": "orders"}
    overrides = {"database.dbname": "${env:OTHER_DB}", "database.sslmode": "require"}
    params = conninfo_to_dict(source_conninfo(load_connector(SHOP), env, overrides))
    # CDC_SYNC_PG_DB is unset but overridden away: Kafka Connect would not need it either.
    assert params["dbname"] == "orders" and params["sslmode"] == "require"


def test_a_missing_placeholder_value_names_the_setting_and_variable() -> None:
    env = {k: v for k, v in ENV.items() if k != "CDC_SYNC_PG_HOST"}
    with pytest.raises(ConfigError, match=r"config\.database\.hostname.*CDC_SYNC_PG_HOST"):
        source_conninfo(load_connector(SHOP), env)


def test_a_missing_setting_is_named_and_the_port_defaults_like_debezium(tmp_path: Path) -> None:
    doc = json.loads(SHOP.read_text())
    del doc["config"]["database.port"], doc["config"]["database.password"]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    params = conninfo_to_dict(source_conninfo(load_connector(path), ENV))
    assert params["port"] == "5432" and "password" not in params
    with pytest.raises(ConfigError, match=r"config\.database\.user.*required"):
        source_conninfo(load_connector(path), ENV, {"database.user": ""})


def test_describe_a_database_without_its_password() -> None:
    conninfo = source_conninfo(load_connector(SHOP), ENV)
    assert describe_database(conninfo) == "cdc@capture@db.internal:6543/shop"
    assert "s3cret" not in describe_database(conninfo)


def test_placeholder_env_prefers_explicit_values_over_the_url() -> None:
    connections = Connections(
        pg_url="postgresql://u:p@127.0.0.1:5433/verifydb",
        kafka_bootstrap=None,
        kafka_flavor="kafka",
        search_url=None,
        search_client="opensearch",
        redis_url=None,
        connect_url=None,
        warehouse=None,
        environment={"CDC_SYNC_PG_DB": "capturedb", "PATH": "/bin"},
    )
    env = placeholder_env(connections)
    assert env["CDC_SYNC_PG_HOST"] == "127.0.0.1" and env["CDC_SYNC_PG_PORT"] == "5433"
    assert env["CDC_SYNC_PG_DB"] == "capturedb"


def test_the_shop_connector_reports_through_the_sink_notification_channel() -> None:
    config = load_connector(SHOP).config
    assert notification_topic(config) == f"{config['topic.prefix']}.notifications"
    assert notification_topic({"notification.sink.topic.name": "t"}) is None  # channel off


def test_notifications_parse_with_and_without_schemas() -> None:
    payload = {
        "id": "snapshot-1",
        "aggregate_type": "Incremental Snapshot",
        "type": "TABLE_SCAN_COMPLETED",
        "additional_data": {
            "scanned_collection": "shop.products",
            "total_rows_scanned": "3",
            "status": "SUCCEEDED",
        },
        "timestamp": 1700000000123,
    }
    for value in (payload, {"schema": {}, "payload": payload}):
        notification = parse_notification(json.dumps(value).encode())
        assert notification is not None and notification.id == "snapshot-1"
        assert describe(notification) == (
            "2023-11-14T22:13:20.123+00:00 table scan completed: shop.products, 3 rows (SUCCEEDED)"
        )
    assert parse_notification(b"not json") is None
    assert parse_notification(json.dumps({"payload": {"op": "c"}}).encode()) is None


def _note(kind: str) -> Notification:
    return Notification("s", "Incremental Snapshot", kind, {"data_collections": "shop.x"}, None)


def test_snapshot_report_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert report_snapshot([_note("STARTED"), _note("COMPLETED")], 5) == 0
    assert "started: shop.x" in capsys.readouterr().out
    assert report_snapshot([_note("STARTED"), _note("ABORTED")], 5) == 1
    capsys.readouterr()
    assert report_snapshot([_note("STARTED")], 5) == 1
    assert "did not complete within 5s" in capsys.readouterr().out
    assert report_snapshot([], 5) == 1
    assert "no notification within 5s" in capsys.readouterr().out
