"""Sink health and log lines from executor tasks to the driver, while the tasks still run.

Row sinks write in executor tasks, whose retries (`core.retry`) would otherwise report only to
the executor's stderr, and Spark accumulators reach the driver only when a task ends: a task
waiting minutes for a frozen sink would be invisible. So the driver listens on a small TCP port
(`HealthRelay`, on the driver's host, which every executor reaches) and each task's retry
observer (`RelayObserver`, picklable: it holds only the address) sends one JSON line per event
(`core.relay`). The driver logs it (naming the task's host and process) and updates
`SinkHealth`. The same port takes the log records of Spark's worker processes (the Kafka
source's planner and readers, `core.relay.relay_logs`), handled as the driver's own.
Reporting is best effort: a lost report never fails a write.
"""

from __future__ import annotations

import json
import logging
import socketserver
import threading
from datetime import UTC, datetime

from cdc_sync.core.relay import LOG_EVENT, RelayedRecords, send_line
from cdc_sync.job.write.health import SinkHealth

log = logging.getLogger(__name__)


class RelayObserver:
    """`core.retry.RetryObserver` for executor tasks: forwards each event to the driver."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.address = address

    def waiting(self, target: str, what: str, since: float, error: BaseException) -> None:
        self._send("waiting", target, what, since, type(error).__name__)

    def recovered(self, target: str, what: str) -> None:
        self._send("recovered", target, what, None, None)

    def gave_up(self, target: str, what: str, since: float, error: BaseException) -> None:
        self._send("gave_up", target, what, since, type(error).__name__)

    def _send(
        self, event: str, target: str, what: str, since: float | None, error: str | None
    ) -> None:
        payload = {"event": event, "target": target, "what": what, "since": since, "error": error}
        send_line(self.address, payload)


class HealthRelay:
    """Driver side: a loopback-or-driver-host TCP listener feeding `health`."""

    def __init__(self, health: SinkHealth, host: str = "127.0.0.1") -> None:
        relay = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                for line in self.rfile:
                    relay.receive(line)

        self.health = health
        self.logs = RelayedRecords()
        self._server = socketserver.ThreadingTCPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="sink-health-relay", daemon=True
        )
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def receive(self, line: bytes) -> None:
        try:
            report = json.loads(line)
            if report.get("event") == LOG_EVENT:
                record = self.logs.record(report)
                if record is not None:
                    logging.getLogger(record.name).handle(record)
                return
            event, target, what = report["event"], report["target"], report["what"]
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("sink health relay: unreadable report ignored")
            return
        task = report.get("task")
        if event == "recovered":
            log.warning("executor task %s: sink %s (%s) answered again", task, target, what)
            self.health.recovered(target, what)
            return
        since = float(report.get("since") or 0.0)
        error = str(report.get("error"))
        if event == "gave_up":
            log.error("executor task %s: gave up on sink %s (%s): %s", task, target, what, error)
            self.health.record_gave_up(target, what, since, error)
            return
        log.warning(
            "executor task %s: waiting for sink %s (%s) since %s: %s",
            task,
            target,
            what,
            datetime.fromtimestamp(since, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            error,
        )
        self.health.record_waiting(target, what, since, error)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
