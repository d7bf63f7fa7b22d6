"""The freshness probe of the search-freeze fault (invariant 8: no sink waits for another).

While the search server is frozen, the one row of adv.probe (schema.sql) is updated every
`interval` seconds, `n` counting up, and each update is timed from its commit until the cache
and the warehouse show it (a value of `n` or later: a later update supersedes it). The cache is
read by key (HGET), the warehouse by reading the one-row table, each through its sink's
read-back module; search is not polled (a request to a frozen server blocks until it times out).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import redis

from cdc_sync.core.model import TableId
from cdc_sync.core.settings import Connections
from cdc_sync.mapping import MappingFile
from cdc_sync.sinks.delta import readback as delta_readback
from cdc_sync.sinks.redis import readback as cache_readback

PROBE_TABLE = TableId("adv", "probe")
PROBE_ID = 1
PROBE_INTERVAL_SECONDS = 0.5
# "Within a few seconds": their usual commit -> visible is about a second; this leaves room
# for a loaded 2-core machine and Delta upkeep between batches, and none for waiting on search
# (its requests time out after 30 s).
PROBE_DEADLINE_SECONDS = 10.0
SINKS = ("redis", "delta")  # the consumers (job.consumers) the probe times
FLAT_CONSUMERS = ("search", "redis", "delta")
POLL_SECONDS = 0.1


@dataclass
class Update:
    n: int
    committed: float  # monotonic
    seen: dict[str, float] = field(default_factory=dict)  # sink -> seconds after commit


@dataclass(frozen=True)
class SinkFreshness:
    """Commit -> visible of the updates in one sink; `unseen`: never shown within the wait."""

    updates: int
    p50: float | None
    p99: float | None
    max: float | None
    unseen: int

    def text(self) -> str:
        if self.max is None:
            return f"none of {self.updates} seen"
        seen = f"p50 {self.p50:.2f} s, p99 {self.p99:.2f} s, max {self.max:.2f} s"
        return seen + (f", {self.unseen} of {self.updates} unseen" if self.unseen else "")


def freshness(seconds: list[float], updates: int) -> SinkFreshness:
    if not seconds:
        return SinkFreshness(updates, None, None, None, updates)
    ordered = sorted(seconds)
    p50, p99 = ordered[0], ordered[0]
    if len(ordered) > 1:
        cuts = statistics.quantiles(ordered, n=100, method="inclusive")
        p50, p99 = cuts[49], cuts[98]
    return SinkFreshness(updates, p50, p99, ordered[-1], updates - len(seconds))


@dataclass(frozen=True)
class FreezeReport:
    """What a search freeze showed: how fresh the cache and the warehouse stayed, and how many
    batches each flat consumer committed while search was frozen."""

    seconds: float
    freshness: dict[str, SinkFreshness]  # redis, delta
    commits: dict[str, int]  # search, redis, delta

    def check(self) -> None:
        """Invariant 8: every update showed in the cache and the warehouse within
        PROBE_DEADLINE_SECONDS while the search consumer committed nothing (one batch at most:
        its write may have been answered just before the freeze)."""
        for sink, fresh in self.freshness.items():
            late = fresh.unseen or fresh.max is None or fresh.max > PROBE_DEADLINE_SECONDS
            assert fresh.updates > 0 and not late, (
                f"{sink} waited for the frozen search server: {fresh.text()} "
                f"(limit {PROBE_DEADLINE_SECONDS:g} s; {self.text()})"
            )
        assert self.commits["search"] <= 1, f"search was not frozen: {self.text()}"

    def summary(self) -> str:
        """One line for the soak's table: p50 / p99 per sink, search's commits."""
        sinks = ", ".join(
            f"{sink} p50/p99 {fresh.p50 or 0:.2f}/{fresh.p99 or 0:.2f} s"
            for sink, fresh in self.freshness.items()
        )
        updates = self.freshness["redis"].updates
        return f"{sinks} ({updates} updates); search committed {self.commits['search']}"

    def text(self) -> str:
        sinks = "; ".join(f"{sink} {fresh.text()}" for sink, fresh in self.freshness.items())
        commits = ", ".join(f"{name} {n}" for name, n in self.commits.items())
        return f"{sinks}; batches committed while frozen: {commits}"


class FreshnessProbe:
    """Updates adv.probe every `interval` s in a thread of its own until `finish()`, timing
    each update until the cache and the warehouse show it."""

    def __init__(self, mapping: MappingFile, connections: Connections, interval: float) -> None:
        route = mapping.tables[PROBE_TABLE]
        assert route.cache is not None and route.delta is not None, "adv.probe routes to both"
        self.cache_route, self.delta_route = route.cache, route.delta
        self.warehouse = Path(connections.require("warehouse"))
        self.cache = redis.Redis.from_url(connections.require("redis_url"))
        self.pg = psycopg.connect(connections.require("pg_url"), autocommit=True)
        row = self.pg.execute(b"SELECT n FROM adv.probe WHERE id = %s", (PROBE_ID,)).fetchone()
        assert row is not None, "adv.probe has no row to update (schema.sql inserts it)"
        self.next_n = int(row[0]) + 1
        self.interval = interval
        self.updates: list[Update] = []
        self._writing = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="freshness-probe", daemon=True)

    def start(self) -> None:
        self._writing.set()
        self._thread.start()

    def finish(self, wait_seconds: float) -> dict[str, SinkFreshness]:
        """Stop updating; wait up to `wait_seconds` for the last updates to show; per sink,
        how fresh the updates were."""
        self._writing.clear()
        deadline = time.monotonic() + wait_seconds
        while not all(len(u.seen) == len(SINKS) for u in self.updates):
            if time.monotonic() > deadline:
                break
            time.sleep(POLL_SECONDS)
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join()
        self.cache.close()
        self.pg.close()
        return {
            sink: freshness(
                [u.seen[sink] for u in self.updates if sink in u.seen], len(self.updates)
            )
            for sink in SINKS
        }

    def _run(self) -> None:
        next_write = time.monotonic()
        while not self._stop.is_set():
            if self._writing.is_set() and time.monotonic() >= next_write:
                self._write()
                next_write += self.interval
            self._poll()
            time.sleep(POLL_SECONDS)

    def _write(self) -> None:
        n = self.next_n
        self.next_n += 1
        self.pg.execute(b"UPDATE adv.probe SET n = %s WHERE id = %s", (n, PROBE_ID))
        self.updates.append(Update(n, time.monotonic()))

    def _poll(self) -> None:
        for sink, read in (("redis", self._cache_n), ("delta", self._delta_n)):
            waiting = [u for u in self.updates if sink not in u.seen]
            if not waiting:
                continue
            shown, now = read(), time.monotonic()
            for update in waiting:
                if shown is not None and shown >= update.n:
                    update.seen[sink] = now - update.committed

    def _cache_n(self) -> int | None:
        row: Any = cache_readback.row(self.cache, self.cache_route, PROBE_TABLE, str(PROBE_ID))
        return None if row is None else int(row["n"])

    def _delta_n(self) -> int | None:
        rows = delta_readback.table_rows(self.warehouse, self.delta_route)
        found = [int(r["n"]) for r in rows if r["id"] == PROBE_ID]
        return found[0] if found else None
