"""The console: quiet by default with everything in the log file, one concise line per batch,
and the snapshot progress view."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from cdc_sync.core import logs
from cdc_sync.core.logs import CONSOLE, setup_logging
from cdc_sync.core.model import TableId
from cdc_sync.job.observe.console import BatchLine, SnapshotProgress, batch_line
from cdc_sync.job.settle.applier import BatchMetrics, TableProgress
from cdc_sync.sinks.base import RecordFailure, WriteResult

pytestmark = pytest.mark.unit
CUSTOMERS = TableId("shop", "customers")
ORDERS = TableId("shop", "orders")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_console_shows_warnings_and_job_lines_the_file_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    settings = setup_logging(verbose=False, directory=tmp_path)
    logging.getLogger("cdc_sync.job.settle.applier").info("batch 3: records=10 ... (detailed)")
    logging.getLogger(CONSOLE).info("batch 3: 10 records")
    logging.getLogger("cdc_sync.sinks").warning("waiting for sink search")
    console = capsys.readouterr().err
    assert "batch 3: 10 records" in console and "waiting for sink search" in console
    assert "detailed" not in console
    logged = (tmp_path / "job.log").read_text()
    assert "detailed" in logged and "batch 3: 10 records" in logged
    assert settings.jvm_log == tmp_path / "spark.log"


def test_after_a_stop_signal_py4j_reports_of_the_jvm_ending_leave_the_console(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    setup_logging(verbose=False, directory=tmp_path)
    gateway = "/venv/lib/python3.11/site-packages/py4j/java_gateway.py"

    def py4j_reports(text: str) -> None:  # as py4j logs it: the root logger, with a traceback
        error = ConnectionResetError(104, "Connection reset by peer")
        record = logging.getLogger().makeRecord(
            "root", logging.ERROR, gateway, 1060, text, (), (ConnectionResetError, error, None)
        )
        logging.getLogger().handle(record)

    py4j_reports("Exception while sending command. (running)")
    assert "(running)" in capsys.readouterr().err  # the JVM gone while running: an error
    logs.stopping_now()
    try:
        py4j_reports("Exception while sending command. (stopping)")
        logging.getLogger("cdc_sync.sinks").error("a real error while stopping")
    finally:
        logs._stopping.clear()
    console = capsys.readouterr().err
    assert "(stopping)" not in console and "a real error while stopping" in console
    assert (
        "DEBUG root: Exception while sending command. (stopping)"
        in (tmp_path / "job.log").read_text()
    )


def test_verbose_console_shows_everything_and_keeps_spark_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    settings = setup_logging(verbose=True, directory=tmp_path)
    logging.getLogger("cdc_sync.job.settle.applier").debug("detailed")
    assert "detailed" in capsys.readouterr().err
    assert settings.jvm_log is None  # the JVM writes to this console


def _metrics() -> BatchMetrics:
    metrics = BatchMetrics(7, records=447, changes=373, compacted=161, dead_lettered=2)
    metrics.sinks["search"] = WriteResult(applied=150, fenced=11)
    metrics.sinks["redis"] = WriteResult(applied=159, fenced=0, failures=[_failure(), _failure()])
    metrics.tables[CUSTOMERS] = TableProgress(100, 9, 1_000_000)
    metrics.tables[ORDERS] = TableProgress(61, 8, 998_000)
    metrics.stages.update({"decode": 7.4, "fold": 2.1})
    metrics.seconds = 1.9
    return metrics


def _failure() -> RecordFailure:
    return RecordFailure(None, "ResponseError", "refused")  # type: ignore[arg-type]


def test_batch_line_is_one_short_line() -> None:
    line = batch_line(_metrics(), now_ms=1_001_300)
    assert line == (
        "batch 7: 447 records, 161 changes; search 150/11 redis 159/0 (2 failed) "
        "(applied/fenced); 2 dead-lettered; lag 1.3 s; 11.4 s"
    )
    assert "\n" not in line


def test_batch_line_counts_the_documents_a_batch_rendered() -> None:
    metrics = _metrics()
    metrics.documents = 300
    assert "(applied/fenced); 300 documents rendered; 2 dead-lettered" in batch_line(metrics, 0)


def _snapshot_batch(batch_id: int, rows: dict[TableId, int], streamed: int = 0) -> BatchMetrics:
    metrics = BatchMetrics(batch_id, compacted=sum(rows.values()) + streamed)
    for table, count in rows.items():
        metrics.tables[table] = TableProgress(count, 1, 1, snapshot_rows=count)
    if streamed:
        metrics.tables.setdefault(ORDERS, TableProgress(streamed, 2, 2))
    return metrics


def test_snapshot_progress_counts_rows_per_table_then_closes_with_a_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    screen = io.StringIO()
    view = SnapshotProgress(
        {CUSTOMERS: 100, ORDERS: None},
        expect_snapshot=True,
        console=Console(file=screen, force_terminal=True, width=120),
    )
    view.start()
    assert view.progress is not None
    view(_snapshot_batch(0, {CUSTOMERS: 60, ORDERS: 5}))
    view(_snapshot_batch(1, {CUSTOMERS: 40}))
    tasks = {task.description: task for task in view.progress.tasks}
    assert (tasks["shop.customers"].completed, tasks["shop.customers"].total) == (100, 100)
    assert (tasks["shop.orders"].completed, tasks["shop.orders"].total) == (5, None)
    with caplog.at_level(logging.INFO, logger=CONSOLE):
        view(_snapshot_batch(2, {}, streamed=3))  # streaming only: the initial load is over
    assert view.done
    assert "snapshot: 105 rows of 2 table(s) synced" in caplog.text
    assert "shop.customers" in screen.getvalue()


def test_snapshot_progress_stays_closed_without_snapshot_rows() -> None:
    view = SnapshotProgress(
        {CUSTOMERS: 10}, expect_snapshot=False, console=Console(file=io.StringIO())
    )
    view.start()
    view(_snapshot_batch(0, {}, streamed=4))
    assert view.progress is None
    view.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _heartbeats(batch_id: int, source_ts_ms: int | None = 1_000_000) -> BatchMetrics:
    """A heartbeat-only batch: a record of the heartbeat table, no routed table."""
    metrics = BatchMetrics(batch_id, records=1, changes=1, compacted=1)
    metrics.sinks["search"] = WriteResult(applied=0, fenced=0)
    metrics.source_ts_ms = source_ts_ms
    return metrics


def test_heartbeat_batches_print_nothing_then_one_idle_line_a_minute() -> None:
    clock = Clock()
    lines = BatchLine(lambda: 0x1A2B3C8, clock=clock)
    shown = []
    for second in range(1, 181):  # three idle minutes, a heartbeat batch a second
        clock.now = 1000.0 + second
        shown.append(lines.console_line(_heartbeats(second), now_ms=1_000_800))
    idle = [line for line in shown if line is not None]
    assert idle == [
        f"idle {took}: 60 heartbeat batches since the last line; lag 0.8 s; watermark 0/1A2B3C8"
        for took in ("60 s", "2 min", "3 min")
    ]


def test_a_batch_that_changes_a_table_is_shown_and_restarts_the_idle_minute() -> None:
    clock = Clock()
    lines = BatchLine(clock=clock)
    clock.now += 50
    assert lines.console_line(_heartbeats(0)) is None
    clock.now += 5
    line = lines.console_line(_metrics(), now_ms=1_001_300)
    assert line is not None and line.startswith("batch 7: 447 records")
    clock.now += 59
    assert lines.console_line(_heartbeats(8)) is None  # a minute after the change, not the start
    clock.now += 1
    idle = lines.console_line(_heartbeats(9, source_ts_ms=None))
    assert idle == "idle 60 s: 2 heartbeat batches since the last line; watermark none yet"


@pytest.mark.parametrize(
    "change",
    [
        {"malformed": 1},
        {"tombstones": 1},
        {"dead_lettered": 1},
    ],
)
def test_a_batch_that_rejected_something_is_never_quiet(change: dict[str, int]) -> None:
    metrics = _heartbeats(1)
    for name, value in change.items():
        setattr(metrics, name, value)
    assert BatchLine().console_line(metrics) is not None


def test_the_log_file_and_verbose_console_keep_every_batch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], restore_logging: None
) -> None:
    setup_logging(verbose=False, directory=tmp_path)
    BatchLine()(_heartbeats(41))
    assert "batch 41" not in capsys.readouterr().err  # quiet on the console
    assert "batch 41: 1 records, 1 changes" in (tmp_path / "job.log").read_text()
    setup_logging(verbose=True, directory=None)
    BatchLine()(_heartbeats(42))
    assert "batch 42: 1 records, 1 changes" in capsys.readouterr().err
