"""The freeze benchmark's pure parts: the comparison of Redis and Delta with and without a
search freeze, and the table it prints (search's row says when it caught up)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from e2ebench.freeze import comparison, render

pytestmark = pytest.mark.unit


def latency(**sinks: tuple[float, float]) -> dict[str, Any]:
    summary: dict[str, Any] = {"probes": 120, "unresolved": 0}
    for sink, (p50, p99) in sinks.items():
        summary[sink] = {"p50": p50, "p95": p99, "p99": p99, "max": p99}
    return summary


def result(after_thaw: dict[str, float]) -> dict[str, Any]:
    found: dict[str, Any] = {
        "started": "2026-11-27T02:00:00+00:00",
        "machine": "test, 2 cores, load 1.0",
        "options": {"rate": 20.0, "freeze_seconds": 60.0},
        "rows": {"shop.customers": 500},
        "initial_sync": {"seconds": {"search": 9.0, "redis": 5.0, "delta": 7.0}},
        "steps": {
            "no freeze": {
                "achieved_rate": 20.0,
                "latency": latency(search=(0.3, 0.5), redis=(0.25, 0.4), delta=(0.6, 1.2)),
            },
            "search frozen": {
                "achieved_rate": 19.9,
                "latency": latency(redis=(0.3, 0.6), delta=(0.7, 1.8)),
            },
        },
        "after_thaw": {"visible": bool(after_thaw), "seconds": after_thaw},
    }
    found["comparison"] = comparison(found)
    return found


def test_redis_and_delta_are_compared_by_p99_with_and_without_the_freeze() -> None:
    compared = result({"search": 12.5, "redis": 0.3, "delta": 0.8})["comparison"]

    assert set(compared) == {"redis", "delta"}  # search is not probed while frozen
    assert compared["redis"] == {
        "p50": 0.25,
        "p99": 0.4,
        "frozen_p50": 0.3,
        "frozen_p99": 0.6,
        "p99_ratio": 1.5,
    }
    assert compared["delta"]["p99_ratio"] == 1.5


def test_the_table_puts_the_steps_side_by_side_and_says_when_search_caught_up() -> None:
    text = render(result({"search": 12.5, "redis": 0.3, "delta": 0.8}))
    rows = {line.split()[0]: line for line in text.splitlines() if line.split()[:1]}

    assert "0.25 / 0.40" in rows["redis"] and "0.30 / 0.60" in rows["redis"]
    assert "0.60 / 1.20" in rows["delta"] and "0.70 / 1.80" in rows["delta"]
    assert "showed after 12.5 s" in rows["search"]


def test_search_not_caught_up_after_the_thaw_is_said() -> None:
    assert "not caught up" in render(result({}))
