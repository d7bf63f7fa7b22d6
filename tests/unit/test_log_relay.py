"""Log records of a process nobody configured logging in (a Spark worker's) reach the driver."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest

from cdc_sync.core.relay import RelayedLogs, RelayedRecords, relay_logs
from cdc_sync.job.write.health import SinkHealth
from cdc_sync.job.write.health_relay import HealthRelay

WORKER = """
import logging, sys
from cdc_sync.core.relay import relay_logs
relay_logs((sys.argv[1], int(sys.argv[2])))
relay_logs((sys.argv[1], int(sys.argv[2])))  # twice: still one handler
assert len(logging.getLogger("cdc_sync.source").handlers) == 1  # the driver dedups lines alike
log = logging.getLogger("cdc_sync.source.python_kafka")
log.debug("not relayed: below INFO")
log.info("planned %d partitions in proportion", 3)
try:
    raise KeyError("gone")
except KeyError:
    log.warning("a transient read failed", exc_info=True)
logging.getLogger("urllib3").warning("not the source's")
logging.getLogger("cdc_sync.core.retry").warning("not the source's: relayed as health events")
"""


def test_a_worker_processes_records_reach_the_drivers_log_as_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    relay = HealthRelay(SinkHealth())
    try:
        host, port = relay.address
        with caplog.at_level(logging.DEBUG):
            subprocess.run([sys.executable, "-c", WORKER, host, str(port)], check=True)
            deadline = time.monotonic() + 10
            while len(relayed(caplog)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
        records = relayed(caplog)
    finally:
        relay.close()
    assert [r.levelno for r in records] == [logging.INFO, logging.WARNING]
    info, warning = (r.getMessage() for r in records)
    assert info.startswith("planned 3 partitions in proportion (in ")
    assert (
        warning.startswith("a transient read failed\nTraceback") and "KeyError: 'gone'" in warning
    )
    assert all(f":{os.getpid()})" not in r.getMessage() for r in records)  # the worker's pid
    assert not [r for r in caplog.records if "not " in r.getMessage()]


def relayed(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "cdc_sync.source.python_kafka"]


def test_a_process_with_its_own_logging_keeps_it() -> None:
    project = logging.getLogger("cdc_sync.source")
    before = list(project.handlers)
    assert logging.getLogger().handlers  # pytest's capture: a configured process
    relay_logs(("127.0.0.1", 1))
    assert project.handlers == before
    assert not any(isinstance(h, RelayedLogs) for h in project.handlers)


def test_an_unreachable_relay_is_not_asked_again_for_a_while(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gone = HealthRelay(SinkHealth())
    address = gone.address
    gone.close()  # nobody listens any more
    record = logging.getLogger("cdc_sync.source").makeRecord(
        "cdc_sync.source.python_kafka", logging.WARNING, __file__, 1, "a line", (), None
    )
    refused = RelayedLogs(address)
    refused.emit(record)  # the line is lost, the work goes on
    assert refused._paused_until > time.monotonic()

    relay = HealthRelay(SinkHealth())
    try:
        handler = RelayedLogs(relay.address)
        handler._paused_until = refused._paused_until  # as if it had just failed
        with caplog.at_level(logging.DEBUG):
            handler.emit(record)  # skipped while paused
            handler._paused_until = 0.0
            handler.emit(record)  # sent once the pause is over
            deadline = time.monotonic() + 10
            while not relayed(caplog) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.2)  # a line sent while paused would have arrived by now too
    finally:
        relay.close()
    assert len(relayed(caplog)) == 1


def test_a_line_several_workers_send_alike_is_logged_once_a_window() -> None:
    records = RelayedRecords(window_seconds=0.3)
    line = {"event": "log", "logger": "cdc_sync.source.data_loss", "level": 30, "message": "lost"}
    first = records.record({**line, "task": "vm:1"})
    assert first is not None and first.getMessage() == "lost (in vm:1)"
    assert records.record({**line, "task": "vm:2"}) is None  # another planner, same decision
    other = records.record({**line, "message": "lost elsewhere", "task": "vm:2"})
    assert other is not None
    assert records.record({"event": "waiting", "target": "search"}) is None  # no log line
    time.sleep(0.35)
    again = records.record({**line, "task": "vm:3"})
    assert again is not None and again.getMessage() == "lost (in vm:3)"
