"""The adversarial freeze's verdict (tests/adversarial/probe.py): it passes only when every probe
update showed in the cache and the warehouse within the deadline while search committed nothing,
and it fails naming the sink that waited (a batch shared by all sinks: issue 28's 119 of 120
updates later than 10 s)."""

from __future__ import annotations

import pytest

from tests.adversarial.probe import PROBE_DEADLINE_SECONDS, FreezeReport, freshness

pytestmark = pytest.mark.unit


def report(redis: list[float], delta: list[float], search_commits: int = 0) -> FreezeReport:
    updates = max(len(redis), len(delta))
    return FreezeReport(
        45.0,
        {"redis": freshness(redis, updates), "delta": freshness(delta, updates)},
        {"search": search_commits, "redis": 40, "delta": 30},
    )


def test_fresh_cache_and_warehouse_beside_a_frozen_search_pass() -> None:
    fresh = report([0.4, 0.5, 0.9, 1.2], [0.7, 0.8, 1.5, 2.1])

    fresh.check()
    assert fresh.freshness["delta"].max == 2.1
    assert "redis p50/p99" in fresh.summary() and "search committed 0" in fresh.summary()


def test_a_sink_that_waited_for_search_fails_naming_it() -> None:
    waited = report([0.4, 0.5, 0.9, 1.2], [0.7, PROBE_DEADLINE_SECONDS + 30, 1.5, 2.1])

    with pytest.raises(AssertionError, match="delta waited for the frozen search server"):
        waited.check()


def test_an_update_never_seen_fails() -> None:
    unseen = report([0.4, 0.5, 0.9, 1.2], [0.7, 0.8, 1.5])

    assert unseen.freshness["delta"].unseen == 1
    with pytest.raises(AssertionError, match="1 of 4 unseen"):
        unseen.check()


def test_a_search_consumer_that_kept_committing_was_not_frozen() -> None:
    with pytest.raises(AssertionError, match="search was not frozen"):
        report([0.4, 0.5], [0.7, 0.8], search_commits=5).check()


def test_percentiles_of_one_and_of_many() -> None:
    assert freshness([2.0], 1).p99 == 2.0
    many = freshness([float(n) for n in range(1, 101)], 100)
    assert (many.p50, many.max, many.unseen) == (50.5, 100.0, 0)
