"""Capture side of the status: the connector's and its tasks' states, the replication slot."""

from __future__ import annotations

from typing import Any

import psycopg

from cdc_sync.connectors.checks import DEFAULT_NAMES
from cdc_sync.connectors.rest import ConnectClient, ConnectError
from cdc_sync.debezium.slots import list_slots
from cdc_sync.status.model import CaptureStatus, SlotStatus, TaskState

REST_TIMEOUT_SECONDS = 10.0


def connect_status(connect_url: str, name: str) -> CaptureStatus:
    """The connector as the Kafka Connect worker reports it."""
    try:
        status = ConnectClient(connect_url, timeout=REST_TIMEOUT_SECONDS).status(name)
    except ConnectError as error:
        if error.status == 404:
            return CaptureStatus("kafka-connect", name, "NOT REGISTERED")
        raise
    tasks = tuple(
        TaskState(int(t["id"]), str(t["state"]), _first_line(t.get("trace")))
        for t in status.get("tasks", [])
    )
    return CaptureStatus("kafka-connect", name, str(status["connector"]["state"]), tasks)


def slot_status(conninfo: str, config: dict[str, str]) -> SlotStatus:
    """The connector's replication slot and max_slot_wal_keep_size, on its database's server."""
    name = config.get("slot.name", DEFAULT_NAMES["slot.name"])
    with psycopg.connect(conninfo, connect_timeout=10) as conn:
        slot = next((s for s in list_slots(conn) if s.name == name), None)
        keep = _keep_bytes(conn)
    if slot is None:
        return SlotStatus(name, exists=False, keep_bytes=keep)
    return SlotStatus(
        name, True, slot.active, slot.wal_status, slot.retained_bytes, slot.lag_bytes, keep
    )


def _keep_bytes(conn: psycopg.Connection[Any]) -> int | None:
    row = conn.execute(
        "SELECT setting::bigint FROM pg_settings WHERE name = 'max_slot_wal_keep_size'"
    ).fetchone()
    if row is None or row[0] < 0:
        return None  # unlimited (or a server without the setting)
    return int(row[0]) * 1024 * 1024  # the setting is in MB


def _first_line(trace: Any) -> str | None:
    return str(trace).strip().splitlines()[0] if trace else None
