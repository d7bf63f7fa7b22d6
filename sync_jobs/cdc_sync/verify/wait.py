"""Read your writes: wait until sinks have applied everything committed at or before a position.

An application commits, reads `pg_current_wal_lsn()`, and calls :func:`wait_for_lsn` (or
`cdc-sync wait --lsn`) with it. Each sink holds an applied watermark per topic, recorded by the
job (`job.observe.watermarks`): every transaction whose commit ends at or before it has been applied
there. The wait is over once each named sink's watermark of every awaited topic reaches the
position. Watermarks are read through each sink's `readback.watermarks`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import redis

from cdc_sync.core.lsn import format_lsn, parse_lsn
from cdc_sync.core.settings import Connections
from cdc_sync.mapping import MappingFile, TableRoute
from cdc_sync.sinks.delta import is_transient as delta_transient
from cdc_sync.sinks.delta import readback as delta_readback
from cdc_sync.sinks.redis import readback as cache_readback
from cdc_sync.sinks.redis.client import is_transient as cache_transient
from cdc_sync.sinks.search import readback as search_readback
from cdc_sync.sinks.search.backends import is_transient as search_transient
from cdc_sync.sinks.search.backends import open_backend

SINK_NAMES = ("search", "cache", "delta")
POLL_SECONDS = 0.2


class WaitError(ValueError):
    """Bad input to a wait (malformed LSN, unknown or unrouted sink): the message says which."""


@dataclass(frozen=True)
class SinkProgress:
    """What one sink has applied: topic -> watermark (None: none recorded for it yet)."""

    sink: str
    watermarks: dict[str, int | None]
    problem: str | None = None  # why nothing could be read this time

    def behind(self, target: int) -> dict[str, int | None]:
        return {t: w for t, w in self.watermarks.items() if w is None or w < target}

    def reached(self, target: int) -> bool:
        return bool(self.watermarks) and not self.behind(target)

    def describe(self, target: int) -> str:
        if self.problem is not None:
            return f"{self.sink}: {self.problem}"
        if not self.watermarks:
            return f"{self.sink}: no watermark recorded yet"
        behind = self.behind(target)
        if not behind:
            return f"{self.sink}: reached (at {format_lsn(min(self._known()))} or above)"
        parts = [
            f"{topic} {'none yet' if mark is None else format_lsn(mark)}"
            for topic, mark in sorted(behind.items())
        ]
        return f"{self.sink}: behind {format_lsn(target)}: {', '.join(parts)}"

    def _known(self) -> list[int]:
        return [w for w in self.watermarks.values() if w is not None]


@dataclass(frozen=True)
class WaitResult:
    target: int
    sinks: list[SinkProgress]
    seconds: float

    @property
    def reached(self) -> bool:
        return all(sink.reached(self.target) for sink in self.sinks)

    def report(self) -> str:
        verdict = "reached" if self.reached else "timed out waiting for"
        lines = [f"{verdict} {format_lsn(self.target)} after {self.seconds:.1f}s"]
        return "\n".join(lines + [f"  {sink.describe(self.target)}" for sink in self.sinks])


def wait_for_lsn(
    lsn: int | str,
    connections: Connections,
    *,
    sinks: Sequence[str] | None = None,
    mapping: MappingFile | None = None,
    timeout_seconds: float = 30.0,
    poll_seconds: float = POLL_SECONDS,
) -> WaitResult:
    """Wait until every named sink (default: every sink the mapping routes to, or every sink
    configured in `connections`) has applied all changes committed at or before `lsn`
    (`pg_current_wal_lsn()` text or an integer). With a mapping, each sink waits for every
    table routed to it; without, for every topic it holds a watermark for. The result says
    whether it was reached and how far each sink got; WaitError on bad input."""
    target = _target(lsn)
    names = _sink_names(sinks, mapping, connections)
    if not names:
        raise WaitError("no sink to wait for: name one with --sink, or configure its URL")
    with ExitStack() as stack:
        readers = [_reader(name, connections, mapping, stack) for name in names]
        started = time.monotonic()
        while True:
            progress = [reader.progress() for reader in readers]
            result = WaitResult(target, progress, time.monotonic() - started)
            if result.reached or result.seconds >= timeout_seconds:
                return result
            time.sleep(poll_seconds)


def _target(lsn: int | str) -> int:
    if isinstance(lsn, int):
        if not 0 <= lsn < 1 << 64:
            raise WaitError(f"LSN {lsn} is not a 64-bit WAL position")
        return lsn
    try:
        return parse_lsn(lsn)
    except ValueError as exc:
        raise WaitError(str(exc)) from exc


def _sink_names(
    sinks: Sequence[str] | None, mapping: MappingFile | None, connections: Connections
) -> list[str]:
    if sinks is None:
        if mapping is not None:
            return [n for n in SINK_NAMES if _routed(mapping, n)]
        configured = {
            "search": connections.search_url,
            "cache": connections.redis_url,
            "delta": connections.warehouse,
        }
        return [name for name in SINK_NAMES if configured[name]]
    unknown = [name for name in sinks if name not in SINK_NAMES]
    if unknown:
        raise WaitError(f"unknown sink {unknown[0]!r}; sinks: {', '.join(SINK_NAMES)}")
    if not sinks:
        raise WaitError(f"no sink named; sinks: {', '.join(SINK_NAMES)}")
    if mapping is not None:
        unrouted = [name for name in sinks if not _routed(mapping, name)]
        if unrouted:
            raise WaitError(f"{mapping.path} routes no table to sink {unrouted[0]!r}")
    return list(dict.fromkeys(sinks))


def _routed(mapping: MappingFile, sink: str) -> bool:
    return any(_serves(route, sink) for route in mapping.tables.values())


def _serves(route: TableRoute, sink: str) -> bool:
    section = {"search": route.search, "cache": route.cache, "delta": route.delta}[sink]
    return section is not None


Reader = Callable[[], dict[str, int]]


@dataclass(frozen=True)
class SinkReader:
    """Reads one sink's watermarks of the awaited topics (None: all it holds)."""

    sink: str
    read: Reader
    is_transient: Callable[[BaseException], bool]
    topics: list[str] | None

    def progress(self) -> SinkProgress:
        try:
            found = self.read()
        except Exception as exc:
            if not self.is_transient(exc):
                raise
            # Unreachable now: not reached yet, and the report says why.
            return SinkProgress(self.sink, {}, f"unreachable ({type(exc).__name__})")
        marks: dict[str, int | None] = (
            dict(found) if self.topics is None else {t: found.get(t) for t in self.topics}
        )
        return SinkProgress(self.sink, marks)


def _reader(
    name: str, connections: Connections, mapping: MappingFile | None, stack: ExitStack
) -> SinkReader:
    topics = (
        [mapping.topic(table) for table, route in mapping.tables.items() if _serves(route, name)]
        if mapping is not None
        else None
    )
    if name == "search":
        backend = open_backend(connections.search_client, connections.require("search_url"))
        stack.callback(backend.close)
        return SinkReader(
            name, lambda: search_readback.watermarks(backend), search_transient, topics
        )
    if name == "cache":
        client = redis.Redis.from_url(connections.require("redis_url"))
        stack.callback(client.close)
        prefixes = _cache_prefixes(mapping.tables.values()) if mapping is not None else [None]
        return SinkReader(
            name,
            lambda: _merged(cache_readback.watermarks(client, p) for p in prefixes),
            cache_transient,
            topics,
        )
    warehouse = Path(connections.require("warehouse"))
    return SinkReader(name, lambda: delta_readback.watermarks(warehouse), delta_transient, topics)


def _cache_prefixes(routes: Iterable[TableRoute]) -> Sequence[str | None]:
    return sorted({route.cache.prefix for route in routes if route.cache is not None})


def _merged(parts: Iterable[dict[str, int]]) -> dict[str, int]:
    merged: dict[str, int] = {}
    for part in parts:
        for topic, mark in part.items():
            merged[topic] = min(mark, merged.get(topic, mark))
    return merged
