"""Which database every Postgres read goes to (`debezium.database`, DESIGN.md invariant 7).

Without services: the identity of a connection (current_database(), system identifier) is
replaced by a table of what each host would answer; tests/integration/test_source_database.py
asks a real server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from psycopg.conninfo import conninfo_to_dict

from cdc_sync.core.settings import Connections, SettingsError
from cdc_sync.debezium import database
from cdc_sync.debezium.database import Identity, SourceMismatch, source_database

pytestmark = pytest.mark.unit
SHOP = Path("connectors/shop.json")
PARTS = {
    "CDC_SYNC_PG_HOST": "db.internal",
    "CDC_SYNC_PG_PORT": "6543",
    "CDC_SYNC_PG_USER": "cdc",
    "CDC_SYNC_PG_PASSWORD": "pw",
    "CDC_SYNC_PG_DB": "shop",
}


def connections(pg_url: str | None, environment: dict[str, str] | None = None) -> Connections:
    return Connections(
        pg_url=pg_url,
        kafka_bootstrap=None,
        kafka_flavor="kafka",
        search_url=None,
        search_client="opensearch",
        redis_url=None,
        connect_url=None,
        warehouse=None,
        environment=environment or {},
    )


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, str], Identity]:
    """(host, dbname) -> what a connection there reports; connecting elsewhere fails."""
    table: dict[tuple[str, str], Identity] = {}
    asked: list[str] = []

    def identity(conninfo: str, setting: str) -> Identity:
        params = conninfo_to_dict(conninfo)
        asked.append(setting)
        key = (str(params.get("host")), str(params.get("dbname")))
        if key not in table:
            raise SettingsError(f"{setting}: cannot connect to {key}")
        return table[key]

    monkeypatch.setattr(database, "identity", identity)
    return table


def connector_on(tmp_path: Path, dbname: str) -> Path:
    """A copy of the shop connector with a database of its own (as the issue's user made)."""
    doc = json.loads(SHOP.read_text())
    doc["config"]["database.dbname"] = dbname
    path = tmp_path / "orders.json"
    path.write_text(json.dumps(doc))
    return path


def test_without_the_url_reads_go_to_the_connectors_database_unchecked(
    answers: dict[tuple[str, str], Identity],
) -> None:
    source = source_database(connections(None, PARTS), SHOP)  # nothing answers: no connection
    params = conninfo_to_dict(source.conninfo)
    assert (params["host"], params["port"], params["dbname"]) == ("db.internal", "6543", "shop")
    assert source.connector_conninfo == source.conninfo
    assert source.describe() == f"cdc@db.internal:6543/shop (connector shop, {SHOP})"


def test_the_url_naming_the_same_database_is_used_for_reads(
    answers: dict[tuple[str, str], Identity],
) -> None:
    # Another host name for the same server: the identity decides, not the spelling.
    answers[("db.internal", "shop")] = answers[("10.0.0.5", "shop")] = Identity("shop", "7001")
    url = "postgresql://reader:r@10.0.0.5:6543/shop"
    source = source_database(connections(url, PARTS), SHOP)
    assert source.conninfo == url
    assert source.connector_conninfo is not None
    assert conninfo_to_dict(source.connector_conninfo)["host"] == "db.internal"
    assert source.origin.startswith("CDC_SYNC_PG_URL, the database of connector shop")


def test_a_url_on_another_database_of_the_same_server_is_refused_naming_both(
    answers: dict[tuple[str, str], Identity], tmp_path: Path
) -> None:
    answers[("db.internal", "shop")] = Identity("shop", "7001")
    answers[("db.internal", "orders")] = Identity("orders", "7001")
    connector = connector_on(tmp_path, "orders")
    url = "postgresql://cdc:pw@db.internal:6543/shop"
    with pytest.raises(SourceMismatch) as refused:
        source_database(connections(url), connector)
    message = str(refused.value)
    assert str(connector) in message and "config.database" in message
    assert "CDC_SYNC_PG_URL names cdc@db.internal:6543/shop (database shop" in message
    assert "captures cdc@db.internal:6543/orders (database orders" in message
    assert "pw" not in message.replace("point", "")


def test_the_same_database_name_on_another_server_is_refused(
    answers: dict[tuple[str, str], Identity],
) -> None:
    answers[("db.internal", "shop")] = Identity("shop", "7001")
    answers[("replica.internal", "shop")] = Identity("shop", "9002")
    url = "postgresql://cdc:pw@replica.internal:6543/shop"
    with pytest.raises(SourceMismatch, match=r"server 7001.*server 9002"):
        source_database(connections(url, PARTS), SHOP)


def test_set_overrides_decide_the_captured_database(
    answers: dict[tuple[str, str], Identity],
) -> None:
    answers[("db.internal", "shop")] = Identity("shop", "7001")
    answers[("db.internal", "orders")] = Identity("orders", "7001")
    url = "postgresql://cdc:pw@db.internal:6543/shop"
    with pytest.raises(SourceMismatch, match="connector second"):
        source_database(
            connections(url, PARTS), SHOP, {"database.dbname": "orders", "name": "second"}
        )


def test_an_unreachable_side_names_its_setting(answers: dict[tuple[str, str], Identity]) -> None:
    answers[("db.internal", "shop")] = Identity("shop", "7001")
    with pytest.raises(SettingsError, match="CDC_SYNC_PG_URL: cannot connect"):
        source_database(connections("postgresql://cdc@gone.internal/shop", PARTS), SHOP)


def test_without_a_connector_the_url_is_the_source(
    answers: dict[tuple[str, str], Identity],
) -> None:
    source = source_database(connections("postgresql://u@h:5/db"), None)
    assert (source.conninfo, source.origin, source.connector_conninfo) == (
        "postgresql://u@h:5/db",
        "CDC_SYNC_PG_URL",
        None,
    )
    with pytest.raises(SettingsError, match=r"CDC_SYNC_PG_URL is not set.*source\.connector"):
        source_database(connections(None), None)
