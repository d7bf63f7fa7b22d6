"""Every sink client bounds one request (a frozen server must fail an attempt, not hang it)."""

from __future__ import annotations

import pytest

from cdc_sync.core.retry import RetryPolicy
from cdc_sync.sinks.redis import RedisSink
from cdc_sync.sinks.search import SearchSink

pytestmark = pytest.mark.unit
URL = "http://127.0.0.1:9"  # never contacted: the clients connect lazily


def test_the_default_request_timeout_is_explicit_in_every_client() -> None:
    opensearch = SearchSink("opensearch", URL, 60, compat_headers=False)
    assert opensearch.backend.client.transport.connection_pool.connections[0].timeout == 30  # type: ignore[attr-defined]
    elastic = SearchSink("elasticsearch", URL, 60, compat_headers=False)
    assert elastic.backend.client._request_timeout == 30  # type: ignore[attr-defined]
    redis_kwargs = RedisSink("redis://127.0.0.1:9/0", 60).client.connection_pool.connection_kwargs
    assert (redis_kwargs["socket_timeout"], redis_kwargs["socket_connect_timeout"]) == (30, 30)


def test_the_request_timeout_and_the_sink_name_come_from_the_policy() -> None:
    policy = RetryPolicy(horizon_seconds=120, attempt_timeout_seconds=5)
    sink = SearchSink("elasticsearch", URL, 60, compat_headers=False, retry=policy)
    assert sink.backend.client._request_timeout == 5  # type: ignore[attr-defined]
    assert (sink.retry.target, sink.retry.horizon_seconds) == ("search", 120)
    assert sink.writer.policy is sink.retry
    cache = RedisSink("redis://127.0.0.1:9/0", 60, retry=policy)
    assert cache.client.connection_pool.connection_kwargs["socket_timeout"] == 5
    assert cache.writer.policy.target == "redis"
