"""The replication-slot query the job's metrics and `connectors slots` share, on real Postgres."""

from __future__ import annotations

import psycopg
import pytest

from cdc_sync.connectors.slots import format_slots
from cdc_sync.debezium.slots import list_slots
from cdc_sync.job.observe.capture_probes import SourceSlots
from tests.pg import private_database

pytestmark = pytest.mark.integration


def test_slots_of_the_source_database_with_retained_wal(pg_url: str) -> None:
    with private_database(pg_url, "slots") as mine, private_database(pg_url, "other") as other:
        with psycopg.connect(mine, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot('metrics_slot', 'pgoutput')")
            conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
            conn.execute("INSERT INTO t SELECT generate_series(1, 1000)")
            (database,) = [s for s in list_slots(conn) if s.name == "metrics_slot"]
            assert database.database == conn.info.dbname and database.plugin == "pgoutput"
        (slot,) = SourceSlots(mine)()  # the job's read: its own database's slots only
        assert (slot.name, slot.active) == ("metrics_slot", False)
        assert slot.retained_bytes and slot.lag_bytes and slot.retained_bytes >= slot.lag_bytes > 0
        assert SourceSlots(other)() == []
        assert "metrics_slot" in format_slots([slot])
