"""Postgres -> Debezium (embedded, real connector JSON) -> broker -> Spark -> search, Redis, Delta.

Runs on the test services (tests/fixtures/services.py: env URL, container, or local process).
Order matters: the snapshot case runs first, the replay last (it checks what all before built).
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from pathlib import Path
from typing import cast

import psycopg
import pytest
import redis
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cdc_sync.core.kafka_clients import admin_config, consumer_config, producer_config
from cdc_sync.debezium.connector import load_connector
from cdc_sync.debezium.signals import request_snapshot
from cdc_sync.demo.workload import run_workload
from cdc_sync.sinks.search.backends import open_backend
from cdc_sync.verify.compare import cache_rows, delta_rows, search_rows, verify_all
from tests.e2e.cases import Case, load_cases, mismatches
from tests.e2e.harness import SyncHarness
from tests.e2e.sinks_state import all_sinks_state

pytestmark = pytest.mark.e2e

CASES = load_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case(pipeline: SyncHarness, case: Case) -> None:
    pipeline.run_sql(case.sql)
    pipeline.wait_converged()
    connections = pipeline.connections
    cache = redis.Redis.from_url(connections.require("redis_url"))
    warehouse = Path(connections.require("warehouse"))
    search = open_backend(connections.search_client, connections.require("search_url"))
    problems: list[str] = []
    for table, expected in case.expect.items():
        route = pipeline.mapping.tables[table]
        key = pipeline.key_columns(table)
        problems += mismatches("search", search_rows(search, route), expected)
        problems += mismatches("cache", cache_rows(cache, route), expected)
        problems += mismatches("delta", delta_rows(warehouse, route, key), expected)
    cache.close()
    search.close()
    assert not problems, "\n".join(problems)


def test_random_workload_converges_across_a_job_restart(pipeline: SyncHarness) -> None:
    url = pipeline.connections.require("pg_url")
    workload = threading.Thread(target=run_workload, args=(url, 150, 11))
    workload.start()
    time.sleep(2)
    pipeline.stop()  # mid-workload: batches in flight re-run on restart and must be harmless
    pipeline.start()
    workload.join()
    run_workload(url, 100, 12)
    report = pipeline.wait_converged(timeout_seconds=180)
    assert sum(t.source_count for t in report.tables) > 0


def test_malformed_record_is_dead_lettered_and_the_job_goes_on(pipeline: SyncHarness) -> None:
    kafka_bootstrap = pipeline.connections.require("kafka_bootstrap")
    flavor = pipeline.connections.kafka_flavor
    topic = f"{pipeline.mapping.topic_prefix}.shop.customers"
    garbage = f"not json {uuid.uuid4()}".encode()
    producer = Producer(producer_config(kafka_bootstrap, flavor))
    producer.produce(topic, key=b"{broken", value=garbage)
    assert producer.flush(10) == 0
    producer.close()
    pipeline.run_sql(
        [
            "INSERT INTO shop.customers (email, full_name) "
            "VALUES ('after-dlq@example.com', 'After DLQ')"
        ]
    )
    pipeline.wait_converged()
    letters = _consume_all(kafka_bootstrap, flavor, pipeline.mapping.dead_letter_topic)
    matching = [(headers, value) for headers, value in letters if value == garbage]
    assert matching, "the malformed record is not on the dead-letter topic"
    headers = matching[0][0]
    assert headers["cdc_sync.topic"] == topic
    assert headers["cdc_sync.stage"] == "parse"
    assert int(headers["cdc_sync.offset"]) >= 0
    # Counts reconcile: every record read became a change, a tombstone or a dead letter.
    assert pipeline.job is not None
    history = pipeline.job.consumer("search").applier.history
    assert history and all(batch.reconciles() for batch in history)
    assert sum(b.malformed for b in history) == sum(b.dead_lettered for b in history) >= 1


def test_incremental_snapshot_while_rows_change_converges(pipeline: SyncHarness) -> None:
    """Snapshot rows flow through the same fenced sinks: never over a newer change."""
    url = pipeline.connections.require("pg_url")
    config = load_connector(Path("connectors/shop.json")).config
    with psycopg.connect(url, autocommit=True) as conn:
        request_snapshot(conn, config, ["shop.products", "shop.order_lines"])
        for round_ in range(20):
            conn.execute(
                "UPDATE shop.products SET price = price + 1, updated_at = now() "
                "WHERE id = (SELECT id FROM shop.products ORDER BY random() LIMIT 1)"
            )
            conn.execute(
                "UPDATE shop.order_lines SET quantity = quantity + 1 "
                "WHERE (order_id, line_no) = "
                "(SELECT order_id, line_no FROM shop.order_lines ORDER BY random() LIMIT 1)"
            )
            time.sleep(0.1 * (round_ % 3))
    topic = f"{pipeline.mapping.topic_prefix}.shop.products"
    deadline = time.monotonic() + 60
    while not _has_incremental_snapshot_rows(pipeline, topic):
        assert time.monotonic() < deadline, "no incremental snapshot rows arrived"
        time.sleep(1)
    pipeline.wait_converged()


def _has_incremental_snapshot_rows(pipeline: SyncHarness, topic: str) -> bool:
    connections = pipeline.connections
    records = _consume_all(connections.require("kafka_bootstrap"), connections.kafka_flavor, topic)
    return any(b'"snapshot":"incremental"' in value for _, value in records)


def test_replay_from_offset_zero_with_a_fresh_checkpoint_changes_nothing(
    pipeline: SyncHarness,
) -> None:
    pipeline.wait_converged()
    pipeline.stop()
    before = all_sinks_state(pipeline.mapping, pipeline.connections)
    assert any(before.values())
    pipeline.drain_fresh(checkpoint=f"replay-{uuid.uuid4().hex[:6]}")
    after = all_sinks_state(pipeline.mapping, pipeline.connections)
    changed = [name for name in before if before[name] != after[name]]
    assert not changed, f"replay changed {changed}"
    pipeline.wait_converged(timeout_seconds=30)


def _consume_all(bootstrap: str, flavor: str, topic: str) -> list[tuple[dict[str, str], bytes]]:
    consumer = Consumer(
        consumer_config(bootstrap, flavor, group_id=f"e2e-{uuid.uuid4().hex[:8]}")
        | {"auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    consumer.subscribe([topic])
    found: list[tuple[dict[str, str], bytes]] = []
    deadline = time.monotonic() + 30
    idle_since = None
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                if found and idle_since is None:
                    idle_since = time.monotonic()
                if idle_since and time.monotonic() - idle_since > 3:
                    break
                continue
            idle_since = None
            raw_headers = cast(list[tuple[str, str | bytes | None]], message.headers() or [])
            headers = {name: _text(raw) for name, raw in raw_headers}
            value = message.value()
            found.append((headers, value if isinstance(value, bytes) else b""))
    finally:
        consumer.close()
    return found


def _text(raw: str | bytes | None) -> str:
    return raw.decode() if isinstance(raw, bytes) else (raw or "")


def test_a_compacted_topic_applied_from_offset_zero_converges(pipeline: SyncHarness) -> None:
    """After the log cleaner ran, a deleted key may have only its tombstone left, and a key's
    only record may be a TOAST-only update. Applying such a log from offset 0 onto sinks that
    still hold the deleted row, with the cache emptied, must converge: the tombstone is the
    delete, and the placeholder is filled from Postgres."""
    toasted = "(SELECT string_agg(md5(g::text), '' ORDER BY g) FROM generate_series(1, 400) g)"
    was_running = pipeline.query is not None
    if not was_running:
        pipeline.start()  # an earlier test may have left it stopped
    pipeline.run_sql(
        [
            "INSERT INTO shop.products (id, sku, name, description, price) "
            f"VALUES (9400, 'CMP-1', 'Compacted', {toasted}, 1.00)",
            "INSERT INTO shop.products (id, sku, name, price) VALUES (9401, 'CMP-2', 'Gone', 2)",
        ]
    )
    pipeline.wait_converged()
    pipeline.stop()
    connections = pipeline.connections
    bootstrap, flavor = connections.require("kafka_bootstrap"), connections.kafka_flavor
    source_topic = f"{pipeline.mapping.topic_prefix}.shop.products"
    before = len(_consume_all(bootstrap, flavor, source_topic))
    try:
        pipeline.run_sql(
            [
                "DELETE FROM shop.products WHERE id = 9401",
                "UPDATE shop.products SET price = 3.00 WHERE id = 9400",  # description unchanged
            ]
        )
        deadline = time.monotonic() + 60
        # delete event, tombstone, update
        while len(_consume_all(bootstrap, flavor, source_topic)) < before + 3:
            assert time.monotonic() < deadline, "the delete and update never reached the topic"
        compacted = dataclasses.replace(
            pipeline.mapping,
            topic_prefix=f"cmp{uuid.uuid4().hex[:6]}",
            dead_letter_topic=f"cmp{uuid.uuid4().hex[:6]}.dead_letter",
        )
        for table in pipeline.mapping.tables:
            _copy_compacted(
                bootstrap,
                flavor,
                f"{pipeline.mapping.topic_prefix}.{table}",
                f"{compacted.topic_prefix}.{table}",
            )
        redis.Redis.from_url(connections.require("redis_url")).flushdb()
        replay = SyncHarness(pipeline.spark, compacted, connections, pipeline.root)
        replay.drain_fresh(checkpoint=f"compacted-{uuid.uuid4().hex[:6]}")
        report = verify_all(pipeline.mapping, connections)
        assert report.converged, report.table()
    finally:
        if was_running:
            pipeline.start()  # leave the session's pipeline as the test found it


def _copy_compacted(bootstrap: str, flavor: str, source: str, target: str) -> None:
    """What Kafka's log cleaner leaves of `source` (the last record per key, in log order),
    written to `target`: the stand-in brokers do not compact."""
    consumer = Consumer(
        consumer_config(bootstrap, flavor, group_id=f"cmp-{uuid.uuid4().hex[:8]}")
        | {"auto.offset.reset": "earliest", "enable.auto.commit": False}
    )
    consumer.subscribe([source])
    last: dict[bytes, tuple[int, bytes | None]] = {}
    idle_since = time.monotonic()
    try:
        while time.monotonic() - idle_since < 5:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            idle_since = time.monotonic()
            key = message.key()
            assert isinstance(key, bytes)
            value = message.value()
            last.pop(key, None)  # re-insert: dict order is the order of each key's last record
            last[key] = (message.offset() or 0, value if isinstance(value, bytes) else None)
    finally:
        consumer.close()
    admin = AdminClient(admin_config(bootstrap))
    for future in admin.create_topics([NewTopic(target, num_partitions=1)]).values():
        future.result(30)
    producer = Producer(producer_config(bootstrap, flavor))
    for key, (_, value) in last.items():
        producer.produce(target, key=key, value=value)
    assert producer.flush(30) == 0
