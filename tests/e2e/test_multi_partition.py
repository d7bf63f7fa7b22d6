"""Per-key order and version fencing hold with 4-partition topics on `local[2]` (issue 9).

The capture creates every topic with 4 partitions before the snapshot (Kafka Connect's
`topic.creation.default.partitions`), and keys records by primary key with the Java client's
murmur2 partitioner, as Debezium does. The job then folds and writes each Kafka partition in its
own task, in parallel, with no shuffle: many updates per key across batches, deletes and
re-inserts of a key, and several changes of one key in one transaction (equal versions, Kafka
order decides) must leave every sink equal to Postgres; a replay of all 4 partitions from
offset 0 must change nothing (fencing).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from cdc_sync.core.kafka_clients import admin_config
from cdc_sync.demo.workload import create_demo_schema
from tests.e2e.conftest import Services, running_pipeline
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.e2e.sinks_state import all_sinks_state
from tests.pg import private_database

pytestmark = pytest.mark.e2e

PARTITIONS = 4
REDIS_DB = 9  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8
KEYS = 16


@pytest.fixture(scope="module")
def pipeline(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncHarness]:
    root = tmp_path_factory.mktemp("e2e-partitions")
    with private_database(services.pg_url, "partitions_e2e") as database:
        connections = services.connections(database, REDIS_DB, root)
        create_demo_schema(database)
        mapping = e2e_mapping(f"mp{uuid.uuid4().hex[:6]}")
        overrides = {"topic.creation.default.partitions": str(PARTITIONS)}
        with running_pipeline(services.spark, mapping, connections, root, overrides) as harness:
            yield harness


def wait_first_batch(pipeline: SyncHarness, timeout_seconds: float = 120.0) -> None:
    assert pipeline.job is not None
    deadline = time.monotonic() + timeout_seconds
    while not pipeline.job.consumer("search").applier.history:
        assert time.monotonic() < deadline, "the restarted job ran no batch"
        time.sleep(0.1)


# Where the batches run (job.batch_phases): Spark tasks, or the driver for small batches. Both
# must leave the same sinks; the driver reads the partitions one after the other.
PATHS = {"executors": 0, "driver": 100_000}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_four_partitions_keep_per_key_order_and_fencing(pipeline: SyncHarness, path: str) -> None:
    pipeline.stop()
    pipeline.start(driver_batch_max_records=PATHS[path])
    wait_first_batch(pipeline)  # the writes below then land in later batches, where paths differ
    topic = f"{pipeline.mapping.topic_prefix}.shop.customers"
    bootstrap = pipeline.connections.require("kafka_bootstrap")
    admin = AdminClient(admin_config(bootstrap))
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == PARTITIONS

    with psycopg.connect(pipeline.connections.require("pg_url"), autocommit=True) as conn:
        ids = [
            row[0]
            for row in conn.execute(
                "INSERT INTO shop.customers (email, full_name) "
                "SELECT %s || n || '@example.com', 'Customer ' || n "
                "FROM generate_series(1, %s) AS n RETURNING id",
                (f"mp-{path}-", KEYS),
            ).fetchall()
        ]
        for round_ in range(6):  # many updates per key, spread over micro-batches
            conn.execute(
                "UPDATE shop.customers SET tier = %s, updated_at = now() WHERE id = ANY(%s)",
                (f"round-{round_}", ids),
            )
            time.sleep(0.3)
        with conn.transaction():  # one transaction: equal versions, Kafka order decides
            for tier in ("tx-a", "tx-b", "tx-final"):
                conn.execute("UPDATE shop.customers SET tier = %s WHERE id = %s", (tier, ids[0]))
            conn.execute("DELETE FROM shop.customers WHERE id = %s", (ids[1],))
            conn.execute(
                "INSERT INTO shop.customers (id, email, full_name, tier) "
                "VALUES (%s, %s, 'Reborn', 'reborn')",
                (ids[1], f"reborn-{path}@example.com"),
            )
        conn.execute("DELETE FROM shop.customers WHERE id = ANY(%s)", (ids[2:6],))
        time.sleep(0.6)  # the deletes and the re-inserts land in different batches
        conn.execute(
            "INSERT INTO shop.customers (id, email, full_name, tier) "
            "SELECT id, 'back' || id || '@example.com', 'Back', 'back' FROM unnest(%s::bigint[]) "
            "AS id",
            (ids[2:4],),
        )
        conn.execute("UPDATE shop.customers SET tier = 'last' WHERE id = %s", (ids[3],))

    pipeline.wait_converged()
    assert pipeline.job is not None
    history = pipeline.job.consumer("search").applier.history
    spread = {partition for batch in history for (t, partition) in batch.offsets if t == topic}
    assert len(spread) > 1, f"every record landed on partitions {spread}: nothing was parallel"
    assert any(len({p for (t, p) in batch.offsets if t == topic}) > 1 for batch in history)
    # Batch 0 always runs on the executors: its start offsets are in no offset log.
    ran_on = {(batch.batch_id, batch.ran_on) for batch in history if batch.changes}
    assert {where for batch_id, where in ran_on if batch_id > 0} == {path}, ran_on

    # Fencing across partitions: a fresh checkpoint replays all 4 partitions from offset 0
    # (every older version of every key) onto the converged sinks, and changes nothing.
    pipeline.stop()
    before = all_sinks_state(pipeline.mapping, pipeline.connections)
    pipeline.drain_fresh(checkpoint=f"replay-{uuid.uuid4().hex[:6]}")
    after = all_sinks_state(pipeline.mapping, pipeline.connections)
    assert [name for name in before if before[name] != after[name]] == []
    pipeline.wait_converged(timeout_seconds=30)
    pipeline.start()  # the module's pipeline runs on for the next case
