"""What real Debezium emits for TRUNCATE once truncate events are on (`skipped.operations=none`).

Observed with the embedded engine (Debezium 3.6.3, pgoutput, Postgres 15):

- `TRUNCATE t` is one record on t's own topic (`<prefix>.<schema>.<table>`): key null, value
  an envelope with `op` "t", `before` and `after` null, `source.schema` / `source.table` naming
  the table, and no tombstone after it;
- its `source.sequence` is `[last commit, lsn]` like any streamed change: `sequence[0]` is the
  commit end of the transaction streamed before it (greater than the version of every change
  before it, lower than that of every later transaction) and `sequence[1]` its own `lsn`;
- `TRUNCATE a, b` is one such record per table, each on its table's topic, with the same `txId`,
  `sequence` and `lsn`.

A keyless record cannot go to a compacted topic on Apache Kafka (the broker refuses it); the
local stand-in brokers accept it (docs/known-limits.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cdc_sync.connectors.publisher import Record, record_key
from cdc_sync.core.model import TableId, Truncate
from cdc_sync.debezium.decoder import parse_record
from tests.debezium_capture import RawRecord, TopicReader, captured
from tests.fixtures.services import KafkaEndpoint
from tests.pg import private_database

pytestmark = pytest.mark.integration
TABLES = ["tr.t", "tr.a", "tr.b"]


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    with private_database(pg_url, "truncate") as url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA tr")
            for table in TABLES:
                conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
                conn.execute(f"INSERT INTO {table} VALUES (1, 'x'), (2, 'y')")
        yield url


def keyless_key(topic: str) -> bytes | None:
    """What the publisher keys a keyless event with (Debezium's own key is null)."""
    return record_key(Record(topic, None, b"{}"))


def payload(record: RawRecord) -> dict[str, Any]:
    assert record.value is not None
    document = json.loads(record.value)["payload"]
    assert isinstance(document, dict)
    return document


def sequence(record: RawRecord) -> list[int | None]:
    positions = json.loads(payload(record)["source"]["sequence"])
    return [None if p is None else int(p) for p in positions]


def version(record: RawRecord) -> int:
    """The commit-order position as the decoder reads it (last commit, else own lsn)."""
    first, own = sequence(record)
    return first if first is not None else int(own or 0)


def test_truncate_events_as_debezium_emits_them(
    database: str, kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    with captured(database, kafka, tmp_path, TABLES, {"skipped.operations": "none"}) as prefix:
        readers = {table: TopicReader(kafka, f"{prefix}.{table}") for table in TABLES}
        try:
            for reader in readers.values():
                reader.wait_count(2)  # the snapshot
            with psycopg.connect(database, autocommit=True) as conn:
                conn.execute("INSERT INTO tr.t VALUES (3, 'z')")
                conn.execute("TRUNCATE tr.t")
                conn.execute("INSERT INTO tr.t VALUES (4, 'w')")
                conn.execute("TRUNCATE tr.a, tr.b")
                conn.execute("INSERT INTO tr.a VALUES (5, 'q')")
            t = readers["tr.t"].wait_count(5)
            a = readers["tr.a"].wait_count(4)
            b = readers["tr.b"].wait_count(3)
        finally:
            for reader in readers.values():
                reader.close()

    # TRUNCATE t: between the two inserts, no before/after, no tombstone after it. Debezium
    # emits it keyless; the publisher keys it by its topic (a compacted topic refuses keyless).
    inserted, truncate, reinserted = t[2:5]
    assert [payload(r)["op"] for r in t] == ["r", "r", "c", "t", "c"]
    assert truncate.key == keyless_key(f"{prefix}.tr.t")
    body = payload(truncate)
    assert body["before"] is None and body["after"] is None
    source = body["source"]
    assert (source["schema"], source["table"], source["snapshot"]) == ("tr", "t", "false")
    assert truncate.coordinates.topic == f"{prefix}.tr.t"
    last_commit, own = sequence(truncate)
    assert last_commit is not None and own == source["lsn"]
    assert version(inserted) < version(truncate) < version(reinserted)
    assert all(r.key is not None and r.value is not None for r in (inserted, reinserted))
    # Decoded: the table's Truncate, versioned as any streamed change, not a malformed record.
    decoded = parse_record(truncate.key, truncate.value, truncate.coordinates)
    assert decoded == Truncate(
        TableId("tr", "t"), last_commit, truncate.coordinates, own, source["ts_ms"]
    )

    # TRUNCATE a, b: one event per table, on each table's topic, of one transaction.
    [truncate_a] = [r for r in a if payload(r)["op"] == "t"]
    [truncate_b] = [r for r in b if payload(r)["op"] == "t"]
    assert [payload(r)["op"] for r in a] == ["r", "r", "t", "c"]
    assert [payload(r)["op"] for r in b] == ["r", "r", "t"]
    assert truncate_a.key == keyless_key(f"{prefix}.tr.a")
    assert truncate_b.key == keyless_key(f"{prefix}.tr.b")
    source_a, source_b = payload(truncate_a)["source"], payload(truncate_b)["source"]
    assert (source_a["table"], source_b["table"]) == ("a", "b")
    for field in ("txId", "sequence", "lsn"):
        assert source_a[field] == source_b[field]
    assert version(reinserted) < version(truncate_a) < version(a[3])
