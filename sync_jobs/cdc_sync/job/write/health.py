"""What each sink is doing right now: ok, waiting for it since when, or failed.

Fed by the retry rule's observer callbacks (`core.retry.RetryObserver`), so the waiting/failed
bookkeeping lives here once, not in each sink. Read from any thread (a future `cdc-sync status`,
tests) while the micro-batch writes in Spark's foreachBatch thread: guarded by a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import Enum


class SinkState(Enum):
    OK = "ok"
    WAITING = "waiting"
    FAILED = "failed"


@dataclass(frozen=True)
class SinkStatus:
    state: SinkState = SinkState.OK
    since: float | None = None  # wall-clock time of the first failure (waiting, failed)
    what: str | None = None  # the write that is waiting or failed
    error_class: str | None = None  # the latest failure's exception class
    failures: int = 0  # failed attempts of that write so far

    def describe(self) -> str:
        if self.state is SinkState.OK:
            return "ok"
        since = "?" if self.since is None else datetime.fromtimestamp(self.since, UTC).isoformat()
        return f"{self.state.value} since {since} ({self.what}): {self.error_class}"


class SinkHealth:
    """Per sink name, its latest `SinkStatus`; implements `RetryObserver`."""

    def __init__(self, sinks: Iterable[str] = ()) -> None:
        self._lock = threading.Lock()
        self._status: dict[str, SinkStatus] = {name: SinkStatus() for name in sinks}
        self._retries: dict[str, int] = {}  # failed attempts since start, per sink (metrics)

    def track(self, sinks: Iterable[str]) -> None:
        """List these sinks (as ok until they report otherwise)."""
        with self._lock:
            for name in sinks:
                self._status.setdefault(name, SinkStatus())

    def waiting(self, target: str, what: str, since: float, error: BaseException) -> None:
        self.record_waiting(target, what, since, type(error).__name__)

    def record_waiting(self, target: str, what: str, since: float, error_class: str) -> None:
        """`waiting`, told by name (a relayed report from an executor task)."""
        with self._lock:
            previous = self._status.get(target, SinkStatus())
            failures = previous.failures + 1 if previous.what == what else 1
            self._retries[target] = self._retries.get(target, 0) + 1
            self._status[target] = SinkStatus(SinkState.WAITING, since, what, error_class, failures)

    def recovered(self, target: str, what: str) -> None:
        with self._lock:
            self._status[target] = SinkStatus()

    def gave_up(self, target: str, what: str, since: float, error: BaseException) -> None:
        self.record_gave_up(target, what, since, type(error).__name__)

    def record_gave_up(self, target: str, what: str, since: float, error_class: str) -> None:
        with self._lock:
            previous = self._status.get(target, SinkStatus())
            self._status[target] = SinkStatus(
                SinkState.FAILED, since, what, error_class, previous.failures
            )

    def status(self) -> dict[str, SinkStatus]:
        """A snapshot: sink name -> status."""
        with self._lock:
            return dict(self._status)

    def retries(self) -> dict[str, int]:
        """Per sink, the transient failures retried since the job started (every sink listed)."""
        with self._lock:
            return {name: self._retries.get(name, 0) for name in self._status}
