"""Postgres helpers for tests: replication slots outlive the connectors that made them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import psycopg


@contextmanager
def private_database(pg_url: str, prefix: str) -> Iterator[str]:
    """A database of its own for one test or pipeline; dropped with the slots left on it."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    try:
        yield urlunsplit(urlsplit(pg_url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            slots = conn.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
            ).fetchall()
        for (slot,) in slots:
            drop_slot(pg_url, slot)
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


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
