"""Each sink's raw ingest rate, measured in the same run on the same rows as the job gets them.

search: versioned (`external_gte`) `_bulk` requests of the job's own size (`BULK_CHUNK`) through
the job's own search backend, then re-index bulks in steady state (after a warm-up, see
`search_update_rate`); redis: HSET of the row JSON and version, 500 commands per pipeline;
delta: one deltalake MERGE of all rows into a new table. Each writes to scratch targets it
removes after.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import redis
from deltalake import DeltaTable, write_deltalake
from psycopg.rows import dict_row

from cdc_sync.mapping import MappingFile, TableRoute
from cdc_sync.sinks.search.backends import open_backend
from cdc_sync.sinks.search.client import BULK_CHUNK

CHUNK = 500  # Redis commands per pipeline
RAW_TABLES = ("shop.customers", "shop.orders")  # the N parents and 10 N children


UPDATE_CHUNK = 10
UPDATE_SECONDS = 30.0  # the stand-in stalls for seconds about once or twice a minute
# Steady state: the re-index rate is measured once this many bulks in a row took less than
# STEADY_BULK_SECONDS (or after WARMUP_SECONDS at most): whatever the server does lazily after
# a load is not what a stream of updates meets for hours.
STEADY_BULKS = 10
STEADY_BULK_SECONDS = 0.2
WARMUP_SECONDS = 60.0


@dataclass(frozen=True)
class RawRates:
    rows: int
    per_sink: dict[str, float]  # rows/s, new rows
    search_updates: float  # documents/s re-indexing existing documents of the loaded index
    search_cpu_seconds: float | None  # the search server's CPU for the raw insert of `rows`
    search_update_bulk_seconds: list[float]  # each re-index bulk's seconds
    search_update_warmup_seconds: float  # back-to-back re-index bulks before steady state

    @property
    def slowest(self) -> tuple[str, float]:
        name = min(self.per_sink, key=lambda n: self.per_sink[n])
        return name, self.per_sink[name]


def _json_safe(value: Any) -> Any:
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    return value


def read_rows(pg_url: str, mapping: MappingFile) -> dict[str, list[dict[str, Any]]]:
    """The routed columns of the raw tables, JSON-safe, in key order."""
    rows: dict[str, list[dict[str, Any]]] = {}
    with psycopg.connect(pg_url, row_factory=dict_row) as conn:
        for name in RAW_TABLES:
            route = _route(mapping, name)
            columns = ", ".join(route.columns) if route.columns else "*"
            fetched = conn.execute(f"SELECT {columns} FROM {name} ORDER BY id".encode())
            rows[name] = [{k: _json_safe(v) for k, v in r.items()} for r in fetched]
    return rows


def _route(mapping: MappingFile, name: str) -> TableRoute:
    return next(r for t, r in mapping.tables.items() if str(t) == name)


def search_rate(
    url: str, client_kind: str, mapping: MappingFile, rows: dict[str, list[dict[str, Any]]]
) -> float:
    """Into scratch indices with the routes' own field mappings (analysis costs the same)."""
    backend = open_backend(client_kind, url, timeout_seconds=60)
    names = [f"bench_raw_{table.split('.')[1]}" for table in rows]
    try:
        for index, table in zip(names, rows, strict=True):
            search = _route(mapping, table).search
            assert search is not None
            backend.create_index(index, dict(search.mapping), {}, f"{index}_alias")
        started = time.monotonic()
        for index, table_rows in zip(names, rows.values(), strict=True):
            for start in range(0, len(table_rows), BULK_CHUNK):
                lines: list[dict[str, Any]] = []
                for version, row in enumerate(table_rows[start : start + BULK_CHUNK], start=start):
                    header = {"_index": index, "_id": str(row["id"]), "version": version + 1}
                    lines += [{"index": header | {"version_type": "external_gte"}}, row]
                answer = backend.bulk(lines)
                if answer.get("errors"):
                    raise RuntimeError(f"raw search bulk into {index} reported item errors")
        return sum(len(r) for r in rows.values()) / (time.monotonic() - started)
    finally:
        backend.close()


def search_update_rate(
    url: str, client_kind: str, rows: dict[str, list[dict[str, Any]]]
) -> tuple[float, list[float], float]:
    """Re-index existing documents of the largest scratch index, 10 per bulk, back to back for
    ~30 s once in steady state: what a stream of updates costs the server (inserts alone can
    hide it; see docs/performance.md), each bulk's seconds (the server's own stalls show there),
    and the seconds of warm-up before steady state."""
    backend = open_backend(client_kind, url, timeout_seconds=300)
    table, table_rows = max(rows.items(), key=lambda item: len(item[1]))
    index = f"bench_raw_{table.split('.')[1]}"
    rng = random.Random(1)
    version = len(table_rows) + 1

    def one_bulk() -> float:
        nonlocal version
        lines: list[dict[str, Any]] = []
        for row in rng.sample(table_rows, UPDATE_CHUNK):
            version += 1
            header = {"_index": index, "_id": str(row["id"]), "version": version}
            lines += [{"index": header | {"version_type": "external_gte"}}, row]
        sent = time.monotonic()
        backend.bulk(lines)
        return time.monotonic() - sent

    try:
        found = steady_bulks(one_bulk)
        return UPDATE_CHUNK * len(found.timed) / found.seconds, found.timed, found.warmup_seconds
    finally:
        backend.close()


@dataclass(frozen=True)
class SteadyBulks:
    warmup: list[float]  # each warm-up bulk's seconds
    warmup_seconds: float
    steady: bool  # False: the warm-up ended at its time limit, not by the rule
    timed: list[float]  # each timed bulk's seconds
    seconds: float  # the timed bulks' wall time


def steady_bulks(
    one_bulk: Callable[[], float],
    seconds: float = UPDATE_SECONDS,
    warmup_limit: float = WARMUP_SECONDS,
) -> SteadyBulks:
    """`one_bulk` (it returns its seconds) back to back: first until STEADY_BULKS in a row took
    less than STEADY_BULK_SECONDS (the server's lazy work after a load is done) or for
    `warmup_limit` seconds at most, then timed for `seconds` (at least one bulk)."""
    warmup: list[float] = []
    warming = time.monotonic()
    fast = 0
    while fast < STEADY_BULKS and time.monotonic() - warming < warmup_limit:
        warmup.append(one_bulk())
        fast = fast + 1 if warmup[-1] < STEADY_BULK_SECONDS else 0
    warmup_seconds = time.monotonic() - warming
    timed: list[float] = []
    started = time.monotonic()
    while not timed or time.monotonic() - started < seconds:
        timed.append(one_bulk())
    return SteadyBulks(
        warmup, warmup_seconds, fast >= STEADY_BULKS, timed, time.monotonic() - started
    )


def wait_quantile(bulk_seconds: list[float], share: float = 0.01) -> float:
    """The wait that `share` of writes arriving at random moments exceed, from the server's
    back-to-back bulks alone: one arriving during a bulk waits at least the rest of it, so
    P(wait > x) = sum(max(0, d - x)) / sum(d). A lower bound on that percentile of freshness
    for anything the server writes while it is kept as busy (near the highest draining rate);
    a lighter load sees fewer stalls."""
    total = sum(bulk_seconds)
    if total <= 0:
        return 0.0
    low, high = 0.0, max(bulk_seconds)
    for _ in range(50):  # bisection: the share falls as x rises
        middle = (low + high) / 2
        if sum(max(0.0, d - middle) for d in bulk_seconds) / total > share:
            low = middle
        else:
            high = middle
    return high


def drop_scratch_indices(url: str, client_kind: str, rows: dict[str, list[dict[str, Any]]]) -> None:
    backend = open_backend(client_kind, url, timeout_seconds=300)
    client = backend.client  # type: ignore[attr-defined]
    for table in rows:
        client.indices.delete(index=f"bench_raw_{table.split('.')[1]}", ignore_unavailable=True)
    backend.close()


def redis_rate(url: str, rows: dict[str, list[dict[str, Any]]]) -> float:
    client = redis.Redis.from_url(url)
    try:
        started = time.monotonic()
        for table, table_rows in rows.items():
            for start in range(0, len(table_rows), CHUNK):
                pipe = client.pipeline(transaction=False)
                for version, row in enumerate(table_rows[start : start + CHUNK], start=start):
                    key = f"benchraw:{table}:{row['id']}"
                    pipe.hset(key, mapping={"row": json.dumps(row), "version": version + 1})
                pipe.execute()
        rate = sum(len(r) for r in rows.values()) / (time.monotonic() - started)
        for key in client.scan_iter("benchraw:*", count=5000):
            client.unlink(key)
        return rate
    finally:
        client.close()


def delta_rate(scratch: Path, rows: dict[str, list[dict[str, Any]]]) -> float:
    tables = {t: pa.Table.from_pylist(r).append_column(
        "_cdc_version", pa.array(range(len(r)), pa.int64())) for t, r in rows.items()}  # fmt: skip
    try:
        elapsed = 0.0
        for table, source in tables.items():
            path = str(scratch / table)
            write_deltalake(path, source.slice(0, 0))
            started = time.monotonic()
            (
                DeltaTable(path)
                .merge(source, "t.id = s.id", source_alias="s", target_alias="t")
                .when_matched_update_all(predicate="s._cdc_version >= t._cdc_version")
                .when_not_matched_insert_all()
                .execute()
            )
            elapsed += time.monotonic() - started
        return sum(t.num_rows for t in tables.values()) / elapsed
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def measure(
    pg_url: str,
    mapping: MappingFile,
    search_url: str,
    client_kind: str,
    redis_url: str,
    scratch: Path,
    search_cpu: Callable[[], float] | None = None,
) -> RawRates:
    """`search_cpu`: reads the search server's CPU seconds, to tell what the raw insert cost it."""
    rows = read_rows(pg_url, mapping)
    try:
        cpu_before = search_cpu() if search_cpu else 0.0
        search = search_rate(search_url, client_kind, mapping, rows)
        cpu = search_cpu() - cpu_before if search_cpu else None
        updates, update_bulks, warmup = search_update_rate(search_url, client_kind, rows)
    finally:
        drop_scratch_indices(search_url, client_kind, rows)
    return RawRates(
        sum(len(r) for r in rows.values()),
        {
            "search": search,
            "redis": redis_rate(redis_url, rows),
            "delta": delta_rate(scratch, rows),
        },
        updates,
        cpu,
        update_bulks,
        warmup,
    )
