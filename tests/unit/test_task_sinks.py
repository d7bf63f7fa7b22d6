"""A process's kept clients (job.write.task_sinks): a process that outlives its jobs (the driver
of a test session, a reused Python worker) must not hold a Postgres connection for every job it
ever ran. Seen in CI: 41 idle connections of earlier jobs' fillers in one database, then
Postgres's "sorry, too many clients already" for the next test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from cdc_sync.core.retry import RetryPolicy
from cdc_sync.job.write import task_sinks as module
from cdc_sync.job.write.task_sinks import (
    KEPT_IDLE_SPECS,
    TaskSinkSpec,
    release_task_sinks,
    task_sinks,
)
from cdc_sync.job.write.unavailable import SourceFiller

pytestmark = pytest.mark.unit


@pytest.fixture
def closed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[SourceFiller]]:
    """The fillers closed, in order (none connects: no change is filled)."""
    seen: list[SourceFiller] = []
    monkeypatch.setattr(SourceFiller, "close", lambda self: seen.append(self))
    monkeypatch.setattr(module, "_opened", {})
    yield seen


def spec_of_job(job: int) -> TaskSinkSpec:
    """Each job's spec differs (its relay's port, at least)."""
    return TaskSinkSpec(
        "opensearch",
        None,
        None,
        60,
        RetryPolicy(attempts=1),
        source_conninfo="postgresql://127.0.0.1:9/x",
        relay=("127.0.0.1", 40000 + job),
    )


def test_a_process_keeps_the_clients_of_a_few_idle_specs_only(closed: list[SourceFiller]) -> None:
    jobs = 3 * KEPT_IDLE_SPECS
    for job in range(jobs):
        for _ in range(2):  # a later task of the same job reuses its clients
            with task_sinks(spec_of_job(job)):
                pass
    assert len(closed) == jobs - KEPT_IDLE_SPECS
    assert len(module._opened) == KEPT_IDLE_SPECS


def test_clients_in_use_are_never_closed(closed: list[SourceFiller]) -> None:
    with task_sinks(spec_of_job(0)) as busy:
        for job in range(1, 3 * KEPT_IDLE_SPECS):
            with task_sinks(spec_of_job(job)):
                pass
        assert busy.filler not in closed
        release_task_sinks(spec_of_job(0))  # in use: kept
        assert busy.filler not in closed
    release_task_sinks(spec_of_job(0))  # the job ended, no task uses them
    assert busy.filler in closed
