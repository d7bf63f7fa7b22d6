"""The job's hot sections run the cycle collector less often (core.collector), and leave the
process's thresholds as they found them."""

from __future__ import annotations

import gc
import pickle
import threading
from collections.abc import Iterator

import pyarrow as pa
import pytest

from cdc_sync.core.collector import YOUNG_THRESHOLD, collecting_less
from cdc_sync.job.write import task_writes
from cdc_sync.job.write.task_writes import WRITES_SCHEMA, load_writes

pytestmark = pytest.mark.unit


@pytest.fixture
def thresholds() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_inside_a_section_the_young_threshold_is_raised_and_then_restored(
    thresholds: None,
) -> None:
    gc.set_threshold(700, 11, 12)
    with collecting_less():
        assert gc.get_threshold() == (YOUNG_THRESHOLD, 11, 12)
    assert gc.get_threshold() == (700, 11, 12)


def test_a_higher_threshold_set_by_the_user_stays(thresholds: None) -> None:
    gc.set_threshold(YOUNG_THRESHOLD * 5, 10, 10)
    with collecting_less():
        assert gc.get_threshold() == (YOUNG_THRESHOLD * 5, 10, 10)
    assert gc.get_threshold() == (YOUNG_THRESHOLD * 5, 10, 10)


def test_a_disabled_collector_stays_disabled(thresholds: None) -> None:
    gc.disable()
    try:
        with collecting_less():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_threshold_comes_back_when_the_last_of_concurrent_sections_ends(
    thresholds: None,
) -> None:
    """The driver's consumers run batches on threads: one ending its section while another is
    inside it leaves the raise in place."""
    gc.set_threshold(700, 10, 10)
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with collecting_less():
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    assert inside.wait(10)
    with collecting_less():
        pass
    assert gc.get_threshold()[0] == YOUNG_THRESHOLD  # the other section is still inside
    release.set()
    thread.join(10)
    assert gc.get_threshold() == (700, 10, 10)


def test_a_section_that_raises_restores_the_threshold(thresholds: None) -> None:
    gc.set_threshold(700, 10, 10)
    with pytest.raises(RuntimeError), collecting_less():
        raise RuntimeError("a write failed")
    assert gc.get_threshold() == (700, 10, 10)


def test_the_drivers_load_of_the_writes_runs_inside_a_section(
    thresholds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    gc.set_threshold(700, 10, 10)
    seen: list[int] = []
    real_loads = pickle.loads

    def loads(blob: bytes) -> object:
        seen.append(gc.get_threshold()[0])
        return real_loads(blob)

    monkeypatch.setattr(pickle, "loads", loads)
    rows = pa.RecordBatch.from_pylist(
        [{"writes": pickle.dumps([])}], schema=WRITES_SCHEMA
    ).to_pylist()
    assert load_writes(rows) == [[]]
    assert seen == [YOUNG_THRESHOLD]
    assert gc.get_threshold() == (700, 10, 10)


def test_the_write_task_reads_its_changes_inside_a_section(
    thresholds: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    gc.set_threshold(700, 10, 10)
    seen: list[int] = []

    def changes_by_table(batches: Iterator[pa.RecordBatch]) -> dict[str, list[object]]:
        seen.append(gc.get_threshold()[0])
        return {}

    monkeypatch.setattr(task_writes, "_changes_by_table", changes_by_table)
    assert list(task_writes.write_partition(iter([]), plan=None)) == []  # type: ignore[arg-type]
    assert seen == [YOUNG_THRESHOLD]
    assert gc.get_threshold() == (700, 10, 10)
