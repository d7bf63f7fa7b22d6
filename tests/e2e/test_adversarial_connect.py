"""Adversarial convergence with capture on a Kafka Connect worker (issue 8, item 7): the worker
JVM killed with SIGKILL inside its first offset-flush window after the initial snapshot (the
restart resumes at the snapshot's offset, with no last commit, and re-sends the transactions it
had streamed: issue 17, item 3), then while it streams the seeded workload; each time restarted
on the same properties, the connector resumes from its offsets topic (no second snapshot), the
records it sends again are fenced, and every sink converges with no dead letter. The long
version is `make soak`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cdc_sync.localstack.connect import worker_home
from tests.adversarial.pipeline import Pipeline
from tests.adversarial.workload import Workload, create_schema, paced, paced_in_background
from tests.e2e.conftest import adversarial_connections
from tests.e2e.sinks_state import clean_sinks
from tests.fixtures.services import KafkaEndpoint
from tests.pg import private_database

pytestmark = pytest.mark.e2e

SEED = 8009
CONNECT_REDIS_DB = 9  # test_adversarial: 8


def test_connect_worker_kill9_resumes_and_converges(
    pg_url: str, kafka: KafkaEndpoint, search_url: str, redis_url: str, tmp_path: Path
) -> None:
    if not (worker_home() / ".assembled").exists():
        pytest.skip(f"Kafka Connect worker not assembled in {worker_home()} (make bootstrap)")
    with private_database(pg_url, "adv_connect") as database:
        connections = adversarial_connections(
            database, kafka, search_url, redis_url, CONNECT_REDIS_DB, tmp_path
        )
        create_schema(database)
        workload = Workload(database, SEED)
        workload.seed_rows()
        workload.run(40)  # part of the initial snapshot
        pipeline = Pipeline.create(connections, tmp_path, capture="connect")
        clean_sinks(pipeline.mapping, connections)
        try:
            # Killed inside its first offset-flush window after the snapshot (issue 17, item 3):
            # the restart resumes at the snapshot's offset and re-sends what it streamed.
            pipeline.kill_capture_in_first_flush_window(lambda: workload.run(30))
            pipeline.job.start()
            pipeline.job.wait_up()
            # The snapshot and the re-sent transactions are in: the next kill hits a stream.
            pipeline.wait_converged(timeout_seconds=180)
            writer = paced_in_background(workload, 150)
            pipeline.kill_capture()
            writer.join()
            paced(workload, 40)
            report = pipeline.wait_converged(timeout_seconds=180)
            assert {t.source_count for t in report.tables} != {0}
            assert pipeline.initial_snapshots() == 1, "a restarted worker snapshotted again"
            assert pipeline.dead_letters() == 0
        finally:
            pipeline.stop()
            workload.close()
