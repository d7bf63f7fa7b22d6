"""What real Debezium puts in `source.sequence`: the facts `commit_order_version` relies on.

Observed with the embedded engine (Debezium 3.6.3, pgoutput, Postgres 15) on the demo schema:

- snapshot rows: `sequence` is `[null, S]` with `lsn` = S (the slot's consistent point);
- the first transaction streamed after the initial snapshot: `sequence[0]` is null, so its
  changes carry only their own `lsn` (the decoder's fallback);
- every later transaction: `sequence[0]` is the same for all of its changes and strictly greater
  from one transaction to the next in commit order, whatever the order of first writes; it is
  the end of the previous transaction's commit record, so it can equal the `lsn` of a change
  written right after that commit;
- changes of one transaction arrive in Kafka in their write order (their `lsn` grows);
- after a restart from stored offsets `sequence[0]` is NOT null: the first transaction streamed
  (here one that wrote before capture stopped and committed after it restarted) carries the
  last commit end stored in the offsets (`lsn_commit`), past every change streamed before the
  stop. Only the first transaction after a snapshot lacks it.
- restarted from the offsets stored at the end of the snapshot (a worker killed before its
  first offset flush after it; the slot was not advanced either), capture sends the
  transactions after the snapshot again, the first one byte for byte as before: `[null, lsn]`,
  the same `lsn` and `txId`, after the later transactions' first copies.
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
from cdc_sync.core.settings import Connections
from cdc_sync.demo.workload import create_demo_schema
from tests.debezium_events import source_fields
from tests.fixtures.services import KafkaEndpoint
from tests.pg import private_database

pytestmark = pytest.mark.integration
CONNECTOR = Path("connectors/shop.json")
TABLE = "shop.customers"


@pytest.fixture
def database(pg_url: str) -> Iterator[str]:
    with private_database(pg_url, "ordering") as url:
        create_demo_schema(url)
        yield url


def capture(
    url: str,
    kafka: KafkaEndpoint,
    state: Path,
    prefix: str,
    settings: dict[str, str] | None = None,
) -> CaptureEngine:
    connections = Connections(
        url, kafka.bootstrap, kafka.flavor, None, "opensearch", None, None, None
    )
    overrides = {"topic.prefix": prefix, "slot.name": prefix, "publication.name": prefix}
    overrides |= settings or {}
    # No heartbeats: their action query is a transaction of its own, which would take the place
    # of the transactions this test observes (the first one after the snapshot, above all).
    overrides["heartbeat.interval.ms"] = "0"
    return CaptureEngine.from_file(CONNECTOR, connections, state, overrides)


def wait_for_events(
    kafka: KafkaEndpoint, topic: str, count: int, timeout: float = 60
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        events = source_fields(kafka, topic)
        if len(events) >= count:
            return events
        assert time.monotonic() < deadline, f"{len(events)} of {count} events in {topic}"
        time.sleep(0.2)


def ids(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute("SELECT email, id FROM shop.customers").fetchall()
    return {email.split("@")[0]: id_ for email, id_ in rows}


def update(conn: psycopg.Connection[Any], row_id: int, tier: str) -> None:
    conn.execute("UPDATE shop.customers SET tier = %s WHERE id = %s", (tier, row_id))


def test_sequence_orders_transactions_by_commit_and_keeps_one_value_per_transaction(
    database: str, kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    prefix = f"ord{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}.{TABLE}"
    with psycopg.connect(database, autocommit=True) as setup:
        row = ids(setup)
    engine = capture(database, kafka, tmp_path, prefix)
    a = psycopg.connect(database)
    b = psycopg.connect(database)
    c = psycopg.connect(database)
    held = psycopg.connect(database)
    try:
        engine.start()
        engine.wait_ready(timeout_seconds=120)
        snapshot = source_fields(kafka, topic)
        assert [e["op"] for e in snapshot] == ["r"] * 4
        snapshot_point = snapshot[0]["lsn"]
        assert all(e["sequence"] == [None, snapshot_point] for e in snapshot)

        with psycopg.connect(database, autocommit=True) as auto:
            update(auto, row["edsger"], "first")  # T0: the first transaction after the snapshot
        # T4 writes now, before everything below, and commits only after capture restarted.
        update(held, row["edsger"], "t4")
        # T1 writes first and commits last; T2 writes second and commits first.
        update(a, row["ada"], "t1")
        update(b, row["alan"], "t2")
        b.commit()
        update(a, row["grace"], "t1")
        a.commit()
        # T3: one transaction, three rows.
        c.execute("UPDATE shop.customers SET tier = 't3' WHERE id <> %s", (row["edsger"],))
        c.commit()
        streamed = wait_for_events(kafka, topic, 4 + 1 + 2 + 3)[4:]
    finally:
        engine.stop()
    t0, t2, t1a, t1b, *t3 = streamed
    assert t0["sequence"][0] is None, "the first transaction after the snapshot"
    assert t0["sequence"][1] == t0["lsn"] > snapshot_point
    assert (t2["row_id"], t1a["row_id"], t1b["row_id"]) == (row["alan"], row["ada"], row["grace"])
    assert t1a["lsn"] < t2["lsn"] < t1b["lsn"], "T1 wrote first, T2 committed first"
    assert t1a["sequence"][0] == t1b["sequence"][0], "one value for all changes of T1"
    assert len({e["sequence"][0] for e in t3}) == 1, "one value for all changes of T3"
    in_commit_order = [t2, t1a, t3[0]]
    firsts = [e["sequence"][0] for e in in_commit_order]
    assert firsts == sorted(set(firsts)), f"strictly increasing in commit order: {firsts}"
    assert t2["sequence"][0] > t0["lsn"]
    assert [e["lsn"] for e in t3] == sorted(e["lsn"] for e in t3), "Kafka order = write order"

    restarted = capture(database, kafka, tmp_path, prefix)
    try:
        restarted.start()
        time.sleep(2.0)
        held.commit()
        with psycopg.connect(database, autocommit=True) as auto:
            update(auto, row["ada"], "t5")
        after = wait_for_events(kafka, topic, len(snapshot) + len(streamed) + 2)
    finally:
        restarted.stop()
        for conn in (a, b, c, held):
            conn.close()
    t4, t5 = after[len(snapshot) + len(streamed) :]
    assert t4["row_id"] == row["edsger"] and t4["lsn"] < t1a["lsn"], "T4 wrote before T1..T3"
    # Restored from the stored offsets (`lsn_commit`): T3's commit end, past T3's last change.
    assert t4["sequence"][0] is not None and t4["sequence"][0] > t3[-1]["lsn"]
    assert t4["sequence"][1] == t4["lsn"]
    assert t5["sequence"][0] > t4["sequence"][0]


# The slot keeps its position until the restart, as when the worker dies before its first flush.
UNFLUSHED = {"lsn.flush.mode": "manual"}


def test_a_restart_from_the_snapshots_offsets_sends_the_first_transaction_again(
    database: str, kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    prefix = f"ord{uuid.uuid4().hex[:6]}"
    topic = f"{prefix}.{TABLE}"
    with psycopg.connect(database, autocommit=True) as setup:
        row = ids(setup)
    engine = capture(database, kafka, tmp_path, prefix, UNFLUSHED)
    offsets = Path(engine.properties["offset.storage.file.filename"])
    try:
        engine.start()
        engine.wait_ready(timeout_seconds=120)
        time.sleep(1.0)  # the snapshot's offsets flushed
        shutil.copy(offsets, tmp_path / "after-snapshot.offsets")
        with psycopg.connect(database, autocommit=True) as auto:
            update(auto, row["ada"], "A")  # T1
            update(auto, row["ada"], "B")  # T2
            update(auto, row["grace"], "C")  # T3
        first = wait_for_events(kafka, topic, 4 + 3)
    finally:
        engine.stop()
    shutil.copy(tmp_path / "after-snapshot.offsets", offsets)
    restarted = capture(database, kafka, tmp_path, prefix, UNFLUSHED)
    try:
        restarted.start()
        events = wait_for_events(kafka, topic, 4 + 3 + 3)
    finally:
        restarted.stop()
    snapshot_point = first[0]["lsn"]
    t1, t2, t3 = first[4:]
    again = events[7:]
    assert t1["sequence"] == [None, t1["lsn"]] and t1["lsn"] > snapshot_point
    assert t2["sequence"][0] is not None and t3["sequence"][0] > t2["sequence"][0]
    fields = ("op", "row_id", "lsn", "txId", "sequence")
    assert [{f: e[f] for f in fields} for e in again] == [
        {f: e[f] for f in fields} for e in (t1, t2, t3)
    ], "the same three transactions, the first again without a last commit"
