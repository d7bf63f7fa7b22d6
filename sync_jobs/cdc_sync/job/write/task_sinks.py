"""The row sinks (search, cache) and the Postgres filler, opened from picklable settings.

The driver ships a `TaskSinkSpec` to executor tasks; each Python worker opens its clients once
per spec and keeps them for the tasks it runs next (Spark reuses Python workers), so a task pays
no connection set-up. The driver opens its own sinks from the same spec (`job.runner`) for
`ensure_target` and the in-process path: one place decides how a row sink is built.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cdc_sync.core.retry import RetryObserver, RetryPolicy
from cdc_sync.core.settings import Connections
from cdc_sync.job.write.health_relay import RelayObserver
from cdc_sync.job.write.unavailable import SourceFiller
from cdc_sync.mapping import MappingFile
from cdc_sync.schema.catalog import ConverterModes
from cdc_sync.sinks.base import Sink

DEBEZIUM_DEFAULTS = ConverterModes()


@dataclass(frozen=True)
class TaskSinkSpec:
    """Where the row sinks and Postgres are, and how writes retry: no clients, no observer."""

    search_client: str
    search_url: str | None  # None: no table routes to search
    redis_url: str | None  # None: no table routes to the cache
    tombstone_retention_seconds: int
    retry: RetryPolicy  # its observer is left out (set where the sinks are opened)
    # The unchanged-TOAST filler reads here (the connector's database, `debezium.database`);
    # None: no filler.
    source_conninfo: str | None = None
    modes: ConverterModes = DEBEZIUM_DEFAULTS
    relay: tuple[str, int] | None = None  # the driver's HealthRelay, for executor tasks

    @classmethod
    def for_job(
        cls,
        mapping: MappingFile,
        connections: Connections,
        retry: RetryPolicy,
        modes: ConverterModes = DEBEZIUM_DEFAULTS,
        source_conninfo: str | None = None,
    ) -> TaskSinkSpec:
        """The routed row sinks; a routed sink without a configured URL is an error.
        `source_conninfo`: the database the TOAST filler reads (None: no filler)."""
        routes = list(mapping.tables.values())
        return cls(
            search_client=connections.search_client,
            search_url=connections.require("search_url") if any(r.search for r in routes) else None,
            redis_url=connections.require("redis_url") if any(r.cache for r in routes) else None,
            tombstone_retention_seconds=mapping.tombstone_retention_seconds,
            retry=dataclasses.replace(retry, observer=None),
            source_conninfo=source_conninfo,
            modes=modes,
        )

    def without_row_sinks(self) -> TaskSinkSpec:
        """The same settings with no row sink: a write only fills and routes."""
        return dataclasses.replace(self, search_url=None, redis_url=None)

    def open_sinks(self, observer: RetryObserver | None) -> list[Sink]:
        retry = dataclasses.replace(self.retry, observer=observer)
        sinks: list[Sink] = []
        if self.search_url is not None:
            from cdc_sync.sinks.search import SearchSink

            sinks.append(
                SearchSink(
                    self.search_client,
                    self.search_url,
                    tombstone_retention_seconds=self.tombstone_retention_seconds,
                    retry=retry,
                )
            )
        if self.redis_url is not None:
            from cdc_sync.sinks.redis import RedisSink

            sinks.append(RedisSink(self.redis_url, self.tombstone_retention_seconds, retry))
        return sinks

    def open_filler(self) -> SourceFiller | None:
        if self.source_conninfo is None:
            return None
        return SourceFiller(self.source_conninfo, self.modes)


@dataclass
class TaskSinks:
    sinks: list[Sink]
    filler: SourceFiller | None
    users: int = 0  # tasks of this process using them now

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        if self.filler is not None:
            self.filler.close()


# Specs whose clients a process keeps open while no task uses them: one per consumer of the
# log of a job, with room. Beyond it the least recently used idle ones are closed: a process
# that outlives its jobs (the driver of a test session, a reused Python worker) would otherwise
# hold a Postgres connection per job it ever ran, until Postgres refuses clients.
KEPT_IDLE_SPECS = 8

_opened: dict[TaskSinkSpec, TaskSinks] = {}  # least recently used first
_opening = threading.Lock()


@contextmanager
def task_sinks(spec: TaskSinkSpec) -> Iterator[TaskSinks]:
    """This process's sinks for `spec`, opened on first use and kept for the next tasks; their
    retries report to the driver's relay."""
    with _opening:
        opened = _opened.pop(spec, None)
        if opened is None:
            observer = RelayObserver(spec.relay) if spec.relay is not None else None
            opened = TaskSinks(spec.open_sinks(observer), spec.open_filler())
        _opened[spec] = opened
        opened.users += 1
    try:
        yield opened
    finally:
        with _opening:
            opened.users -= 1
            _close_idle(KEPT_IDLE_SPECS)


def release_task_sinks(spec: TaskSinkSpec) -> None:
    """Close this process's clients of `spec` unless a task uses them (a job that ends)."""
    with _opening:
        opened = _opened.get(spec)
        if opened is not None and opened.users == 0:
            del _opened[spec]
            opened.close()


def _close_idle(kept: int) -> None:
    idle = [spec for spec, opened in _opened.items() if opened.users == 0]
    for spec in idle[: max(0, len(idle) - kept)]:
        _opened.pop(spec).close()
