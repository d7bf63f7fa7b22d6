"""Live schema changes on the running pipeline, per `on_schema_change` policy.

evolve: added columns reach Delta, the search mapping and the cache; dropped columns stay; a
varchar(n) -> text change is no type change; int4 -> int8 widens; a rename is a drop plus an add;
narrowing stops the job naming the table, column and setting. ignore: sinks keep the first
schema. fail: the first change stops the job, naming the setting, also when the change was made
while the job was stopped (the accepted schema is kept beside the checkpoint).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Generator, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
import redis
from deltalake import DeltaTable

from cdc_sync.core.model import TableId
from cdc_sync.demo.workload import create_demo_schema
from cdc_sync.job.consumers import consumer_checkpoint
from cdc_sync.job.settle.schema_store import SCHEMAS_DIR
from cdc_sync.mapping import MappingFile, OnSchemaChange, Policies, SearchRoute
from cdc_sync.sinks.search.backends import connect
from tests.e2e.conftest import Services, running_pipeline
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.pg import private_database

pytestmark = pytest.mark.e2e
CUSTOMERS = TableId("shop", "customers")
ORDER_LINES = TableId("shop", "order_lines")
REDIS_DB = {OnSchemaChange.EVOLVE: 5, OnSchemaChange.IGNORE: 6, OnSchemaChange.FAIL: 7}


def policy_mapping(policy: OnSchemaChange) -> MappingFile:
    mapping = e2e_mapping(f"sc{uuid.uuid4().hex[:6]}")
    tables = {}
    for table, route in mapping.tables.items():
        route = dataclasses.replace(
            route,
            policies=Policies(route.policies.on_tombstone, route.policies.on_malformed, policy),
        )
        if table == ORDER_LINES and route.search is not None:
            # quantity widens to int8 below: an explicit `integer` field could not hold it.
            properties = dict(route.search.mapping["properties"]) | {"quantity": {"type": "long"}}
            route = dataclasses.replace(
                route, search=SearchRoute(route.search.index, {"properties": properties})
            )
        tables[table] = route
    return dataclasses.replace(mapping, tables=tables)


def policy_pipeline(
    policy: OnSchemaChange, services: Services, root: Path
) -> Generator[SyncHarness, None, None]:
    with private_database(services.pg_url, f"schema_{policy.value}") as database:
        create_demo_schema(database)
        connections = services.connections(database, REDIS_DB[policy], root)
        mapping = policy_mapping(policy)
        with running_pipeline(services.spark, mapping, connections, root, {}) as harness:
            harness.wait_converged()
            yield harness


@pytest.fixture(scope="module")
def evolving(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncHarness]:
    yield from policy_pipeline(OnSchemaChange.EVOLVE, services, tmp_path_factory.mktemp("evolve"))


def delta_columns(harness: SyncHarness, table: TableId) -> dict[str, str]:
    path = Path(harness.connections.require("warehouse")) / table.schema / table.table
    schema = pa.schema(DeltaTable(str(path)).schema().to_arrow())
    return {f.name: str(f.type) for f in schema}


def search_fields(harness: SyncHarness, table: TableId) -> dict[str, str]:
    route = harness.mapping.tables[table]
    assert route.search is not None
    backend = connect("opensearch", harness.connections.require("search_url"))
    try:
        [mappings] = backend.mappings(route.search.index).values()
    finally:
        backend.close()
    return {name: spec.get("type", "object") for name, spec in mappings["properties"].items()}


def cached_row(harness: SyncHarness, table: TableId, ident: str) -> dict[str, object]:
    route = harness.mapping.tables[table]
    assert route.cache is not None
    client = redis.Redis.from_url(harness.connections.require("redis_url"))
    try:
        raw = client.hget(route.cache.key(table, ident), "row")
    finally:
        client.close()
    assert isinstance(raw, bytes)
    return dict(json.loads(raw))


def wait_for_failure(harness: SyncHarness, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if harness.query is not None and harness.query.exception() is not None:
            return str(harness.query.exception())
        time.sleep(0.5)
    raise AssertionError(f"the sync job did not stop within {timeout}s")


def test_added_column_reaches_delta_search_and_cache(evolving: SyncHarness) -> None:
    evolving.run_sql(
        [
            "ALTER TABLE shop.customers ADD COLUMN nickname text",
            "UPDATE shop.customers SET nickname = 'nick-' || id WHERE id <= 2",
        ]
    )
    evolving.wait_converged()
    assert delta_columns(evolving, CUSTOMERS)["nickname"] == "string"
    assert "nickname" in search_fields(evolving, CUSTOMERS)
    assert cached_row(evolving, CUSTOMERS, "1")["nickname"] == "nick-1"


def test_dropped_column_and_varchar_to_text_keep_the_job_running(evolving: SyncHarness) -> None:
    evolving.run_sql(
        [
            "ALTER TABLE shop.customers DROP COLUMN tier",
            "ALTER TABLE shop.customers ALTER COLUMN full_name TYPE varchar(200)",
            "UPDATE shop.customers SET full_name = full_name || ' Jr.' WHERE id = 3",
            "ALTER TABLE shop.customers ALTER COLUMN full_name TYPE text",
            "UPDATE shop.customers SET full_name = full_name || ' II' WHERE id = 4",
        ]
    )
    evolving.wait_converged()
    assert "tier" in delta_columns(evolving, CUSTOMERS)  # kept for the rows written before


def test_int4_to_int8_widens_the_targets(evolving: SyncHarness) -> None:
    evolving.run_sql(
        [
            "ALTER TABLE shop.order_lines ALTER COLUMN quantity TYPE bigint",
            "UPDATE shop.order_lines SET quantity = 3000000000 WHERE line_no = 1",
        ]
    )
    evolving.wait_converged()
    assert delta_columns(evolving, ORDER_LINES)["quantity"] == "int64"


def test_rename_is_a_drop_plus_an_add(evolving: SyncHarness) -> None:
    evolving.run_sql(
        [
            "ALTER TABLE shop.customers RENAME COLUMN full_name TO display_name",
            # rows carry the new name as they change
            "UPDATE shop.customers SET updated_at = now()",
        ]
    )
    evolving.wait_converged()
    assert {"display_name", "full_name"} <= set(delta_columns(evolving, CUSTOMERS))


def test_narrowing_stops_the_job_naming_table_column_and_setting(evolving: SyncHarness) -> None:
    evolving.run_sql(
        [
            "UPDATE shop.order_lines SET quantity = 1",
            "ALTER TABLE shop.order_lines ALTER COLUMN quantity TYPE smallint",
            "UPDATE shop.order_lines SET quantity = 2 WHERE line_no = 1",
        ]
    )
    message = wait_for_failure(evolving)
    assert "shop.order_lines" in message and "quantity" in message
    assert "on_schema_change" in message


@pytest.mark.parametrize("policy", [OnSchemaChange.IGNORE, OnSchemaChange.FAIL])
def test_ignore_keeps_the_first_schema_and_fail_stops(
    policy: OnSchemaChange, services: Services, tmp_path: Path
) -> None:
    pipeline = policy_pipeline(policy, services, tmp_path)
    harness = next(pipeline)
    try:
        harness.run_sql(
            [
                "ALTER TABLE shop.customers ADD COLUMN nickname text",
                "UPDATE shop.customers SET nickname = 'n', full_name = 'Changed' WHERE id = 1",
            ]
        )
        if policy is OnSchemaChange.FAIL:
            message = wait_for_failure(harness)
            assert "shop.customers" in message and "nickname" in message
            assert "on_schema_change" in message
            return
        deadline = time.monotonic() + 60
        while cached_row(harness, CUSTOMERS, "1")["full_name"] != "Changed":
            assert time.monotonic() < deadline, "the update did not arrive"
            time.sleep(0.5)
        assert "nickname" not in cached_row(harness, CUSTOMERS, "1")
        assert "nickname" not in delta_columns(harness, CUSTOMERS)
        assert "nickname" not in search_fields(harness, CUSTOMERS)
    finally:
        pipeline.close()


def test_fail_stops_on_a_column_added_while_the_job_was_stopped(
    services: Services, tmp_path: Path
) -> None:
    pipeline = policy_pipeline(OnSchemaChange.FAIL, services, tmp_path)
    harness = next(pipeline)
    try:
        harness.stop()
        root = tmp_path / "checkpoints" / "main"
        for consumer in ("search", "redis", "delta"):  # each accepts the schema for its targets
            accepted = consumer_checkpoint(root, consumer) / SCHEMAS_DIR / "shop.customers.json"
            assert accepted.exists(), consumer
        harness.run_sql(
            [
                "ALTER TABLE shop.customers ADD COLUMN nickname text",
                "UPDATE shop.customers SET nickname = 'n' WHERE id = 1",
            ]
        )
        harness.start()  # the same checkpoint: a restart, not a new job
        message = wait_for_failure(harness)
        assert "shop.customers" in message and "nickname" in message
        assert "on_schema_change" in message
    finally:
        pipeline.close()
