"""Applied watermarks in each real store: recorded per topic, read back, never lowered."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from cdc_sync.mapping import DeltaRoute, TableRoute
from cdc_sync.sinks.base import Sink
from cdc_sync.sinks.delta import DeltaSink
from cdc_sync.sinks.delta import readback as delta_readback
from cdc_sync.sinks.redis import RedisSink
from cdc_sync.sinks.redis import readback as cache_readback
from cdc_sync.sinks.search import SearchSink
from cdc_sync.sinks.search import readback as search_readback
from tests.changes import products_route

pytestmark = pytest.mark.integration
RETENTION = 3600
# Above 2**53: a store comparing positions as doubles would get these wrong.
HIGH = (0x2A << 32) << 20
Store = tuple[Sink, Callable[[], dict[str, int]]]


@pytest.fixture(params=["cache", "search", "delta"])
def store(
    request: pytest.FixtureRequest, redis_url: str, search_url: str, tmp_path: Path
) -> Iterator[Store]:
    """A sink and the reader of what it recorded."""
    if request.param == "cache":
        sink: Sink = RedisSink(redis_url, RETENTION)
        client = redis.Redis.from_url(redis_url)
        yield sink, lambda: cache_readback.watermarks(client)
        client.close()
    elif request.param == "search":
        sink = SearchSink("opensearch", search_url, RETENTION)
        yield sink, lambda: search_readback.watermarks(sink.backend)  # type: ignore[attr-defined]
    else:
        sink = DeltaSink(tmp_path, RETENTION)
        yield sink, lambda: delta_readback.watermarks(tmp_path)
    sink.close()


def routed_topic() -> tuple[str, TableRoute]:
    route = dataclasses.replace(products_route(), delta=DeltaRoute("shop", "products"))
    return f"t{uuid.uuid4().hex[:8]}.shop.products", route


def test_a_watermark_is_recorded_per_topic_and_never_lowered(store: Store) -> None:
    sink, read = store
    topic, route = routed_topic()
    other, other_route = routed_topic()
    sink.record_watermark({topic: route, other: other_route}, HIGH + 10)
    sink.record_watermark({topic: route}, HIGH + 9)  # a replayed batch, an older job: ignored
    sink.record_watermark({topic: route}, HIGH + 10)
    assert read()[topic] == HIGH + 10
    sink.record_watermark({topic: route}, HIGH + 11)
    marks = read()
    assert (marks[topic], marks[other]) == (HIGH + 11, HIGH + 10)


def test_a_route_without_the_sink_records_nothing_there(store: Store) -> None:
    sink, read = store
    topic, route = routed_topic()
    bare = dataclasses.replace(route, search=None, cache=None, delta=None)
    sink.record_watermark({topic: bare}, 5)
    assert topic not in read()
