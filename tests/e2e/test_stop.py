"""A stop that stops (issue 28, item 3): `cdc-sync run` exits within 10 s of SIGTERM or Ctrl-C
(exit code 0) while its search consumer's batch waits for a search server that answers nothing,
Spark's JVM and workers end after it, and nothing is lost: the abandoned batch is not committed
and re-runs on restart.

The job runs as a process (tests/adversarial/pipeline.py JobProcess) on a search server of the
test's own, which it freezes (SIGSTOP: the server keeps its sockets and answers nothing, so a
request blocks until the client's 30 s timeout), leaving the session's server to other tests.
SIGTERM goes to the job's process only, as an orchestrator sends it to a container's first
process; Ctrl-C (SIGINT) to its whole process group, as a terminal does (the Python workers get
it too). An idle job stopped by SIGTERM to its whole group, as systemd's default KillMode
(control-group) sends it, must not fail on Spark's JVM ending beside it (it did: a py4j
traceback, exit code 1), nor print py4j's report of it as an error.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdc_sync.localstack.process import Started
from tests.adversarial.child import Stopped, frozen
from tests.adversarial.pipeline import JobProcess, Pipeline
from tests.adversarial.workload import Workload
from tests.e2e.conftest import adversarial_connections, running_adversarial
from tests.fixtures.services import KafkaEndpoint
from tests.pg import private_database

pytestmark = pytest.mark.e2e

SEED = 2802
STOP_REDIS_DB = 14  # conftest: shop 3, types 4, schema evolution 5-7, adversarial 8, others 9-13
STOP_LIMIT_SECONDS = 10.0  # issue 28: the job ends within 10 s whatever a sink is doing
# Spark's JVM and Python workers end after the job's process: 0.5-2.5 s later on a loaded
# machine, 6 s at a load of 25 on two cores with the job at nice 19. A JVM still running after
# this would be a hang, and a restart would meet it on the same checkpoint.
GROUP_LIMIT_SECONDS = 20.0
STUCK_SECONDS = 2.0  # the search consumer's batch stays uncommitted this long: it waits


@pytest.fixture
def stop_pipeline(
    pg_url: str, kafka: KafkaEndpoint, redis_url: str, private_search: Started, tmp_path: Path
) -> Iterator[tuple[Pipeline, Workload]]:
    with private_database(pg_url, "stop_e2e") as database:
        connections = adversarial_connections(
            database, kafka, private_search.url, redis_url, STOP_REDIS_DB, tmp_path
        )
        with running_adversarial(connections, tmp_path / "pipeline", SEED, 20) as running:
            yield running


def test_sigterm_and_ctrl_c_end_the_job_within_10_s_while_search_is_frozen(
    stop_pipeline: tuple[Pipeline, Workload], private_search: Started
) -> None:
    pipeline, workload = stop_pipeline
    pipeline.job.wait_committed(0, timeout_seconds=300, consumer="search")
    stops: dict[str, Stopped] = {}
    for name, signum, whole_group in (
        ("SIGTERM to the job", signal.SIGTERM, False),
        ("Ctrl-C (SIGINT to its group)", signal.SIGINT, True),
    ):
        with frozen(private_search.pid):
            workload.run(10)
            wait_search_stuck(pipeline.job)
            stops[name] = stopped = pipeline.job.stop_timed(signum, whole_group)
        log = pipeline.job.tail()
        assert stopped.returncode == 0, f"{name}: exit code {stopped.returncode}:\n{log}"
        assert stopped.seconds <= STOP_LIMIT_SECONDS, f"{name}: {stopped}:\n{log}"
        assert stopped.group_seconds <= GROUP_LIMIT_SECONDS, f"{name}: {stopped}:\n{log}"
        restart_and_rerun(pipeline.job)
    workload.run(10)
    pipeline.wait_converged(timeout_seconds=180)
    assert pipeline.dead_letters() == 0
    stops["SIGTERM to its group, idle (systemd)"] = stopped = pipeline.job.stop_timed(
        signal.SIGTERM, whole_group=True
    )
    log = pipeline.job.log.read_text(errors="replace")
    assert stopped.returncode == 0 and "Traceback" not in log, f"{stopped}:\n{log[-4000:]}"
    # The JVM ending under py4j's calls is the stop: no py4j error on the console.
    assert "Exception while sending command" not in log, log[-4000:]
    print({name: stopped for name, stopped in stops.items()})


def wait_search_stuck(job: JobProcess, timeout_seconds: float = 120.0) -> None:
    """Until the search consumer has a batch in flight that stays uncommitted STUCK_SECONDS:
    its write waits for the frozen server."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        job.raise_if_dead()
        if job.in_flight("search"):
            time.sleep(STUCK_SECONDS)
            if job.in_flight("search"):
                return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"no search batch in flight within {timeout_seconds}s:\n{job.tail()}"
            )
        time.sleep(0.1)


def restart_and_rerun(job: JobProcess) -> None:
    """Search answers again: the job restarts on the same checkpoint, and the search consumer
    re-runs the batch the stop abandoned (planned, never committed) and commits it."""
    assert job.in_flight("search"), "the stop committed the search consumer's batch"
    committed = job.committed_batches("search")
    job.start()
    job.wait_committed(committed, timeout_seconds=180, consumer="search")
