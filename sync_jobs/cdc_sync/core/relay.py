"""Lines from Spark's worker processes to the job's driver, while they run.

Executor tasks and the Python data source's planner run in processes Spark starts: their
logging is configured by no one (a record below WARNING is dropped, a warning goes to the
worker's stderr, which the quiet console sends to `spark.log`), and their results reach the
driver only when they end. So the driver listens on a small TCP port (the job's task relay,
on the driver's host, which every executor reaches) and a worker sends one JSON line per event:
a sink's health (`job.write.health_relay`) or a log record (`relay_logs`), which the driver
logs as its own, to its console and `job.log`. Sending is best effort: a lost line never fails
the work that sent it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

SEND_TIMEOUT_SECONDS = 2.0
# After a log line could not be sent, a worker sends none for this long: a relay it cannot reach
# (a firewall between executors and the driver) costs each line the send timeout, and the
# source's read loop logs each transient broker error.
PAUSE_AFTER_FAILURE_SECONDS = 60.0
LOG_EVENT = "log"  # the event of a relayed log record
# A line several workers send alike (each consumer's planner decides the same data loss, and
# checks it again when it plans the batch's partitions) is logged once in this long.
SAME_LINE_SECONDS = 60.0
# The loggers whose records a worker relays: the Kafka source's (its planner's decisions, its
# readers' transient broker errors). Executor tasks' sink waits reach the driver as health
# events instead (`job.write.health_relay`), which the driver words itself.
RELAYED = "cdc_sync.source"


def worker_name() -> str:
    """The sending process, as the driver's lines name it."""
    return f"{socket.gethostname()}:{os.getpid()}"


def send_line(address: tuple[str, int], payload: Mapping[str, Any]) -> bool:
    """One JSON line to the driver's relay at `address`: whether it went (a failure is logged
    here, at DEBUG)."""
    line = json.dumps({**payload, "task": worker_name()}, default=str)
    try:
        with socket.create_connection(address, timeout=SEND_TIMEOUT_SECONDS) as conn:
            conn.sendall(line.encode() + b"\n")
    except OSError as exc:
        log.debug("a line to the driver's relay %s failed: %s", address, exc)
        return False
    return True


class RelayedLogs(logging.Handler):
    """Sends each record to the driver's relay, formatted here (its arguments and traceback
    need not cross)."""

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(logging.INFO)
        self.address = address
        self._paused_until = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        if time.monotonic() < self._paused_until:
            return  # the relay was unreachable a moment ago
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            sent = send_line(
                self.address,
                {
                    "event": LOG_EVENT,
                    "logger": record.name,
                    "level": record.levelno,
                    "message": message,
                },
            )
            if not sent:
                self._paused_until = time.monotonic() + PAUSE_AFTER_FAILURE_SECONDS
        except Exception:
            self.handleError(record)


def relay_logs(address: tuple[str, int] | None) -> None:
    """In a process whose logging nobody configured (a Spark worker's), the `RELAYED` records
    from INFO up go to the driver's relay at `address`; once per process and address. A process
    with handlers of its own (the driver, a test session) keeps its configuration."""
    if address is None or logging.getLogger().handlers:
        return
    relayed = logging.getLogger(RELAYED)
    if any(isinstance(h, RelayedLogs) and h.address == address for h in relayed.handlers):
        return
    for handler in [h for h in relayed.handlers if isinstance(h, RelayedLogs)]:
        relayed.removeHandler(handler)  # a driver restarted on another port
    relayed.addHandler(RelayedLogs(address))
    if relayed.level == logging.NOTSET or relayed.level > logging.INFO:
        relayed.setLevel(logging.INFO)


class RelayedRecords:
    """The driver's side: the record each relayed log line carries, re-made as the driver's
    own, a line that came alike within `SAME_LINE_SECONDS` (from any worker) left out."""

    def __init__(self, window_seconds: float = SAME_LINE_SECONDS) -> None:
        self.window_seconds = window_seconds
        self._last: dict[tuple[str, int, str], float] = {}
        self._lock = threading.Lock()  # the relay handles each connection in a thread

    def record(self, report: Mapping[str, Any]) -> logging.LogRecord | None:
        """None when `report` is no log line, or the same line came a moment ago."""
        if report.get("event") != LOG_EVENT:
            return None
        name = str(report.get("logger") or RELAYED)
        level = int(report.get("level") or logging.INFO)
        text = str(report.get("message"))
        now = time.monotonic()
        with self._lock:
            self._last = {k: t for k, t in self._last.items() if now - t < self.window_seconds}
            if (name, level, text) in self._last:
                return None
            self._last[(name, level, text)] = now
        message = f"{text} (in {report.get('task')})"
        return logging.getLogger(name).makeRecord(name, level, "(relayed)", 0, message, (), None)
