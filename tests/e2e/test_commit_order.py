"""Transactions open across a snapshot: the sinks must end with what Postgres committed.

(a) Initial snapshot. Debezium creates the slot; slot creation waits for the transactions that
    were running when it began (T0), then for those running once T0 ended (T1), and the snapshot
    is consistent at the point where T1 ended. T2 began between the two waits: its writes lie
    before the snapshot's point, it is not in the snapshot, it commits afterwards and is the
    first transaction streamed, the one whose `source.sequence[0]` is null.
(b) Incremental snapshot. T writes (an update and a delete) before the chunk is read and commits
    after Debezium reported the snapshot completed; the chunk rows hold the old values.
(c) The first transaction sent again. A connector re-created on the same topics snapshots and
    streams T1, T2, T3; restarted from the offsets stored at the end of its snapshot (killed
    before its first flush after it), it sends them again, T1 without a last commit: the copy
    must not rise above T2.
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_sync.connectors.engine import CaptureEngine
from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.core.model import TableId
from cdc_sync.debezium.notifications import end_offsets, follow, notification_topic
from cdc_sync.debezium.signals import request_snapshot
from cdc_sync.demo.workload import create_demo_schema
from cdc_sync.job.consumers import plan_consumers
from cdc_sync.job.observe.checkpoint import processed_offsets
from tests.debezium_events import source_fields
from tests.e2e.conftest import CONNECTOR, Services
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.e2e.sinks_state import clean_sinks
from tests.pg import private_database

pytestmark = pytest.mark.e2e
# The job's first batch starts Spark's Python workers: slow on a loaded machine.
FIRST_CONVERGENCE_S = 300
REDIS_DB = 9  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8


class Pipeline:
    """One database, capture and job for the module; the initial-snapshot case starts capture
    itself (it must interleave with slot creation), so it runs first."""

    def __init__(self, services: Services, root: Path, database: str) -> None:
        self.connections = services.connections(database, REDIS_DB, root)
        self.mapping = e2e_mapping(f"co{uuid.uuid4().hex[:6]}")
        prefix = self.mapping.topic_prefix
        overrides = {
            "topic.prefix": prefix,
            "slot.name": f"{prefix}_slot",
            "publication.name": f"{prefix}_pub",
            "notification.sink.topic.name": f"{prefix}.notifications",
            "slot.drop.on.stop": "true",
            # No heartbeats: their action query commits transactions of its own, which could
            # stream before the transaction whose race with the snapshot these tests stage.
            "heartbeat.interval.ms": "0",
        }
        self.root = root
        self.capture_overrides = overrides
        self.capture = CaptureEngine.from_file(
            CONNECTOR, self.connections, root / "capture", overrides
        )
        self.capture_started = False
        self.kafka = services.kafka
        self.job = SyncHarness(services.spark, self.mapping, self.connections, root)
        clean_sinks(self.mapping, self.connections)

    def start_capture(self) -> None:
        self.capture.start()
        self.capture_started = True

    def ensure_running(self) -> None:
        if not self.capture_started:
            self.start_capture()
            self.capture.wait_ready(timeout_seconds=120)
        if self.job.query is None:
            self.job.start()

    def close(self) -> None:
        self.job.stop()
        self.capture.stop()


@pytest.fixture(scope="module")
def pipeline(services: Services, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pipeline]:
    with private_database(services.pg_url, "commit_order") as database:
        create_demo_schema(database)
        built = Pipeline(services, tmp_path_factory.mktemp("commit-order"), database)
        try:
            yield built
        finally:
            built.close()


def row_ids(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT email, id FROM shop.customers").fetchall()
    return {email.split("@")[0]: id_ for email, id_ in rows}


def xid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
    assert row is not None
    return int(row[0])


def wait_slot_creation_waits_for(url: str, transaction: int, timeout: float = 60) -> None:
    """Until the walsender creating the slot waits for `transaction` to end."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            waiting = conn.execute(
                "SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE a.backend_type = 'walsender' AND NOT l.granted "
                "AND l.locktype = 'transactionid' AND l.transactionid::text::bigint = %s",
                (transaction,),
            ).fetchone()
            if waiting:
                return
            assert time.monotonic() < deadline, f"slot creation never waited for {transaction}"
            time.sleep(0.1)


def test_transaction_open_across_the_initial_snapshot_wins(pipeline: Pipeline) -> None:
    url = pipeline.connections.require("pg_url")
    row = row_ids(url)
    t0, t1, t2 = (psycopg.connect(url) for _ in range(3))
    try:
        t0.execute("UPDATE shop.customers SET tier = 't0' WHERE id = %s", (row["edsger"],))
        pipeline.start_capture()
        wait_slot_creation_waits_for(url, xid(t0))
        t1.execute("UPDATE shop.products SET price = price + 1 WHERE sku = 'KB-01'")
        t1_xid = xid(t1)
        t0.commit()
        wait_slot_creation_waits_for(url, t1_xid)
        # T2 starts after slot creation stopped waiting for new transactions: it is decoded
        # in full, but its writes precede the snapshot's consistent point (the end of T1).
        t2.execute("UPDATE shop.customers SET tier = 't2' WHERE id = %s", (row["ada"],))
        t2.execute("DELETE FROM shop.customers WHERE id = %s", (row["alan"],))
        t2.execute("UPDATE shop.products SET name = 'T2 mouse' WHERE sku = 'MS-01'")
        t1.commit()
        pipeline.capture.wait_ready(timeout_seconds=120)
        t2.commit()
    finally:
        for conn in (t0, t1, t2):
            conn.close()
    pipeline.ensure_running()
    pipeline.job.wait_converged(timeout_seconds=FIRST_CONVERGENCE_S)
    # The race happened: T2 streamed first, without a last commit, written before the snapshot.
    events = source_fields(pipeline.kafka, f"{pipeline.mapping.topic_prefix}.shop.customers")
    snapshot_point = events[0]["lsn"]
    t2_events = [e for e in events if e["op"] != "r"]
    assert [e["row_id"] for e in t2_events] == [row["ada"], row["alan"]]
    assert all(e["sequence"][0] is None and e["lsn"] < snapshot_point for e in t2_events)


def test_transaction_open_across_an_incremental_snapshot_chunk_wins(pipeline: Pipeline) -> None:
    url = pipeline.connections.require("pg_url")
    row = row_ids(url)
    pipeline.ensure_running()
    pipeline.job.wait_converged(timeout_seconds=FIRST_CONVERGENCE_S)

    config = pipeline.capture.properties
    topic = notification_topic(config)
    assert topic is not None
    kafka = consumer_config(
        pipeline.connections.require("kafka_bootstrap"),
        pipeline.connections.kafka_flavor,
        group_id=f"t-{uuid.uuid4()}",
    )
    start = end_offsets(kafka, topic)
    with psycopg.connect(url) as held, psycopg.connect(url, autocommit=True) as signal:
        held.execute("UPDATE shop.customers SET tier = 'held' WHERE id = %s", (row["ada"],))
        held.execute("DELETE FROM shop.customers WHERE id = %s", (row["grace"],))
        held.execute("UPDATE shop.products SET name = 'held keyboard' WHERE sku = 'KB-01'")
        signal_id = request_snapshot(signal, config, ["shop.customers", "shop.products"])
        seen = []
        for notification in follow(kafka, topic, start, signal_id, timeout=120):
            seen.append(notification.type)
            if notification.type in ("COMPLETED", "ABORTED"):
                break
        assert seen and seen[-1] == "COMPLETED", f"incremental snapshot: {seen}"
        held.commit()
    pipeline.job.wait_converged(timeout_seconds=120)


def test_a_first_transaction_sent_again_does_not_jump_the_queue(pipeline: Pipeline) -> None:
    url = pipeline.connections.require("pg_url")
    row = row_ids(url)
    pipeline.ensure_running()
    pipeline.job.wait_converged(timeout_seconds=FIRST_CONVERGENCE_S)
    pipeline.capture.stop()
    prefix = pipeline.mapping.topic_prefix
    topic = f"{prefix}.shop.customers"
    settings = pipeline.capture_overrides | {
        "slot.name": f"{prefix}_again",
        "slot.drop.on.stop": "false",
        "lsn.flush.mode": "manual",  # the slot stays where the snapshot left it
    }
    state = pipeline.root / "capture-again"

    def recreated() -> CaptureEngine:
        return CaptureEngine.from_file(CONNECTOR, pipeline.connections, state, settings)

    before = len(source_fields(pipeline.kafka, topic))
    capture = pipeline.capture = recreated()
    offsets = Path(capture.properties["offset.storage.file.filename"])
    capture.start()
    capture.wait_ready(timeout_seconds=120)
    time.sleep(1.0)  # the snapshot's offsets flushed
    shutil.copy(offsets, state / "after-snapshot.offsets")
    with psycopg.connect(url, autocommit=True) as auto:
        for tier, who in (("A", "ada"), ("B", "ada"), ("C", "edsger")):  # T1, T2, T3
            auto.execute("UPDATE shop.customers SET tier = %s WHERE id = %s", (tier, row[who]))
    snapshot_rows = len(row)
    wait_for_records(pipeline, topic, before + snapshot_rows + 3)
    pipeline.job.wait_converged(timeout_seconds=120)
    capture.stop()
    shutil.copy(state / "after-snapshot.offsets", offsets)
    capture = pipeline.capture = recreated()
    capture.start()
    events = wait_for_records(pipeline, topic, before + snapshot_rows + 6)
    t1, t1_again = events[before + snapshot_rows], events[before + snapshot_rows + 3]
    assert t1["row_id"] == t1_again["row_id"] == row["ada"]
    assert t1_again["sequence"] == t1["sequence"] == [None, t1["lsn"]], "T1 sent again"
    wait_processed(pipeline, topic)  # the sinks already held B: the copies must be read first
    pipeline.job.wait_converged(timeout_seconds=120)  # ada is B: T2 wins over the copy of T1


def wait_for_records(pipeline: Pipeline, topic: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 120
    while len(events := source_fields(pipeline.kafka, topic)) < count:
        assert time.monotonic() < deadline, f"{len(events)} of {count} records in {topic}"
        time.sleep(0.2)
    return events


def wait_processed(pipeline: Pipeline, topic: str) -> None:
    """Until every consumer of the topic committed a batch that read it to its end."""
    config = consumer_config(pipeline.kafka.bootstrap, pipeline.kafka.flavor, group_id="end")
    ends = end_offsets(config, topic)
    root = pipeline.job.options("main").checkpoint_dir
    table = TableId(*topic.split(".")[-2:])
    readers = [c for c in plan_consumers(pipeline.mapping, root) if table in c.mapping.tables]
    assert readers, f"no consumer reads {topic}"
    deadline = time.monotonic() + 120
    for reader in readers:
        while True:
            processed = processed_offsets(reader.checkpoint_dir)
            if processed is not None and all(
                processed.offsets.get((topic, p), 0) >= end for p, end in ends.items()
            ):
                break
            assert time.monotonic() < deadline, f"{reader.name} did not read {topic} to {ends}"
            time.sleep(0.5)
