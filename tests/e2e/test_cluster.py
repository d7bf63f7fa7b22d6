"""The job on a Spark standalone cluster, a worker killed mid-batch (issue 17, "On a real cluster").

A master and two workers started from the installed pyspark (tests/e2e/spark_cluster.py), one
core each, so the two executors are JVMs of their own with their own Python workers, apart from
the driver: `cdc-sync run` as a subprocess with `CDC_SYNC_SPARK_MASTER=spark://...` and
`--driver-batch-records 0`, so every batch is decoded, folded and written by executor tasks
(the executor write path, the version floors shipped to them, the health relay back to the
driver). Capture (`cdc-sync capture`) writes 4-partition topics. While the adversarial workload
runs (inserts, updates, deletes, primary-key moves, TOAST-only updates), the batch in flight is
held in its write stage: an ACCESS EXCLUSIVE lock on the parent table makes an executor task's
unchanged-TOAST read wait, and the Python worker whose Postgres connection waits names the
worker it runs under. That worker is killed with SIGKILL together with its executor JVM and
Python workers, the lock released (the task re-runs on the other executor), the worker restarted
(the master launches an executor on it, which joins the driver). Then the job's Redis, reached
through a proxy, is cut until an executor task's wait for it is logged by the driver (only the
health relay carries it there). Every sink must equal Postgres.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from cdc_sync.core import settings
from cdc_sync.core.kafka_clients import admin_config
from cdc_sync.core.settings import Connections
from cdc_sync.job.spark_session import MASTER_VAR
from cdc_sync.mapping import load_mapping
from tests.adversarial.capture import EngineCapture
from tests.adversarial.child import wait_for
from tests.adversarial.pipeline import (
    PYTHONPATH,
    JobProcess,
    Pipeline,
    connector_config,
    differences,
    job_environment,
    write_mapping,
)
from tests.adversarial.workload import Workload, create_schema, paced_in_background
from tests.e2e.conftest import adversarial_connections, with_path
from tests.e2e.cut_proxy import CutProxy
from tests.e2e.sinks_state import clean_sinks
from tests.e2e.spark_cluster import Proc, SparkCluster, socket_owner
from tests.e2e.spark_cluster import missing as cluster_missing
from tests.fixtures.services import KafkaEndpoint
from tests.pg import private_database

pytestmark = pytest.mark.e2e

SEED = 1717
PARTITIONS = 4
REDIS_DB = 11  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8, others 9-10
WORKERS = 2
OPERATIONS = 200  # workload operations while the job runs (~2-3 row changes each)
HELD_TABLE = "adv.parent"  # the table whose TOAST fill read is held by the lock
RELAYED = re.compile(r"executor task (\S+:(\d+)): waiting for sink redis")
DRIVER_WAIT = re.compile(r"^\S+ (\S+: )?waiting for sink redis", re.MULTILINE)  # its own step
ANSWERED = re.compile(r"sink redis .*answered again")  # the driver's wait for Redis ended
CUT_SECONDS = 30.0  # one cut of Redis while waiting for an executor task's relayed wait
# The executor's fill read (cdc_sync.schema.source_rows.read_columns) waiting for the lock; the
# workload's own reads of the table do not quote its name.
BLOCKED_FILL_READS = """
    SELECT client_port FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
      AND wait_event_type = 'Lock' AND client_port IS NOT NULL
      AND query LIKE 'SELECT %' AND position('FROM "adv"."parent" WHERE' IN query) > 0
"""


@dataclass
class ClusterRun:
    cluster: SparkCluster
    pipeline: Pipeline
    workload: Workload
    redis_proxy: CutProxy  # the job's way to Redis


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    if reason := cluster_missing():
        pytest.skip(f"Spark standalone cluster: {reason}")
    spark_cluster = SparkCluster(tmp_path_factory.mktemp("spark-cluster"), WORKERS, PYTHONPATH)
    try:
        spark_cluster.start()  # ready is awaited once capture runs
        yield spark_cluster
    finally:
        spark_cluster.stop()


@pytest.fixture(scope="module")
def cluster_run(
    cluster: SparkCluster,
    pg_url: str,
    kafka: KafkaEndpoint,
    search_url: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ClusterRun]:
    root = tmp_path_factory.mktemp("cluster-e2e")
    redis_address = urlsplit(redis_url)
    proxy = CutProxy((redis_address.hostname or "127.0.0.1", redis_address.port or 6379))
    with private_database(pg_url, "cluster_e2e") as database:
        connections = adversarial_connections(
            database, kafka, search_url, redis_url, REDIS_DB, root
        )
        create_schema(database)
        workload = Workload(database, SEED)
        workload.seed_rows()
        workload.run(40)  # part of the initial snapshot
        pipeline = _cluster_pipeline(connections, root, cluster, proxy.port)
        clean_sinks(pipeline.mapping, connections)
        try:
            pipeline.start_capture()
            cluster.wait_ready()
            pipeline.job.start()
            pipeline.job.wait_up()
            yield ClusterRun(cluster, pipeline, workload, proxy)
        finally:
            workload.close()
            pipeline.stop()
            proxy.close()


def _cluster_pipeline(
    connections: Connections, root: Path, cluster: SparkCluster, redis_proxy_port: int
) -> Pipeline:
    """The adversarial pipeline's parts, with 4-partition topics and the job on the cluster,
    writing to Redis through the proxy."""
    topic_prefix = f"cl{uuid.uuid4().hex[:6]}"
    mapping_path = write_mapping(root, topic_prefix)
    env = job_environment(connections, root / "state")
    config = connector_config(topic_prefix) | {"topic.creation.default.partitions": str(PARTITIONS)}
    connector = root / "connector.json"
    connector.write_text(json.dumps({"name": topic_prefix, "config": config}, indent=2))
    pg_url = connections.require("pg_url")
    capture = EngineCapture(connector, root, env, pg_url, config["slot.name"])
    proxied = with_path(f"redis://127.0.0.1:{redis_proxy_port}", f"/{REDIS_DB}")
    job_env = env | {
        settings.REDIS_URL: proxied,
        MASTER_VAR: cluster.url,
        "SPARK_CONF_DIR": str(cluster.conf_dir),  # spark-defaults.conf: loopback, small heaps
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    job = JobProcess(mapping_path, root / "checkpoints" / "main", job_env, root / "job.log")
    job.argv += ["--driver-batch-records", "0"]  # every batch on the executors
    mapping = load_mapping(mapping_path)
    return Pipeline(connections, root, topic_prefix, mapping_path, mapping, job, capture)


def test_worker_killed_mid_batch_converges(cluster_run: ClusterRun) -> None:
    cluster, pipeline, workload = cluster_run.cluster, cluster_run.pipeline, cluster_run.workload
    cluster.wait_app_cores(WORKERS)  # two executors, one per worker
    _assert_partitions(pipeline)

    # 1. A worker killed while its executor's task is in the write stage of a batch.
    # Held once part of it is committed, so the held batch carries a share of the workload.
    writer = paced_in_background(workload, OPERATIONS // 2)
    started = workload.changes
    wait_for("workload under way", lambda: workload.changes > started + 50, 120, 0.2)
    held = HeldWriteStage(pipeline.connections.require("pg_url"))
    try:
        victim, reader = held.hold(cluster)
        # The executor's Python worker imports this checkout's cdc_sync, not an installed one.
        assert PYTHONPATH in _environment(reader.pid).get("PYTHONPATH", ""), reader
        killed = cluster.kill_worker(victim)
        kinds = {proc.kind for proc in killed}
        assert {"worker JVM", "executor JVM", "Python worker"} <= kinds, killed
        assert reader in killed
        cluster.wait_workers(WORKERS - 1)  # the master saw the worker go
    finally:
        held.release()  # the held task, re-run on the other executor, goes on
    cluster.restart_worker(victim)  # registers while the workload goes on
    writer.join(timeout=300)
    assert not writer.is_alive(), "the workload did not finish"

    # 2. More of the workload; Redis cut meanwhile, until a task's wait for it reached the
    # driver through the health relay; the restarted worker's executor joins meanwhile.
    writer = paced_in_background(workload, OPERATIONS // 2)
    relayed = _relayed_wait(cluster_run, writer)
    cluster.wait_workers(WORKERS)
    cluster.wait_app_cores(WORKERS)  # the master launched an executor on it again,
    cluster.wait_executor_registered(victim)  # which joined the job
    writer.join(timeout=300)
    assert not writer.is_alive(), "the workload did not finish"

    report = pipeline.wait_converged(timeout_seconds=180)
    assert differences(report) == 0
    assert pipeline.dead_letters() == 0
    done = workload.done
    for kind in ("TOAST unchanged", "move parent primary key", "delete", "insert"):
        assert any(kind in label for label in done), f"no {kind!r} in the workload: {done}"
    driver_log = _driver_log(pipeline)
    # The driver lost the executor, a live executor ran the lost task again (attempt 1): the
    # survivor, or the restarted worker's new one (each consumer of the log has its own tasks
    # held by the lock, so the survivor's cores may both be busy until the restart),
    assert "Lost executor" in driver_log, "the driver lost no executor"
    live = [log for i in range(WORKERS) for log in cluster.executor_logs(i)]  # current starts
    assert _ran(live, r"Running task \d+\.[1-9]"), "no task attempt re-ran on a live executor"
    # and the relayed wait ended in a relayed recovery.
    assert f"executor task {relayed}: sink redis" in driver_log


def _environment(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    pairs = [item.decode(errors="replace").partition("=") for item in raw if b"=" in item]
    return {name: value for name, _, value in pairs}


def _ran(logs: list[Path], pattern: str) -> bool:
    return any(re.search(pattern, path.read_text(errors="replace")) for path in logs)


def _relayed_wait(run: ClusterRun, writer: threading.Thread, timeout_seconds: float = 240) -> str:
    """Cut the job's Redis until the driver logs an executor task's wait for it (relayed);
    returns the task (host:pid), whose pid must be a Python worker under a Spark worker.

    The Redis consumer's batch may be in a step the driver runs itself when the cut comes (a
    snapshot end's or TRUNCATE's scan of the cache): no executor task runs until it passes. So
    the cut lasts CUT_SECONDS at a time, with Redis back in between until the driver's wait
    ended, and more of the workload runs once `writer`'s is done, until a task's wait is
    relayed."""
    deadline = time.monotonic() + timeout_seconds
    found = None
    extra: list[threading.Thread] = []
    while found is None:
        assert time.monotonic() < deadline, "no executor's wait for Redis reached the driver"
        if not writer.is_alive():  # changes for the Redis consumer's tasks to write
            writer = paced_in_background(run.workload, 20)
            extra.append(writer)
        # Counted, not searched from an offset: the driver log is several files joined.
        seen = {pattern: _count(run, pattern) for pattern in (DRIVER_WAIT, ANSWERED)}
        with run.redis_proxy.cut():
            window = time.monotonic() + CUT_SECONDS
            while (found := RELAYED.search(_driver_log(run.pipeline))) is None:
                if time.monotonic() > window:
                    break
                run.pipeline.job.raise_if_dead()
                for index in range(len(run.cluster.workers)):
                    run.cluster.worker_processes(index)  # remembers the Python workers seen
                time.sleep(0.2)
        if found is None and _count(run, DRIVER_WAIT) > seen[DRIVER_WAIT]:

            def ended(before: int = seen[ANSWERED]) -> bool:
                return _count(run, ANSWERED) > before

            wait_for("the driver's wait for Redis to end", ended, 60, 0.2)
    for index in range(len(run.cluster.workers)):  # the task's worker may be new since
        run.cluster.worker_processes(index)
    for thread in extra:
        thread.join(timeout=300)
    python_workers = {p.pid for p in run.cluster.seen.values() if p.kind == "Python worker"}
    assert int(found.group(2)) in python_workers, (found.group(0), python_workers)
    return found.group(1)


def _assert_partitions(pipeline: Pipeline) -> None:
    topic = f"{pipeline.topic_prefix}.{HELD_TABLE}"
    admin = AdminClient(admin_config(pipeline.connections.require("kafka_bootstrap")))
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == PARTITIONS


def _count(run: ClusterRun, pattern: re.Pattern[str]) -> int:
    return len(pattern.findall(_driver_log(run.pipeline)))


def _driver_log(pipeline: Pipeline) -> str:
    """The job's console and its driver JVM's log (under its state directory)."""
    logs = [pipeline.job.log, *sorted((pipeline.root / "state").rglob("spark.log"))]
    return "\n".join(path.read_text(errors="replace") for path in logs)


class HeldWriteStage:
    """Holds one batch in its write stage: a TOAST-only update is committed, then the table is
    locked (ACCESS EXCLUSIVE) before the job gets to it, so the executor task that fills the
    unchanged values from Postgres waits on the lock inside its write stage."""

    def __init__(self, pg_url: str) -> None:
        self.pg_url = pg_url
        self.lock: psycopg.Connection[Any] | None = None

    def hold(self, cluster: SparkCluster, attempts: int = 5) -> tuple[int, Proc]:
        """(index of the worker the waiting task runs under, the Python worker that waits)."""
        for _ in range(attempts):
            with psycopg.connect(self.pg_url, autocommit=True) as conn:
                conn.execute(
                    "UPDATE adv.parent SET c_text = %s WHERE id = (SELECT min(id) FROM adv.parent)",
                    (f"held {uuid.uuid4().hex[:8]}",),
                )
            self._lock()
            found = self._waiting_reader(cluster, timeout_seconds=90)
            if found is not None:
                return found
            self.release()  # that batch had the row's values at hand: try again
        raise AssertionError(f"no executor task waited on the lock in {attempts} attempts")

    def _lock(self, timeout_seconds: float = 60.0) -> None:
        """The workload's interleaved transactions can hold a lock while waiting for this one:
        give up after 2 s and try again, never deadlock."""
        self.lock = psycopg.connect(self.pg_url)
        deadline = time.monotonic() + timeout_seconds
        while True:
            self.lock.execute("SET lock_timeout = '2s'")
            try:
                self.lock.execute(f"LOCK TABLE {HELD_TABLE} IN ACCESS EXCLUSIVE MODE")
                return
            except psycopg.errors.LockNotAvailable:
                self.lock.rollback()
                assert time.monotonic() < deadline, f"{HELD_TABLE} not locked in {timeout_seconds}s"

    def _waiting_reader(
        self, cluster: SparkCluster, timeout_seconds: float
    ) -> tuple[int, Proc] | None:
        deadline = time.monotonic() + timeout_seconds
        while time.monotonic() < deadline:
            cluster.raise_if_dead()
            with psycopg.connect(self.pg_url, autocommit=True) as conn:
                ports = [int(row[0]) for row in conn.execute(BLOCKED_FILL_READS).fetchall()]
            for index in range(len(cluster.workers)):
                processes = cluster.worker_processes(index)
                for port in ports:
                    if (owner := socket_owner(processes, port)) is not None:
                        return index, owner
            time.sleep(0.2)
        return None

    def release(self) -> None:
        if self.lock is not None:
            self.lock.close()  # rolls the transaction back: the lock goes
            self.lock = None
