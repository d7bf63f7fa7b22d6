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
)
from cdc_sync.connectors.init.setup import setup_sql
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
        r"Sales\.order\x20lines,crm\.users,Sales\.cdc_sync_signal,Sales\.cdc_sync_heartbeat"
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
        # Before: not flagged (a delete would carry only the index's columns, not the key).
        ({"identity": "i", "identity_index": ("line_no",)}, "does not hold the primary key (id)"),
        (
            {"leaves": (_facts(TableId("app", "p1"), unlogged=True),)},
            "partition app.p1 is UNLOGGED",
        ),
    ],
)
def test_what_logical_decoding_cannot_capture_is_flagged_with_the_fix(
    changes: dict[str, object], fix: str
) -> None:
    [flag] = flags_for(_facts(LINES, **changes))  # type: ignore[arg-type]
    assert fix in str(flag)


def test_a_deferrable_key_under_replica_identity_full_is_capturable() -> None:
    assert flags_for(_facts(LINES, deferrable_key=True, identity="f")) == []


EVENTS = TableId("app", "events")


def _schema_plan(
    *facts: TableFacts, version: int = 150000, others: tuple[TableId, ...] = ()
) -> Plan:
    tables = frozenset([*(f.table for f in facts), *others])
    survey = Survey("app", "app", list(facts), [], server_version=version, database_tables=tables)
    return Plan("app", survey, ("search", "cache", "delta"), "../connectors/app.json")


def test_a_partitioned_table_is_captured_through_its_root(tmp_path: Path) -> None:
    # Before: left out ("init does not capture partitioned tables; route it by hand").
    leaf = _facts(TableId("app", "events_2026_01"))
    events = _facts(EVENTS, ("id", "at"), partitioned=True, leaves=(leaf,))
    assert flags_for(events) == []
    plan = _schema_plan(events, others=(leaf.table,))
    config = connector_config(plan)
    assert config["table.include.list"].split(",")[0] == r"app\.events"  # the root alone
    sql = setup_sql(plan)
    assert 'CREATE PUBLICATION "cdc_sync_app" FOR TABLE "app"."events"' in sql
    assert "WITH (publish_via_partition_root = true)" in sql
    assert 'ALTER PUBLICATION "cdc_sync_app" SET (publish_via_partition_root = true)' in sql
    assert 'CREATE EVENT TRIGGER "cdc_sync_app_partitions" ON ddl_command_end' in sql
    assert "'type', 'blocking'" in sql and "pg_get_partition_constraintdef" in sql
    _, mapping_path = _write(tmp_path, plan)
    assert "# partitioned (1 partitions now)" in mapping_path.read_text()
    assert set(load_mapping(mapping_path).tables) == {EVENTS}


def test_no_event_trigger_without_partitioned_tables() -> None:
    assert "EVENT TRIGGER" not in setup_sql(_schema_plan(_facts(EVENTS)))


@pytest.mark.parametrize(("version", "published"), [(170000, False), (180000, True)])
def test_generated_columns_are_named_and_published_from_postgres_18(
    tmp_path: Path, version: int, published: bool
) -> None:
    plan = _schema_plan(_facts(EVENTS, generated=("price",)), version=version)
    assert ("publish_generated_columns = stored" in setup_sql(plan)) is published
    _, mapping_path = _write(tmp_path, plan)
    how = "publish_generated_columns = stored" if published else "the job reads them back by key"
    assert f"# stored generated columns price: {'published (' if published else ''}" in (
        mapping_path.read_text()
    )
    assert how in mapping_path.read_text()


def test_tables_differing_by_case_get_distinct_names_and_exact_include_entries(
    tmp_path: Path,
) -> None:
    # Before: both went to index app_app_users (and Delta app/Users, app/users); the mapping
    # loaded, and the two tables overwrote each other's documents by id.
    upper, lower = TableId("app", "Users"), TableId("app", "users")
    plan = _schema_plan(_facts(upper), _facts(lower))
    assert plan.names.index(lower) == "app_app_users"
    assert plan.names.index(upper).startswith("app_app_users_t")
    assert plan.names.delta(lower) == lower and plan.names.delta(upper).table.startswith("Users_t")
    assert plan.include_list().split(",")[:2] == [r"(?-i:app\.Users)", r"(?-i:app\.users)"]
    _, mapping_path = _write(tmp_path, plan)
    mapping = load_mapping(mapping_path)  # loads: mapping load refuses shared names
    assert {r.search.index for r in mapping.tables.values() if r.search} == {
        plan.names.index(upper),
        "app_app_users",
    }
    assert plan.names.renamed("app")[0].startswith("app.Users: search index app_app_users_t")


def test_names_with_dots_and_quotes_are_quoted_everywhere(tmp_path: Path) -> None:
    # Before: a dot or a quote in a name made init's SQL (and its own catalog reads) fail.
    odd = TableId('we"ird', "a.b")
    plan = _schema_plan(_facts(odd))
    sql = setup_sql(plan)
    assert '"we""ird"."a.b"' in sql and 'GRANT USAGE ON SCHEMA "app", "we""ird"' in sql
    _, mapping_path = _write(tmp_path, plan)
    mapping = load_mapping(mapping_path)
    assert set(mapping.tables) == {odd}
    assert mapping.topics()[-1] == "app.we_ird.a.b"


def test_an_index_holding_the_key_is_a_usable_identity() -> None:
    assert flags_for(_facts(EVENTS, identity="i", identity_index=("id", "email"))) == []
