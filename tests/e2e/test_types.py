"""Type fidelity on real Debezium output: one table holding every type, under the default
converter settings and the documented alternatives, compared row by row with what Postgres
returns, in the search documents, the cache entries and the Delta rows read back."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from confluent_kafka import Consumer, TopicPartition
from deltalake import DeltaTable

from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.core.model import Change, Coordinates, TableId, Truncate
from cdc_sync.debezium.connector import load_connector
from cdc_sync.debezium.decoder import parse_record
from cdc_sync.mapping import SchemaSource
from cdc_sync.schema.catalog import ConverterModes, row_schema_from_catalog
from cdc_sync.schema.source_rows import read_columns
from cdc_sync.sinks.search.backends import connect
from tests.e2e.conftest import Services, running_pipeline
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.pg import private_database

pytestmark = pytest.mark.e2e

TYPES_DIR = Path(__file__).parent / "types"
TABLE = TableId("types", "all_types")
HEARTBEAT = "types.cdc_sync_heartbeat"
TYPES_REDIS_DB = 4
CONNECTOR_MODES = dict(load_connector(Path("connectors/shop.json")).config)
MODES = {
    # name: connector overrides (Debezium's documented alternatives)
    "defaults": {},
    "decimal-string": {"decimal.handling.mode": "string"},
    "decimal-double": {"decimal.handling.mode": "double"},
    "binary-base64": {"binary.handling.mode": "base64"},
    "time-adaptive": {"time.precision.mode": "adaptive"},
    # Records without Connect schemas: the job takes the types from the catalog.
    "schemaless": {
        "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
    },
}


@pytest.fixture(scope="module", params=list(MODES), ids=list(MODES))
def types_pipeline(
    request: pytest.FixtureRequest, services: Services, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SyncHarness]:
    root = tmp_path_factory.mktemp(f"types-{request.param}")
    with private_database(services.pg_url, "types_e2e") as database:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute((TYPES_DIR / "all_types.sql").read_bytes())
        connections = services.connections(database, TYPES_REDIS_DB, root)
        mapping = e2e_mapping(f"ty{uuid.uuid4().hex[:6]}", TYPES_DIR / "types.yaml")
        if request.param == "schemaless":
            mapping = dataclasses.replace(
                mapping, schema_source=SchemaSource.CATALOG, connector=Path("connectors/shop.json")
            )
        overrides = {
            "schema.include.list": "types",
            "table.include.list": f"{TABLE},{HEARTBEAT}",
            "heartbeat.action.query": CONNECTOR_MODES["heartbeat.action.query"].replace(
                "shop.cdc_sync_heartbeat", HEARTBEAT
            ),
        }
        overrides |= MODES[request.param]
        with running_pipeline(services.spark, mapping, connections, root, overrides) as harness:
            yield harness


def test_every_type_converges_in_every_sink(types_pipeline: SyncHarness) -> None:
    report = types_pipeline.wait_converged(timeout_seconds=120)
    [table] = report.tables
    assert table.source_count == 3
    assert {s.sink for s in table.sinks} == {"search", "cache", "delta"}


def test_updates_of_every_type_converge(types_pipeline: SyncHarness) -> None:
    types_pipeline.run_sql(
        [
            "UPDATE types.all_types SET c_int8 = c_int8 - 1, c_numeric = 0.001, "
            "c_jsonb = '{\"changed\": true}', c_bytea = '\\x01'::bytea, "
            "c_timestamptz = '2030-01-01 00:00:00+00', c_text_array = '{x}', "
            "c_interval = '-00:00:00.000001' WHERE id = 1",
            # Debezium's numeric mode sent this one 1 µs short (issue 8).
            "UPDATE types.all_types SET c_text = 'was null', "
            "c_interval = '98 days 02:53:35.627452' WHERE id = 2",
            "DELETE FROM types.all_types WHERE id = 3",
        ]
    )
    report = types_pipeline.wait_converged(timeout_seconds=120)
    assert report.tables[0].source_count == 2


def test_unchanged_toasted_values_of_every_type_are_kept(
    types_pipeline: SyncHarness, types_mode: str
) -> None:
    """Large, poorly compressible values are stored out of line; an update of another column
    then sends Debezium's placeholder for each, in its per-type form (schema/unavailable.py):
    no sink may store a placeholder as data or lose the value."""
    series = "(SELECT string_agg(md5(g::text), '' ORDER BY g) FROM generate_series(1, 400) g)"
    # Under binary.handling.mode=base64 Debezium sends an unchanged TOASTed bytea as null, which
    # nothing can tell from a real null (`connectors validate` warns): keep bytea inline there.
    bytea = "'\\x0102'::bytea" if types_mode == "binary-base64" else f"decode({series}, 'hex')"
    types_pipeline.run_sql(
        [
            f"UPDATE types.all_types SET c_text = {series}, "
            f"c_bytea = {bytea}, c_xml = ('<a>' || {series} || '</a>')::xml, "
            "c_jsonb = (SELECT jsonb_object_agg(md5(g::text), md5((g + 1)::text)) "
            "FROM generate_series(1, 300) g), "
            "c_json = (SELECT json_object_agg(md5(g::text), g) FROM generate_series(1, 400) g), "
            "c_int_array = (SELECT array_agg(hashtext(g::text)) FROM generate_series(1, 3000) g), "
            "c_text_array = (SELECT array_agg(md5(g::text)) FROM generate_series(1, 400) g) "
            "WHERE id = 1",
        ]
    )
    types_pipeline.wait_converged(timeout_seconds=120)
    types_pipeline.run_sql(["UPDATE types.all_types SET c_int2 = 7 WHERE id = 1"])
    report = types_pipeline.wait_converged(timeout_seconds=120)
    assert report.converged


def test_delta_types_are_exact_where_arrow_allows(
    types_pipeline: SyncHarness, types_mode: str
) -> None:
    types_pipeline.wait_converged(timeout_seconds=120)
    warehouse = Path(types_pipeline.connections.require("warehouse"))
    schema = pa.schema(DeltaTable(str(warehouse / "types" / "all_types")).schema().to_arrow())
    fields = {f.name: f.type for f in schema}
    assert fields["c_int8"] == pa.int64() and fields["c_int2"] == pa.int16()
    assert str(fields["c_date"]) == "date32[day]"
    assert "timestamp" in str(fields["c_timestamptz"])
    if types_mode == "defaults":
        assert str(fields["c_numeric"]) == "decimal128(12, 3)"
        assert "binary" in str(fields["c_bytea"])
    if types_mode == "decimal-double":
        assert fields["c_numeric"] == pa.float64()


def test_search_fields_get_a_mapping_per_type(types_pipeline: SyncHarness) -> None:
    types_pipeline.wait_converged(timeout_seconds=120)
    backend = connect("opensearch", types_pipeline.connections.require("search_url"))
    try:
        [mappings] = backend.mappings("types_all_types").values()
    finally:
        backend.close()
    properties = mappings["properties"]
    assert properties["c_int8"]["type"] == "long"
    assert properties["c_bool"]["type"] == "boolean"
    assert properties["c_timestamptz"]["type"] == "date"
    assert properties["c_uuid"]["type"] == "keyword"


def table_consumer(pipeline: SyncHarness) -> Consumer:
    connections = pipeline.connections
    bootstrap = connections.require("kafka_bootstrap")
    return Consumer(consumer_config(bootstrap, connections.kafka_flavor, f"t{uuid.uuid4()}"))


@pytest.fixture
def types_mode(request: pytest.FixtureRequest) -> str:
    """The converter mode of the current `types_pipeline` parameter."""
    return str(request.node.callspec.params["types_pipeline"])


def test_catalog_schema_matches_what_debezium_sends(
    types_pipeline: SyncHarness, types_mode: str
) -> None:
    """Records without Connect schemas get their types from the catalog: they must agree."""
    if types_mode == "schemaless":
        pytest.skip("schemaless records carry no schema to compare with")
    connections = types_pipeline.connections
    topic = f"{types_pipeline.mapping.topic_prefix}.{TABLE}"
    consumer = table_consumer(types_pipeline)
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        message = consumer.poll(30)
    finally:
        consumer.close()
    assert message is not None and message.value() is not None
    parsed = parse_record(message.key(), message.value(), Coordinates(topic, 0, 0))
    assert isinstance(parsed, Change) and parsed.schema is not None
    modes = ConverterModes.from_connector(CONNECTOR_MODES | MODES[types_mode])
    with psycopg.connect(connections.require("pg_url")) as conn:
        from_catalog = row_schema_from_catalog(conn, TABLE, modes)
    from_debezium = {c.name: c.type for c in parsed.schema.columns}
    mismatched = {
        c.name: (str(c.type), str(from_debezium.get(c.name)))
        for c in from_catalog.columns
        if from_debezium.get(c.name) != c.type
    }
    assert not mismatched


# Variable-length types: the ones Postgres can TOAST, so the ones that can arrive as
# unchanged-value placeholders and be read back from Postgres instead (job.write.unavailable).
TOASTABLE = [
    "c_numeric",
    "c_numeric_free",
    "c_text",
    "c_varchar",
    "c_char",
    "c_json",
    "c_jsonb",
    "c_bytea",
    "c_int_array",
    "c_text_array",
    "c_xml",
]


def test_values_read_from_postgres_equal_what_debezium_sends(
    types_pipeline: SyncHarness, types_mode: str
) -> None:
    """A placeholder filled from Postgres must hold exactly what Debezium would have sent."""
    if types_mode == "schemaless":
        pytest.skip("the same values; the schema comes from the catalog")
    connections = types_pipeline.connections
    topic = f"{types_pipeline.mapping.topic_prefix}.{TABLE}"
    consumer = table_consumer(types_pipeline)
    # Per key, the newest record holding every TOASTable column but those whose null may be a
    # placeholder (`Change.uncertain_columns`: a null array): after it only placeholders
    # (unchanged values) or other columns changed, so it holds what Postgres holds now.
    latest: dict[object, Change] = {}
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        while (message := consumer.poll(3)) is not None:
            if message.value() is None:
                continue
            parsed = parse_record(message.key(), message.value(), Coordinates(topic, 0, 0))
            assert not isinstance(parsed, Truncate)
            if not isinstance(parsed, Change) or parsed.row is None:
                latest.pop(parsed.key[0][1], None)
            elif set(TOASTABLE) <= set(parsed.row) | parsed.uncertain_columns:
                latest[parsed.key[0][1]] = parsed
    finally:
        consumer.close()
    sent = list(latest.values())
    assert sent
    schema = sent[0].schema
    assert schema is not None
    modes = ConverterModes.from_connector(CONNECTOR_MODES | MODES[types_mode])
    with psycopg.connect(connections.require("pg_url")) as conn:
        read = read_columns(
            conn,
            TABLE,
            [schema.column("id")],
            [(change.key[0][1],) for change in sent],
            [schema.column(name) for name in TOASTABLE],
            modes,
        )
    for change in sent:
        assert change.row is not None
        from_debezium = {name: change.row[name] for name in TOASTABLE if name in change.row}
        from_postgres = read[(change.key[0][1],)]
        assert {name: from_postgres[name] for name in from_debezium} == from_debezium
