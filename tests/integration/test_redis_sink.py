"""Redis sink on a real server: Lua compare-and-set, tombstones with TTL, TOAST merge, row TTL."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from cdc_sync.core.model import Change, Coordinates, Truncate
from cdc_sync.mapping import CacheRoute, TableRoute
from cdc_sync.sinks.redis import RedisSink
from tests.changes import change, products_route, tombstone_only
from tests.envelopes import UNAVAILABLE, product

pytestmark = pytest.mark.integration
RETENTION = 3600


@pytest.fixture
def sink(redis_url: str) -> Iterator[RedisSink]:
    sink = RedisSink(redis_url, tombstone_retention_seconds=RETENTION)
    yield sink
    sink.close()


@pytest.fixture
def route(sink: RedisSink) -> TableRoute:
    route = products_route()
    sink.ensure_target(route, None)
    return route


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


def stored(client: redis.Redis, route: TableRoute, ident: int) -> dict[str, Any] | None:
    assert route.cache is not None
    raw = client.hget(route.cache.key(route.table, str(ident)), "row")
    return None if raw is None else json.loads(str(raw))


def apply(sink: RedisSink, route: TableRoute, *changes: Change) -> tuple[int, int, int]:
    result = sink.apply(route, list(changes))
    return result.applied, result.fenced, len(result.failures)


def test_newer_wins_older_is_fenced_and_versions_are_stored(
    sink: RedisSink, route: TableRoute, client: redis.Redis
) -> None:
    big = 2**63 + 5  # beyond a Lua double's exact range: compared as padded strings
    assert apply(sink, route, change(route, "c", big, 1, product(1, name="new"))) == (1, 0, 0)
    assert apply(sink, route, change(route, "u", big - 1, 1, product(1, name="old"))) == (0, 1, 0)
    row = stored(client, route, 1)
    assert row is not None and row["name"] == "new"
    assert route.cache is not None
    assert int(str(client.hget(route.cache.key(route.table, "1"), "version"))) == big


def test_delete_leaves_a_tombstone_that_fences_stale_updates(
    sink: RedisSink, route: TableRoute, client: redis.Redis
) -> None:
    apply(sink, route, change(route, "c", 10, 2, product(2)))
    assert apply(sink, route, change(route, "d", 40, 2)) == (1, 0, 0)
    assert stored(client, route, 2) is None
    assert route.cache is not None
    stone = route.cache.tombstone_key(route.table, "2")
    assert 0 < client.ttl(stone) <= RETENTION
    assert apply(sink, route, change(route, "u", 30, 2, product(2))) == (0, 1, 0)
    assert stored(client, route, 2) is None
    assert apply(sink, route, change(route, "c", 50, 2, product(2, name="reborn"))) == (1, 0, 0)
    assert (stored(client, route, 2) or {})["name"] == "reborn"


def test_replay_is_idempotent(sink: RedisSink, route: TableRoute, client: redis.Redis) -> None:
    batch = [change(route, "c", 10, 3, product(3)), change(route, "d", 12, 4)]
    apply(sink, route, *batch)
    before = stored(client, route, 3)
    applied, fenced, failed = apply(sink, route, *batch)
    assert failed == 0 and applied + fenced == 2
    assert stored(client, route, 3) == before


def test_unchanged_toast_column_keeps_the_stored_value_and_exact_numbers(
    sink: RedisSink, route: TableRoute, client: redis.Redis
) -> None:
    first = product(5, description="long stored text") | {"id": 5}
    apply(sink, route, change(route, "c", 10, 5, first))
    toast = product(5, name="renamed", description=UNAVAILABLE)
    assert apply(sink, route, change(route, "u", 20, 5, toast)) == (1, 0, 0)
    row = stored(client, route, 5)
    assert row is not None
    assert (row["name"], row["description"], row["price"]) == (
        "renamed",
        "long stored text",
        "89.90",
    )


def test_row_ttl_expires_row_keys(sink: RedisSink, client: redis.Redis) -> None:
    route = products_route()
    route = dataclasses.replace(route, cache=CacheRoute(route.cache.prefix, ttl_seconds=120))  # type: ignore[union-attr]
    apply(sink, route, change(route, "c", 10, 6, product(6)))
    assert route.cache is not None
    assert 0 < client.ttl(route.cache.key(route.table, "6")) <= 120


def test_a_key_of_the_wrong_type_is_a_terminal_record_failure(
    sink: RedisSink, route: TableRoute, client: redis.Redis
) -> None:
    assert route.cache is not None
    client.set(route.cache.key(route.table, "7"), "not a hash")
    result = sink.apply(
        route, [change(route, "c", 10, 7, product(7)), change(route, "c", 10, 8, product(8))]
    )
    assert result.applied == 1
    [failure] = result.failures
    assert failure.change.doc_id == "7" and failure.error_class == "ResponseError"


def test_equal_versions_of_one_transaction_keep_kafka_order_across_batches(
    sink: RedisSink, route: TableRoute, client: redis.Redis
) -> None:
    """Delete + re-insert in one transaction share its version: the re-insert, later in Kafka
    order but in the next micro-batch, must apply."""
    apply(sink, route, change(route, "c", 10, 6, product(6, name="before")))
    apply(sink, route, change(route, "d", 30, 6))
    assert apply(sink, route, change(route, "c", 30, 6, product(6, name="again"))) == (1, 0, 0)
    row = stored(client, route, 6)
    assert row is not None and row["name"] == "again"


def test_a_tombstone_without_its_delete_event_deletes_what_is_stored(
    sink: RedisSink, route: TableRoute, client: redis.Redis
) -> None:
    apply(sink, route, change(route, "c", 10, 7, product(7)))
    assert apply(sink, route, tombstone_only(route, 7)) == (1, 0, 0)
    assert stored(client, route, 7) is None
    assert apply(sink, route, tombstone_only(route, 8)) == (1, 0, 0)  # nothing stored: done
    assert apply(sink, route, change(route, "c", 5, 7, product(7, name="stale"))) == (0, 1, 0)
    apply(sink, route, change(route, "c", 20, 7, product(7, name="later")))
    row = stored(client, route, 7)
    assert row is not None and row["name"] == "later"


def test_truncate_removes_older_rows_fenced_and_leaves_tombstones(
    sink: RedisSink, route: TableRoute, client: redis.Redis
) -> None:
    """Rows below the truncate's version go (a tombstone each, so a stale update stays out);
    a later change applied before the truncate arrived, and its own transaction's reload,
    stay."""
    apply(sink, route, change(route, "c", 10, 1, product(1)), change(route, "c", 20, 2, product(2)))
    apply(sink, route, change(route, "c", 60, 3, product(3)), change(route, "c", 50, 4, product(4)))
    truncate = Truncate(route.table, 50, Coordinates("cdc.shop.products", 0, 9), 55)
    assert sink.truncate(route, truncate) == 2
    assert [i for i in range(1, 5) if stored(client, route, i) is not None] == [3, 4]
    assert apply(sink, route, change(route, "u", 30, 1, product(1, name="stale"))) == (0, 1, 0)
    assert stored(client, route, 1) is None
    assert sink.truncate(route, truncate) == 0  # replayed: nothing older is left
    assert apply(sink, route, change(route, "c", 70, 1, product(1, name="new"))) == (1, 0, 0)


def test_a_foreign_version_fences_nothing(
    sink: RedisSink, route: TableRoute, client: redis.Redis
) -> None:
    """A key (or tombstone) under the prefix whose version is not the pipeline's 20 digits was
    written by something else: as a string "5" sorts above every padded version, so it fenced
    every change of the key before; now the change applies as over no row."""
    assert route.cache is not None
    row_key = route.cache.key(route.table, "1")
    client.hset(row_key, mapping={"row": json.dumps({"id": 1, "name": "foreign"}), "version": "5"})
    assert apply(sink, route, change(route, "u", 10, 1, product(1, name="ours"))) == (1, 0, 0)
    assert (stored(client, route, 1) or {})["name"] == "ours"
    client.set(route.cache.tombstone_key(route.table, "2"), "zz")
    assert apply(sink, route, change(route, "c", 10, 2, product(2))) == (1, 0, 0)
    client.hset(row_key, "version", "not a version")
    assert apply(sink, route, change(route, "d", 11, 1)) == (1, 0, 0)
    assert stored(client, route, 1) is None
    client.hset(row_key, mapping={"row": json.dumps({"id": 1, "name": "foreign"}), "version": "7"})
    truncate = Truncate(route.table, 50, Coordinates("cdc.shop.products", 0, 9), 55)
    assert sink.truncate(route, truncate) == 2  # the foreign row orders before it, as row 2
    assert stored(client, route, 1) is None and stored(client, route, 2) is None
