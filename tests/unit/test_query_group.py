"""The consumers' queries as one (job.runner.QueryGroup): a query that failed for a reason that
may pass is started again after a delay, a bounded number of times, while the others run; one
whose failure will not pass ends the job at once; a stop is bounded in time."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

import pytest

from cdc_sync.job.runner import RESTART_DELAYS, ConsumerFailed, QueryGroup

pytestmark = pytest.mark.unit


class FakeQuery:
    """What QueryGroup reads of a StreamingQuery."""

    def __init__(self, error: Exception | None = None) -> None:
        self.isActive = error is None
        self.error = error
        self.stopped = threading.Event()

    def exception(self) -> Exception | None:
        return self.error

    def stop(self) -> None:
        self.isActive = False
        self.stopped.set()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def group_of(
    queries: dict[str, FakeQuery],
    restart: Any = None,
    terminal: Any = lambda name: False,
    clock: Any = time.monotonic,
) -> QueryGroup:
    return QueryGroup(cast(dict[str, Any], queries), restart, terminal, clock)


def test_a_failed_query_starts_again_after_its_delay_while_the_group_runs() -> None:
    clock, started = Clock(), []

    def restart(name: str) -> Any:
        started.append(name)
        return FakeQuery()  # this time it comes up

    group = group_of(
        {"search": FakeQuery(), "delta": FakeQuery(RuntimeError("worker did not connect"))},
        restart,
        clock=clock,
    )
    assert group.isActive and group.exception() is None  # waiting for its restart
    assert started == []
    clock.now += RESTART_DELAYS[0]
    assert group.isActive
    assert started == ["delta"]


def test_restarts_are_bounded_and_then_the_failure_ends_the_job() -> None:
    clock = Clock()
    group = group_of(
        {"redis": FakeQuery(RuntimeError("down"))},
        lambda name: FakeQuery(RuntimeError("still down")),
        clock=clock,
    )
    for delay in RESTART_DELAYS:
        assert group.isActive
        clock.now += delay
        group.exception()
    assert len(group.restarted["redis"]) == len(RESTART_DELAYS)
    failed = group.exception()
    assert isinstance(failed, ConsumerFailed) and failed.consumer == "redis"
    assert not group.isActive


def test_a_failure_that_will_not_pass_ends_the_job_at_once() -> None:
    def restart(name: str) -> Any:
        raise AssertionError("a policy's failure must not be retried")

    group = group_of(
        {"search": FakeQuery(RuntimeError("policy says fail"))}, restart, lambda name: True
    )
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


def test_a_stopped_group_starts_nothing_again() -> None:
    """A query that failed for a reason that may pass is not started again once the job was
    stopped: a query started after the stop would run on, unowned, in the driver (seen in CI:
    a stopped job's query read through a later test's stand-in consumer)."""
    clock, started = Clock(), []

    def restart(name: str) -> Any:
        started.append(name)
        return FakeQuery()

    group = group_of({"delta": FakeQuery(RuntimeError("broker away"))}, restart, clock=clock)
    assert group.isActive  # waiting for its restart
    group.stop()
    clock.now += RESTART_DELAYS[-1]
    assert not group.isActive
    assert started == []
    assert isinstance(group.exception(), ConsumerFailed)  # the failure is still told
