"""`cdc-sync init`'s files from a survey (no database): they load as the job loads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_sync.connectors.init.render import (
    JOB_SETTINGS,
    Plan,
    connector_config,
    connector_json,
    mapping_yaml,
    setup_sql,
)
from cdc_sync.connectors.init.survey import Flag, Survey, TableFacts, flags_for
from cdc_sync.core.model import TableId
from cdc_sync.core.types import Column, ColumnType, RowSchema, TypeKind
from cdc_sync.debezium.connector import load_connector
from cdc_sync.mapping import load_mapping

pytestmark = pytest.mark.unit
LINES = TableId("Sales", "order lines")


def _facts(table: TableId, key: tuple[str, ...] = ("id",), **changes: object) -> TableFacts:
    schema = RowSchema(
        (
            Column("id", ColumnType(TypeKind.INT64, False)),
            Column("line_no", ColumnType(TypeKind.INT32, False)),
            Column("price", ColumnType(TypeKind.DECIMAL, True, precision=10, scale=2)),
            Column("tags", ColumnType(TypeKind.ARRAY, True, element=ColumnType(TypeKind.STRING))),
            Column("at", ColumnType(TypeKind.TIMESTAMP_TZ, True)),
        )
    )
    values: dict[str, object] = {
        "table": table,
        "key": key,
        "identity": "d",
        "unlogged": False,
        "partitioned": False,
        "deferrable_key": False,
        "schema": schema,
    }
    return TableFacts(**(values | changes))  # type: ignore[arg-type]


def _plan(sinks: tuple[str, ...] = ("search", "cache", "delta")) -> Plan:
    survey = Survey(
        database="app",
        control_schema="Sales",
        captured=[_facts(LINES, ("id", "line_no")), _facts(TableId("crm", "users"))],
        flags=[Flag(TableId("crm", "log"), "no primary key", "ALTER TABLE ...")],
    )
    return Plan("sales", survey, sinks, "../connectors/sales.json")


def _write(tmp_path: Path, plan: Plan) -> tuple[Path, Path]:
    (tmp_path / "connectors").mkdir()
    (tmp_path / "mappings").mkdir()
    connector = tmp_path / "connectors" / "sales.json"
    connector.write_text(connector_json(plan))
    mapping = tmp_path / "mappings" / "sales.yaml"
    mapping.write_text(mapping_yaml(plan))
    return connector, mapping


def test_the_job_settings_are_the_shop_connectors() -> None:
    shop = load_connector(Path("connectors/shop.json")).config
    assert {key: shop[key] for key in JOB_SETTINGS} == JOB_SETTINGS


def test_the_connector_is_its_own_and_loads(tmp_path: Path) -> None:
    connector_path, _ = _write(tmp_path, _plan())
    connector = load_connector(connector_path)
    config = connector.config
    assert connector.name == "sales" and connector.topic_prefix == "sales"
    assert config["slot.name"] == config["publication.name"] == "cdc_sync_sales"
    assert config["notification.sink.topic.name"] == "sales.notifications"
    assert config["publication.autocreate.mode"] == "disabled"
    assert config["skipped.operations"] == "none"
    assert config["signal.data.collection"] == "Sales.cdc_sync_signal"
    assert config["table.include.list"] == (
        r"Sales\.order\ lines,crm\.users,Sales\.cdc_sync_signal,Sales\.cdc_sync_heartbeat"
    )
    assert config["schema.include.list"] == "Sales,crm"
    assert 'INSERT INTO "Sales"."cdc_sync_heartbeat"' in config["heartbeat.action.query"]
    assert "'sales'" in config["heartbeat.action.query"]


def test_the_mapping_routes_every_table_to_the_chosen_sinks(tmp_path: Path) -> None:
    _, mapping_path = _write(tmp_path, _plan())
    mapping = load_mapping(mapping_path)
    assert mapping.connector == (tmp_path / "connectors" / "sales.json").resolve()
    assert set(mapping.tables) == {LINES, TableId("crm", "users")}
    assert mapping.heartbeat_table == TableId("Sales", "cdc_sync_heartbeat")
    assert mapping.ignored == {TableId("Sales", "cdc_sync_signal")}
    route = mapping.tables[LINES]
    assert route.search is not None and route.search.index == "sales_sales_order_lines"
    properties = route.search.mapping["properties"]
    assert properties["price"] == {"type": "double"}
    assert properties["tags"]["type"] == "text"  # an array's field maps its element
    assert properties["at"] == {"type": "date"}
    assert route.cache is not None and route.cache.prefix == "sales"
    assert route.delta is not None and route.delta.relative_path() == "Sales/order lines"
    text = mapping_path.read_text()
    assert "# primary key (id, line_no)" in text
    assert "#   crm.log: no primary key. Fix: ALTER TABLE ..." in text
    assert "&id" not in text  # no YAML anchors in a file people edit


def test_only_the_chosen_sinks(tmp_path: Path) -> None:
    _, mapping_path = _write(tmp_path, _plan(("delta",)))
    route = load_mapping(mapping_path).tables[LINES]
    assert route.search is None and route.cache is None and route.delta is not None


def test_setup_sql_grants_the_role_only_what_capture_and_reads_need() -> None:
    sql = setup_sql(_plan())
    assert 'CREATE ROLE "cdc_sync_sales" LOGIN REPLICATION;' in sql
    assert 'GRANT SELECT ON TABLE "Sales"."order lines", "crm"."users" TO "cdc_sync_sales";' in sql
    assert 'GRANT SELECT, INSERT, UPDATE ON TABLE "Sales"."cdc_sync_heartbeat"' in sql
    assert 'GRANT SELECT, INSERT ON TABLE "Sales"."cdc_sync_signal"' in sql
    grants = [line for line in sql.splitlines() if line.startswith("GRANT")]
    assert len(grants) == 5 and not any("ALL" in g or "CREATE" in g for g in grants)
    assert 'CREATE PUBLICATION "cdc_sync_sales" FOR TABLE' in sql
    assert "--   crm.log: no primary key" in sql


def test_the_files_are_deterministic() -> None:
    plan = _plan()
    assert connector_json(plan) == connector_json(plan)
    assert mapping_yaml(plan) == mapping_yaml(plan) and setup_sql(plan) == setup_sql(plan)
    assert json.loads(connector_json(plan))["config"] == connector_config(plan)


@pytest.mark.parametrize(
    ("changes", "fix"),
    [
        ({"key": ()}, "ADD PRIMARY KEY"),
        ({"identity": "n"}, "REPLICA IDENTITY DEFAULT"),
        ({"deferrable_key": True}, "REPLICA IDENTITY FULL"),
        ({"unlogged": True}, "SET LOGGED"),
        ({"schema": None, "conversion_error": "t.x.p: Postgres type 'point'"}, "column's type"),
    ],
)
def test_what_logical_decoding_cannot_capture_is_flagged_with_the_fix(
    changes: dict[str, object], fix: str
) -> None:
    [flag] = flags_for(_facts(LINES, **changes))  # type: ignore[arg-type]
    assert fix in flag.fix


def test_a_deferrable_key_under_replica_identity_full_is_capturable() -> None:
    assert flags_for(_facts(LINES, deferrable_key=True, identity="f")) == []
