"""Spark's JVM output (start-up notices, log4j WARN lines) goes to the log file, not the console;
the driver's heap is the one asked for.

Runs in a fresh interpreter: the JVM's output is decided when the JVM starts, once per process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = """
import sys
from pathlib import Path
from cdc_sync.job.spark_session import build_spark
spark = build_spark("console-test", jvm_log=Path(sys.argv[1]), driver_memory=sys.argv[2])
spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getLogger("cdc-sync-test").warn("jvm-warning")
print(spark.range(3).count())
print(spark.sparkContext._jvm.java.lang.Runtime.getRuntime().maxMemory() // 2**20)
spark.stop()
"""


def _run(jvm_log: str, driver_memory: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, jvm_log, driver_memory],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_jvm_output_goes_to_the_log_file_and_stays_off_the_console(tmp_path: Path) -> None:
    """One JVM for both checks (each start costs ~20 s): its output, and its heap."""
    log = tmp_path / "logs" / "spark.log"
    quiet = _run(str(log), "1536m")
    assert quiet.returncode == 0, quiet.stderr
    count, heap_mib = quiet.stdout.split()
    assert count == "3"
    assert "jvm-warning" not in quiet.stderr and "log4j" not in quiet.stderr, quiet.stderr
    assert "jvm-warning" in log.read_text()
    assert 1300 <= int(heap_mib) <= 1536, heap_mib  # the heap asked for, less a survivor space
