"""The benchmark's pipeline on a local stack of its own: embedded capture of connectors/shop.json
in this process, the sync job (`python -m cdc_sync.cli run`) as a subprocess so its CPU and RSS
are its own, sinks counted per table for the initial sync."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import redis
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from cdc_sync.connectors.engine import CaptureEngine
from cdc_sync.core.settings import Connections
from cdc_sync.mapping import MappingFile
from cdc_sync.sinks.search.backends import SearchBackend, open_backend
from tests.adversarial.child import ChildProcess
from tests.adversarial.pipeline import JobProcess, job_environment

ROOT = Path(__file__).resolve().parents[2]
MAPPING = ROOT / "mappings" / "shop.yaml"
CONNECTOR = ROOT / "connectors" / "shop.json"


def start_job(connections: Connections, run: Path, job_args: list[str]) -> JobProcess:
    """The job with its defaults plus `job_args` (the adversarial suite's smaller batches are
    not wanted here); returns once its streaming query runs, else stops it and raises."""
    job = JobProcess(
        MAPPING, run / "checkpoint", job_environment(connections, run / "state"), run / "job.log"
    )
    job.argv = [*job.argv[:6], "--checkpoint", str(run / "checkpoint"), *job_args]
    job.start()
    try:
        job.wait_up(timeout_seconds=300)
    except BaseException:  # the caller never gets the job to stop: stop it here
        job.stop()
        raise
    return job


def start_capture(
    connections: Connections, run: Path, partitions: int | None = None
) -> CaptureEngine:
    """The demo connector's capture; `partitions`: its topics' partition count instead of the
    connector's (records keep their key's partition: murmur2, as Connect does)."""
    connector = CONNECTOR
    if partitions is not None:
        document = json.loads(CONNECTOR.read_text())
        document["config"]["topic.creation.default.partitions"] = str(partitions)
        connector = run / "connector.json"
        connector.write_text(json.dumps(document, indent=2))
    capture = CaptureEngine.from_file(connector, connections, run / "capture")
    capture.start()
    return capture


def wait_captured(capture: CaptureEngine, stall_seconds: float = 120.0) -> None:
    """Until capture has published its snapshot, however long that takes while it makes
    progress: a fixed limit ended the 550,000-row run on the Tansu stand-in, whose produce rate
    falls as its partitions grow (477,202 records in 600 s, 2026-11-28). A TimeoutError once
    `stall_seconds` pass without a record published."""
    published = -1
    while True:
        try:
            capture.wait_ready(timeout_seconds=stall_seconds)
            return
        except TimeoutError:
            if capture.published == published:
                raise
            published = capture.published


@dataclass
class SinkCounter:
    """Rows each sink holds for the routed tables (sums over tables)."""

    mapping: MappingFile
    connections: Connections

    def __post_init__(self) -> None:
        self.search: SearchBackend = open_backend(
            self.connections.search_client,
            self.connections.require("search_url"),
            timeout_seconds=30,
        )
        self.cache = redis.Redis.from_url(self.connections.require("redis_url"))
        self.warehouse = Path(self.connections.require("warehouse"))

    def counts(self) -> dict[str, int]:
        search = delta = 0
        for route in self.mapping.tables.values():
            if route.search is not None:
                search += self._search_count(route.search.index)
            if route.delta is not None:
                delta += self._delta_count(self.warehouse / route.delta.relative_path())
        # Fresh server and no deletes yet: every key is a row (tombstone keys come with deletes).
        return {"search": search, "redis": int(self.cache.dbsize()), "delta": delta}

    def _search_count(self, alias: str) -> int:
        client = self.search.client  # type: ignore[attr-defined]
        if not client.indices.exists_alias(name=alias):
            return 0
        return int(client.count(index=alias)["count"])

    def _delta_count(self, path: Path) -> int:
        try:
            return int(DeltaTable(str(path)).to_pyarrow_dataset().count_rows())
        except TableNotFoundError:
            return 0

    def wait_all(
        self, expected: int, timeout: float, started: float, job: ChildProcess | None = None
    ) -> dict[str, float]:
        """Seconds from `started` until each sink holds `expected` rows; raises at once when
        `job` (the one writing them) has exited, with its log's tail, rather than after
        `timeout`."""
        reached: dict[str, float] = {}
        deadline = time.monotonic() + timeout
        while len(reached) < 3:
            if job is not None:
                job.raise_if_dead()
            for sink, count in self.counts().items():
                if sink not in reached and count >= expected:
                    reached[sink] = time.monotonic() - started
            if time.monotonic() > deadline:
                raise TimeoutError(f"initial sync: only {sorted(reached)} done after {timeout}s")
            time.sleep(0.5)
        return reached

    def close(self) -> None:
        self.search.close()
        self.cache.close()


class Closable(Protocol):
    def close(self) -> None: ...


class Stoppable(Protocol):
    def stop(self) -> None: ...


RUN_DATA = ("stack", "warehouse", "checkpoint", "capture")


def stop_run(
    closables: tuple[Closable | None, ...],
    job: Stoppable | None,
    capture: Stoppable | None,
    stack: Stoppable,
) -> None:
    """A run's teardown, in order: the readers and the workload, the job, capture, the stack."""
    for closing in closables:
        if closing is not None:
            closing.close()
    if job is not None:
        job.stop()
    if capture is not None:
        capture.stop()
    stack.stop()


def drop_run_data(run_dir: Path, names: tuple[str, ...] = RUN_DATA, keep: bool = False) -> None:
    """A run's data (its logs stay: the JSON points at them), unless it is to be kept."""
    if keep:
        return
    for name in names:
        shutil.rmtree(run_dir / name, ignore_errors=True)
