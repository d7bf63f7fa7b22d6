"""A process that ran the embedded capture exits once the capture stopped, even mid-snapshot.

Seen twice in benchmarks (2026-11-28, 550,000 rows): after the capture failed or was stopped
during its snapshot, the bench process never exited: its main thread waited in JPype's
`_JTerminate`, the JVM's destroy waiting for Debezium threads that did not end. `cdc-sync capture`
leaves through the same path, so it would hang instead of exiting for a supervisor to restart it.
The capture runs in a child process here, stopped while it still publishes its snapshot.

Leaving the JVM alive has its own hazard, seen once in CI (exit -6, "FATAL: exception not
rethrown"): JPype's reference queue, a Java thread that releases Python objects Java held, took
the GIL while the interpreter finalized and was ended there, which aborts the process. The second
test makes that queue busy at exit on purpose (it aborted six runs of six before the fix).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests.fixtures.services import KafkaEndpoint
from tests.pg import private_database

pytestmark = pytest.mark.integration

ROWS = 60_000  # a snapshot of several seconds on the stand-in brokers
EXIT_SECONDS = 30.0

CHILD = """
import sys, time, uuid
from pathlib import Path
from cdc_sync.connectors.engine import CaptureEngine
from cdc_sync.core.settings import Connections

database, bootstrap, flavor, state = sys.argv[1:5]
prefix = f"exit{uuid.uuid4().hex[:8]}"
connections = Connections(database, bootstrap, flavor, None, "opensearch", None, None, None)
settings = {
    "topic.prefix": prefix, "slot.name": prefix, "publication.name": prefix,
    "schema.include.list": "exit", "table.include.list": "exit.rows",
    "signal.data.collection": "", "heartbeat.interval.ms": "0", "slot.drop.on.stop": "true",
}
engine = CaptureEngine.from_file(Path("connectors/shop.json"), connections, Path(state), settings)
engine.start()
deadline = time.monotonic() + 120
while engine.published < 2_000:
    engine.raise_if_failed()
    assert time.monotonic() < deadline, "the snapshot did not start"
    time.sleep(0.05)
engine.stop()
print(f"stopped after {engine.published} records", flush=True)
"""

# A capture stopped once its snapshot is published: no Java thread is left behind it.
STOPPED_CLEANLY = (
    CHILD.replace("engine.published < 2_000", "not engine._snapshot_done.is_set()")
    + """
import jpype.config
print(f"destroy the JVM at exit: {jpype.config.destroy_jvm}", flush=True)
"""
)


REPO = Path(__file__).resolve().parents[2]


def child_env() -> dict[str, str]:
    """The child imports the code under test as this process does (a worktree's too)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def run_child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=EXIT_SECONDS * 4,
        cwd=REPO,
        env=child_env(),
    )


def create_rows(database: str, count: int) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA exit")
        conn.execute("CREATE TABLE exit.rows (id int PRIMARY KEY, body text)")
        conn.execute(
            "INSERT INTO exit.rows SELECT g, md5(g::text) FROM generate_series(1, %s) g", (count,)
        )


RELEASED_AT_EXIT = """
import jpype
from cdc_sync.connectors.engine import JVM_OPTIONS, ensure_java_home, keep_the_jvm_at_exit
from pydbzengine.engine.jvm import ensure_jvm_started

ensure_java_home()
ensure_jvm_started(jvm_opts=JVM_OPTIONS)
keep_the_jvm_at_exit()
ArrayList = jpype.JClass("java.util.ArrayList")
Runnable = jpype.JClass("java.lang.Runnable")
System = jpype.JClass("java.lang.System")

@jpype.JImplements(Runnable)
class Task:
    @jpype.JOverride
    def run(self) -> None:
        pass

for _ in range(5):  # Python objects held by Java, then released: the queue's work at exit
    held = ArrayList()
    for _ in range(20_000):
        held.add(Task())
    del held
System.gc()
"""


def test_a_process_that_kept_its_jvm_exits_cleanly_while_java_releases_python_objects() -> None:
    child = run_child(RELEASED_AT_EXIT)
    assert child.returncode == 0, child.stderr[-2000:]


def test_a_capture_stopped_mid_snapshot_lets_its_process_exit(
    pg_url: str, kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    with private_database(pg_url, "capture_exit") as database:
        create_rows(database, ROWS)
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, database, kafka.bootstrap, kafka.flavor, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=REPO,
            env=child_env(),
        )
        try:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line.startswith("stopped after"), line
            stopped = time.monotonic()
            child.wait(timeout=EXIT_SECONDS)
            assert time.monotonic() - stopped < EXIT_SECONDS
            assert child.returncode == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()


def test_a_capture_stopped_after_its_snapshot_leaves_the_jvm_to_be_destroyed_at_exit(
    pg_url: str, kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    """Only a stop that leaves Debezium's threads running keeps the JVM at exit (whose hazards
    the test above shows); after a clean stop JPype destroys it as usual (CI, 2026-11-28: a test
    session that kept it ended with a segmentation fault after every test had passed)."""
    with private_database(pg_url, "capture_clean_exit") as database:
        create_rows(database, 50)
        child = run_child(STOPPED_CLEANLY, database, kafka.bootstrap, kafka.flavor, str(tmp_path))
        assert child.returncode == 0, child.stderr[-2000:]
        assert "destroy the JVM at exit: True" in child.stdout, child.stdout
