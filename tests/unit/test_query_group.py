"""The consumers' queries as one (job.runner.QueryGroup): a query that fails before its first
batch is started again, a bounded number of times; one that failed later ends the job; a stop
is bounded in time."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import pytest

from cdc_sync.job.runner import START_ATTEMPTS, ConsumerFailed, QueryGroup

pytestmark = pytest.mark.unit


class FakeQuery:
    """What QueryGroup reads of a StreamingQuery."""

    def __init__(self, error: Exception | None = None, progress: Any = None) -> None:
        self.isActive = error is None
        self.error = error
        self.lastProgress = progress
        self.stopped = threading.Event()

    def exception(self) -> Exception | None:
        return self.error

    def stop(self) -> None:
        self.isActive = False
        self.stopped.set()


def group_of(queries: dict[str, FakeQuery], restart: Any = None) -> QueryGroup:
    return QueryGroup(cast(dict[str, Any], queries), restart=restart)


def test_a_query_that_failed_before_its_first_batch_starts_again() -> None:
    started: list[str] = []

    def restart(name: str) -> Any:
        started.append(name)
        return FakeQuery()  # this time it comes up

    group = group_of(
        {"search": FakeQuery(), "delta": FakeQuery(RuntimeError("worker did not connect"))},
        restart,
    )
    assert group.isActive
    assert started == ["delta"]
    assert group.exception() is None


def test_restarts_are_bounded_and_then_the_failure_stands() -> None:
    def restart(name: str) -> Any:
        return FakeQuery(RuntimeError("still down"))

    group = group_of({"redis": FakeQuery(RuntimeError("down"))}, restart)
    for _ in range(START_ATTEMPTS + 2):
        group.exception()
    assert group.starts["redis"] == START_ATTEMPTS
    failed = group.exception()
    assert isinstance(failed, ConsumerFailed) and failed.consumer == "redis"
    assert not group.isActive


def test_a_query_that_failed_after_it_made_progress_is_not_started_again() -> None:
    def restart(name: str) -> Any:
        raise AssertionError("a query that applied batches must not be restarted silently")

    failed = FakeQuery(RuntimeError("policy says fail"), progress={"batchId": 4})
    group = group_of({"search": failed}, restart)
    assert not group.isActive
    assert isinstance(group.exception(), ConsumerFailed)


def test_a_stop_is_bounded_even_when_a_query_does_not_stop() -> None:
    class Stuck(FakeQuery):
        def stop(self) -> None:
            time.sleep(30)

    quick = FakeQuery()
    group = group_of({"search": Stuck(), "redis": quick})
    started = time.monotonic()
    assert group.stop(timeout=0.5) is False
    assert time.monotonic() - started < 2
    assert quick.stopped.is_set()
