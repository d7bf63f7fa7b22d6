"""Embedded capture on real Postgres and broker: Kafka Connect's record shape, snapshot, live
changes with tombstones, and a restart resuming from committed offsets (no re-snapshot, no loss).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from cdc_sync.connectors.engine import CaptureEngine
from cdc_sync.core import settings
from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.core.model import Change, Coordinates, Op, Tombstone
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.decoder import parse_record
from cdc_sync.demo.workload import create_demo_schema
from tests.adversarial.child import PROJECT_ROOT
from tests.fixtures.services import KafkaEndpoint
from tests.pg import private_database

pytestmark = pytest.mark.integration
CONNECTOR = PROJECT_ROOT / "connectors" / "shop.json"

Record = tuple[bytes | None, bytes | None, Coordinates]


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    with private_database(pg_url, "capture") as url:
        create_demo_schema(url)
        yield url


def engine(url: str, kafka: KafkaEndpoint, state: Path, prefix: str) -> CaptureEngine:
    connections = Connections(
        url, kafka.bootstrap, kafka.flavor, None, "opensearch", None, None, None
    )
    overrides = {"topic.prefix": prefix, "slot.name": prefix, "publication.name": prefix}
    return CaptureEngine.from_file(CONNECTOR, connections, state, overrides)


def read_topic(kafka: KafkaEndpoint, topic: str) -> list[Record]:
    consumer = Consumer(
        consumer_config(kafka.bootstrap, kafka.flavor, group_id=f"t-{uuid.uuid4()}")
    )
    try:
        partition = TopicPartition(topic, 0)
        high = consumer.get_watermark_offsets(partition, timeout=10)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        records: list[Record] = []
        while len(records) < high:
            message = consumer.poll(10)
            assert message is not None, f"{topic}: {len(records)} of {high} records read"
            coordinates = Coordinates(topic, message.partition() or 0, message.offset() or 0)
            records.append((message.key(), message.value(), coordinates))
        return records
    finally:
        consumer.close()


def drop_slot(url: str, slot: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE slot_name = %s AND NOT active",
            (slot,),
        )


def test_snapshot_live_changes_and_restart_without_loss_or_resnapshot(
    database: str, kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    prefix = f"cap{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}.shop.customers"
    first = engine(database, kafka, tmp_path, prefix)
    try:
        first.start()
        first.wait_ready(timeout_seconds=120)
        snapshot = [parse_record(*r) for r in read_topic(kafka, topic)]
        assert [c.op for c in snapshot if isinstance(c, Change)] == [Op.READ] * 4
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute(
                "UPDATE shop.customers SET tier = 'platinum' WHERE email = 'ada@example.com'"
            )
            conn.execute("DELETE FROM shop.customers WHERE email = 'alan@example.com'")
        live = _wait_for(kafka, topic, len(snapshot) + 3)  # update, delete, tombstone
    finally:
        first.stop()
    parsed = [parse_record(*r) for r in live[len(snapshot) :]]
    update, delete, tombstone = parsed
    assert isinstance(update, Change) and update.op is Op.UPDATE and update.row is not None
    assert update.row["tier"] == "platinum" and update.version > max(
        c.version for c in snapshot if isinstance(c, Change)
    )
    assert isinstance(delete, Change) and delete.op is Op.DELETE
    assert isinstance(tombstone, Tombstone) and tombstone.key == delete.key

    # A change made while capture is down arrives exactly once after the restart.
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(
            "UPDATE shop.customers SET tier = 'while-down' WHERE email = 'grace@example.com'"
        )
    second = engine(database, kafka, tmp_path, prefix)
    try:
        second.start()
        after = _wait_for(kafka, topic, len(live) + 1)
    finally:
        second.stop()
        drop_slot(database, prefix)
    resumed = [parse_record(*r) for r in after[len(live) :]]
    assert len(resumed) == 1, "a restart must neither re-snapshot nor repeat committed changes"
    change = resumed[0]
    assert isinstance(change, Change) and change.row is not None
    assert change.row["tier"] == "while-down"


def _wait_for(kafka: KafkaEndpoint, topic: str, count: int, timeout: float = 60) -> list[Record]:
    import time

    deadline = time.monotonic() + timeout
    while True:
        records = read_topic(kafka, topic)
        if len(records) >= count or time.monotonic() > deadline:
            time.sleep(1.0)  # anything beyond `count` (a duplicate) would show up now
            return read_topic(kafka, topic)
        time.sleep(0.2)


def test_stale_offsets_are_named_in_one_line_with_the_command_that_starts_over(
    database: str, kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    """Issue 28: after the database was re-created (here: its slot dropped), `cdc-sync capture`
    printed Debezium's 40-line trace ("Last recorded offset is no longer available on the
    server") and exited. Now one line says what is stale and how to start over; --reset does."""
    prefix = f"cap{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}.shop.customers"
    connector = tmp_path / "app.json"
    document = json.loads(CONNECTOR.read_text())
    document["config"] |= {"topic.prefix": prefix, "slot.name": prefix, "publication.name": prefix}
    connector.write_text(json.dumps(document))
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDC_SYNC_")} | {
        settings.PG_URL: database,
        settings.KAFKA_BOOTSTRAP: kafka.bootstrap,
        settings.KAFKA_FLAVOR: kafka.flavor,
        settings.STATE_DIR_VAR: str(state),
        "PYTHONPATH": str(PROJECT_ROOT),
    }
    command = [sys.executable, "-m", "cdc_sync.cli", "capture", "--connector", str(connector)]
    connections = Connections(
        database, kafka.bootstrap, kafka.flavor, None, "opensearch", None, None, None
    )
    first = CaptureEngine.from_file(connector, connections, state / "capture" / "app")
    try:
        first.start()
        first.wait_ready(timeout_seconds=120)
    finally:
        first.stop()
    snapshot = len(read_topic(kafka, topic))
    drop_slot(database, prefix)

    refused = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 2, refused.stderr
    [line] = refused.stderr.strip().splitlines()
    offsets = state / "capture" / "app" / "shop.offsets"  # the connector's name
    assert line.startswith(f"cdc-sync capture: the capture's stored offsets ({offsets}) ")
    assert f"replication slot {prefix} does not exist" in line
    assert line.endswith(
        f"Start over with a new snapshot: {shlex.join(['cdc-sync', *command[3:], '--reset'])}"
    )

    again = subprocess.Popen(
        [*command, "--reset"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        resnapshot = _wait_for(kafka, topic, snapshot * 2, timeout=180)
    finally:
        again.send_signal(signal.SIGINT)
        output = again.communicate(timeout=120)[0]
        drop_slot(database, prefix)
    assert again.returncode == 0, output
    assert "capture offsets removed: a new snapshot follows" in output
    reread = [parse_record(*r) for r in resnapshot[snapshot:]]
    assert [c.op for c in reread if isinstance(c, Change)] == [Op.READ] * snapshot


def test_offsets_cut_short_by_a_kill_during_their_save_resume_from_the_last_complete_copy(
    database: str, kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    """CI, kill -9 of the capture: Kafka's file store rewrites the offsets file in place, the
    kill left it empty, and the restart died reading it (EOFException). Now the start resumes
    from the copy kept beside it: no new snapshot, the change made while down arrives once. A
    file cut short with no complete copy is removed, and a new snapshot follows."""
    prefix = f"cap{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}.shop.customers"
    first = engine(database, kafka, tmp_path, prefix)
    try:
        first.start()
        first.wait_ready(timeout_seconds=120)
    finally:
        first.stop()
    snapshot = read_topic(kafka, topic)
    offsets = first.offsets_file
    assert offsets is not None
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(
            "UPDATE shop.customers SET tier = 'while-down' WHERE email = 'ada@example.com'"
        )
    offsets.write_bytes(b"")  # the save opened (truncated) the file; the kill came before it wrote

    copy = offsets.with_name(offsets.name + ".last-complete")
    kept_at_stop = copy.read_bytes()
    second = engine(database, kafka, tmp_path, prefix)
    try:
        second.start()
        _wait_for(kafka, topic, len(snapshot) + 1)
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute("UPDATE shop.customers SET tier = 'live' WHERE email = 'ada@example.com'")
        resumed = _wait_for(kafka, topic, len(snapshot) + 2)
        # The second change's batch copied the offsets saved after the first: a kill now would
        # resume from there, not from the last stop.
        assert copy.read_bytes() != kept_at_stop
    finally:
        second.stop()
    changes = [parse_record(*r) for r in resumed[len(snapshot) :]]
    assert len(changes) == 2, "resumed from the copy: no new snapshot, nothing repeated"
    tiers = [c.row["tier"] for c in changes if isinstance(c, Change) and c.row is not None]
    assert tiers == ["while-down", "live"]

    complete = offsets.read_bytes()
    offsets.write_bytes(complete[: len(complete) // 2])  # cut short mid-write, and no copy
    copy.unlink()
    third = engine(database, kafka, tmp_path, prefix)
    try:
        third.start()
        again = _wait_for(kafka, topic, len(resumed) + len(snapshot))
    finally:
        third.stop()
        drop_slot(database, prefix)
    reread = [parse_record(*r) for r in again[len(resumed) :]]
    assert [c.op for c in reread if isinstance(c, Change)] == [Op.READ] * len(snapshot)
