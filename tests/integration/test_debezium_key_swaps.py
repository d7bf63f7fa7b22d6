"""What real Debezium emits for key swaps on a DEFERRABLE primary key (issue 17 item 5).

Observed with the embedded engine (Debezium 3.6.3, pgoutput, Postgres 15):

- a deferrable primary key cannot be the replica identity: under REPLICA IDENTITY DEFAULT a
  published table has none, and Postgres refuses its updates (so `connectors validate` requires
  FULL for such a table);
- under FULL, `UPDATE t SET id = 3 - id` (rows 1 and 2) reaches Kafka as d(1) ts(1) c(2) d(2)
  ts(2) c(1), in one transaction (one `txId`, one `sequence[0]`), each delete with the full
  `before` image of the row that held the key before the transaction;
- a chain in one transaction (the row at 5 moved to 6, then back to 5) reads d(5) c(6) d(6)
  c(5): by key and op the same as a swap of 5 and 6. Their `before` images differ only when
  the swapped rows differ: swapping two rows whose other columns are equal emits exactly the
  chain's events (ops, keys, before and after images), yet Postgres then holds key 6 and after
  the chain it does not. No rule over the events alone can tell them apart; reading Postgres
  by key can (what `job/decode/fold.py` does when both sit in one batch).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from cdc_sync.connectors.engine import CaptureEngine
from cdc_sync.core.kafka_clients import consumer_config
from cdc_sync.core.settings import Connections
from tests.fixtures.services import KafkaEndpoint
from tests.pg import private_database

pytestmark = pytest.mark.integration
CONNECTOR = Path("connectors/shop.json")
TABLE = "shop.pairs"


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    with private_database(pg_url, "swaps") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA shop")
            conn.execute(
                "CREATE TABLE shop.pairs (id int PRIMARY KEY DEFERRABLE INITIALLY DEFERRED, "
                "v text NOT NULL)"
            )
        yield url


def events(kafka: KafkaEndpoint, topic: str) -> list[dict[str, Any]]:
    """Every record in Kafka order: key id, op ('ts' for a tombstone), before/after, source."""
    consumer = Consumer(consumer_config(kafka.bootstrap, kafka.flavor, f"t-{uuid.uuid4()}"))
    try:
        high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        found: list[dict[str, Any]] = []
        while len(found) < high:
            message = consumer.poll(10)
            assert message is not None, f"{topic}: {len(found)} of {high} records read"
            raw_key, value = message.key(), message.value()
            assert raw_key is not None
            key = json.loads(raw_key)["payload"]["id"]
            if value is None:
                found.append({"key": key, "op": "ts"})
                continue
            payload = json.loads(value)["payload"]
            source = payload["source"]
            found.append(
                {
                    "key": key,
                    "op": payload["op"],
                    "before": payload["before"],
                    "after": payload["after"],
                    "txId": source["txId"],
                    "commit": json.loads(source["sequence"])[0],
                }
            )
        return found
    finally:
        consumer.close()


def wait_for(kafka: KafkaEndpoint, topic: str, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 60
    while len(found := events(kafka, topic)) < count:
        assert time.monotonic() < deadline, f"{len(found)} of {count} records in {topic}"
        time.sleep(0.2)
    return found


def shape(found: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(e["op"], e["key"]) for e in found]


def test_a_published_table_with_a_deferrable_key_needs_replica_identity_full(
    database: str,
) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("INSERT INTO shop.pairs VALUES (1, 'a')")
        conn.execute("CREATE PUBLICATION swaps_probe FOR TABLE shop.pairs")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="replica identity"):
            conn.execute("UPDATE shop.pairs SET v = 'b'")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="non-immediate"):
            conn.execute("ALTER TABLE shop.pairs REPLICA IDENTITY USING INDEX pairs_pkey")
        conn.execute("ALTER TABLE shop.pairs REPLICA IDENTITY FULL")
        conn.execute("UPDATE shop.pairs SET v = 'b'")


def test_a_swap_and_a_chain_of_equal_rows_emit_the_same_events(
    database: str, kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    prefix = f"swp{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}.{TABLE}"
    connections = Connections(
        database, kafka.bootstrap, kafka.flavor, None, "opensearch", None, None, None
    )
    overrides = {
        "topic.prefix": prefix,
        "slot.name": prefix,
        "publication.name": prefix,
        "table.include.list": TABLE,
        "heartbeat.interval.ms": "0",  # no heartbeat transactions between the observed ones
    }
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("ALTER TABLE shop.pairs REPLICA IDENTITY FULL")
        conn.execute("INSERT INTO shop.pairs VALUES (1, 'a'), (2, 'b'), (5, 'same')")
    engine = CaptureEngine.from_file(CONNECTOR, connections, tmp_path, overrides)
    try:
        engine.start()
        engine.wait_ready(timeout_seconds=120)
        with psycopg.connect(database, autocommit=True) as conn:
            conn.execute("UPDATE shop.pairs SET id = 3 - id WHERE id IN (1, 2)")  # the swap
            with conn.transaction():  # the chain: 5 -> 6 -> 5
                conn.execute("UPDATE shop.pairs SET id = 6 WHERE id = 5")
                conn.execute("UPDATE shop.pairs SET id = 5 WHERE id = 6")
            conn.execute("INSERT INTO shop.pairs VALUES (6, 'same')")
            conn.execute("UPDATE shop.pairs SET id = 11 - id WHERE id IN (5, 6)")  # equal rows
            held = sorted(conn.execute("SELECT id, v FROM shop.pairs").fetchall())
        found = wait_for(kafka, topic, 3 + 6 + 6 + 1 + 6)
    finally:
        engine.stop()
    assert held == [(1, "b"), (2, "a"), (5, "same"), (6, "same")]
    snapshot, swap, chain = found[:3], found[3:9], found[9:15]
    insert, equal_swap = found[15], found[16:22]
    assert shape(snapshot) == [("r", 1), ("r", 2), ("r", 5)]
    assert shape(swap) == [("d", 1), ("ts", 1), ("c", 2), ("d", 2), ("ts", 2), ("c", 1)]
    changes = [e for e in swap if e["op"] != "ts"]
    assert len({(e["txId"], e["commit"]) for e in changes}) == 1  # one transaction
    # Full `before` images: each delete carries the row that held its key before the swap.
    assert [(e["before"], e["after"]) for e in changes] == [
        ({"id": 1, "v": "a"}, None),
        (None, {"id": 2, "v": "a"}),
        ({"id": 2, "v": "b"}, None),
        (None, {"id": 1, "v": "b"}),
    ]
    assert shape(chain) == [("d", 5), ("ts", 5), ("c", 6), ("d", 6), ("ts", 6), ("c", 5)]
    assert insert["op"] == "c" and insert["key"] == 6

    def images(part: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(e["key"], e["op"], e.get("before"), e.get("after")) for e in part]

    # Key 6 ends deleted after the chain and held after the swap; the events are the same.
    assert images(chain) == images(equal_swap)
