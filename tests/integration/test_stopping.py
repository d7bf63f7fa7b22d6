"""A batch cut short by its query's stop ends the query cleanly, whatever error it raised
(cdc_sync.job.stopping); a batch that fails on its own still fails the query with its error.

Each case runs a real Spark streaming query in a fresh interpreter, with the JVM's output in a
file: Spark's reading of a long stop error overflowed its stream thread's stack there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = """
import sys, threading
from pathlib import Path
from cdc_sync.job.spark_session import build_spark
from cdc_sync.job.stopping import raise_for_spark

spark = build_spark("stopping-test", jvm_log=Path(sys.argv[1]))
stop_mid_batch = sys.argv[2] == "stop"
started, queries = threading.Event(), []
# What an interrupted Spark call leaves in the batch's Python error: Py4J's marker, then a Java
# stack trace of 20,000 characters.
LONG = "py4j.protocol.Py4JJavaError: An error occurred while calling o1.count.\\n" + (
    "\\tat org.apache.spark.SparkContext.runJob(SparkContext.scala:2500)\\n" * 300
)

def batch(frame, batch_id):
    try:
        started.set()
        if stop_mid_batch:
            threading.Event().wait(8)  # the stop comes meanwhile
        raise RuntimeError(LONG)
    except BaseException as exc:
        raise_for_spark(exc, batch_id, queries[0] if queries else None)

query = spark.readStream.format("rate").load().writeStream.foreachBatch(batch).start()
queries.append(query)
started.wait(120)
if stop_mid_batch:
    query.stop()
else:
    try:
        query.awaitTermination(120)
    except Exception:
        pass
error = query.exception()
print("EXCEPTION", "none" if error is None else len(str(error)))
print("ORIGINAL", error is not None and "SparkContext.runJob" in str(error))
spark.stop()
"""


def _run(jvm_log: Path, mode: str) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(jvm_log), mode],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)


def test_a_batch_cut_short_by_the_stop_ends_the_query_cleanly(tmp_path: Path) -> None:
    log = tmp_path / "spark.log"
    out = _run(log, "stop")
    assert "StackOverflowError" not in log.read_text()
    assert out["EXCEPTION"] == "none"  # a stop, not a failure


def test_a_batch_that_fails_on_its_own_fails_the_query_with_its_error(tmp_path: Path) -> None:
    log = tmp_path / "spark.log"
    out = _run(log, "fail")
    assert out["EXCEPTION"] != "none"
    assert out["ORIGINAL"] == "True"  # the whole error, Java stack trace included
    assert "StackOverflowError" not in log.read_text()
