"""Commit -> visible per sink, sampled while the workload runs (sync_jobs' demo/latency.py, but
with several probes in flight so a lagging job still yields samples).

Every `interval` seconds a probe writes a unique marker into `full_name` of one of the first
`rows` customers (a row whose previous probe was seen everywhere) and commits (row `rows` + 1
is the drain probe's); each sink is polled on a thread of its own (each has its own consumer
of the log: a slow answer of one must not delay what is seen in the others) for every probe
it has not shown yet: search by `_mget`, Redis by a pipelined HGET, Delta by one filtered read
of the table (less often: each read replays the table's log). `sinks` narrows
the sinks polled and `search_index` reads another index (bench_pgsync: pgsync's, search only).
"""

from __future__ import annotations

import json
import logging
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.dataset as ds
import redis
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from cdc_sync.core.model import TableId
from cdc_sync.core.settings import Connections
from cdc_sync.mapping import MappingFile
from cdc_sync.sinks.redis.client import is_transient as cache_transient
from cdc_sync.sinks.search.backends import is_transient as search_transient
from cdc_sync.sinks.search.backends import open_backend

TABLE = TableId("shop", "customers")
COLUMN = "full_name"
POLL_SECONDS = 0.025
DELTA_POLL_SECONDS = 0.1
SINKS = ("search", "redis", "delta")
TRANSIENT = {"search": search_transient, "redis": cache_transient, "delta": lambda _: False}
log = logging.getLogger(__name__)


@dataclass
class Probe:
    row_id: int
    marker: str
    committed: float  # monotonic
    seen: dict[str, float] = field(default_factory=dict)  # sink -> seconds after commit
    sinks: tuple[str, ...] = SINKS  # the sinks it must show in

    @property
    def done(self) -> bool:
        return len(self.seen) == len(self.sinks)


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    if len(values) == 1:
        return {"p50": values[0], "p95": values[0], "p99": values[0], "max": values[0]}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": cuts[49], "p95": cuts[94], "p99": cuts[98], "max": max(values)}


class Sampler:
    def __init__(
        self,
        mapping: MappingFile,
        connections: Connections,
        rows: int,
        sinks: tuple[str, ...] = SINKS,
        search_index: str | None = None,
    ) -> None:
        route = mapping.tables[TABLE]
        assert route.search and route.cache and route.delta, "the probe table routes everywhere"
        unknown = set(sinks) - set(SINKS)
        if unknown or not sinks:
            raise ValueError(f"sampler sinks {sinks}: expected some of {SINKS}")
        self.alias = search_index or route.search.index
        self.cache_route = route.cache
        self.search = open_backend(connections.search_client, connections.require("search_url"))
        # Only the sinks polled need their settings (pgsync's run has no warehouse).
        self.cache = (
            redis.Redis.from_url(connections.require("redis_url")) if "redis" in sinks else None
        )
        self.delta_path = (
            Path(connections.require("warehouse")) / route.delta.relative_path()
            if "delta" in sinks
            else None
        )
        self.pg = psycopg.connect(connections.require("pg_url"), autocommit=True)
        self._init_probes(sinks, rows)

    def _init_probes(self, sinks: tuple[str, ...], rows: int) -> None:
        """No probe yet, on `rows` rows, polled in `sinks`."""
        self.sinks = sinks
        self.rows = rows
        self.probes: list[Probe] = []
        self._busy: dict[int, Probe] = {}
        self._next_row = 0
        # The probing thread adds probes, each sink's poller marks and retires them.
        self._lock = threading.Lock()

    # -- probes --------------------------------------------------------------------------------

    def commit_probe(self) -> Probe | None:
        """One probe on a free row (None when every row still has a probe in flight)."""
        for _ in range(self.rows):
            row_id = self._next_row % self.rows + 1
            self._next_row += 1
            with self._lock:
                free = row_id not in self._busy
            if free:
                return self._probe(row_id)
        return None

    def drain_probe(self) -> Probe:
        """A probe on the row after the periodic ones: always free, it is awaited at once."""
        return self._probe(self.rows + 1)

    def _probe(self, row_id: int) -> Probe:
        marker = self._marker(row_id)
        self._write(row_id, marker)
        probe = Probe(row_id, marker, time.monotonic(), sinks=self.sinks)
        with self._lock:
            self.probes.append(probe)
            self._busy[row_id] = probe
        return probe

    # What a probe writes and where: overridden by samplers that probe other rows
    # (e2ebench.docprobe: a line, product or customer of an order document).
    def _marker(self, row_id: int) -> str:
        return f"probe-{uuid.uuid4().hex[:12]}"

    def _write(self, row_id: int, marker: str) -> None:
        self.pg.execute(
            f"UPDATE {TABLE} SET {COLUMN} = %s WHERE id = %s".encode(), (marker, row_id)
        )

    def poll_sink(self, sink: str) -> None:
        """One read of `sink` for every probe not seen there yet; a probe seen is timed at the
        read's start. Each sink is polled on a thread of its own (`_polling`): every sink has
        its own consumer of the log, and a slow answer of one must not delay what the sampler
        sees in the others."""
        with self._lock:
            waiting = [p for p in self._busy.values() if sink not in p.seen]
        if not waiting:
            return
        now = time.monotonic()
        try:
            values = self._reads()[sink]([p.row_id for p in waiting])
        except Exception as exc:
            # A busy server's slow answer (a document fan-out keeps search busy): the probes
            # wait for the next read, whose time is what they are measured at.
            if not TRANSIENT[sink](exc):
                raise
            log.info("sampler: %s read %s; polling again", sink, type(exc).__name__)
            return
        with self._lock:
            for probe in waiting:
                if values.get(probe.row_id) == probe.marker:
                    probe.seen[sink] = now - probe.committed
                if probe.done:
                    self._busy.pop(probe.row_id, None)

    def _reads(self) -> dict[str, Callable[[list[int]], dict[int, Any]]]:
        return {"search": self._search_values, "redis": self._cache_values,
                "delta": self._delta_values}  # fmt: skip

    def _search_values(self, ids: list[int]) -> dict[int, Any]:
        docs = self.search.mget(self.alias, [str(i) for i in ids])
        return {int(d["_id"]): d["_source"].get(COLUMN) for d in docs if d.get("found")}

    def _cache_values(self, ids: list[int]) -> dict[int, Any]:
        assert self.cache is not None
        pipe = self.cache.pipeline(transaction=False)
        for row_id in ids:
            pipe.hget(self.cache_route.key(TABLE, str(row_id)), "row")
        stored = pipe.execute()
        return {
            row_id: json.loads(value).get(COLUMN)
            for row_id, value in zip(ids, stored, strict=True)
            if value is not None
        }

    def _delta_values(self, ids: list[int]) -> dict[int, Any]:
        assert self.delta_path is not None
        try:
            dataset = DeltaTable(str(self.delta_path)).to_pyarrow_dataset()
        except TableNotFoundError:
            return {}
        found = dataset.to_table(columns=["id", COLUMN], filter=ds.field("id").isin(ids))
        return dict(zip(found["id"].to_pylist(), found[COLUMN].to_pylist(), strict=True))

    # -- running -------------------------------------------------------------------------------

    def run(self, interval: float, stop: threading.Event) -> None:
        """Probe every `interval` seconds while every sink is polled, until `stop`."""
        with self._polling():
            next_probe = time.monotonic()
            while not stop.is_set():
                self.commit_probe()
                next_probe += interval
                stop.wait(max(0.0, next_probe - time.monotonic()))

    def wait_visible(self, probe: Probe, timeout: float) -> bool:
        """Poll until `probe` is seen in every sink; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._polling():
            while not probe.done and time.monotonic() < deadline:
                time.sleep(POLL_SECONDS)
        return probe.done

    @contextmanager
    def _polling(self) -> Iterator[None]:
        """Every sink polled on a thread of its own while the block runs."""
        stop = threading.Event()
        pollers = [
            threading.Thread(target=self._poll_loop, args=(sink, stop), daemon=True)
            for sink in self.sinks
        ]
        for poller in pollers:
            poller.start()
        try:
            yield
        finally:
            stop.set()
            for poller in pollers:
                poller.join()

    def _poll_loop(self, sink: str, stop: threading.Event) -> None:
        # Each Delta read replays the table's log: less often.
        pause = DELTA_POLL_SECONDS if sink == "delta" else POLL_SECONDS
        while not stop.is_set():
            self.poll_sink(sink)
            stop.wait(pause)

    def take(self) -> list[Probe]:
        """The probes so far (resolved or not), and start a new set."""
        with self._lock:
            taken, self.probes = self.probes, []
        return taken

    def close(self) -> None:
        self.search.close()
        if self.cache is not None:
            self.cache.close()
        self.pg.close()


def latency_summary(probes: list[Probe]) -> dict[str, Any]:
    """p50/p95/p99/max per sink and for all sinks (the slowest sink of each probe); sinks the
    probes were not polled in are left out."""
    summary: dict[str, Any] = {"probes": len(probes), "unresolved": sum(not p.done for p in probes)}
    for sink in probes[0].sinks if probes else SINKS:
        summary[sink] = percentiles([p.seen[sink] for p in probes if sink in p.seen])
    summary["all"] = percentiles([max(p.seen.values()) for p in probes if p.done])
    return summary
