"""Read your writes: commit, take `pg_current_wal_lsn()`, wait for it, and the write is in every
sink; idle tables still let the wait return (heartbeats); a stopped job makes it time out."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import psycopg
import pytest
import redis

from cdc_sync.cli import main
from cdc_sync.core import settings
from cdc_sync.core.model import TableId
from cdc_sync.sinks.search.backends import open_backend
from cdc_sync.verify.compare import cache_rows, delta_rows, search_rows
from cdc_sync.verify.wait import wait_for_lsn
from tests.e2e.harness import MAPPING, SyncHarness

pytestmark = pytest.mark.e2e

CUSTOMERS = TableId("shop", "customers")


def commit_and_position(pipeline: SyncHarness, sql: str | None) -> tuple[str, str | None]:
    """Run `sql` (an INSERT ... RETURNING id) in its own transaction, then read the WAL
    position after its commit, as an application would."""
    with psycopg.connect(pipeline.connections.require("pg_url"), autocommit=True) as conn:
        row = conn.execute(sql.encode()).fetchone() if sql else None
        lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert lsn is not None
    return str(lsn[0]), None if row is None else str(row[0])


def new_customer(pipeline: SyncHarness) -> tuple[str, str]:
    email = f"ryw-{uuid.uuid4().hex[:8]}@example.com"
    lsn, ident = commit_and_position(
        pipeline,
        f"INSERT INTO shop.customers (email, full_name) VALUES ('{email}', 'Read Back') "
        "RETURNING id",
    )
    assert ident is not None
    return lsn, ident


def test_after_waiting_for_its_lsn_a_write_is_in_every_sink(pipeline: SyncHarness) -> None:
    lsn, ident = new_customer(pipeline)
    result = wait_for_lsn(lsn, pipeline.connections, mapping=pipeline.mapping, timeout_seconds=240)
    assert result.reached, result.report()
    assert {s.sink for s in result.sinks} == {"search", "cache", "delta"}
    # No polling from here: the promise is that the write is there now.
    connections = pipeline.connections
    route = pipeline.mapping.tables[CUSTOMERS]
    search = open_backend(connections.search_client, connections.require("search_url"))
    cache = redis.Redis.from_url(connections.require("redis_url"))
    try:
        held = {
            "search": search_rows(search, route),
            "cache": cache_rows(cache, route),
            "delta": delta_rows(Path(connections.require("warehouse")), route, ["id"]),
        }
    finally:
        search.close()
        cache.close()
    missing = [
        sink for sink, rows in held.items() if rows.get(ident, {}).get("full_name") != "Read Back"
    ]
    assert not missing, f"customer {ident} not in {missing} after {result.report()}"


def test_an_idle_database_still_lets_the_wait_return(pipeline: SyncHarness) -> None:
    """No further writes: only the connector's heartbeats move the watermarks past the
    position, and the heartbeat table itself reaches no sink."""
    lsn, _ = commit_and_position(pipeline, None)
    result = wait_for_lsn(lsn, pipeline.connections, mapping=pipeline.mapping, timeout_seconds=120)
    assert result.reached, result.report()
    print(f"idle wait: {result.seconds:.2f}s")
    cache = redis.Redis.from_url(pipeline.connections.require("redis_url"))
    try:
        assert not list(cache.scan_iter(match="*cdc_sync_heartbeat:*"))
    finally:
        cache.close()
    assert not (
        Path(pipeline.connections.require("warehouse")) / "shop" / "cdc_sync_heartbeat"
    ).exists()


def test_wait_times_out_with_exit_1_while_the_job_is_stopped(
    pipeline: SyncHarness,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env_file = write_env_file(pipeline, tmp_path, monkeypatch)
    mapping_file = tmp_path / "shop.yaml"
    # The mapping's connector (where wait checks CDC_SYNC_PG_URL points) stays the shop's.
    connector = f"connector: {pipeline.mapping.connector}"
    mapping_file.write_text(
        MAPPING.read_text()
        .replace("topic_prefix: cdc", f"topic_prefix: {pipeline.mapping.topic_prefix}")
        .replace("connector: ../connectors/shop.json", connector)
    )
    pipeline.stop()
    lsn, _ = new_customer(pipeline)
    argv = ["--env-file", str(env_file), "wait", "--lsn", lsn, "--mapping", str(mapping_file)]
    try:
        started = time.monotonic()
        assert main([*argv, "--sink", "cache,delta", "--timeout", "3"]) == 1
        assert time.monotonic() - started < 20
        out = capsys.readouterr().out
        assert out.startswith(f"timed out waiting for {lsn}")
        assert "cache: behind" in out and "delta: behind" in out and "search" not in out
    finally:
        pipeline.start()
    # The restarted job catches up, and the same command then succeeds.
    assert main([*argv, "--timeout", "240"]) == 0
    assert capsys.readouterr().out.startswith(f"reached {lsn}")


def write_env_file(pipeline: SyncHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The pipeline's connections as the env file a command reads (the process environment
    would win over it, so its CDC_SYNC_* connection variables are cleared)."""
    connections = pipeline.connections
    values = {
        settings.PG_URL: connections.require("pg_url"),
        settings.KAFKA_BOOTSTRAP: connections.require("kafka_bootstrap"),
        settings.KAFKA_FLAVOR: connections.kafka_flavor,
        settings.SEARCH_URL: connections.require("search_url"),
        settings.SEARCH_CLIENT: connections.search_client,
        settings.REDIS_URL: connections.require("redis_url"),
        settings.WAREHOUSE: connections.require("warehouse"),
    }
    for name in [*values, settings.CONNECT_URL]:
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "stack.env"
    settings.write_env_file(path, values)
    return path
