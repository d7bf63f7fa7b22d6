"""TRUNCATE reaches every sink (the connector emits truncate events: `skipped.operations=none`).

Rows written before a TRUNCATE are gone from search, cache and Delta, rows written after it
stay, in one micro-batch or across several, with the job running or stopped while the table was
truncated; a replay of every topic from offset 0 on a fresh checkpoint changes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from cdc_sync.core.model import TableId
from cdc_sync.demo.workload import create_demo_schema
from cdc_sync.sinks.search.backends import open_backend
from cdc_sync.verify.compare import cache_rows, delta_rows, search_rows
from tests.e2e.cases import mismatches
from tests.e2e.conftest import Services, running_pipeline
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.e2e.sinks_state import all_sinks_state
from tests.pg import private_database

pytestmark = pytest.mark.e2e
REDIS_DB = 11  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8, others 9-10
PRODUCTS = TableId("shop", "products")
# order_lines references products: they are truncated together (`TRUNCATE a, b`).
TRUNCATE = "TRUNCATE shop.order_lines, shop.products"


@pytest.fixture(scope="module")
def truncating(
    services: Services, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SyncHarness]:
    root = tmp_path_factory.mktemp("e2e-truncate")
    with private_database(services.pg_url, "truncate_e2e") as database:
        connections = services.connections(database, REDIS_DB, root)
        create_demo_schema(database)
        mapping = e2e_mapping(f"tr{uuid.uuid4().hex[:6]}")
        with running_pipeline(services.spark, mapping, connections, root, {}) as harness:
            yield harness


def insert(*ids: int, name: str = "row") -> str:
    values = ", ".join(f"({i}, 'TR-{i}', '{name} {i}', 1.00)" for i in ids)
    return f"INSERT INTO shop.products (id, sku, name, price) VALUES {values}"


def sink_problems(pipeline: SyncHarness, expected: dict[str, dict[str, Any] | None]) -> list[str]:
    """What each sink holds for products against `expected` (id -> columns, or None: absent)."""
    connections = pipeline.connections
    route = pipeline.mapping.tables[PRODUCTS]
    cache = redis.Redis.from_url(connections.require("redis_url"))
    search = open_backend(connections.search_client, connections.require("search_url"))
    warehouse = Path(connections.require("warehouse"))
    try:
        held = {
            "search": search_rows(search, route),
            "cache": cache_rows(cache, route),
            "delta": delta_rows(warehouse, route, pipeline.key_columns(PRODUCTS)),
        }
    finally:
        cache.close()
        search.close()
    problems = [p for sink, rows in held.items() for p in mismatches(sink, rows, expected)]
    # Exactly the rows Postgres holds: nothing the truncate removed is left anywhere.
    for sink, rows in held.items():
        kept = {ident for ident, columns in expected.items() if columns is not None}
        if set(rows) != kept:
            problems.append(f"{sink}: holds {sorted(rows)}, expected {sorted(kept)}")
    return problems


def test_insert_truncate_insert_leaves_exactly_the_new_rows(truncating: SyncHarness) -> None:
    pipeline = truncating
    pipeline.run_sql([insert(9500, 9501, name="old")])
    pipeline.wait_converged(timeout_seconds=300)  # the first batch starts Spark's workers
    pipeline.run_sql([TRUNCATE, insert(9502, name="new")])
    pipeline.wait_converged()
    expected: dict[str, dict[str, Any] | None] = {
        "9500": None,
        "9501": None,
        "9502": {"name": "new 9502"},
    }
    assert not sink_problems(pipeline, expected)

    # All in one go (one micro-batch, most likely): the insert before the truncate is dropped,
    # and a reload transaction (TRUNCATE then INSERT, one version) keeps what it inserted.
    pipeline.run_sql(
        [
            insert(9503, name="gone"),
            f"{TRUNCATE}; {insert(9504, name='kept')}",
            f"BEGIN; {insert(9505, name='gone too')}; {TRUNCATE}; "
            f"{insert(9506, name='reloaded')}; COMMIT",
        ]
    )
    pipeline.wait_converged()
    expected = {str(i): None for i in range(9500, 9506)} | {"9506": {"name": "reloaded 9506"}}
    assert not sink_problems(pipeline, expected)


def test_a_table_truncated_while_the_job_is_down_converges_on_restart(
    truncating: SyncHarness,
) -> None:
    pipeline = truncating
    pipeline.run_sql([insert(9600, 9601, name="before")])
    pipeline.wait_converged()
    pipeline.stop()
    pipeline.run_sql(
        [
            "UPDATE shop.products SET name = 'stale' WHERE id = 9600",
            TRUNCATE,
            insert(9602, name="after"),
        ]
    )
    pipeline.start()
    pipeline.wait_converged(timeout_seconds=300)
    expected: dict[str, dict[str, Any] | None] = {
        "9600": None,
        "9601": None,
        "9602": {"name": "after 9602"},
    }
    assert not sink_problems(pipeline, expected)


def test_a_replay_from_offset_zero_on_a_fresh_checkpoint_changes_nothing(
    truncating: SyncHarness,
) -> None:
    """Every truncate and every change before it is read again: the truncates fence them."""
    pipeline = truncating
    pipeline.wait_converged()
    pipeline.stop()
    before = all_sinks_state(pipeline.mapping, pipeline.connections)
    pipeline.drain_fresh(checkpoint=f"replay-{uuid.uuid4().hex[:6]}")
    after = all_sinks_state(pipeline.mapping, pipeline.connections)
    assert [name for name in before if before[name] != after[name]] == []
    pipeline.start()
    pipeline.wait_converged()
