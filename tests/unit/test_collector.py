"""The job's processes run the cycle collector less often (core.collector): the driver from the
job's start, Spark's Python workers from the first task of each phase."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from cdc_sync.core.collector import YOUNG_THRESHOLD, collect_less_often


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_the_young_threshold_is_raised_and_the_older_ones_kept(thresholds: None) -> None:
    gc.set_threshold(700, 11, 12)
    collect_less_often()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 11, 12)


def test_a_higher_threshold_set_by_the_user_stays(thresholds: None) -> None:
    gc.set_threshold(YOUNG_THRESHOLD * 5, 10, 10)
    collect_less_often()
    assert gc.get_threshold() == (YOUNG_THRESHOLD * 5, 10, 10)


def test_a_disabled_collector_stays_disabled(thresholds: None) -> None:
    gc.disable()
    try:
        collect_less_often()
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize(
    "call",
    [
        "from cdc_sync.job.decode.partition import decode_and_fold as f; list(f(iter([])))",
        "from cdc_sync.job.write.task_writes import write_partition as f; "
        "list(f(iter([]), plan=None))",
    ],
    ids=["decode_and_fold", "write_partition"],
)
def test_a_python_worker_runs_it_from_its_first_task(call: str) -> None:
    """A fresh interpreter, as a Spark worker is: the phase's function raises the threshold
    itself (no start-up code of the job runs there)."""
    script = f"import gc; assert gc.get_threshold()[0] < {YOUNG_THRESHOLD}; {call}; "
    script += "print(gc.get_threshold()[0])"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert int(out) == YOUNG_THRESHOLD
