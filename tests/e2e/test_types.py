"""Type fidelity on real Debezium output: one table holding every type, under the default
converter settings and the documented alternatives, compared row by row with what Postgres
returns, in the search documents, the cache entries and the Delta rows read back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from sync_jobs.events import TableId
from sync_jobs.sinks.search.backends import connect
from tests.e2e.conftest import pipeline_connections, private_database, running_pipeline
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.fixtures.services import KafkaEndpoint

pytestmark = pytest.mark.e2e

TYPES_DIR = Path(__file__).parent / "types"
TABLE = TableId("types", "all_types")
TYPES_REDIS_DB = 4
MODES = {
    # name: connector overrides (Debezium's documented alternatives)
    "defaults": {},
    "decimal-string": {"decimal.handling.mode": "string"},
    "decimal-double": {"decimal.handling.mode": "double"},
    "binary-base64": {"binary.handling.mode": "base64"},
}


@pytest.fixture(scope="module", params=list(MODES), ids=list(MODES))
def types_pipeline(
    request: pytest.FixtureRequest,
    spark: SparkSession,
    pg_url: str,
    kafka: KafkaEndpoint,
    search_url: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SyncHarness]:
    root = tmp_path_factory.mktemp(f"types-{request.param}")
    with private_database(pg_url, "types_e2e") as database:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute((TYPES_DIR / "all_types.sql").read_bytes())
        connections = pipeline_connections(
            database, kafka, search_url, redis_url, TYPES_REDIS_DB, root
        )
        mapping = e2e_mapping(f"ty{uuid.uuid4().hex[:6]}", TYPES_DIR / "types.yaml")
        overrides = {"schema.include.list": "types", "table.include.list": str(TABLE)}
        overrides |= MODES[request.param]
        with running_pipeline(spark, mapping, connections, root, overrides) as harness:
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
            "c_timestamptz = '2030-01-01 00:00:00+00', c_text_array = '{x}' WHERE id = 1",
            "UPDATE types.all_types SET c_text = 'was null', c_interval = '00:00:01' WHERE id = 2",
            "DELETE FROM types.all_types WHERE id = 3",
        ]
    )
    report = types_pipeline.wait_converged(timeout_seconds=120)
    assert report.tables[0].source_count == 2


def test_delta_types_are_exact_where_arrow_allows(types_pipeline: SyncHarness) -> None:
    types_pipeline.wait_converged(timeout_seconds=120)
    warehouse = Path(types_pipeline.connections.require("warehouse"))
    schema = pa.schema(DeltaTable(str(warehouse / "types" / "all_types")).schema().to_arrow())
    fields = {f.name: f.type for f in schema}
    assert fields["c_int8"] == pa.int64() and fields["c_int2"] == pa.int16()
    assert str(fields["c_date"]) == "date32[day]"
    assert "timestamp" in str(fields["c_timestamptz"])
    mode = _mode(types_pipeline)
    if mode == "defaults":
        assert str(fields["c_numeric"]) == "decimal128(12, 3)"
        assert "binary" in str(fields["c_bytea"])
    if mode == "decimal-double":
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


def _mode(harness: SyncHarness) -> str:
    return str(harness.root.name.split("-", 1)[1]).rstrip("0123456789")
