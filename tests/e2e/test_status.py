"""`cdc-sync status` on a running pipeline (healthy, exit 0), then with the job stopped while
changes wait in the topics (stopped, exit 1). Runs the real command in a subprocess against the
pipeline's own mapping, connector settings and checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cdc_sync.debezium.connector import load_connector
from tests.e2e.conftest import CONNECTOR
from tests.e2e.harness import MAPPING, SyncHarness

pytestmark = pytest.mark.e2e
CLI = Path(sys.executable).parent / "cdc-sync"


def _status_files(pipeline: SyncHarness, root: Path, connect_url: str | None) -> list[str]:
    """An env file, a connector file and a mapping file saying what this pipeline runs."""
    prefix = pipeline.mapping.topic_prefix
    connections = pipeline.connections
    env = {
        "CDC_SYNC_PG_URL": connections.require("pg_url"),
        "CDC_SYNC_KAFKA_BOOTSTRAP": connections.require("kafka_bootstrap"),
        "CDC_SYNC_KAFKA_FLAVOR": connections.kafka_flavor,
        "CDC_SYNC_SEARCH_URL": connections.require("search_url"),
        "CDC_SYNC_REDIS_URL": connections.require("redis_url"),
        "CDC_SYNC_WAREHOUSE": connections.require("warehouse"),
    }
    if connect_url:
        env["CDC_SYNC_CONNECT_URL"] = connect_url
    (root / "stack.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    connector = load_connector(CONNECTOR)
    config = dict(connector.config) | {
        "topic.prefix": prefix,
        "slot.name": f"{prefix}_slot",
        "publication.name": f"{prefix}_pub",
    }
    (root / "connector.json").write_text(json.dumps({"name": prefix, "config": config}))
    mapping = MAPPING.read_text().replace("topic_prefix: cdc", f"topic_prefix: {prefix}")
    mapping = mapping.replace("topic: cdc.cdc_sync.dead_letter", f"topic: {prefix}.dead_letter")
    (root / "mapping.yaml").write_text(mapping)
    return [
        "--env-file",
        str(root / "stack.env"),
        "status",
        "--mapping",
        str(root / "mapping.yaml"),
        "--connector",
        str(root / "connector.json"),
        "--checkpoint",
        str(pipeline.root / "checkpoints" / "main"),
    ]


def _status(args: list[str], *extra: str) -> tuple[int, dict[str, Any], str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("CDC_SYNC_")}
    screen = subprocess.run(
        [str(CLI), *args, *extra], capture_output=True, text=True, env=environment, timeout=120
    )
    as_json = subprocess.run(
        [str(CLI), *args, *extra, "--json"],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )
    assert screen.returncode == as_json.returncode, screen.stderr + as_json.stderr
    return screen.returncode, json.loads(as_json.stdout), screen.stdout


def test_status_is_healthy_while_running_and_stopped_after_the_job_stops(
    pipeline: SyncHarness, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    connect = request.node.callspec.params.get("pipeline") == "connect"
    connect_url = request.getfixturevalue("connect_url") if connect else None
    args = _status_files(pipeline, tmp_path, connect_url)
    pipeline.wait_converged()
    deadline = time.monotonic() + 60
    while True:  # converged sinks; the checkpoint commit and the heartbeat follow shortly
        code, document, screen = _status(args)
        if code == 0 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert code == 0, screen
    assert screen.splitlines()[1].startswith("verdict: HEALTHY"), screen
    assert document["verdict"]["health"] == "healthy"
    consumers = {c["name"]: c for c in document["consumers"]}
    documents = [f"documents:{name}" for name in pipeline.mapping.documents]
    assert list(consumers) == ["search", "redis", "delta", *documents]
    assert all(c["job"]["state"] == "running" for c in consumers.values())
    # Caught up: nothing waits on the routed tables' topics. The heartbeat table's topic gets a
    # record every second, so a few of those may be between two batches.
    heartbeat = f"{pipeline.mapping.topic_prefix}.{pipeline.mapping.heartbeat_table}"
    partitions = [p for c in consumers.values() for p in c["partitions"]]
    assert all(p["waiting"] == 0 for p in partitions if p["topic"] != heartbeat), screen
    assert document["slot"]["exists"] and document["slot"]["active"]
    if connect:
        assert document["capture"]["state"] == "RUNNING"
    marks = {(w["sink"], w["table"]): w for c in consumers.values() for w in c["watermarks"]}
    flat = {
        (sink, str(table))
        for sink in ("search", "redis", "delta")
        for table in pipeline.mapping.tables
    }
    assert flat <= set(marks)
    assert all(w["version"] and w["source_ts_ms"] for w in marks.values())
    assert isinstance(document["dead_letters"], int)
    assert all(c["job"]["last_batch"]["stages"] for c in consumers.values())

    pipeline.stop()
    try:
        # Only updated_at: the pipeline is shared, and the e2e cases check the other columns.
        pipeline.run_sql(["UPDATE shop.customers SET updated_at = now()"])
        deadline = time.monotonic() + 60
        while True:  # capture publishes the updates; nothing processes them
            code, document, screen = _status(args)
            if document["waiting"] > 0 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert code == 1, screen
        assert document["verdict"]["health"] == "stopped"
        assert any("search: stopped" in r for r in document["verdict"]["reasons"]), screen
        assert document["waiting"] > 0
        assert "verdict: STOPPED: search: stopped" in screen
    finally:
        pipeline.start()
    pipeline.wait_converged()
