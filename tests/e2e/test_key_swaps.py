"""Deferrable-key swaps with micro-batch boundaries inside them converge (issue 17 item 5).

Real Debezium captures a table whose primary key is DEFERRABLE (REPLICA IDENTITY FULL); each
swap `UPDATE ... SET id = CASE id WHEN a THEN b ELSE a END` reaches Kafka as d(a) ts(a) c(b)
d(b) ts(b) c(a), one transaction. The job then reads the topic with maxOffsetsPerTrigger 3, so
batch boundaries fall at every third record: single-row updates between the swaps shift where,
so boundaries land between c(b) and d(b) and between d(b) and its tombstone (asserted from the
records and the batches). The first swap is the first transaction streamed after the snapshot
(`[null, lsn]`: its changes differ in version, observed here). Two chains through a key (a -> 100
-> a) emit a swap's events and leave the key absent. Every sink must equal Postgres, on the
driver path and on the executors, with the job stopped halfway and restarted on its checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.debezium.connector import load_connector
from cdc_sync.job.settle.applier import BatchMetrics
from cdc_sync.mapping import MappingFile, load_mapping
from tests.e2e.conftest import CONNECTOR, Services, running_pipeline
from tests.e2e.harness import SyncHarness
from tests.e2e.sinks_state import clean_sinks
from tests.pg import private_database

pytestmark = pytest.mark.e2e
REDIS_DB = 12  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8, others 9-11
TABLE = "shop.pairs"
ROWS = 8
MAX_OFFSETS_PER_TRIGGER = 3  # each swap is 6 records: boundaries inside every swap


OVERRIDES = {
    "table.include.list": TABLE,
    "heartbeat.interval.ms": "0",  # nothing streamed before the first swap
}


def write_mapping(root: Path, prefix: str) -> MappingFile:
    """The table to all three sinks (tombstones are deletes: the default), with a connector
    file that captures only it."""
    connector = load_connector(CONNECTOR)
    config = {**connector.config, **OVERRIDES, "topic.prefix": prefix}
    (root / "connector.json").write_text(json.dumps({"name": prefix, "config": config}))
    document = {
        "version": 1,
        "source": {"topic_prefix": prefix, "connector": "connector.json"},
        "defaults": {"on_tombstone": "delete", "on_malformed": "fail"},
        "dead_letter": {"topic": f"{prefix}.dead_letter"},
        "tables": {
            TABLE: {
                "search": {"index": f"{prefix}_pairs"},
                "cache": {"prefix": prefix},
                "delta": {"table": TABLE},
            }
        },
    }
    path = root / "mapping.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return load_mapping(path)


@pytest.fixture(scope="module")
def swapped(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SyncHarness]:
    """Capture of the table, its snapshot, then the swaps; the job stopped meanwhile, so every
    run below reads all of it in batches of exactly MAX_OFFSETS_PER_TRIGGER records."""
    root = tmp_path_factory.mktemp("e2e-key-swaps")
    with private_database(services.pg_url, "swaps_e2e") as database:
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA shop")
            conn.execute(
                "CREATE TABLE shop.pairs (id int, v text NOT NULL, "
                "CONSTRAINT pairs_pkey PRIMARY KEY (id) DEFERRABLE INITIALLY DEFERRED)"
            )
            conn.execute("ALTER TABLE shop.pairs REPLICA IDENTITY FULL")
            conn.execute(
                "INSERT INTO shop.pairs SELECT n, 'row ' || n FROM generate_series(1, %s) n",
                (ROWS,),
            )
        connections = services.connections(database, REDIS_DB, root)
        mapping = write_mapping(root, f"sw{uuid.uuid4().hex[:6]}")
        with running_pipeline(services.spark, mapping, connections, root, OVERRIDES) as harness:
            harness.stop()  # capture has the snapshot; the job reads it all later
            records = ROWS + write_swaps(database)
            wait_for_records(harness, records)
            yield harness


def write_swaps(database: str) -> int:
    """Swaps (6 records each), single-row updates (1 record) shifting where the boundaries fall
    in the next swap, and chains through a free key; the records written."""
    records = 0
    with psycopg.connect(database, autocommit=True) as conn:
        for number in range(12):
            a, b = 1 + number % ROWS, 1 + (number * 3 + 1) % ROWS
            if a == b:
                b = 1 + b % ROWS
            conn.execute(
                "UPDATE shop.pairs SET id = CASE id WHEN %s THEN %s ELSE %s END "
                "WHERE id IN (%s, %s)",
                (a, b, a, a, b),
            )
            records += 6
            if number % 3 == 1:
                conn.execute("UPDATE shop.pairs SET v = v || '+' WHERE id = %s", (a,))
                records += 1
            if number % 6 == 5:  # a -> 100 -> a: key 100 ends absent
                with conn.transaction():
                    conn.execute("UPDATE shop.pairs SET id = 100 WHERE id = %s", (b,))
                    conn.execute("UPDATE shop.pairs SET id = %s WHERE id = 100", (b,))
                records += 6
    return records


def topic_of(pipeline: SyncHarness) -> str:
    return f"{pipeline.mapping.topic_prefix}.{TABLE}"


def read_records(pipeline: SyncHarness) -> list[dict[str, Any]]:
    """The topic's records in order: key, op ("ts": tombstone), last commit, txId."""
    consumer = Consumer(
        consumer_config(
            pipeline.connections.require("kafka_bootstrap"),
            pipeline.connections.kafka_flavor,
            f"t-{uuid.uuid4().hex[:8]}",
        )
    )
    try:
        high = consumer.get_watermark_offsets(TopicPartition(topic_of(pipeline), 0), timeout=10)[1]
        consumer.assign([TopicPartition(topic_of(pipeline), 0, 0)])
        found: list[dict[str, Any]] = []
        while len(found) < high:
            message = consumer.poll(10)
            assert message is not None, f"{len(found)} of {high} records read"
            if message.error() is not None:
                continue
            raw_key, value = message.key(), message.value()
            assert raw_key is not None
            key = json.loads(raw_key)["payload"]["id"]
            if value is None:
                found.append({"key": key, "op": "ts"})
                continue
            payload = json.loads(value)["payload"]
            source = payload["source"]
            commit = json.loads(source["sequence"])[0]
            found.append({"key": key, "op": payload["op"], "commit": commit, "lsn": source["lsn"]})
        return found
    finally:
        consumer.close()


def wait_for_records(pipeline: SyncHarness, count: int) -> None:
    deadline = time.monotonic() + 120
    while len(read_records(pipeline)) < count:
        assert time.monotonic() < deadline, f"capture did not publish {count} records"
        time.sleep(0.5)


def inside_swaps(records: list[dict[str, Any]], ends: list[int]) -> dict[str, int]:
    """Batch boundaries (a batch's last offset) that fall inside a transaction where a key is
    created then deleted: between c(b) and d(b), and between d(b) and its tombstone."""
    found = {"create|delete": 0, "delete|tombstone": 0}
    for end in ends:
        if end + 1 >= len(records):
            continue
        last, first = records[end], records[end + 1]
        if last["key"] != first["key"]:
            continue
        if (last["op"], first["op"]) == ("c", "d"):
            found["create|delete"] += 1
        created_before = (
            end >= 1 and records[end - 1]["op"] == "c" and records[end - 1]["key"] == last["key"]
        )
        if (last["op"], first["op"]) == ("d", "ts") and created_before:
            found["delete|tombstone"] += 1
    return found


# Where the batches run (job.batch_phases): the driver for small batches, or Spark tasks.
PATHS = {"driver": 2_000, "executors": 0}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_swaps_with_batch_boundaries_inside_them_leave_every_sink_equal_to_postgres(
    swapped: SyncHarness, path: str
) -> None:
    records = read_records(swapped)
    # Observed: the first swap is the first transaction after the snapshot, `[null, lsn]`:
    # its create and delete of one key carry different versions (their own lsns).
    first = records[ROWS : ROWS + 6]
    assert [(r["op"], r["commit"]) for r in first if r["op"] != "ts"] == [
        ("d", None), ("c", None), ("d", None), ("c", None)
    ]  # fmt: skip
    # d(a) c(b) d(b) c(a): one UPDATE record per row moved, so c(b) and d(b) differ in lsn.
    assert (first[2]["op"], first[3]["op"]) == ("c", "d") and first[2]["lsn"] < first[3]["lsn"]

    # A run of its own: fresh checkpoint, clean sinks, a warehouse of its own. Stopped halfway
    # (mid-batch, likely: that batch re-runs) and restarted on its checkpoint: the open
    # transactions come back from the file beside it.
    connections = dataclasses.replace(
        swapped.connections, warehouse=str(swapped.root / f"warehouse-{path}")
    )
    clean_sinks(swapped.mapping, connections)
    run = SyncHarness(swapped.spark, swapped.mapping, connections, swapped.root)
    options: dict[str, Any] = {
        "checkpoint": f"{path}-{uuid.uuid4().hex[:6]}",
        "max_offsets_per_trigger": MAX_OFFSETS_PER_TRIGGER,
        "driver_batch_max_records": PATHS[path],
        "trigger_seconds": 0.1,
    }
    where = (topic_of(swapped), 0)
    history: list[BatchMetrics] = []
    try:
        run.start(**options)
        history += applied_through(run, where, len(records) // 2)
        run.stop()
        run.start(**options)
        history += applied_through(run, where, len(records) - 1)  # the sinks are then final
        ends = sorted(batch.offsets[where] for batch in history if where in batch.offsets)
        inside = inside_swaps(records, ends)
        assert inside["create|delete"] > 0 and inside["delete|tombstone"] > 0, (inside, ends)
        ran_on = {batch.ran_on for batch in history if batch.batch_id > 0 and batch.changes}
        assert ran_on == {path}
        run.wait_converged(timeout_seconds=60)
    finally:
        run.stop()


def applied_through(run: SyncHarness, where: tuple[str, int], offset: int) -> list[BatchMetrics]:
    """The running job's batches once one of them applied `offset` (or beyond)."""
    deadline = time.monotonic() + 600
    while True:
        run.raise_if_failed()
        assert run.job is not None
        history = list(run.job.consumer("search").applier.history)
        if any(batch.offsets.get(where, -1) >= offset for batch in history):
            return history
        assert time.monotonic() < deadline, f"the job did not apply offset {offset}"
        time.sleep(0.2)
