"""Repair's building blocks on real services: key filters run by Postgres, and extra rows
deleted at their stored version in each sink (a concurrent re-insert wins)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdc_sync.core.model import TableId
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.signals import key_filters
from cdc_sync.mapping import DeltaRoute, MappingFile, TableRoute
from cdc_sync.sinks.delta import readback as delta_readback
from cdc_sync.sinks.redis import readback as cache_readback
from cdc_sync.sinks.redis.actions import parsed_version
from cdc_sync.sinks.search import SearchSink
from cdc_sync.sinks.search import readback as search_readback
from cdc_sync.verify.compare import source_keys
from cdc_sync.verify.extra_rows import RepairSinks, delete_extra_rows
from tests.changes import change, products_route
from tests.envelopes import product
from tests.pg import private_database

pytestmark = pytest.mark.integration

ODD_NAMES = ["plain", "o'quote", "pipe|bar", "back\\slash", 'dq"uote', "ünï", "", " lead"]


def test_key_filters_select_exactly_the_keys_in_postgres(pg_url: str) -> None:
    with private_database(pg_url, "repair_filters") as url, psycopg.connect(url) as conn:
        conn.execute(
            "CREATE SCHEMA s; CREATE TABLE s.t (name text, at timestamptz, n int, "
            "PRIMARY KEY (name, at, n))"
        )
        moment = datetime(2024, 2, 29, 12, 30, 15, 123456, tzinfo=UTC)
        rows = [(name, moment, n) for name in ODD_NAMES for n in (-1, 0, 7)]
        with conn.cursor() as cursor:
            cursor.executemany("INSERT INTO s.t VALUES (%s, %s, %s)", rows)
        keys = source_keys(conn, TableId("s", "t"))
        wanted = sorted(keys)[::2]  # every other row
        filters = key_filters(conn, ["name", "at", "n"], [keys[k] for k in wanted], budget=200)
        assert filters is not None and len(filters) > 1  # split by the small budget
        found: list[tuple[Any, ...]] = []
        for condition in filters:
            found += conn.execute(f"SELECT name, at, n FROM s.t WHERE {condition}".encode())
        assert sorted(found) == sorted(keys[k] for k in wanted)


def open_repair_sinks(search_url: str, redis_url: str, warehouse: Path) -> RepairSinks:
    """Repair's sinks on the test services, for a mapping with no tables of its own."""
    connections = Connections(
        pg_url=None,
        kafka_bootstrap=None,
        kafka_flavor="tansu",
        search_url=search_url,
        search_client="opensearch",
        redis_url=redis_url,
        connect_url=None,
        warehouse=str(warehouse),
    )
    mapping = MappingFile(
        path=Path("repair.yaml"),
        topic_prefix="t",
        connector=None,
        dead_letter_topic="t.dead",
        tombstone_retention_seconds=3600,
        tables={},
        ignored=frozenset(),
    )
    return RepairSinks(mapping, connections)


@pytest.fixture
def sinks(search_url: str, redis_url: str, tmp_path: Path) -> Iterator[RepairSinks]:
    sinks = open_repair_sinks(search_url, redis_url, tmp_path / "warehouse")
    yield sinks
    sinks.close()


@pytest.fixture
def route() -> TableRoute:
    return dataclasses.replace(
        products_route(), delta=DeltaRoute("shop", f"products_{uuid.uuid4().hex[:8]}")
    )


def held(sinks: RepairSinks, name: str, route: TableRoute) -> dict[str, str]:
    """doc id -> the row's name, as the sink holds it."""
    sink = sinks.sink(name)
    if isinstance(sink, SearchSink):
        assert route.search is not None
        docs = search_readback.documents(sink.backend, route.search.index)
        return {i: source["name"] for i, (_, source) in docs.items()}
    if name == "cache":
        assert route.cache is not None
        client = redis.Redis.from_url(sinks.connections.require("redis_url"))
        try:
            return {
                i: r["name"]
                for i, r in cache_readback.rows(client, route.cache, route.table).items()
            }
        finally:
            client.close()
    assert route.delta is not None
    warehouse = Path(sinks.connections.require("warehouse"))
    return {
        i: r["name"] for i, r in delta_readback.rows_by_id(warehouse, route.delta, ["id"]).items()
    }


def write(
    sinks: RepairSinks, name: str, route: TableRoute, version: int, key: int, label: str
) -> int:
    created = change(route, "c", version, key, product(key, name=label))
    sink = sinks.sink(name)
    sink.ensure_target(route, created.schema)
    result = sink.apply(route, [created])
    return result.applied


SINKS = ["search", "cache", "delta"]


@pytest.mark.parametrize("name", SINKS)
def test_extra_rows_are_deleted_at_their_stored_version(
    sinks: RepairSinks, route: TableRoute, name: str
) -> None:
    assert write(sinks, name, route, 100, 1, "extra") == 1
    assert write(sinks, name, route, 100, 2, "back in postgres") == 1
    outcome = delete_extra_rows(sinks, name, route, ["id"], ["1", "2", "3"], lambda: {"2"})
    assert (outcome.deleted, outcome.back, outcome.gone, outcome.fenced) == (1, 1, 1, 0)
    assert held(sinks, name, route) == {"2": "back in postgres"}
    # The delete is remembered at the stored version: an older change cannot resurrect the row.
    assert write(sinks, name, route, 99, 1, "stale") == 0
    assert "1" not in held(sinks, name, route)


@pytest.mark.parametrize("name", SINKS)
def test_a_reinsert_landing_after_the_check_wins_over_the_delete(
    sinks: RepairSinks, route: TableRoute, name: str
) -> None:
    assert write(sinks, name, route, 100, 1, "extra") == 1

    def postgres_check_then_reinsert_lands() -> set[str]:
        # Postgres says the key is gone; then a re-insert commits and the job applies it
        # before repair's delete reaches the sink.
        write(sinks, name, route, 200, 1, "re-inserted")
        return set()

    outcome = delete_extra_rows(
        sinks, name, route, ["id"], ["1"], postgres_check_then_reinsert_lands
    )
    assert (outcome.deleted, outcome.fenced) == (0, 1)
    assert held(sinks, name, route) == {"1": "re-inserted"}


def write_foreign(
    sinks: RepairSinks, route: TableRoute, key: int, version_field: bytes | None
) -> None:
    """A row key under the route's prefix written by something else: its own version field
    (or none)."""
    assert route.cache is not None
    client = redis.Redis.from_url(sinks.connections.require("redis_url"))
    try:
        fields: dict[str, bytes] = {"row": json.dumps({"id": key, "name": "foreign"}).encode()}
        if version_field is not None:
            fields["version"] = version_field
        client.hset(route.cache.key(route.table, str(key)), mapping=fields)  # type: ignore[arg-type]
    finally:
        client.close()


# Anything but the pipeline's 20 digits: a short number ("newer" than every padded version as a
# string), 21 digits, 20 characters that are not all digits, text, no field at all.
FOREIGN_FIELDS: list[bytes | None] = [
    b"5",
    b"9" * 21,
    b"0000000000000000000x",
    b"\xff\xfe not text",
    b"",
    None,
]


def test_cache_keys_whose_version_is_not_the_pipelines_are_deleted_as_foreign(
    sinks: RepairSinks, route: TableRoute
) -> None:
    """Before: a foreign key was kept as "newer in the sink" (its field compared as a string
    above the padded version), or counted "already gone" (no field): it was immortal."""
    ids = [str(key) for key in range(1, len(FOREIGN_FIELDS) + 1)]
    for key, field in enumerate(FOREIGN_FIELDS, start=1):
        write_foreign(sinks, route, key, field)
    assert write(sinks, "cache", route, 100, 100, "the pipeline's") == 1
    assert set(held(sinks, "cache", route)) == {*ids, "100"}  # verify sees every one as a row
    outcome = delete_extra_rows(sinks, "cache", route, ["id"], [*ids, "100"], lambda: set())
    assert (outcome.foreign, outcome.deleted, outcome.fenced, outcome.gone) == (6, 1, 0, 0)
    assert "6 deleted as foreign" in outcome.describe()
    assert held(sinks, "cache", route) == {}


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(field=st.binary(max_size=24).filter(lambda b: parsed_version(b) is None))
def test_any_foreign_version_field_is_deleted_by_repair(sinks: RepairSinks, field: bytes) -> None:
    route = products_route()
    write_foreign(sinks, route, 1, field)
    outcome = delete_extra_rows(sinks, "cache", route, ["id"], ["1"], lambda: set())
    assert (outcome.foreign, outcome.fenced) == (1, 0)
    assert held(sinks, "cache", route) == {}


def test_a_pipeline_write_landing_on_a_foreign_key_after_the_read_wins(
    sinks: RepairSinks, route: TableRoute
) -> None:
    """The pipeline writes over a foreign key (its version fences nothing); repair, which read
    the foreign field before, then leaves the key alone."""
    write_foreign(sinks, route, 1, b"5")

    def postgres_check_then_reinsert_lands() -> set[str]:
        assert write(sinks, "cache", route, 200, 1, "re-inserted") == 1
        return set()

    outcome = delete_extra_rows(
        sinks, "cache", route, ["id"], ["1"], postgres_check_then_reinsert_lands
    )
    assert (outcome.foreign, outcome.fenced) == (0, 1)
    assert held(sinks, "cache", route) == {"1": "re-inserted"}
