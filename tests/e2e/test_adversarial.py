"""Adversarial convergence, bounded (issue 8, item 7): a seeded random workload over every column
type, TOAST-only updates, primary-key moves, deferred keys, savepoints, rollbacks and interleaved
transactions, with faults in between: kill -9 of the sync job subprocess mid-batch (restarted on
its checkpoint), a graceful capture restart with changes made while it was down, kill -9 of the
capture process (the embedded engine's JVM) while it streams, the Redis cache flushed while
running (repaired by an incremental snapshot), and the search server frozen (SIGSTOP) while the
workload writes. Kafka Connect worker kills: test_adversarial_connect.py. Long version: `make soak`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from cdc_sync.core.settings import Connections
from tests.adversarial.pipeline import Pipeline
from tests.adversarial.workload import (
    TABLES,
    Workload,
    create_schema,
    paced,
    paced_in_background,
    swap_deferred_keys,
)
from tests.e2e.conftest import with_path
from tests.fixtures.services import KafkaEndpoint, SearchServer
from tests.pg import private_database

pytestmark = pytest.mark.e2e

SEED = 8007
ADVERSARIAL_REDIS_DB = 8  # conftest: shop 3, types 4, schema evolution 5-7
LARGE_TRANSACTION_ROWS = 2000
FREEZE_SECONDS = 45.0


@pytest.fixture(scope="module")
def adversarial(
    pg_url: str,
    kafka: KafkaEndpoint,
    search_url: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Pipeline, Workload]]:
    root = tmp_path_factory.mktemp("adversarial")
    with private_database(pg_url, "adv_e2e") as database:
        connections = Connections(
            pg_url=database,
            kafka_bootstrap=kafka.bootstrap,
            kafka_flavor=kafka.flavor,
            search_url=search_url,
            search_client="opensearch",
            redis_url=with_path(redis_url, f"/{ADVERSARIAL_REDIS_DB}"),
            connect_url=None,
            warehouse=str(root / "warehouse"),
        )
        create_schema(database)
        workload = Workload(database, SEED)
        workload.seed_rows()
        workload.run(40)  # part of the initial snapshot
        pipeline = Pipeline.create(connections, root)
        pipeline.start()
        try:
            yield pipeline, workload
        finally:
            pipeline.stop()
            workload.close()


def test_converges_through_kill9_capture_restart_capture_kill9_and_cache_loss(
    adversarial: tuple[Pipeline, Workload],
) -> None:
    pipeline, workload = adversarial
    # (a) kill -9 of the job subprocess while a batch is in flight, restart on the checkpoint.
    writer = paced_in_background(workload, 150)
    assert pipeline.kill_job(), "no batch was in flight when the job was killed"
    writer.join()
    workload.large_transaction(LARGE_TRANSACTION_ROWS)
    writer = paced_in_background(workload, 100)
    pipeline.kill_job()
    writer.join()
    # (b) capture stopped while the workload goes on; restarted on its offsets and slot.
    pipeline.stop_capture()
    workload.run(60)
    pipeline.start_capture()
    paced(workload, 60)
    # (c) capture (the engine's JVM) killed with SIGKILL while it streams: it re-sends from its
    # last flushed offset on restart, and the sinks fence the duplicates.
    writer = paced_in_background(workload, 100)
    pipeline.kill_capture()
    writer.join()
    # Generous: under a loaded machine the large transaction's backlog took minutes (its
    # inserts applied, its deletes still queued: verify saw only extra rows meanwhile).
    report = pipeline.wait_converged(timeout_seconds=300)
    assert {t.source_count for t in report.tables} != {0}
    assert pipeline.initial_snapshots() == 1, "a capture restart snapshotted again"
    # (d) the cache is lost while running: verify names it, an incremental snapshot repairs it.
    pipeline.flush_cache()
    broken = pipeline.verify()
    lost = {
        (str(t.table), s.sink): len(s.missing)
        for t in broken.tables
        for s in t.sinks
        if not s.matches
    }
    assert lost, "verify did not report the flushed cache"
    assert {sink for _, sink in lost} == {"cache"}, broken.table()
    assert sum(lost.values()) == sum(t.source_count for t in broken.tables), broken.table()
    pipeline.request_resnapshot()
    paced(workload, 40)
    pipeline.wait_converged(timeout_seconds=180)
    # Nothing was malformed or refused: the dead-letter topic holds no record.
    assert pipeline.dead_letters() == 0
    assert pipeline.job.starts == 3


def test_search_server_frozen_the_job_waits_and_converges(
    adversarial: tuple[Pipeline, Workload], search_server: SearchServer
) -> None:
    """The search server answers nothing (SIGSTOP) while the workload writes: the job retries,
    logs that it waits for the sink, does not exit, and converges once the server is back."""
    if search_server.pid is None:
        pytest.skip("the search server is not a local process here: it cannot be frozen")
    pipeline, workload = adversarial
    pipeline.wait_converged(timeout_seconds=120)
    # Longer than the job's 30 s per-request sink timeout (cdc_sync.core.retry): a bulk sent
    # while frozen times out, and the job must wait, not end.
    pipeline.freeze_search(search_server.pid, FREEZE_SECONDS, lambda stop: write(workload, stop))
    pipeline.wait_converged(timeout_seconds=180)
    assert pipeline.job.starts == 3  # still the process of the first test's last restart
    assert pipeline.dead_letters() == 0


def write(workload: Workload, stop: threading.Event) -> None:
    while not stop.is_set():
        workload.run(10)
        time.sleep(0.2)


def test_workload_is_deterministic_for_a_seed(pg_url: str) -> None:
    """The same seed on the same starting state runs the same statements: same final rows."""
    states = []
    for _ in range(2):
        with private_database(pg_url, "adv_seed") as database:
            create_schema(database)
            workload = Workload(database, SEED)
            workload.seed_rows()
            workload.run(200)
            workload.large_transaction(300)
            workload.run(100)
            workload.close()
            states.append(table_digests(database))
    assert states[0] == states[1]


def table_digests(database: str) -> list[tuple[str, int]]:
    with psycopg.connect(database) as conn:
        digests = []
        for table in TABLES:
            row = conn.execute(
                f"SELECT md5(string_agg(t::text, ',' ORDER BY t::text)), count(*) FROM {table} t"
            ).fetchone()
            assert row is not None
            digests.append((str(row[0]), int(row[1])))
        return digests


def test_deferred_primary_key_swap_converges(adversarial: tuple[Pipeline, Workload]) -> None:
    """Two rows of a DEFERRABLE-keyed table swap keys in one UPDATE: Debezium emits delete(a)
    create(b) delete(b) create(a), so key b's last change is a delete though Postgres holds b
    (found by this suite); the fold hands such a delete to Postgres (job.fold.fold_key)."""
    pipeline, workload = adversarial
    pipeline.wait_converged(timeout_seconds=120)  # the state before: converged
    assert swap_deferred_keys(workload.context()) is not None
    pipeline.wait_converged(timeout_seconds=30)
