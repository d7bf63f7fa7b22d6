"""One adversarial pipeline: capture and the sync job, each a subprocess in its own group.

The job runs as `python -m cdc_sync.cli run --mapping ... --checkpoint ...` with its settings in
`CDC_SYNC_*` variables, so a fault is a real `kill -9` of the job (its JVM and Python workers
included) and a restart reads the same checkpoint. Capture (tests/adversarial/capture.py: the
embedded engine as `cdc-sync capture`, or a Kafka Connect worker) runs the connector of
tests/adversarial/connector.json with the pipeline's own topics and slot; it can be stopped, or
killed with SIGKILL, and restarted on its offsets and slot. Used by tests/e2e/test_adversarial.py
and tests/adversarial/soak.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
import redis
import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from opensearchpy.exceptions import ConnectionError as SearchConnectionError

from cdc_sync.core import settings
from cdc_sync.core.kafka_clients import admin_config, consumer_config
from cdc_sync.core.settings import Connections
from cdc_sync.debezium.connector import load_connector, pg_env_from_url
from cdc_sync.debezium.notifications import parse_notification
from cdc_sync.debezium.signals import request_snapshot
from cdc_sync.job.consumers import consumer_checkpoint
from cdc_sync.mapping import MappingFile, load_mapping
from cdc_sync.verify.compare import Report, verify_all
from tests.adversarial.capture import Capture, ConnectCapture, EngineCapture
from tests.adversarial.child import PROJECT_ROOT, ChildProcess, frozen, wait_for
from tests.adversarial.probe import (
    FLAT_CONSUMERS,
    PROBE_DEADLINE_SECONDS,
    PROBE_INTERVAL_SECONDS,
    FreezeReport,
    FreshnessProbe,
)
from tests.adversarial.workload import CONNECTOR, MAPPING, TABLES
from tests.e2e.sinks_state import clean_sinks
from tests.pg import drop_slot

MAX_OFFSETS_PER_TRIGGER = 2000
MAINTAIN_EVERY_BATCHES = 3
# The adversarial workers' offset.flush.interval.ms (the local recipe's is 1 s, Kafka Connect's
# default 60 s): wide enough to write and kill inside one window.
CONNECT_OFFSET_FLUSH_MS = 20_000
STARTED_LINE = "sync job started"  # logged by cdc_sync.job.runner once the query runs
WAITING_LINE = "waiting for sink"  # logged by cdc_sync.core.retry while a sink does not answer
PYTHONPATH = os.pathsep.join(
    str(PROJECT_ROOT / part) for part in ("sync_jobs", "connectors", "infra", ".")
)


def write_mapping(directory: Path, topic_prefix: str) -> Path:
    """tests/adversarial/mapping.yaml with this pipeline's own topic prefix and dead letters."""
    document: dict[str, Any] = yaml.safe_load(MAPPING.read_text())
    document["source"]["topic_prefix"] = topic_prefix
    document["source"]["connector"] = str(CONNECTOR)
    document["dead_letter"]["topic"] = f"{topic_prefix}.dead_letter"
    for name, route in document["tables"].items():
        route["search"]["index"] = f"{topic_prefix}_{name.split('.')[1]}"
    path = directory / "mapping.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def connector_config(topic_prefix: str) -> dict[str, str]:
    """tests/adversarial/connector.json with this pipeline's topics, slot and publication.
    The slot survives a capture stop, so a restart streams what changed meanwhile;
    tests.pg.private_database drops it with the database."""
    return dict(load_connector(CONNECTOR).config) | {
        "topic.prefix": topic_prefix,
        "slot.name": f"{topic_prefix}_slot",
        "publication.name": f"{topic_prefix}_pub",
        "notification.sink.topic.name": f"{topic_prefix}.notifications",
        "slot.drop.on.stop": "false",
    }


def job_environment(connections: Connections, state: Path) -> dict[str, str]:
    """The job's and the tools' settings. CDC_SYNC_PG_URL is left unset: they must find the
    captured database (a private one, not the server's default) through the connector's
    `${env:CDC_SYNC_PG_*}` settings, as a deployment that sets only those does."""
    values = {
        **pg_env_from_url(connections.require("pg_url")),
        settings.KAFKA_BOOTSTRAP: connections.require("kafka_bootstrap"),
        settings.KAFKA_FLAVOR: connections.kafka_flavor,
        settings.SEARCH_URL: connections.require("search_url"),
        settings.SEARCH_CLIENT: connections.search_client,
        settings.REDIS_URL: connections.require("redis_url"),
        settings.WAREHOUSE: connections.require("warehouse"),
        settings.STATE_DIR_VAR: str(state),
        "PYTHONPATH": PYTHONPATH,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    return {k: v for k, v in os.environ.items() if not k.startswith("CDC_SYNC_")} | values


class JobProcess(ChildProcess):
    """`cdc-sync run` as a subprocess; `kill()` is SIGKILL to its whole process group."""

    def __init__(
        self,
        mapping: Path,
        checkpoint: Path,
        env: dict[str, str],
        log: Path,
        max_offsets_per_trigger: int = MAX_OFFSETS_PER_TRIGGER,
    ) -> None:
        argv = [
            sys.executable,
            "-m",
            "cdc_sync.cli",
            "run",
            "--mapping",
            str(mapping),
            "--checkpoint",
            str(checkpoint),
            "--trigger-seconds",
            "0.5",
            # Smaller than the default 20k: after a kill the backlog of ~60 kB parent documents
            # in one search bulk outlasted the client's 10 s read timeout on the local search
            # stand-in (five retries, then the job failed).
            # A few records (the soak's --max-offsets-per-trigger) put batch boundaries inside
            # transactions: deferrable-key swaps straddling batches, for one.
            "--max-offsets-per-trigger",
            str(max_offsets_per_trigger),
            # Delta upkeep between batches, as production runs it: the faults and the
            # convergence checks then cover compacted and vacuumed tables too.
            "--maintain-every",
            str(MAINTAIN_EVERY_BATCHES),
        ]
        super().__init__("sync job", argv, env, log)
        self.base_argv = list(argv)
        self.checkpoint = checkpoint

    def with_options(self, *options: str) -> None:
        """The next starts run with `options` added (none: the usual arguments)."""
        self.argv = [*self.base_argv, *options]

    def _queries(self, consumer: str | None = None) -> list[Path]:
        """The checkpoints of the job's streaming queries: one per consumer of the log
        (job.consumers), each with Spark's offsets/ and commits/ folders; or `consumer`'s."""
        if consumer is not None:
            return [consumer_checkpoint(self.checkpoint, consumer)]
        return sorted(path.parent for path in self.checkpoint.glob("**/offsets"))

    @staticmethod
    def _batches(query: Path, folder: str) -> list[int]:
        path = query / folder
        return [int(p.name) for p in path.iterdir() if p.name.isdigit()] if path.exists() else []

    def committed_batches(self, consumer: str | None = None) -> int:
        """Batches committed so far, all consumers together (grows when any commits), or
        consumer `consumer`'s (search, redis, delta, documents:<name>). By the highest batch
        id: Spark deletes old commit files (it keeps the last 100)."""
        return sum(
            max(self._batches(query, "commits"), default=-1) + 1
            for query in self._queries(consumer)
        )

    def in_flight(self, consumer: str | None = None) -> bool:
        """A consumer's batch is planned (its offsets written) and not yet committed; with
        `consumer`: that consumer's."""
        for query in self._queries(consumer):
            planned, committed = self._batches(query, "offsets"), self._batches(query, "commits")
            if planned and max(planned) > max(committed, default=-1):
                return True
        return False

    def wait_in_flight(self, timeout_seconds: float = 120.0) -> bool:
        """Until a batch is being processed; False when none started within the timeout."""
        deadline = time.monotonic() + timeout_seconds
        while not self.in_flight():
            self.raise_if_dead()
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True

    def wait_committed(
        self, more_than: int, timeout_seconds: float = 120.0, consumer: str | None = None
    ) -> None:
        """Until the queries (or `consumer`'s) have committed more than `more_than` batches."""
        deadline = time.monotonic() + timeout_seconds
        while self.committed_batches(consumer) <= more_than:
            self.raise_if_dead()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no batch committed in {timeout_seconds}s (log {self.log})")
            time.sleep(0.2)

    def wait_up(self, timeout_seconds: float = 180.0) -> None:
        """Until this start's streaming query runs (the job logs "sync job started")."""
        deadline = time.monotonic() + timeout_seconds
        while self.log.read_text(errors="replace").count(STARTED_LINE) < self.starts:
            self.raise_if_dead()
            if time.monotonic() > deadline:
                raise TimeoutError(f"sync job not started in {timeout_seconds}s: {self.log}")
            time.sleep(0.2)


@dataclass
class Pipeline:
    """Capture + job + the pipeline's own sinks (topic prefix, Redis db, indices, warehouse).

    `capture` is "engine" (`cdc-sync capture`, the embedded engine) or "connect" (a Kafka
    Connect worker of the pipeline's own): both are processes a fault can kill -9."""

    connections: Connections
    root: Path
    topic_prefix: str
    mapping_path: Path
    mapping: MappingFile
    job: JobProcess
    capture: Capture

    @classmethod
    def create(
        cls,
        connections: Connections,
        root: Path,
        capture: str = "engine",
        max_offsets_per_trigger: int = MAX_OFFSETS_PER_TRIGGER,
    ) -> Pipeline:
        topic_prefix = f"adv{uuid.uuid4().hex[:6]}"
        root.mkdir(parents=True, exist_ok=True)
        mapping_path = write_mapping(root, topic_prefix)
        env = job_environment(connections, root / "state")
        job = JobProcess(
            mapping_path,
            root / "checkpoints" / "main",
            env,
            root / "job.log",
            max_offsets_per_trigger,
        )
        pg_url = connections.require("pg_url")
        # `cdc-sync capture` takes its database from CDC_SYNC_PG_URL (the job does not).
        capture_env = env | {settings.PG_URL: pg_url}
        config = connector_config(topic_prefix)
        runner: Capture
        if capture == "engine":
            connector = root / "connector.json"
            connector.write_text(json.dumps({"name": topic_prefix, "config": config}, indent=2))
            runner = EngineCapture(connector, root, capture_env, pg_url, config["slot.name"])
        elif capture == "connect":
            runner = ConnectCapture(
                {"name": topic_prefix} | config,
                root / "connect",
                connections.require("kafka_bootstrap"),
                connections.kafka_flavor,
                pg_url,
                {"offset.flush.interval.ms": str(CONNECT_OFFSET_FLUSH_MS)},
            )
        else:
            raise ValueError(f"capture: expected engine or connect, got {capture!r}")
        mapping = load_mapping(mapping_path)
        return cls(connections, root, topic_prefix, mapping_path, mapping, job, runner)

    # -- capture ------------------------------------------------------------------------------

    def start_capture(self) -> None:
        self.capture.start()

    def stop_capture(self) -> None:
        self.capture.stop()

    def restart_capture(self) -> None:
        self.stop_capture()
        self.start_capture()

    def captured(self) -> int:
        """Records capture has published to the tables' topics so far."""
        return sum(topic_size(self.connections, f"{self.topic_prefix}.{t}") for t in TABLES)

    def kill_capture_in_first_flush_window(self, write: Callable[[], object]) -> None:
        """The Connect worker started (not running yet); once its first offset flush after the
        initial snapshot is stored, `write()` and kill -9 as soon as part of it is published,
        before the next flush (CONNECT_OFFSET_FLUSH_MS): the restart resumes from the snapshot's
        offset, without a last commit, and re-sends the transactions streamed after it
        (issue 17, item 3). No second snapshot."""
        assert isinstance(self.capture, ConnectCapture), "the embedded engine flushes each batch"
        self.start_capture()
        stored: list[dict[str, Any]] = []

        def snapshot_offset_stored() -> bool:
            self.capture.raise_if_dead()
            stored[:] = self._stored_offsets()
            return any(_after_the_snapshot(offset) for offset in stored)

        # The count comes from the read that saw the flush: a second read spent the window.
        wait_for("the snapshot's offset flushed", snapshot_offset_stored, 300.0, 0.2)
        flushed = len(stored)
        before = self.captured()
        write()
        wait_for("capture streaming", lambda: self.captured() > before, 60.0, 0.1)
        self.capture.kill()
        if len(self._stored_offsets()) != flushed:
            raise AssertionError("the worker flushed its offsets again before the kill")
        self.capture.start()

    def _stored_offsets(self) -> list[dict[str, Any]]:
        """This connector's offsets in its worker's offsets topic, oldest first."""
        assert isinstance(self.capture, ConnectCapture)
        values = read_topic(self.connections, self.capture.offsets_topic)
        return [json.loads(value) for value in values if value]

    def recreate_topics(self) -> list[str]:
        """Capture and job stopped; the tables' topics deleted, the capture's offsets and slot
        dropped: the next capture start re-creates the topics, from offset 0, with a new
        snapshot, and the job's checkpoint points past their ends. Returns the deleted topics."""
        assert isinstance(self.capture, EngineCapture), "the embedded engine's offsets are a file"
        self.job.stop()
        self.stop_capture()
        self.capture.forget_offsets()
        drop_slot(self.connections.require("pg_url"), self.capture.ready.slot)
        self.capture.ready.holder = None
        topics = [f"{self.topic_prefix}.{t}" for t in (*TABLES, "adv.cdc_sync_heartbeat")]
        admin = AdminClient(admin_config(self.connections.require("kafka_bootstrap")))
        for future in admin.delete_topics(topics, operation_timeout=30).values():
            future.result(timeout=60)
        wait_for("topics deleted", lambda: self.captured() == 0, 60.0, 0.5)
        return topics

    def refused_start(self, other_url: str) -> str:
        """`cdc-sync run` with CDC_SYNC_PG_URL on another database than the connector's: it
        must exit at start (before Spark). Returns what it printed."""
        env = self.job.env | {settings.PG_URL: other_url}
        argv = [sys.executable, "-m", "cdc_sync.cli", "run", "--mapping", str(self.mapping_path)]
        argv += ["--checkpoint", str(self.root / "checkpoints" / "refused")]
        done = subprocess.run(
            argv, cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        output = done.stdout + done.stderr
        assert done.returncode != 0, (
            f"the job started with {settings.PG_URL}={other_url}:\n{output}"
        )
        return output

    def kill_capture(self, timeout_seconds: float = 120.0) -> None:
        """kill -9 of capture while it streams (it has published since this call began), then a
        restart on its offsets and slot: Debezium re-sends from its last flushed offset."""
        before = self.captured()
        wait_for("capture streaming", lambda: self.captured() > before, timeout_seconds, 0.5)
        self.capture.kill()
        self.capture.start()

    # -- the whole pipeline -------------------------------------------------------------------

    def start(self) -> None:
        clean_sinks(self.mapping, self.connections)
        self.start_capture()
        self.job.start()
        self.job.wait_up()

    def stop(self) -> None:
        try:
            self.job.stop()
        finally:  # capture must not outlive the run, even when the job's stop is interrupted
            self.stop_capture()

    # -- faults and repairs -------------------------------------------------------------------

    def kill_job(self) -> bool:
        """kill -9 of the job, mid-batch when one starts within a minute, then a restart on the
        same checkpoint. Returns whether a batch was in flight when it was killed."""
        if self.job.in_flight():  # the batch the last kill interrupted: let it commit first
            # Generous: on a loaded 2-core machine a restarted job's first batch took minutes.
            self.job.wait_committed(self.job.committed_batches(), timeout_seconds=600)
        mid_batch = self.job.wait_in_flight(timeout_seconds=60)
        self.job.kill()
        self.job.start()
        self.job.wait_up()
        return mid_batch

    def freeze_search(
        self, search_pid: int, seconds: float, write: Callable[[threading.Event], None]
    ) -> FreezeReport:
        """The search server SIGSTOPped for `seconds` (always SIGCONTed) while `write(stop)` runs
        in a thread and the freshness probe updates adv.probe twice a second; then the job must
        have logged that it waits for the sink, without exiting or restarting, and the other
        consumers must have kept applying (FreezeReport.check: invariant 8)."""
        starts, log_before = self.job.starts, len(self.job.log.read_bytes())
        stop = threading.Event()
        writer = threading.Thread(target=write, args=(stop,), daemon=True)
        probe = FreshnessProbe(self.mapping, self.connections, PROBE_INTERVAL_SECONDS)
        writer.start()
        try:
            with frozen(search_pid):
                probe.start()
                before = self._commits()
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    self.job.raise_if_dead()
                    time.sleep(0.5)
                during = {name: n - before[name] for name, n in self._commits().items()}
        finally:
            stop.set()
            writer.join()
            freshness = probe.finish(PROBE_DEADLINE_SECONDS)  # its last updates, after the thaw
        report = FreezeReport(seconds, freshness, during)
        logged = self.job.log.read_bytes()[log_before:].decode(errors="replace")
        assert WAITING_LINE in logged, f"no {WAITING_LINE!r} in the job log:\n{self.job.tail()}"
        # The job's console (its stdout and stderr): its own one-line reports, no client's
        # traceback per timed-out request (issue 28).
        assert "Traceback" not in logged, f"a traceback on the job's console:\n{logged[-3000:]}"
        self.job.raise_if_dead()
        assert self.job.starts == starts, "the sync job was restarted"
        report.check()
        return report

    def _commits(self) -> dict[str, int]:
        """Batches each flat sink's consumer has committed so far."""
        return {name: self.job.committed_batches(name) for name in FLAT_CONSUMERS}

    def flush_cache(self) -> None:
        client = redis.Redis.from_url(self.connections.require("redis_url"))
        client.flushdb()
        client.close()

    def request_resnapshot(self) -> None:
        """The documented repair of a lost sink: an incremental snapshot of every table
        (what `cdc-sync connectors snapshot` signals), applied by the running job."""
        config = load_connector(CONNECTOR).config
        with psycopg.connect(self.connections.require("pg_url"), autocommit=True) as conn:
            request_snapshot(conn, config, list(TABLES))

    # -- checks -------------------------------------------------------------------------------

    def verify(self) -> Report:
        """As the job reads: CDC_SYNC_PG_URL unset, the connector's CDC_SYNC_PG_* settings."""
        pg = pg_env_from_url(self.connections.require("pg_url"))
        return verify_all(self.mapping, replace(self.connections, pg_url=None, environment=pg))

    def wait_converged(self, timeout_seconds: float = 180.0) -> Report:
        deadline = time.monotonic() + timeout_seconds
        while True:
            self.job.raise_if_dead()
            self.capture.raise_if_dead()
            try:
                report = self.verify()
            except SearchConnectionError:  # the search stand-in is slow under a big bulk
                if time.monotonic() > deadline:
                    raise
                continue
            if report.converged:
                return report
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"sinks did not converge in {timeout_seconds}s:\n{report.table()}"
                )
            time.sleep(1.0)

    def initial_snapshots(self) -> int:
        """Initial snapshots Debezium started, by its notifications (1: a restart resumed)."""
        notifications = read_topic(self.connections, f"{self.topic_prefix}.notifications")
        parsed = [parse_notification(value) for value in notifications]
        return sum(
            1
            for n in parsed
            if n is not None and n.aggregate_type == "Initial Snapshot" and n.type == "STARTED"
        )

    def dead_letters(self) -> int:
        """Records on the pipeline's dead-letter topic (0 when it was never created)."""
        return topic_size(self.connections, self.mapping.dead_letter_topic)


def topic_size(connections: Connections, topic: str) -> int:
    consumer = Consumer(
        consumer_config(
            connections.require("kafka_bootstrap"),
            connections.kafka_flavor,
            group_id=f"adv-{uuid.uuid4().hex[:8]}",
        )
    )
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return 0
        total = 0
        for partition in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
            total += high - low
        return total
    finally:
        consumer.close()


def read_topic(connections: Connections, topic: str) -> list[bytes | None]:
    """Every record value of a (small) topic, in offset order within each partition.

    One assignment of every partition, read until each reports its end: a Connect offsets
    topic has 25 partitions, and a watermark query and a fetch per partition took ~10 s on
    Tansu, half a 20 s offset-flush window (the connect kill -9 test then missed it)."""
    consumer = Consumer(
        consumer_config(
            connections.require("kafka_bootstrap"),
            connections.kafka_flavor,
            group_id=f"adv-{uuid.uuid4().hex[:8]}",
            **{"enable.partition.eof": True},
        )
    )
    values: list[bytes | None] = []
    try:
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return values
        pending = set(metadata.partitions)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in pending])
        deadline = time.monotonic() + 30
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: partitions {sorted(pending)} not read to their end")
            message = consumer.poll(1)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    pending.discard(message.partition() or 0)
                continue
            values.append(message.value())
        return values
    finally:
        consumer.close()


def _after_the_snapshot(offset: dict[str, Any]) -> bool:
    """A Debezium offset stored after the snapshot: its last record's, or a streamed change's."""
    return offset.get("last_snapshot_record") is True or "snapshot" not in offset


def rows_compared(report: Report) -> int:
    return sum(t.source_count * len(t.sinks) for t in report.tables)


def differences(report: Report) -> int:
    return sum(
        len(s.missing) + len(s.extra) + len(s.different) for t in report.tables for s in t.sinks
    )
