"""What real Debezium emits for a partitioned table (issue 27, point 7), observed with the
embedded engine (Debezium 3.6.3, pgoutput, Postgres 15):

- With a publication `WITH (publish_via_partition_root = true)` and the root alone in
  `table.include.list`: the initial snapshot reads the root (rows of every partition, the
  default one included) into the root's topic, `source.table` naming the root; an insert into
  any partition is a create of the root, a partition created while streaming included.
- An update of the partition key (a row moving to another partition) is a delete of the old key
  (with its tombstone) and a create of the new one: the key holds the partition key (a primary
  key on a partitioned table must), so no sink can keep both.
- ATTACH PARTITION emits nothing for the rows the table brings (a later change of one arrives as
  an update of a key no sink holds); after DETACH PARTITION the table's changes are not
  published; TRUNCATE of a single partition and DROP of a partition emit nothing. A TRUNCATE of
  the root is a truncate event on the root's topic. (`cdc-sync init`'s event trigger turns the
  partition changes into the signals below: tests/integration/test_init.py.)
- An incremental snapshot of the root narrowed by a partition's constraint
  (`pg_get_partition_constraintdef`) reads exactly that partition's rows; a blocking snapshot of
  the root marks its rows `first` ... `last`, as an initial one does (the job sweeps at it).
- The publication Debezium creates itself (`publication.autocreate.mode=filtered`) does not
  publish via the root: the snapshot reads the root, but every streamed change of a partition
  is lost (`cdc-sync connectors validate` refuses it, tests/integration/test_connector_checks.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.debezium_capture import RawRecord, TopicReader, captured
from tests.fixtures.services import KafkaEndpoint
from tests.pg import private_database

pytestmark = pytest.mark.integration
ROOT = "pt.events"
SCHEMA = """
CREATE SCHEMA pt;
CREATE TABLE pt.events (id bigint, at date, v text, PRIMARY KEY (id, at)) PARTITION BY RANGE (at);
CREATE TABLE pt.events_2026_01 PARTITION OF pt.events
    FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
CREATE TABLE pt.events_2026_02 PARTITION OF pt.events
    FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
CREATE TABLE pt.events_default PARTITION OF pt.events DEFAULT;
INSERT INTO pt.events VALUES (1, '2026-01-05', 'a'), (2, '2026-02-05', 'b'), (3, '2030-01-01', 'c');
CREATE TABLE pt.sig (id varchar(64) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048));
"""
VIA_ROOT = (
    "CREATE PUBLICATION p FOR TABLE pt.events, pt.sig WITH (publish_via_partition_root = true)"
)
EPOCH_DAYS = {"2026-01-05": 20458, "2026-01-07": 20460, "2026-02-05": 20489, "2026-02-09": 20493,
              "2030-01-01": 21915, "2031-02-09": 22319, "2026-03-03": 20515, "2026-04-03": 20546,
              "2026-04-04": 20547}  # fmt: skip


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    with private_database(pg_url, "partitions") as url:
        run(url, SCHEMA)
        yield url


def run(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement.encode())


def seen(record: RawRecord) -> tuple[Any, ...]:
    """(op, key, source table, snapshot marker); a tombstone is ("tombstone", key)."""
    # A truncate has no key (the embedded publisher keys it by its topic: no payload).
    fields = json.loads(record.key).get("payload") if record.key else None
    key = (fields["id"], fields["at"]) if fields else None
    if record.value is None:
        return ("tombstone", key)
    payload = json.loads(record.value)["payload"]
    return (payload["op"], key, payload["source"]["table"], payload["source"]["snapshot"])


def key(id_: int, day: str) -> tuple[int, int]:
    return (id_, EPOCH_DAYS[day])


def settle(reader: TopicReader, count: int, seconds: float = 4.0) -> list[tuple[Any, ...]]:
    """The `count` records after those read so far, once no more arrive for `seconds`."""
    start = len(reader.records)
    reader.wait_count(start + count)
    with contextlib.suppress(AssertionError):  # nothing more arrived: what we wanted
        reader.wait_count(start + count + 1, timeout=seconds)
    return [seen(r) for r in reader.records[start:]]


def test_a_partitioned_table_through_its_root(
    database: str, kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    run(database, VIA_ROOT)
    overrides = {"publication.name": "p", "publication.autocreate.mode": "disabled",
                 "signal.data.collection": "pt.sig"}  # fmt: skip
    with captured(database, kafka, tmp_path, [ROOT, "pt.sig"], overrides) as prefix:
        reader = TopicReader(kafka, f"{prefix}.{ROOT}")
        try:
            assert settle(reader, 3) == [
                ("r", key(1, "2026-01-05"), "events", "first"),
                ("r", key(2, "2026-02-05"), "events", "true"),
                ("r", key(3, "2030-01-01"), "events", "last"),
            ]
            run(
                database,
                "INSERT INTO pt.events VALUES (4, '2026-01-07', 'd')",
                "UPDATE pt.events SET at = '2026-02-09' WHERE id = 1",  # to another partition
                "UPDATE pt.events SET at = '2031-02-09' WHERE id = 2",  # to the default one
            )
            assert settle(reader, 7) == [
                ("c", key(4, "2026-01-07"), "events", "false"),
                ("d", key(1, "2026-01-05"), "events", "false"),
                ("tombstone", key(1, "2026-01-05")),
                ("c", key(1, "2026-02-09"), "events", "false"),
                ("d", key(2, "2026-02-05"), "events", "false"),
                ("tombstone", key(2, "2026-02-05")),
                ("c", key(2, "2031-02-09"), "events", "false"),
            ]
            run(
                database,
                "CREATE TABLE pt.events_2026_03 PARTITION OF pt.events "
                "FOR VALUES FROM ('2026-03-01') TO ('2026-04-01')",
                "INSERT INTO pt.events VALUES (5, '2026-03-03', 'e')",
                "CREATE TABLE pt.events_2026_04 (LIKE pt.events)",
                "INSERT INTO pt.events_2026_04 VALUES (6, '2026-04-03', 'f'), "
                "(7, '2026-04-04', 'g')",
                "ALTER TABLE pt.events ATTACH PARTITION pt.events_2026_04 "
                "FOR VALUES FROM ('2026-04-01') TO ('2026-05-01')",
                "UPDATE pt.events SET v = 'ff' WHERE id = 6",
                "ALTER TABLE pt.events DETACH PARTITION pt.events_2026_03",
                "UPDATE pt.events_2026_03 SET v = 'detached' WHERE id = 5",
                "TRUNCATE pt.events_2026_01",
                "DROP TABLE pt.events_default",
                "INSERT INTO pt.events VALUES (8, '2026-02-05', 'h')",
            )
            assert settle(reader, 3) == [
                ("c", key(5, "2026-03-03"), "events", "false"),  # a partition made meanwhile
                ("u", key(6, "2026-04-03"), "events", "false"),  # 7: attached, never sent
                ("c", (8, EPOCH_DAYS["2026-02-05"]), "events", "false"),  # nothing in between
            ]

            # Narrowed to the attached partition: its rows, and only those.
            with psycopg.connect(database, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT pg_get_partition_constraintdef('pt.events_2026_04'::regclass)"
                ).fetchone()
                assert row is not None
                narrowed = [{"data-collection": ROOT, "filter": row[0]}]
                data = {"type": "incremental", "data-collections": [ROOT],
                        "additional-conditions": narrowed}  # fmt: skip
                conn.execute(
                    "INSERT INTO pt.sig VALUES ('i', 'execute-snapshot', %s)", (json.dumps(data),)
                )
            assert settle(reader, 2) == [
                ("r", key(6, "2026-04-03"), "events", "incremental"),
                ("r", key(7, "2026-04-04"), "events", "incremental"),
            ]
            blocking = {"type": "blocking", "data-collections": [ROOT]}
            run(
                database,
                f"INSERT INTO pt.sig VALUES ('b', 'execute-snapshot', '{json.dumps(blocking)}')",
            )
            assert [(op, marker) for op, _, _, marker in settle(reader, 4)] == [
                ("r", "first"), ("r", "true"), ("r", "true"), ("r", "last"),
            ]  # fmt: skip
            run(database, "TRUNCATE pt.events")
            [truncate] = settle(reader, 1)
            assert truncate[0] == "t" and truncate[2] == "events"
        finally:
            reader.close()


def test_debeziums_own_publication_loses_a_partitions_changes(
    database: str, kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    with captured(database, kafka, tmp_path, [ROOT]) as prefix:  # autocreate: filtered
        reader = TopicReader(kafka, f"{prefix}.{ROOT}")
        try:
            assert len(settle(reader, 3)) == 3  # the snapshot reads the root
            with psycopg.connect(database) as conn:
                via_root = conn.execute(
                    "SELECT pubviaroot FROM pg_publication WHERE pubname = %s", (prefix,)
                ).fetchone()
            assert via_root == (False,)
            run(database, "INSERT INTO pt.events VALUES (9, '2026-01-05', 'lost')")
            with pytest.raises(AssertionError):
                reader.wait_count(4, timeout=8)
        finally:
            reader.close()
