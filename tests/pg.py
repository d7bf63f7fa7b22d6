"""Postgres helpers for tests: replication slots outlive the connectors that made them."""

from __future__ import annotations

import time

import psycopg


def drop_slot(pg_url: str, slot: str, timeout: float = 30) -> None:
    """End the session still holding the slot (a deleted connector's task), then drop it."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(pg_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            if row is None:
                return
            if row[0] is not None:
                conn.execute("SELECT pg_terminate_backend(%s)", (row[0],))
                time.sleep(0.3)
                continue
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
            return
