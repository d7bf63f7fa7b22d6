"""The e2e pipeline: a private database, topic prefix, Redis db, indices and warehouse per run."""

from __future__ import annotations

import contextlib
import urllib.error
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
import redis

from connectors.engine import CaptureEngine
from sync_jobs.demo.workload import create_demo_schema
from sync_jobs.job.spark_session import build_spark
from sync_jobs.mapping import MappingFile
from sync_jobs.settings import Connections
from tests.e2e.harness import SyncHarness, e2e_mapping
from tests.e2e.sinks_state import http_json
from tests.fixtures.services import KafkaEndpoint

CONNECTOR = Path("connectors/shop.json")
E2E_REDIS_DB = 3


def _with_path(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=path))


@pytest.fixture(scope="session")
def e2e_database(pg_url: str) -> Iterator[str]:
    name = f"shop_e2e_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    url = _with_path(pg_url, f"/{name}")
    yield url
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


@pytest.fixture(scope="session")
def pipeline(
    e2e_database: str,
    kafka: KafkaEndpoint,
    search_url: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[SyncHarness]:
    root = tmp_path_factory.mktemp("e2e")
    prefix = f"e2e{uuid.uuid4().hex[:6]}"
    connections = Connections(
        pg_url=e2e_database,
        kafka_bootstrap=kafka.bootstrap,
        kafka_flavor=kafka.flavor,
        search_url=search_url,
        search_client="opensearch",
        redis_url=_with_path(redis_url, f"/{E2E_REDIS_DB}"),
        connect_url=None,
        warehouse=str(root / "warehouse"),
    )
    mapping = e2e_mapping(prefix)
    _clean_sinks(mapping, connections)
    create_demo_schema(e2e_database)
    capture = CaptureEngine.from_file(
        CONNECTOR,
        connections,
        root / "capture",
        overrides={
            "topic.prefix": prefix,
            "slot.name": f"{prefix}_slot",
            "publication.name": f"{prefix}_pub",
            "slot.drop.on.stop": "true",
        },
    )
    capture.start()
    spark = build_spark("cdc-sync-e2e")
    harness = SyncHarness(spark, mapping, connections, root)
    try:
        capture.wait_ready(timeout_seconds=120)
        harness.start()
        yield harness
    finally:
        harness.stop()
        capture.stop()
        spark.stop()


def _clean_sinks(mapping: MappingFile, connections: Connections) -> None:
    """Indices and cache keys of earlier runs on a shared server must not leak into this one."""
    client = redis.Redis.from_url(connections.require("redis_url"))
    client.flushdb()
    client.close()
    for route in mapping.tables.values():
        if route.search is not None:
            for name in (route.search.index, f"{route.search.index}_v1"):
                with contextlib.suppress(urllib.error.HTTPError):  # absent: nothing to clean
                    http_json(f"{connections.require('search_url')}/{name}", method="DELETE")
