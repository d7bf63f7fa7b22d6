"""How `cdc-sync run` waits on its consumers' queries (cli.wait_for_end): until a stop signal, or
until a query ended for good. A query that failed for a reason that may pass is started again by
the group (job.runner.QueryGroup): that is not an end. Seen in tests/e2e/test_stop.py under
load: the query failed between the group's restart check and its activity check, the wait
ended, the restart then happened inside `exception()`, which found no failure, and the job
exited 0 in the middle of its start."""

from __future__ import annotations

import threading
import time

import pytest

from cdc_sync.cli import wait_for_end
from cdc_sync.job.runner import RESTART_DELAYS, ConsumerFailed, QueryGroup

pytestmark = pytest.mark.unit


class Jumps:
    """A clock that moves past any restart delay each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += max(RESTART_DELAYS) + 1
        return self.now


class FakeQuery:
    """A streaming query whose `isActive` answers are scripted (then the last one repeats)."""

    def __init__(self, active: list[bool], error: Exception | None = None) -> None:
        self.active = active
        self.error = error
        self.lastProgress: dict[str, object] | None = None

    @property
    def isActive(self) -> bool:
        return self.active.pop(0) if len(self.active) > 1 else self.active[0]

    def exception(self) -> Exception | None:
        return None if self.isActive else self.error

    def stop(self) -> None:
        self.active = [False]


def test_a_query_started_again_after_failing_before_its_first_batch_is_no_end() -> None:
    # Active when the group looks whether to restart it, failed when it looks whether all run.
    early = FakeQuery([True, False], RuntimeError("Python worker failed to connect back."))
    started_again = FakeQuery([True])
    group = QueryGroup({"redis": early}, restart=lambda name: started_again, clock=Jumps())  # type: ignore[dict-item,arg-type,return-value]
    stopping = threading.Event()
    threading.Timer(1.0, stopping.set).start()

    wait_for_end(group, stopping)

    assert stopping.is_set(), "the wait ended before the stop: the job would have exited 0"
    assert group.queries["redis"] is started_again
    assert group.exception() is None


def test_a_query_whose_failure_will_not_pass_ends_the_wait() -> None:
    failed = FakeQuery([True, False], RuntimeError("on_malformed: fail"))
    group = QueryGroup(
        {"search": failed},  # type: ignore[dict-item]
        restart=lambda name: FakeQuery([True]),  # type: ignore[arg-type,return-value]
        terminal=lambda name: True,
    )
    stopping = threading.Event()
    started = time.monotonic()

    wait_for_end(group, stopping)

    assert time.monotonic() - started < 5 and not stopping.is_set()
    error = group.exception()
    assert isinstance(error, ConsumerFailed) and error.consumer == "search"


def test_a_query_that_keeps_failing_ends_the_wait_after_its_restarts() -> None:
    def failing(_name: str) -> FakeQuery:
        return FakeQuery([False], RuntimeError("Python worker failed to connect back."))

    group = QueryGroup({"delta": failing("delta")}, restart=failing, clock=Jumps())  # type: ignore[dict-item,arg-type]
    stopping = threading.Event()

    wait_for_end(group, stopping)

    assert not stopping.is_set()
    assert len(group.restarted["delta"]) == len(RESTART_DELAYS)
    assert isinstance(group.exception(), ConsumerFailed)
